"""The ADR-37 pull flow without I/O: what to ask the server for, and what each answer means.

One :class:`PullFlow` holds the arithmetic of a pull consumer's requests: what is *pending*
(asked for and not yet taken), what is *buffered* (arrived and not yet taken), the threshold
below which to ask again, the heartbeat deadline, and the reaction to every status. It never
touches a socket, a clock or trio, h11-style: its driver tells it what happened, with the time
as an explicit ``now``, and does what it answers.

- :meth:`~PullFlow.pull` answers "send this :class:`PullRequest`" or ``None``;
- :meth:`~PullFlow.received`, :meth:`~PullFlow.taken`, :meth:`~PullFlow.status` and
  :meth:`~PullFlow.timer` answer a :data:`Decision`: :class:`Pull` (call ``pull`` now),
  :class:`Warn` (tell the user; no request before the retry time), :class:`Alarm` (heartbeats
  missed; counts reset, pull now), :class:`CheckConsumer` (after a 503: ask whether the consumer
  still exists, then pull), :class:`Unpinned` (a 423 refused the pin id this flow held: it is
  forgotten; tell the user, pull without it), :class:`Ended` (no more requests; the error, if
  any, is the end), or ``None``.

On a consumer with priority groups (ADR-42) every request names the flow's ``priority``
(group, thresholds, priority) and, once the driver reported a ``Nats-Pin-Id`` with
:meth:`~PullFlow.pinned`, that pin ``id``, until a 423 says the pin moved on.

Two drivers share it: the consume buffer (:mod:`headrace.jetstream.consume`, ``refill=True``:
it pulls again each time the user takes it below the threshold) and ``fetch``/``next``
(:mod:`headrace.jetstream.pull_consumer`, ``refill=False``: one request, ended by a full batch,
a status, a heartbeat alarm or its driver's time limit). The calls are per batch of messages,
not per message, so the consume path stays as cheap as the arithmetic it replaces.

Why each reaction is what it is is in the consume buffer's module docs (statuses, 409 Message
Size Exceeds MaxBytes, heartbeats only while the server owes messages).
"""

from __future__ import annotations

import math

import attrs

from headrace.errors import NoRespondersError
from headrace.jetstream.errors import MessageTooLarge
from headrace.jetstream.priority import PriorityPull
from headrace.jetstream.pull_request import BYTES_MODE_BATCH, PullRequest
from headrace.jetstream.pull_status import StatusKind, classify, status_error

#: Heartbeat alarm after this many ``idle_heartbeat`` intervals of silence (ADR-37: 2 for pull;
#: push consumers use 3, ADR-15).
HEARTBEAT_ALARM_FACTOR = 2.0
#: Pause before pulling again after a 503 (nothing serves the pull API right now).
NO_RESPONDERS_RETRY = 1.0
#: Pause before pulling again after a warning status: the server answers the next request the
#: same way at once (409 Exceeded MaxWaiting, say), so re-pulling at once would spin.
WARNING_RETRY = 0.25


def default_heartbeat(expires: float) -> float:
    """ADR-37's default ``idle_heartbeat``: half of ``expires``, within [0.5 s, 30 s] (and
    never more than half: an ``expires`` under 1 s, for a pin that lasts 1 s or less, gets a
    heartbeat of half of it)."""
    return min(max(expires / 2, 0.5), 30.0, expires / 2)


@attrs.frozen(slots=True)
class Pull:
    """Ask :meth:`PullFlow.pull` for a request now."""


@attrs.frozen(slots=True)
class Warn:
    """A request was refused (``status``, ``description``): tell the user. No request goes out
    before :attr:`PullFlow.retry_at`; the driver calls :meth:`PullFlow.timer` then."""

    status: int
    description: str


@attrs.frozen(slots=True)
class Alarm:
    """No message nor heartbeat for ``silence`` seconds while the server owed messages: the
    requests are taken as lost (counts reset). Tell the user, then pull."""

    silence: float


@attrs.frozen(slots=True)
class CheckConsumer:
    """The retry after a 503 is due: ask whether the consumer still exists, end with
    :class:`ConsumerDeleted` if not, else pull."""


@attrs.frozen(slots=True)
class Unpinned:
    """A 423 refused the pin id the flow held (``description``: ``Nats-Pin-Id mismatch`` or
    ``Nats-Wrong-Pin-Id``): another client holds the group's pin now. The id is forgotten and
    the pending counts reset (every request that carried it is refused); tell the user, then
    pull, without an id, as a standby (ADR-42)."""

    pin_id: str
    description: str


@attrs.frozen(slots=True)
class Ended:
    """The flow is over: no more requests. ``error`` ends it (``None``: a quiet end)."""

    error: BaseException | None


Decision = Pull | Warn | Alarm | CheckConsumer | Unpinned | Ended | None

PULL = Pull()
CHECK_CONSUMER = CheckConsumer()


class PullFlow:
    """The pull flow of one consume (``refill=True``) or one fetch (``refill=False``).

    ``batch`` is the buffer size in messages (the fetch's batch), ``max_bytes`` the buffer size
    in bytes (bytes mode: then ``batch`` is not used). ``threshold`` is the pending count
    (messages, or bytes) at or below which a consume asks again. ``heartbeat`` ``None`` means
    no heartbeats and no alarm. The counters are public for drivers and tests to read; only
    the methods change them.
    """

    __slots__ = (
        "_check_exists",
        "alarm_after",
        "batch",
        "buffered_bytes",
        "buffered_msgs",
        "consumer",
        "ended",
        "error",
        "expires",
        "heartbeat",
        "last_activity",
        "max_bytes",
        "min_request",
        "no_wait",
        "pending_bytes",
        "pending_msgs",
        "pin_id",
        "priority",
        "pulling",
        "refill",
        "requests_sent",
        "retry_at",
        "stop_after",
        "stream",
        "subject",
        "taken_total",
        "threshold",
    )

    def __init__(
        self,
        *,
        batch: int,
        max_bytes: int | None = None,
        threshold: int | None = None,
        expires: float | None,
        heartbeat: float | None,
        alarm_factor: float = HEARTBEAT_ALARM_FACTOR,
        no_wait: bool = False,
        refill: bool,
        stream: str,
        consumer: str,
        subject: str,
        priority: PriorityPull | None = None,
        pin_id: str | None = None,
        stop_after: int | None = None,
    ) -> None:
        if batch < 1 or (max_bytes is not None and max_bytes < 1):
            raise ValueError("batch and max_bytes must be at least 1")
        if stop_after is not None and (stop_after < 1 or max_bytes is not None):
            raise ValueError("stop_after is a number of messages, at least 1, without max_bytes")
        #: A consume ends once this many messages were taken, and never asks for more.
        self.stop_after = stop_after
        #: Messages taken by the user in all.
        self.taken_total = 0
        self.batch = batch
        self.max_bytes = max_bytes
        size = max_bytes if max_bytes is not None else batch
        self.threshold = size if threshold is None else threshold
        if not 0 <= self.threshold <= size:
            raise ValueError(f"threshold must be between 0 and {size}, not {threshold}")
        self.expires = expires
        self.heartbeat = heartbeat
        self.no_wait = no_wait
        self.alarm_after = math.inf if heartbeat is None else heartbeat * alarm_factor
        self.refill = refill
        self.stream = stream
        self.consumer = consumer
        self.subject = subject
        #: The priority group every request names (ADR-42), if the consumer has groups.
        self.priority = priority
        #: The pin id the server last handed out (``Nats-Pin-Id``), sent back in each request.
        self.pin_id = pin_id if priority is not None else None
        #: Messages (or bytes, in bytes mode) requested and not yet taken.
        self.pending_msgs = 0
        self.pending_bytes = 0
        #: Messages (and bytes, in bytes mode) received and not yet taken.
        self.buffered_msgs = 0
        self.buffered_bytes = 0
        self.requests_sent = 0
        #: When the server was last heard from (or the heartbeat clock started).
        self.last_activity = 0.0
        #: After a 503 or a warning: no request before this time.
        self.retry_at: float | None = None
        #: Bytes mode: the smallest request worth sending, after a 409 Message Size Exceeds
        #: MaxBytes said the next message is larger than what was asked (0: no such bound).
        self.min_request = 0
        #: False while disconnected, draining or stopped: no requests, no heartbeat alarm.
        self.pulling = True
        self.ended = False
        self.error: BaseException | None = None
        self._check_exists = False

    @property
    def bytes_mode(self) -> bool:
        return self.max_bytes is not None

    def outstanding(self) -> bool:
        """Whether the server still owes messages (the heartbeat alarm runs only then)."""
        if self.max_bytes is not None:
            return self.pending_bytes > self.buffered_bytes
        return self.pending_msgs > self.buffered_msgs

    # -- requests -----------------------------------------------------------------------------

    def pull(self, now: float, connected: bool) -> PullRequest | None:
        """The request to send now for what is missing, if the threshold is reached (counted
        as pending from here on); ``None`` if nothing is to be sent.

        ``connected`` is the connection's own view: a disconnect reaches the driver's events a
        moment late, and a request sent meanwhile would go out next to the reconnect's own.
        """
        if not self.pulling or self.ended or not connected:
            return None
        if self.retry_at is not None:
            if now < self.retry_at:
                return None
            self.retry_at = None
        if not self.refill and self.requests_sent:
            return None
        # Whether the server owed anything before this request: if not, the heartbeat clock
        # starts with it (taken before the pending counts grow, or it is always true).
        owed = self.outstanding()
        if self.max_bytes is not None:
            if self.pending_bytes > self.threshold:
                return None
            want = self.max_bytes - self.pending_bytes
            if want <= 0 or want < self.min_request:
                return None
            request = PullRequest(
                batch=BYTES_MODE_BATCH,
                max_bytes=want,
                expires=self.expires,
                no_wait=self.no_wait,
                idle_heartbeat=self.heartbeat,
                priority=self.priority,
                id=self.pin_id,
            )
            self.pending_bytes += want
        else:
            if self.pending_msgs > self.threshold:
                return None
            want = self.batch - self.pending_msgs
            if self.stop_after is not None:
                # Never more than the messages left to hand out (pending ones included).
                want = min(want, self.stop_after - self.taken_total - self.pending_msgs)
            if want <= 0:
                return None
            request = PullRequest(
                batch=want,
                expires=self.expires,
                no_wait=self.no_wait,
                idle_heartbeat=self.heartbeat,
                priority=self.priority,
                id=self.pin_id,
            )
            self.pending_msgs += want
        if not owed:
            self.last_activity = now
        self.requests_sent += 1
        return request

    # -- what happened ------------------------------------------------------------------------

    def received(self, count: int, nbytes: int, now: float) -> Decision:
        """``count`` messages of ``nbytes`` bytes (bytes mode; else 0) arrived at ``now``.

        Also call it with ``count`` 0 for a read of statuses only: any word from the server is
        activity. A fetch ends once its batch (or ``max_bytes``) is full.
        """
        self.last_activity = now
        if count:
            # A message held is pending until taken, even if its request was counted as gone
            # (a warning or an alarm forgets every request, and an older one may still deliver):
            # else taking it drives the count below zero and the next request asks for more
            # than the buffer holds.
            self.buffered_msgs += count
            if self.max_bytes is not None:
                self.buffered_bytes += nbytes
                self.min_request = 0  # the head of the consumer moved
                if self.pending_bytes < self.buffered_bytes:
                    self.pending_bytes = self.buffered_bytes
            elif self.pending_msgs < self.buffered_msgs:
                self.pending_msgs = self.buffered_msgs
        if not self.refill and not self.ended:
            if self.max_bytes is not None:
                full = self.buffered_bytes >= self.max_bytes
            else:
                full = self.buffered_msgs >= self.batch
            if full:
                return self._end(None)
        return None

    def taken(self, count: int, nbytes: int) -> None:
        """The user took ``count`` buffered messages of ``nbytes`` bytes (bytes mode; else 0).
        The driver then calls :meth:`pull`: the pending count fell, maybe to the threshold."""
        self.buffered_msgs -= count
        self.taken_total += count
        if self.max_bytes is not None:
            self.buffered_bytes -= nbytes
            self.pending_bytes -= nbytes
        else:
            self.pending_msgs -= count
        if self.stop_after is not None and self.taken_total >= self.stop_after:
            self._end(None)

    @property
    def left(self) -> int | None:
        """Messages still to hand out before ``stop_after`` (None: no such limit)."""
        return None if self.stop_after is None else self.stop_after - self.taken_total

    def pinned(self, pin_id: str) -> bool:
        """A delivered message carried ``Nats-Pin-Id``: send it back from now on. Returns
        whether it is new (the client just became the group's pinned one)."""
        if self.priority is None or pin_id == self.pin_id:
            return False
        self.pin_id = pin_id
        return True

    def dropped(self) -> None:
        """The driver dropped every buffered message (they will come back after ack_wait)."""
        self.buffered_msgs = 0
        self.buffered_bytes = 0

    def status(
        self, code: int, description: str, gone_msgs: int, gone_bytes: int, now: float
    ) -> Decision:
        """A status message arrived, with its ``Nats-Pending-Messages``/``-Bytes`` counts
        (``gone_msgs``, ``gone_bytes``: what its request no longer owes; 0 when absent)."""
        kind = classify(code, description)
        if kind is StatusKind.HEARTBEAT or self.ended:
            return None
        lost_pin = self.pin_id if code == 423 else None
        if lost_pin is not None:
            self.pin_id = None  # ADR-42: forget it; pull without an id from now on
        if not self.refill:
            return self._fetch_status(kind, code, description)
        # What the request had left: the header, or (older servers) all that was outstanding.
        refused = gone_bytes or self.pending_bytes - self.buffered_bytes
        self.pending_msgs = max(self.pending_msgs - gone_msgs, self.buffered_msgs)
        self.pending_bytes = max(self.pending_bytes - gone_bytes, self.buffered_bytes)
        if kind is StatusKind.ERROR:
            return self._end(status_error(code, description))
        if lost_pin is not None:
            # Every request that carried the old id is refused, and the "Nats-Pin-Id mismatch"
            # form says not how much was left: count only what is held, pull again at once.
            self.reset_pending()
            return Unpinned(lost_pin, description)
        if kind is StatusKind.TOO_LARGE and self.max_bytes is not None:
            # The next message is larger than ``refused``: ask again only for more than that;
            # if even the whole max_bytes was refused, it can never be pulled with this limit.
            if refused >= self.max_bytes:
                return self._end(self._too_large(description))
            self.min_request = max(self.min_request, refused + 1)
            return PULL  # sent only if the buffer has room for more than that already
        if kind is StatusKind.RESET:
            # The consumer's leader moved: waiting requests are gone. Count only what is held
            # and ask the new leader at once (waiting for a heartbeat alarm would stall).
            self.reset_pending()
            return PULL
        if kind is StatusKind.WARNING:
            # The request was refused (Exceeded Max*): what it asked for will not come. Count
            # only what is held and ask again shortly (at once would be refused the same way).
            self.reset_pending()
            self.retry_at = now + WARNING_RETRY
            return Warn(code, description)
        if kind is StatusKind.NO_RESPONDERS:
            self.reset_pending()
            self._check_exists = True
            self.retry_at = now + NO_RESPONDERS_RETRY
            return Warn(code, description or "No Responders")
        return PULL

    def _fetch_status(self, kind: StatusKind, code: int, description: str) -> Decision:
        """A fetch: any status but a heartbeat ends its one request."""
        if kind is StatusKind.ERROR:
            return self._end(status_error(code, description))
        if kind is StatusKind.TOO_LARGE and self.max_bytes is not None and not self.buffered_msgs:
            # Nothing fitted the whole max_bytes: the next message never will, and returning
            # nothing would have the caller ask again in a loop.
            return self._end(self._too_large(description))
        if kind is StatusKind.NO_RESPONDERS:
            return self._end(NoRespondersError(self.subject))
        return self._end(None)

    def _too_large(self, description: str) -> MessageTooLarge:
        assert self.max_bytes is not None
        return MessageTooLarge(description, self.stream, self.consumer, self.max_bytes)

    def deadline(self, now: float) -> float:
        """When the driver must call :meth:`timer` at the latest (``math.inf``: never).

        A consume wakes at least every heartbeat interval: requests sent from the user's side
        change what is outstanding without telling the timer's task.
        """
        deadline = math.inf
        if self.refill and self.heartbeat is not None:
            deadline = now + self.heartbeat
        if self.pulling and self.outstanding():
            deadline = min(deadline, self.last_activity + self.alarm_after)
        if self.retry_at is not None:
            deadline = min(deadline, self.retry_at)
        return deadline

    def timer(self, now: float) -> Decision:
        """Time passed to ``now`` (the driver's deadline came): a retry or a heartbeat alarm."""
        if self.ended:
            return None
        if self.retry_at is not None and now >= self.retry_at:
            # Cleared here, not by pull(): while pulling is paused pull() returns early, and a
            # retry time left in the past would make the timer spin.
            self.retry_at = None
            if self._check_exists:
                self._check_exists = False
                return CHECK_CONSUMER
            return PULL
        # The same sum as deadline(), not ``now - last_activity >= alarm_after``: in floats the
        # two can disagree (1.05 + 1.0 == 2.05, but 2.05 - 1.05 < 1.0), and a driver woken at
        # its deadline would find nothing due, and wake again at once.
        if self.pulling and self.outstanding() and now >= self.last_activity + self.alarm_after:
            if not self.refill:
                return self._end(None)  # the request is lost: conclude the fetch
            self.reset_pending()
            return Alarm(now - self.last_activity)
        return None

    # -- the connection and the end -----------------------------------------------------------

    def reset_pending(self) -> None:
        """Forget outstanding requests: count only what is buffered (ADR-37 on reconnect)."""
        self.pending_msgs = self.buffered_msgs
        self.pending_bytes = self.buffered_bytes

    def pause(self) -> None:
        """Disconnected, draining or stopping: no requests, heartbeat alarm paused."""
        self.pulling = False

    def resume(self, now: float) -> Decision:
        """(Re)connected: the old requests are gone with the old connection; pull again."""
        if self.ended:
            return None
        self.pulling = True
        self.reset_pending()
        self.last_activity = now
        return PULL

    def fail(self, error: BaseException) -> Ended:
        """End with ``error`` (the first end counts: a later error is not raised instead)."""
        return self._end(error)

    def end(self) -> Ended:
        """End quietly (drained or closed), unless already ended."""
        return self._end(None)

    def _end(self, error: BaseException | None) -> Ended:
        if not self.ended:
            self.ended = True
            self.pulling = False
            self.error = error
        return Ended(self.error)
