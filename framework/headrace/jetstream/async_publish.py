"""Asynchronous JetStream publish: many messages in flight, every PubAck accounted for.

:meth:`JetStreamAPI.publish <headrace.jetstream.JetStreamAPI.publish>` waits for each PubAck,
one round trip a message. A producer that has many messages wants them out back to back, with
the stream's answers coming back while it goes on. Doing that with futures and callbacks (as
nats.go's ``PublishAsync`` and nats-py's ``publish_async`` do) leaves questions open: who
hears of a refusal nobody awaited, what waits for the last answers, what a lost connection
does to the answers still owed, what is left running once the publisher is no longer used.
Here a publisher is a scope::

    async with js.async_publisher(max_pending=4000) as pub:
        for order in orders:
            await pub.publish("orders.new", order.data, msg_id=order.id)
        # leaving the block waits for every PubAck still outstanding

and the answers to those questions follow from it:

- :meth:`AsyncPublisher.publish` returns once the message is queued for the socket, with a
  :class:`PendingPubAck`; ``await pending.ack()`` gives the :class:`PubAck`, or raises the
  typed error that stands for the refusal. Awaiting it is optional.
- At most ``max_pending`` PubAcks are outstanding at once, and at most ``max_pending_bytes``
  of their messages: ``publish`` waits for room, so memory (the publisher keeps each message
  until it is answered, to send it again after "no responders"), the server's queue and the
  time to drain stay bounded. Wrap it in ``trio.fail_after`` to stop waiting; nothing is sent
  then.
- Every message is answered within ``timeout`` seconds (:class:`PubAckTimeout` otherwise),
  retries included, so waiting for the answers always ends.
- "No responders" (the 503 status: no stream yet, or its leader being elected) is retried
  ``retry_attempts`` times, ``retry_wait`` seconds apart, as the synchronous publish does;
  then :class:`~headrace.jetstream.errors.NoStreamForSubject`.
- A refusal nobody awaited is not dropped: :meth:`AsyncPublisher.wait_all` and the end of the
  block raise :class:`AsyncPublishFailed`, which lists each failed message with its error
  (:class:`PublishFailure`: enough to publish it again). A failure is reported once: by its
  own ``ack()`` or by one of those.
- When the connection is lost, the answers still owed cannot come (the server sends a reply
  to the subscription as it is then, and there is none): they fail at once with
  :class:`PubAckLost` rather than waiting out their timeout. When the block is left by an
  exception or a cancellation, nothing more is awaited; what is outstanding fails with
  :class:`PublishAbandoned` (counted in the stats, noted on the exception). These three, the
  "don't know" outcomes, are :class:`PubAckMissing`: the message may or may not be stored, and
  publishing it again with the same ``msg_id`` is safe within the stream's duplicate window.
- Cancellation is immediate and leaves nothing behind: the publisher's two tasks (the timer
  that expires answers and re-sends after "no responders", and the watcher of the connection)
  run in a nursery inside the ``async with``.

How it keeps pace (a message costs the client about what it costs the server, so the client
must not be the slower of the two):

- One wildcard subscription (``<inbox>.*``) receives every PubAck; the token after the inbox
  says which message it answers. That subscription hands each batch the reader parsed straight
  to a function of the publisher (no queue, no task switch), which settles the matching
  messages in place. A PubAck is only classified there (a plain success starts with
  ``{"stream":``); it is decoded into a :class:`PubAck` when someone asks ``ack()`` for it.
- The publisher encodes each ``PUB`` itself and queues it with
  :meth:`Connection.write_nowait <headrace.nats.Connection.write_nowait>`, without the
  checkpoint and the checks of a plain publish that it does not need: the reply subject is
  its own, and a subject is checked the first time it is seen. It does not wait on the
  connection's ``write_buffer_size`` either: everything it queued and the socket has not taken
  yet belongs to messages still outstanding, which ``max_pending_bytes`` bounds. While
  disconnected, the reconnect buffer's bound holds as for any publish.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Final

import attrs
import trio

from headrace._trio import BodyError, EventWatcher
from headrace.errors import (
    ConnectionClosedError,
    ConnectionLostError,
    HeadraceError,
    MaxPayloadExceeded,
    NatsError,
    NoRespondersError,
    PermissionViolation,
    RequestTimeout,
)
from headrace.jetstream.errors import JetStreamError, NoStreamForSubject
from headrace.jetstream.msg_ttl import MessageTTL
from headrace.jetstream.publish_headers import parse_pub_ack, publish_headers
from headrace.jetstream.responses import PubAck
from headrace.jetstream.schedules import MessageSchedule
from headrace.nats.connection import Connection
from headrace.nats.events import (
    Closed,
    ConnectionEvent,
    Disconnected,
    Reconnected,
    ServerErrorEvent,
)
from headrace.nats.subscription import Subscription
from headrace.protocol.commands import check_subject
from headrace.protocol.events import Msg
from headrace.protocol.headers import Headers, encode_header_block

#: PubAcks outstanding at once by default (nats.go's default too).
DEFAULT_MAX_PENDING: Final = 4000
#: Bytes of the outstanding messages (headers and payloads) at once by default.
DEFAULT_MAX_PENDING_BYTES: Final = 16 * 1024 * 1024
#: Re-sends after "no responders", and the wait before each (as the synchronous publish).
DEFAULT_RETRY_ATTEMPTS: Final = 2
DEFAULT_RETRY_WAIT: Final = 0.25

#: How every plain successful PubAck starts: nats-server writes the error first when there is
#: one.
_SUCCESS: Final = b'{"stream":'
#: A duplicate's PubAck (``"duplicate": true``, as the server writes it): decoded in full.
_DUPLICATE: Final = b'"duplicate"'
#: Subjects remembered as checked (and encoded); forgotten all at once beyond this many.
_KNOWN_SUBJECTS: Final = 4096
#: A publisher that always has room takes a checkpoint every 256 publishes (see ``publish``).
_YIELD_MASK: Final = 255

_PENDING: Final = 0
_ACKED: Final = 1
_FAILED: Final = 2


# -- errors -------------------------------------------------------------------------------------


class PubAckMissing(JetStreamError):
    """No PubAck came for a message, so whether the stream stored it is unknown.

    Publishing it again with the same ``msg_id`` is safe: within the stream's duplicate window
    a stored one is answered as a duplicate instead of being stored twice. The subclasses say
    why the answer is missing; ``subject`` is the message's."""

    def __init__(self, message: str, subject: str) -> None:
        super().__init__(message)
        self.subject = subject


class PubAckTimeout(PubAckMissing, RequestTimeout):
    """No PubAck within the publisher's ``timeout`` (counted from the first send, retries
    included). Also a :class:`~headrace.errors.RequestTimeout`, as the synchronous publish
    raises."""


class PubAckLost(PubAckMissing):
    """The connection was lost, or closed, while the PubAck was outstanding: a reply sent
    while we are away is dropped by the server, so it cannot come any more. The connection
    error is the ``__cause__``."""


class PublishAbandoned(PubAckMissing):
    """The publisher's block ended (an exception, a cancellation) before the PubAck came, so
    it was not awaited."""


class AsyncPublisherClosed(JetStreamError):
    """A publish on a publisher whose ``async with`` block has ended, or that can receive no
    PubAck any more (the server refused its inbox subscription: the ``__cause__``)."""


@attrs.frozen(slots=True, eq=False)
class PublishFailure:
    """One message that was not stored, or may not have been: which one, and why.

    ``index`` is its place among the publisher's publishes (1 for the first); ``headers``
    are those it was sent with (the ``Nats-Msg-Id`` and ``Nats-Expected-*`` ones included),
    so ``subject``, ``data`` and ``headers`` publish it again as it was."""

    index: int
    subject: str
    data: bytes
    headers: Headers | None
    msg_id: str | None
    error: Exception


class AsyncPublishFailed(JetStreamError):
    """Publishes of an :class:`AsyncPublisher` failed and nobody awaited their
    :meth:`PendingPubAck.ack`: raised by :meth:`AsyncPublisher.wait_all` and when the block
    ends. ``failures`` lists each (in publish order) with its typed error.

    One exception carrying a list rather than an ``ExceptionGroup``: a load of 100,000
    messages to a stream that refuses them all is one failure to handle, not 100,000
    tracebacks to print; ``errors`` gives the exceptions for whoever wants them."""

    def __init__(self, failures: list[PublishFailure], sent: int) -> None:
        kinds = Counter(type(f.error).__name__ for f in failures)
        first = failures[0]
        super().__init__(
            f"{len(failures)} of {sent} JetStream publishes failed ("
            + ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
            + f"); the first, #{first.index} to {first.subject!r}: {first.error}"
        )
        self.failures = tuple(failures)

    @property
    def errors(self) -> list[Exception]:
        return [f.error for f in self.failures]


# -- value types --------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class AsyncPublishStats:
    """A publisher's counts so far. ``sent`` = ``acked`` + ``failed`` + ``abandoned`` +
    ``pending``. ``acked`` counts every stored message, ``duplicates`` those of them the
    stream had already (``msg_id``); ``failed`` every refusal, timeout and lost answer;
    ``retried`` the re-sends after "no responders"; ``peak_pending`` the most PubAcks that
    were outstanding at once (never above ``max_pending``), ``pending_bytes`` what their
    messages (headers and payload) add up to now."""

    sent: int
    acked: int
    duplicates: int
    failed: int
    abandoned: int
    retried: int
    pending: int
    peak_pending: int
    pending_bytes: int


# -- helpers shared with the synchronous publish --------------------------------------------------


# -- one message ----------------------------------------------------------------------------------


class PendingPubAck:
    """One published message and the stream's answer to come: ``await ack()``.

    Made by :meth:`AsyncPublisher.publish`. ``index`` is the message's place among the
    publisher's publishes (1 for the first); ``done`` says whether it is answered (or failed).
    """

    __slots__ = (
        "_ack",
        "_answer",
        "_attempts",
        "_data",
        "_deadline",
        "_error",
        "_headers",
        "_reply",
        "_reported",
        "_size",
        "_state",
        "_waiter",
        "index",
        "msg_id",
        "subject",
    )

    def __init__(
        self,
        index: int,
        subject: str,
        data: bytes,
        headers: Headers | None,
        msg_id: str | None,
        reply: str,
        deadline: float,
        size: int,
    ) -> None:
        self.index = index
        self.subject = subject
        self.msg_id = msg_id
        self._data = data
        self._headers = headers
        self._reply = reply
        self._deadline = deadline
        self._size = size
        self._state = _PENDING
        self._attempts = 0  # re-sends after "no responders"
        self._waiter: trio.Event | None = None
        # Set when it is settled (one message costs the publisher about what it costs the
        # server, so nothing is set twice): _answer and _ack when acked, _error and
        # _reported when failed.
        self._answer: bytes
        self._ack: PubAck | None
        self._error: Exception
        self._reported: bool

    def __repr__(self) -> str:
        state = ("pending", "acked", "failed")[self._state]
        return f"<PendingPubAck #{self.index} {self.subject!r} {state}>"

    @property
    def done(self) -> bool:
        return self._state != _PENDING

    async def ack(self) -> PubAck:
        """The stream's :class:`PubAck` (``duplicate`` set when ``msg_id`` found the message
        already stored), waiting for it if it has not come yet. Raises what stands for a
        failure: the server's refusal (:class:`~headrace.jetstream.errors.WrongLastSequence`,
        any :class:`~headrace.jetstream.errors.JetStreamAPIError`),
        :class:`~headrace.jetstream.errors.NoStreamForSubject` after the retries, or a
        :class:`PubAckMissing` (timed out, lost, abandoned). A failure raised here counts as
        reported: it is not raised again by :meth:`AsyncPublisher.wait_all` or the block's
        end. Never waits longer than the publisher's ``timeout`` (and no longer than its block
        lasts)."""
        if self._state == _PENDING:
            if self._waiter is None:
                self._waiter = trio.Event()
            await self._waiter.wait()
        if self._state == _ACKED:
            ack = self._ack
            if ack is None:
                ack = self._ack = parse_pub_ack(self._answer)
            return ack
        self._reported = True
        raise self._error.with_traceback(None)

    # -- settled by the publisher -----------------------------------------------------------------

    def _succeed(self, answer: bytes, ack: PubAck | None = None) -> None:
        self._state = _ACKED
        self._answer = answer
        self._ack = ack
        self._data = b""  # kept for a retry until now: no longer needed
        self._headers = None
        if self._waiter is not None:
            self._waiter.set()

    def _fail(self, error: Exception) -> None:
        self._state = _FAILED
        self._error = error
        self._reported = False
        if self._waiter is not None:
            self._waiter.set()

    def _failure(self) -> PublishFailure:
        return PublishFailure(
            self.index, self.subject, self._data, self._headers, self.msg_id, self._error
        )


# -- the publisher --------------------------------------------------------------------------------


class AsyncPublisher:
    """Publishes to JetStream with up to ``max_pending`` PubAcks outstanding: see the module
    docs. Made by ``JetStream.async_publisher()``, used inside its ``async with`` block."""

    def __init__(
        self,
        nc: Connection,
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        timeout: float = 5.0,
        retry_attempts: int = DEFAULT_RETRY_ATTEMPTS,
        retry_wait: float = DEFAULT_RETRY_WAIT,
    ) -> None:
        for name, value in (("max_pending", max_pending), ("max_pending_bytes", max_pending_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")
        if not timeout > 0 or math.isinf(timeout):
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        if retry_attempts < 0:
            raise ValueError(f"retry_attempts must be 0 or more, not {retry_attempts!r}")
        if not retry_wait >= 0:
            raise ValueError(f"retry_wait must be 0 or more seconds, not {retry_wait!r}")
        self._nc = nc
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.timeout = float(timeout)
        self.retry_attempts = retry_attempts
        self.retry_wait = float(retry_wait)
        self._prefix = nc.new_inbox() + "."
        self._prefix_bytes = self._prefix.encode()
        self._subjects: dict[str, bytes] = {}  # checked subjects, encoded
        self._max_payload = nc.max_payload
        self._now: Callable[[], float] = trio.current_time
        # Outstanding messages by reply subject, in publish order (so also by deadline).
        self._pending: dict[str, PendingPubAck] = {}
        self._pending_bytes = 0
        self._retries: deque[tuple[float, PendingPubAck]] = deque()
        self._unreported: list[PendingPubAck] = []
        # Publishers waiting for room and wait_all() callers: woken when answers settle.
        self._progress = trio.lowlevel.ParkingLot()
        self._wake = trio.Event()  # the timer's: a retry queued, or the first message sent
        self._timer_idle = False
        self._closed = False
        self._broken: BaseException | None = None
        self._sub: Subscription | None = None
        self._events: EventWatcher[ConnectionEvent] | None = None
        self._stop_denied: list[Callable[[], None]] = []
        self._refusing = False  # closed, or broken: publish() says which
        self._count = 0  # messages queued (the last one's index)
        self._acked = self._duplicates = self._failed = 0
        self._abandoned = self._retried = self._peak = 0

    def __repr__(self) -> str:
        return (
            f"<AsyncPublisher pending={len(self._pending)}/{self.max_pending} "
            f"sent={self._count}{' closed' if self._closed else ''}>"
        )

    @property
    def pending(self) -> int:
        """PubAcks outstanding now."""
        return len(self._pending)

    @property
    def stats(self) -> AsyncPublishStats:
        return AsyncPublishStats(
            sent=self._count,
            acked=self._acked,
            duplicates=self._duplicates,
            failed=self._failed,
            abandoned=self._abandoned,
            retried=self._retried,
            pending=len(self._pending),
            peak_pending=self._peak,
            pending_bytes=self._pending_bytes,
        )

    # -- publishing -------------------------------------------------------------------------------

    async def publish(
        self,
        subject: str,
        data: bytes = b"",
        *,
        headers: Headers | Mapping[str, str | list[str]] | None = None,
        msg_id: str | None = None,
        expected_stream: str | None = None,
        expected_last_seq: int | None = None,
        expected_last_subject_seq: int | None = None,
        expected_last_subject_seq_subject: str | None = None,
        expected_last_msg_id: str | None = None,
        ttl: MessageTTL | None = None,
        schedule: MessageSchedule | None = None,
    ) -> PendingPubAck:
        """Publish to a stream; return once the message is queued for the socket, waiting
        first while ``max_pending`` PubAcks (or ``max_pending_bytes`` of messages) are
        outstanding. The arguments are those of :meth:`JetStreamAPI.publish
        <headrace.jetstream.JetStreamAPI.publish>`; a bad one (subject, header, TTL, a
        payload over the server's maximum) raises here and sends nothing, and so do the
        connection's own errors (closed, the reconnect buffer full). The stream's answer is
        the returned :class:`PendingPubAck`'s.

        Messages go out in the order of the calls, and a stream stores them in that order,
        but for one re-sent after "no responders", which is stored after those sent while it
        waited. With room to publish, most calls return without a checkpoint; one in 256
        takes one, before sending anything. A loop that never waits would otherwise starve the
        connection's writer and reader until the window is full, then let them run all at
        once: the server would idle between bursts (measured: about 15% fewer messages a
        second). Checkpointing on every call would cost more than the message."""
        if self._count & _YIELD_MASK == _YIELD_MASK:
            # Before anything is queued: cancelled here, nothing was sent.
            await trio.lowlevel.checkpoint()
        if self._refusing:
            self._refuse()
        if (
            headers is None
            and msg_id is None
            and expected_stream is None
            and expected_last_seq is None
            and expected_last_subject_seq is None
            and expected_last_msg_id is None
            and ttl is None
            and expected_last_subject_seq_subject is None
            and schedule is None
        ):
            hdrs = block = None
            size = len(data)
        else:
            hdrs = publish_headers(
                headers,
                msg_id=msg_id,
                expected_stream=expected_stream,
                expected_last_seq=expected_last_seq,
                expected_last_subject_seq=expected_last_subject_seq,
                expected_last_subject_seq_subject=expected_last_subject_seq_subject,
                expected_last_msg_id=expected_last_msg_id,
                ttl=ttl,
                schedule=schedule,
                subject=subject,
            )
            block = None if hdrs is None else encode_header_block(hdrs)
            size = len(data) if block is None else len(block) + len(data)
        encoded = self._subjects.get(subject)
        if encoded is None:
            encoded = self._known(subject)
        max_payload = self._max_payload
        if max_payload is not None and size > max_payload:
            raise MaxPayloadExceeded(
                f"message of {size} bytes to {subject!r} exceeds the server's max_payload of "
                f"{max_payload} bytes"
            )
        pending = self._pending
        while len(pending) >= self.max_pending or (
            pending and self._pending_bytes + size > self.max_pending_bytes
        ):
            await self._progress.park()
            if self._refusing:
                self._refuse()
        index = self._count + 1
        if block is None:
            command = b"PUB %b %b%d %d\r\n%b\r\n" % (
                encoded,
                self._prefix_bytes,
                index,
                size,
                data,
            )
        else:
            command = b"HPUB %b %b%d %d %d\r\n%b%b\r\n" % (
                encoded,
                self._prefix_bytes,
                index,
                len(block),
                size,
                block,
                data,
            )
        # Queued before it is registered, with no checkpoint in between: if it cannot be
        # queued (closed, the reconnect buffer full), nothing was sent and nothing is pending;
        # no answer can come before the next checkpoint, so none is missed.
        self._nc.write_nowait(command, 1, size)
        self._count = index
        reply = self._prefix + str(index)
        entry = PendingPubAck(
            index, subject, data, hdrs, msg_id, reply, self._now() + self.timeout, size
        )
        pending[reply] = entry
        self._pending_bytes += size
        if len(pending) > self._peak:
            self._peak = len(pending)
        if self._timer_idle:
            self._timer_idle = False
            self._wake.set()
        return entry

    def _known(self, subject: str) -> bytes:
        """``subject`` checked (:class:`~headrace.errors.InvalidSubjectError`), encoded and
        remembered: a publisher sends to few subjects, many times each."""
        check_subject(subject)
        if len(self._subjects) >= _KNOWN_SUBJECTS:
            self._subjects.clear()
        encoded = self._subjects[subject] = subject.encode()
        return encoded

    def _refuse(self) -> None:
        if self._broken is not None:
            raise AsyncPublisherClosed(
                f"this async publisher can receive no PubAck: {self._broken}"
            ) from self._broken
        raise AsyncPublisherClosed(
            "this async publisher's block has ended; open a new one to publish"
        )

    async def wait_all(self) -> None:
        """Wait until every message published before this call is answered (or has failed),
        then raise :class:`AsyncPublishFailed` for the failures not reported yet (each is
        reported once: by its own ``ack()``, by this, or by the block's end). Ends within the
        publisher's ``timeout``."""
        mark = self._count
        pending = self._pending
        while pending and next(iter(pending.values())).index <= mark:
            await self._progress.park()
        self._raise_unreported()

    # -- settling ---------------------------------------------------------------------------------

    def _on_acks(self, batch: list[Msg]) -> None:
        """The inbox subscription's handler, called by the connection's reader with every
        batch of answers: settle the messages they answer, in place. It must not block, and
        does not raise."""
        pending = self._pending
        acked = freed = 0
        for msg in batch:
            entry = pending.get(msg.subject)
            if entry is None:
                continue  # answered already, timed out, or lost
            data = msg.data
            if data.startswith(_SUCCESS) and _DUPLICATE not in data:
                del pending[msg.subject]
                freed += entry._size
                # entry._succeed(data), inlined: this runs once for every message.
                entry._state = _ACKED
                entry._answer = data
                entry._ack = None
                entry._data = b""
                entry._headers = None
                if entry._waiter is not None:
                    entry._waiter.set()
                acked += 1
            elif not data and msg.status == 503:
                self._no_responders(entry)
            else:
                del pending[msg.subject]
                freed += entry._size
                self._settle_slowly(entry, data)
        self._acked += acked
        self._pending_bytes -= freed
        if self._progress:
            self._progress.unpark_all()

    def _settle_slowly(self, entry: PendingPubAck, data: bytes) -> None:
        """An answer that is not a plain PubAck (a refusal, a duplicate, or a PubAck written
        another way): decoded now, to count it right and to tell a refusal from garbage."""
        try:
            ack = parse_pub_ack(data)
        except Exception as error:  # the typed refusal, or DecodeError
            self._fail(entry, error)
            return
        entry._succeed(data, ack)
        self._acked += 1
        if ack.duplicate:
            self._duplicates += 1

    def _no_responders(self, entry: PendingPubAck) -> None:
        if entry._attempts < self.retry_attempts and not self._closed:
            entry._attempts += 1
            self._retries.append((self._now() + self.retry_wait, entry))
            self._wake.set()
            return
        self._forget(entry)
        self._fail(entry, _no_stream(entry.subject))

    def _forget(self, entry: PendingPubAck) -> None:
        del self._pending[entry._reply]
        self._pending_bytes -= entry._size

    def _fail(self, entry: PendingPubAck, error: Exception) -> None:
        entry._fail(error)
        self._failed += 1
        self._unreported.append(entry)

    def _settled(self) -> None:
        if self._progress:
            self._progress.unpark_all()

    def _lose_all(self, cause: BaseException) -> None:
        """Fail every outstanding message: the connection is gone (``cause``), so no answer
        can come any more."""
        for entry in self._take_all():
            lost = PubAckLost(
                f"publish #{entry.index} to {entry.subject!r}: the connection was lost before "
                f"its PubAck came ({cause}); it may or may not be stored",
                entry.subject,
            )
            lost.__cause__ = cause
            self._fail(entry, lost)
        self._settled()

    def _abandon_all(self) -> int:
        """The block ends without waiting: what is outstanding is abandoned (reported by the
        block's exception, so not again at its end). Returns how many."""
        entries = self._take_all()
        for entry in entries:
            entry._fail(
                PublishAbandoned(
                    f"publish #{entry.index} to {entry.subject!r} was not answered before the "
                    "async publisher's block ended; it may or may not be stored",
                    entry.subject,
                )
            )
            entry._reported = True
        self._abandoned += len(entries)
        self._settled()
        return len(entries)

    def _take_all(self) -> list[PendingPubAck]:
        entries = list(self._pending.values())
        self._pending.clear()
        self._pending_bytes = 0
        self._retries.clear()
        return entries

    def _on_denied(self, error: PermissionViolation) -> None:
        """The server refused a publish of ours (permissions): it dropped the message, and
        says so only in ``-ERR``, so the messages waiting on that subject fail with it."""
        refused = [e for e in self._pending.values() if e.subject == error.subject]
        for entry in refused:
            self._forget(entry)
            self._fail(entry, error)
        if refused:
            self._settled()

    def _raise_unreported(self) -> None:
        failures = sorted(
            (e._failure() for e in self._unreported if not e._reported), key=lambda f: f.index
        )
        for entry in self._unreported:
            entry._reported = True
        self._unreported.clear()
        if failures:
            raise AsyncPublishFailed(failures, self._count)

    # -- the publisher's tasks --------------------------------------------------------------------

    async def _timer(self) -> None:
        """Re-send after "no responders" when due, and fail what has not been answered in
        time. Sleeps until the earlier of the next re-send and the oldest deadline: the
        messages are kept in publish order, so the oldest outstanding one expires first."""
        while True:
            now = self._now()
            while self._retries and self._retries[0][0] <= now:
                _, entry = self._retries.popleft()
                if entry._state == _PENDING:
                    self._resend(entry)
            self._expire(now)
            wake_at = self._retries[0][0] if self._retries else math.inf
            if self._pending:
                wake_at = min(wake_at, next(iter(self._pending.values()))._deadline)
            self._wake = trio.Event()
            self._timer_idle = wake_at == math.inf
            with trio.move_on_at(wake_at):
                await self._wake.wait()

    def _resend(self, entry: PendingPubAck) -> None:
        encoded = self._subjects.get(entry.subject) or entry.subject.encode()
        if entry._headers is None:
            command = b"PUB %b %b%d %d\r\n%b\r\n" % (
                encoded,
                self._prefix_bytes,
                entry.index,
                entry._size,
                entry._data,
            )
        else:
            block = encode_header_block(entry._headers)
            command = b"HPUB %b %b%d %d %d\r\n%b%b\r\n" % (
                encoded,
                self._prefix_bytes,
                entry.index,
                len(block),
                entry._size,
                block,
                entry._data,
            )
        try:
            self._nc.write_nowait(command, 1, entry._size)
        except HeadraceError as error:  # closed, or the reconnect buffer full
            self._forget(entry)
            self._fail(entry, error)
            self._settled()
            return
        self._retried += 1

    def _expire(self, now: float) -> None:
        expired = []
        for entry in self._pending.values():
            if entry._deadline > now:
                break
            expired.append(entry)
        for entry in expired:
            self._forget(entry)
            if entry._attempts:  # the only answer was "no responders"
                error: Exception = _no_stream(entry.subject)
            else:
                error = PubAckTimeout(
                    f"no PubAck for publish #{entry.index} to {entry.subject!r} within "
                    f"{self.timeout:g}s; it may or may not be stored",
                    entry.subject,
                )
            self._fail(entry, error)
        if expired:
            self._settled()

    async def _watch(self, events: EventWatcher[ConnectionEvent]) -> None:
        """Fail the outstanding messages at once when their answers can no longer come, and
        follow the server's ``max_payload`` across reconnects."""
        async for event in events:
            if type(event) is Disconnected:
                cause: BaseException = ConnectionLostError(
                    f"disconnected from {event.server}"
                    + (f": {event.error}" if event.error is not None else "")
                )
                self._lose_all(cause)
            elif type(event) is Reconnected:
                self._max_payload = self._nc.max_payload
            elif type(event) is Closed:
                self._lose_all(ConnectionClosedError("the connection closed"))
                return
            elif type(event) is ServerErrorEvent:
                sub = self._sub
                if sub is not None and sub.is_closed and self._broken is None:
                    # The server ended the inbox subscription (permissions): nothing can answer.
                    self._broken = sub.error or event.error
                    self._refusing = True
                    self._lose_all(self._broken)

    # -- the block --------------------------------------------------------------------------------

    def _open(self) -> None:
        """Subscribe to the inbox and watch the connection (before the nursery, so that a
        closed connection's error comes out as raised)."""
        nc = self._nc
        self._now = trio.lowlevel.current_clock().current_time
        self._sub = nc.subscribe_nowait(self._prefix + "*", handler=self._on_acks)
        self._events = nc.events(64)
        self._stop_denied.append(nc.on_publish_denied("", self._on_denied))
        self._max_payload = nc.max_payload

    def _start(self, nursery: trio.Nursery) -> None:
        assert self._events is not None
        nursery.start_soon(self._timer)
        nursery.start_soon(self._watch, self._events)

    async def _wait_answered(self) -> None:
        while self._pending:
            await self._progress.park()

    def _end(self, error: BaseException | None) -> None:
        """The block is over: abandon what is outstanding (nothing when it ended normally,
        as it waited), wake the publishers waiting for room, refuse further publishes."""
        self._closed = self._refusing = True
        abandoned = self._abandon_all()
        unreported = sum(1 for e in self._unreported if not e._reported)
        if isinstance(error, Exception) and (abandoned or unreported):
            error.add_note(
                f"headrace: the async publisher's block ended with {abandoned} PubAcks "
                f"outstanding (abandoned: may or may not be stored) and {unreported} failed "
                "publishes nobody awaited; see its stats"
            )

    async def _release(self) -> None:
        """Drop the inbox subscription and the connection hooks (the tasks have ended)."""
        self._closed = self._refusing = True
        for stop in self._stop_denied:
            stop()
        self._stop_denied.clear()
        if self._events is not None:
            self._events.close()
        if self._sub is not None:
            with trio.CancelScope(shield=True), suppress(NatsError):
                await self._sub.unsubscribe()


def _no_stream(subject: str) -> NoStreamForSubject:
    error = NoStreamForSubject(subject)
    error.__cause__ = NoRespondersError(subject)
    return error


@asynccontextmanager
async def open_async_publisher(
    nc: Connection,
    *,
    max_pending: int = DEFAULT_MAX_PENDING,
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    timeout: float = 5.0,
    retry_attempts: int = DEFAULT_RETRY_ATTEMPTS,
    retry_wait: float = DEFAULT_RETRY_WAIT,
) -> AsyncIterator[AsyncPublisher]:
    """An :class:`AsyncPublisher` on ``nc`` for the ``async with`` block (see the module
    docs). A block that ends normally waits for every outstanding PubAck, then raises
    :class:`AsyncPublishFailed` if failures were not reported; one that raises abandons what
    is outstanding and lets its exception through as raised (with a note saying what was
    abandoned)."""
    pub = AsyncPublisher(
        nc,
        max_pending=max_pending,
        max_pending_bytes=max_pending_bytes,
        timeout=timeout,
        retry_attempts=retry_attempts,
        retry_wait=retry_wait,
    )
    body = BodyError()
    pub._open()
    try:
        async with trio.open_nursery() as nursery:
            pub._start(nursery)
            try:
                # The wait for the last PubAcks is part of the body: cancelled, it ends the
                # block as a cancelled body does, its Cancelled not wrapped by the nursery.
                with body:
                    yield pub
                    await pub._wait_answered()
            finally:
                pub._end(body.error)
                nursery.cancel_scope.cancel()
    finally:
        await pub._release()
    body.reraise()
    pub._raise_unreported()


__all__ = [
    "AsyncPublishFailed",
    "AsyncPublishStats",
    "AsyncPublisher",
    "AsyncPublisherClosed",
    "PendingPubAck",
    "PubAckLost",
    "PubAckMissing",
    "PubAckTimeout",
    "PublishAbandoned",
    "PublishFailure",
    "open_async_publisher",
]
