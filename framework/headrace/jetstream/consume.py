"""``consume()``: the consume buffer actor (ADR-37 "Consume specification").

The buffer keeps up to ``max_messages`` (or ``max_bytes``) messages requested from the server
and not yet taken by the user. It counts what is *pending*: asked for and not yet taken. Each
time the user takes messages and the pending count falls to the threshold, it publishes one pull
request for exactly what is missing. So memory is bounded by the buffer size, and a slow reader
simply stops the requests: backpressure reaches the server without anything being dropped.

Data and control are split. Messages go straight from the connection's reader into the buffer
(one call per socket read, no task switch per message). The actor's own task handles what takes
time: connection events (pause on disconnect; on reconnect reset the pending counts and pull
again, without checking consumer info, ADR-37 rev 2), the heartbeat timer, and retries after a
503. Its inbox carries those control messages.

Heartbeats: every pull request asks for ``idle_heartbeat``; an alarm is raised after twice that
without any message from the server (ADR-37; push consumers use 3x, ADR-15). The timer runs
only while requested messages are outstanding on the server: when everything asked for has
arrived and waits for the user, the server owes us nothing and silence is not an alarm. An alarm
is not terminal: it is reported as an event, the pending counts are reset and a new request is
sent, which is how a consume survives a consumer leader change that lost its waiting requests.

Statuses (ADR-37): 100 is a heartbeat; 404, 408, 423 and 409 Batch Completed end a request
quietly; the ``Exceeded Max*`` 409s and 409 Server Shutdown are reported as warnings and the
next request waits a quarter second (the server would refuse it the same way at once); 409
Consumer Deleted, 409 Consumer is push based, 400, and any status or 409 this module does not
know (ADR-15 "Unknown Error Statuses") end the consume with a typed error after the buffered
messages are read. A 503 (nothing serves the pull API, as while a server restarts) is reported
and the pull retried after a delay, so a consume never stalls on it. Every terminating status
with ``Nats-Pending-Messages`` / ``Nats-Pending-Bytes`` headers reduces the pending counts by
them.

409 Message Size Exceeds MaxBytes (bytes mode) says the next message is larger than what the
request had left. Asking again for that much or less would be refused at once: that loop sent
thousands of requests a second, without a message or an error. So the next request waits until the
buffer can ask for more than was refused; and a request for the whole of ``max_bytes`` refused
so means the message can never be pulled with this limit: the consume ends with
:class:`MessageTooLarge`.

Acks the server refuses (a user without permission to publish to ``$JS.ACK``) are reported by
the connection (:meth:`Connection.on_publish_denied`); the consume then ends at once with
:class:`AckRefused`, dropping what it buffered (those messages come back after ack_wait), since
every message it hands out would come back the same way.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from typing import TYPE_CHECKING, Any

import attrs
import trio

from headrace.actors.actor import Actor, ActorState
from headrace.errors import NatsError, PermissionViolation, SubscriptionClosedError
from headrace.jetstream.ack_reply import parse_ack_reply
from headrace.jetstream.errors import (
    AckRefused,
    ConsumerDeleted,
    ConsumerNotFound,
    InvalidAckReply,
    JetStreamError,
    MessageTooLarge,
)
from headrace.jetstream.events import HeartbeatsMissed, PullWarning
from headrace.jetstream.message import WPI, JsMsg, wire_size
from headrace.jetstream.pull_request import BYTES_MODE_BATCH, PullRequest
from headrace.jetstream.pull_status import StatusKind, classify, pending_counts, status_error
from headrace.nats.events import (
    Closed,
    Connected,
    Disconnected,
    EventHub,
    EventWatcher,
    Reconnected,
)
from headrace.protocol.events import Msg

if TYPE_CHECKING:
    from headrace.jetstream.pull_consumer import PullConsumer

DEFAULT_MAX_MESSAGES = 1000
NO_RESPONDERS_RETRY = 1.0
#: Pause before pulling again after a warning status: the server answers the next request the
#: same way at once (409 Exceeded MaxWaiting, say), so re-pulling at once would spin.
WARNING_RETRY = 0.25


def _positive_int(_inst: object, attr: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{attr.name} must be at least 1, not {value}")


@attrs.frozen(slots=True, kw_only=True)
class ConsumeOptions:
    """Buffer size and request settings of a consume (ADR-37 defaults).

    Give ``max_messages`` or ``max_bytes``, not both; with neither, ``max_messages`` is 1000.
    Thresholds default to half of the size and may not exceed it.
    """

    max_messages: int | None = attrs.field(default=None, validator=_positive_int)
    max_bytes: int | None = attrs.field(default=None, validator=_positive_int)
    expires: float = 30.0
    idle_heartbeat: float | None = None
    threshold_messages: int | None = None
    threshold_bytes: int | None = None
    #: Heartbeat alarm after this many idle_heartbeat intervals of silence (ADR-37: 2).
    heartbeat_alarm_factor: float = 2.0

    def __attrs_post_init__(self) -> None:
        if self.max_messages is not None and self.max_bytes is not None:
            raise ValueError("give max_messages or max_bytes, not both (ADR-37)")
        if self.expires < 1:
            raise ValueError(f"expires must be at least 1 second, not {self.expires}")
        hb = self.heartbeat
        if hb > self.expires / 2:
            raise ValueError(f"idle_heartbeat ({hb}s) must be at most half of expires")
        if self.heartbeat_alarm_factor < 1:
            raise ValueError("heartbeat_alarm_factor must be at least 1")
        if self.threshold_messages is not None:
            if self.max_bytes is not None:
                raise ValueError("threshold_messages goes with max_messages, not max_bytes")
            if not 0 <= self.threshold_messages <= self.buffer_messages:
                raise ValueError("threshold_messages must be between 0 and max_messages")
        if self.threshold_bytes is not None:
            if self.max_bytes is None:
                raise ValueError("threshold_bytes needs max_bytes")
            if not 0 <= self.threshold_bytes <= self.max_bytes:
                raise ValueError("threshold_bytes must be between 0 and max_bytes")

    @property
    def bytes_mode(self) -> bool:
        return self.max_bytes is not None

    @property
    def buffer_messages(self) -> int:
        return self.max_messages if self.max_messages is not None else DEFAULT_MAX_MESSAGES

    @property
    def heartbeat(self) -> float:
        """idle_heartbeat, by default half of expires within [0.5 s, 30 s] (ADR-37)."""
        if self.idle_heartbeat is not None:
            return self.idle_heartbeat
        return min(max(self.expires / 2, 0.5), 30.0)

    @property
    def threshold(self) -> int:
        """Pending count (messages, or bytes in bytes mode) at or below which to pull."""
        if self.max_bytes is not None:
            return self.threshold_bytes if self.threshold_bytes is not None else self.max_bytes // 2
        if self.threshold_messages is not None:
            return self.threshold_messages
        return self.buffer_messages // 2


ConsumeEvent = HeartbeatsMissed | PullWarning


@attrs.frozen(slots=True)
class _Retry:
    pass


_Control = Connected | Disconnected | Reconnected | _Retry


class ConsumeBuffer(Actor[_Control]):
    """The consume buffer actor of one :meth:`PullConsumer.consume` call (see module docs)."""

    def __init__(self, consumer: PullConsumer, options: ConsumeOptions) -> None:
        super().__init__(f"consume-buffer:{consumer.stream}/{consumer.name}", inbox_size=256)
        self.consumer = consumer
        self.options = options
        self._nc = consumer.js.nc
        self._next_subject = consumer.js.api_subject(
            f"CONSUMER.MSG.NEXT.{consumer.stream}.{consumer.name}"
        )
        self._ack_none = consumer.ack_none
        self.inbox_subject = self._nc.new_inbox()
        self._buf: deque[Msg] = deque()
        # When the buffered messages arrived, as [time, count] runs in buffer order: read by
        # keep_alive(), so messages waiting here for a slow reader are not redelivered.
        self._arrivals: deque[list[float]] = deque()
        #: When the oldest message of the last batch taken arrived (or was last kept alive by
        #: ``+WPI``): its ack_wait runs from then, not from when it was taken.
        self.taken_since = 0.0
        self._buffered_bytes = 0
        #: Messages (or bytes) requested and not yet taken by the user.
        self.pending_msgs = 0
        self.pending_bytes = 0
        self._getters = trio.lowlevel.ParkingLot()
        self._error: BaseException | None = None
        self._ended = False  # no more messages will be added
        self._pulling = True  # False while disconnected, draining or stopped
        self._last_activity = 0.0
        self._retry_at: float | None = None  # after a 503 or a warning: no request before
        self._check_exists = False  # after a 503: does the consumer still exist?
        self._hub: EventHub[ConsumeEvent] = EventHub()
        self._sub: Any = None
        self.requests_sent = 0
        #: Bytes mode: the smallest request worth sending, after a 409 Message Size Exceeds
        #: MaxBytes said the next message is larger than what was asked (0: no such bound).
        self._min_request = 0

    # -- the user's side ----------------------------------------------------------------------

    def events(self, buffer: int = 256) -> EventWatcher[ConsumeEvent]:
        """Watch heartbeat alarms and pull warnings."""
        return self._hub.watch(buffer)

    @property
    def buffered(self) -> int:
        """Messages received and not yet taken."""
        return len(self._buf)

    def __aiter__(self) -> ConsumeBuffer:
        return self

    async def __anext__(self) -> JsMsg:
        try:
            batch = await self._take(1)
        except SubscriptionClosedError:
            raise StopAsyncIteration from None
        return batch[0]

    async def next_batch(self, max_msgs: int | None = None) -> list[JsMsg]:
        """Every buffered message (up to ``max_msgs``), waiting for at least one.

        Raises the error that ended the consume, or :class:`SubscriptionClosedError` once it
        was stopped or drained and nothing is left.
        """
        return await self._take(max_msgs)

    async def _take(self, max_msgs: int | None) -> list[JsMsg]:
        if max_msgs is not None and max_msgs < 1:
            raise ValueError(f"max_msgs must be at least 1, not {max_msgs}")
        buf = self._buf
        while not buf:
            if self._ended:
                if self._error is not None:
                    raise self._error
                raise SubscriptionClosedError(f"{self.name} has ended")
            await self._getters.park()
        if max_msgs is None or max_msgs >= len(buf):
            taken = list(buf)
            buf.clear()
        else:
            taken = [buf.popleft() for _ in range(max_msgs)]
        self._forget_arrivals(len(taken))
        if self.options.bytes_mode:
            size = sum(map(wire_size, taken))
            self._buffered_bytes -= size
            self.pending_bytes -= size
        else:
            self.pending_msgs -= len(taken)
        if self._pull():
            # Let the writer send the request now: otherwise it waits in the outbound buffer
            # until this task next yields, after the user has processed the whole batch, and
            # the next take waits for the network. Shielded: the batch is already taken.
            await trio.lowlevel.cancel_shielded_checkpoint()
        nc, ack_none, tracker = self._nc, self._ack_none, self.consumer.tracker
        if tracker is not None and not ack_none:
            tracker.delivered(len(taken))
        return [JsMsg(m, nc, ack_none, tracker) for m in taken]

    def keep_alive(self, arrived_before: float) -> int:
        """Send ``+WPI`` for buffered messages that arrived before ``arrived_before`` (a
        ``trio.current_time()``), and count them as arrived now; return how many.

        A reader slower than the server (a pipeline waiting for room) leaves messages here, and
        their ack_wait runs from delivery: without this they would be redelivered while waiting.
        """
        if self._ack_none:
            return 0
        now = trio.current_time()
        publish = self._nc.publish_nowait
        sent = 0
        position = 0
        for run in self._arrivals:
            arrived, count = run
            if arrived < arrived_before:
                for msg in itertools.islice(self._buf, position, position + int(count)):
                    assert msg.reply is not None
                    publish(msg.reply, WPI)
                    sent += 1
                run[0] = now
            position += int(count)
        return sent

    def _forget_arrivals(self, taken: int) -> None:
        arrivals = self._arrivals
        since = math.inf
        while taken and arrivals:
            run = arrivals[0]
            since = min(since, run[0])
            if run[1] <= taken:
                taken -= int(run[1])
                arrivals.popleft()
            else:
                run[1] -= taken
                taken = 0
        self.taken_since = since if since != math.inf else trio.current_time()

    # -- requests -----------------------------------------------------------------------------

    def _pull(self) -> bool:
        """Publish a pull request for what is missing, if the threshold has been reached;
        return whether one was sent."""
        if not self._pulling or self._ended or not self._nc.is_connected:
            # (is_connected too: the Disconnected event reaches this actor a moment late, and a
            # request queued meanwhile would go out next to the reconnect's own.)
            return False
        if self._retry_at is not None:
            if trio.current_time() < self._retry_at:
                return False
            self._retry_at = None
        opts = self.options
        # Whether the server owed us anything before this request: if not, the heartbeat
        # clock starts with it (taken before the pending counts grow, or it is always true).
        owed = self._outstanding()
        if opts.bytes_mode:
            assert opts.max_bytes is not None
            if self.pending_bytes > opts.threshold:
                return False
            want = opts.max_bytes - self.pending_bytes
            if want <= 0 or want < self._min_request:
                return False
            request = PullRequest(
                batch=BYTES_MODE_BATCH,
                max_bytes=want,
                expires=opts.expires,
                idle_heartbeat=opts.heartbeat,
            )
            self.pending_bytes += want
        else:
            if self.pending_msgs > opts.threshold:
                return False
            want = opts.buffer_messages - self.pending_msgs
            if want <= 0:
                return False
            request = PullRequest(batch=want, expires=opts.expires, idle_heartbeat=opts.heartbeat)
            self.pending_msgs += want
        if not owed:
            self._last_activity = trio.current_time()
        self._nc.publish_nowait(self._next_subject, request.encode(), self.inbox_subject)
        self.requests_sent += 1
        return True

    def _outstanding(self) -> bool:
        """Whether the server still owes us messages (the heartbeat timer runs only then)."""
        if self.options.bytes_mode:
            return self.pending_bytes > self._buffered_bytes
        return self.pending_msgs > len(self._buf)

    def _reset_pending(self) -> None:
        """Forget outstanding requests: count only what is buffered (ADR-37 on reconnect)."""
        self.pending_msgs = len(self._buf)
        self.pending_bytes = self._buffered_bytes

    # -- the reader's side (runs in the connection's reader task: must not block) -------------

    def _on_batch(self, batch: list[Msg]) -> None:
        now = self._last_activity = trio.current_time()
        buf = self._buf
        before = len(buf)
        if self.options.bytes_mode:
            for msg in batch:
                if msg.reply is not None:
                    buf.append(msg)
                    self._buffered_bytes += wire_size(msg)
                    self._min_request = 0  # the head of the consumer moved
                else:
                    self._on_status(msg)
        else:
            for msg in batch:
                if msg.reply is not None:
                    buf.append(msg)
                else:
                    self._on_status(msg)
        added = len(buf) - before
        if added:
            self._arrivals.append([now, added])
            self._getters.unpark_all()

    def _on_status(self, msg: Msg) -> None:
        status = msg.status
        if status is None:
            return  # neither a JetStream message nor a status: not ours to judge, drop it
        description = msg.description
        kind = classify(status, description)
        if kind is StatusKind.HEARTBEAT:
            return
        gone_msgs, gone_bytes = pending_counts(msg)
        # What the request had left: the header, or (older servers) all that was outstanding.
        refused = gone_bytes or self.pending_bytes - self._buffered_bytes
        self.pending_msgs = max(self.pending_msgs - gone_msgs, len(self._buf))
        self.pending_bytes = max(self.pending_bytes - gone_bytes, self._buffered_bytes)
        if kind is StatusKind.ERROR:
            self._fail(status_error(status, description))
            return
        if kind is StatusKind.TOO_LARGE and self.options.bytes_mode:
            self._too_large(description, refused)
            return
        if kind is StatusKind.RESET:
            # The consumer's leader moved: waiting requests are gone. Count only what we hold
            # and ask the new leader at once (waiting for a heartbeat alarm would stall).
            self._reset_pending()
            self._pull()
            return
        if kind is StatusKind.WARNING:
            # The request was refused (Exceeded Max*): what it asked for will not come. Count
            # only what is held and ask again shortly (at once would be refused the same way).
            self._hub.emit(PullWarning(self.consumer.name, status, description))
            self._reset_pending()
            self._retry_later(WARNING_RETRY)
            return
        if kind is StatusKind.NO_RESPONDERS:
            self._hub.emit(PullWarning(self.consumer.name, status, description or "No Responders"))
            self._reset_pending()
            self._check_exists = True
            self._retry_later(NO_RESPONDERS_RETRY)
            return
        self._pull()

    def _too_large(self, description: str, refused: int) -> None:
        """The next message is larger than ``refused``, the bytes its request had left: ask
        again only for more than that, and end the consume if even ``max_bytes`` is not more
        (see the module docs)."""
        max_bytes = self.options.max_bytes
        assert max_bytes is not None
        if refused >= max_bytes:
            consumer = self.consumer
            self._fail(MessageTooLarge(description, consumer.stream, consumer.name, max_bytes))
            return
        self._min_request = max(self._min_request, refused + 1)
        self._pull()  # sent only if the buffer has room for more than that already

    def _on_publish_denied(self, violation: PermissionViolation) -> None:
        """The server refused a ``$JS.ACK`` publish: if it is this consumer's, end now."""
        try:
            meta = parse_ack_reply(violation.subject)
        except InvalidAckReply:
            return
        consumer = self.consumer
        if meta.stream != consumer.stream or meta.consumer != consumer.name:
            return
        error = AckRefused(consumer.stream, consumer.name, violation.subject)
        error.__cause__ = violation
        # Nothing more is handed out: its acks would be refused too, and it would come back.
        self._buf.clear()
        self._arrivals.clear()
        self._buffered_bytes = 0
        self._fail(error)

    def _retry_later(self, delay: float) -> None:
        """No request before ``delay`` seconds from now; the control loop pulls then."""
        self._retry_at = trio.current_time() + delay
        self.tell(_Retry())  # wake the control loop so it recomputes its deadline

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._end()

    def _end(self) -> None:
        self._pulling = False
        self._ended = True
        self._getters.unpark_all()
        self._hub.close()
        self.tell(_Retry())  # wake the control loop, so the actor stops now

    # -- the actor's task ---------------------------------------------------------------------

    async def run(self) -> None:
        nc = self._nc
        self._sub = nc.subscribe_nowait(self.inbox_subject, handler=self._on_batch)
        stop_watching = nc.on_publish_denied("$JS.ACK.", self._on_publish_denied)
        try:
            with nc.events() as connection_events:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._forward, connection_events)
                    if nc.is_connected:
                        self._pull()
                    else:
                        self._pulling = False
                    await self._control_loop()
                    nursery.cancel_scope.cancel()
        finally:
            stop_watching()
            if not self._sub.is_closed and not nc.is_closed:
                await self._sub.unsubscribe()

    @trio.lowlevel.enable_ki_protection  # a Ctrl-C goes to the app (shutdown.py)
    async def _forward(self, connection_events: EventWatcher[Any]) -> None:
        async for event in connection_events:
            if isinstance(event, Connected | Disconnected | Reconnected):
                await self.send(event)
            elif isinstance(event, Closed):
                break
        # The connection is closed for good (its events end with it): so is this consume.
        if not self._ended:
            self._fail(self._nc._closed_error())

    async def _control_loop(self) -> None:
        inbox = self.inbox
        hb = self.options.heartbeat
        alarm_after = hb * self.options.heartbeat_alarm_factor
        while not self._ended:
            # Wake at least every heartbeat interval: requests sent from the user's task change
            # what is outstanding without telling this loop.
            deadline = trio.current_time() + hb
            if self._pulling and self._outstanding():
                deadline = min(deadline, self._last_activity + alarm_after)
            if self._retry_at is not None:
                deadline = min(deadline, self._retry_at)
            with trio.move_on_at(deadline):
                self._on_control(await inbox.receive())
                continue
            now = trio.current_time()
            if self._retry_at is not None and now >= self._retry_at:
                # Cleared here, not by _pull: while pulling is paused _pull returns early, and
                # a retry time left in the past would make this loop spin.
                self._retry_at = None
                if self._check_exists:
                    self._check_exists = False
                    if await self._consumer_gone():
                        return
                self._pull()
            elif self._pulling and self._outstanding() and now - self._last_activity >= alarm_after:
                self._hub.emit(HeartbeatsMissed(self.consumer.name, now - self._last_activity))
                self._reset_pending()
                self._pull()

    async def _consumer_gone(self) -> bool:
        """After a 503: a deleted consumer gets no responder for its pull requests either, and
        retrying would wait forever. Ask; end the consume if it is gone. Anything else (no
        JetStream yet, a timeout) means: keep retrying."""
        try:
            await self.consumer.info()
        except ConsumerNotFound as exc:
            self._fail(
                ConsumerDeleted(
                    404,
                    exc.description,
                    f"consumer {self.consumer.name!r} on stream {self.consumer.stream!r} no "
                    "longer exists",
                )
            )
            return True
        except (JetStreamError, NatsError):
            pass
        return False

    def _on_control(self, message: _Control) -> None:
        if isinstance(message, Disconnected):
            self._pulling = False  # heartbeat timer paused, no requests
        elif isinstance(message, Connected | Reconnected) and self.state is not ActorState.DRAINING:
            self._pulling = True
            self._reset_pending()
            self._last_activity = trio.current_time()
            self._pull()
        # _Retry only wakes the loop, which recomputes its deadline.

    # -- stopping -----------------------------------------------------------------------------

    async def drain(self, timeout: float | None = None) -> None:
        """Stop requesting; let what the server already sent arrive; iteration then ends once
        the buffered messages have been read (ADR-37 drain)."""
        self.state = ActorState.DRAINING
        self._pulling = False
        sub = self._sub
        try:
            if sub is not None and not sub.is_closed:
                await sub.drain(timeout)
        finally:
            self._end()  # whatever happened, iteration ends after what is buffered

    def close(self) -> None:
        """Stop at once: no more requests or messages; buffered messages can still be read."""
        self._pulling = False
        self._end()
        self.stop()
