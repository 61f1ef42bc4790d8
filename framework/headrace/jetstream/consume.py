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

Priority groups (ADR-42): with ``group`` set, every request names it (and ``min_pending``,
``min_ack_pending`` or ``priority``). On a ``pinned_client`` group the reader notes the
``Nats-Pin-Id`` of delivered messages; the flow sends it back as ``id`` in every later request
(a :class:`PinGained` event says so), and a 423 to a request carrying it means the pin moved
on: it is forgotten, the pending counts reset and the buffer pulls again without it, as a
standby (a :class:`PinLost` event). The server keeps a pin only while its holder pulls again
within ``priority_timeout``, and a waiting request does not count: an idle consume pulls
again only when its request expires, so ``expires`` must be shorter than the timeout
(checked when the consume starts).

Acks the server refuses (a user without permission to publish to ``$JS.ACK``) are reported by
the connection (:meth:`Connection.on_publish_denied`); the consume then ends at once with
:class:`AckRefused`, dropping what it buffered (those messages come back after ack_wait), since
every message it hands out would come back the same way.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

from headrace._trio import EventHub, EventWatcher
from headrace._validators import at_least_one_or_none
from headrace.actors.actor import Actor, ActorState
from headrace.errors import NatsError, PermissionViolation, SubscriptionClosedError
from headrace.jetstream.ack_reply import parse_ack_reply
from headrace.jetstream.errors import (
    AckRefused,
    ConsumerDeleted,
    ConsumerNotFound,
    InvalidAckReply,
    JetStreamError,
)
from headrace.jetstream.events import HeartbeatsMissed, PinGained, PinLost, PullWarning
from headrace.jetstream.message import WPI, JsMsg, wire_size
from headrace.jetstream.priority import PriorityPull, pin_id, priority_pull
from headrace.jetstream.pull_flow import (
    HEARTBEAT_ALARM_FACTOR,
    Alarm,
    CheckConsumer,
    Decision,
    Ended,
    Pull,
    PullFlow,
    Unpinned,
    Warn,
    default_heartbeat,
)
from headrace.jetstream.pull_status import pending_counts
from headrace.nats.events import (
    Connected,
    Disconnected,
    Reconnected,
    forward_until_closed,
)
from headrace.protocol.events import Msg

if TYPE_CHECKING:
    from headrace.jetstream.api import JetStreamAPI
    from headrace.jetstream.consumer_config import ConsumerInfo
    from headrace.jetstream.message import OutstandingAcks

DEFAULT_MAX_MESSAGES = 1000


@attrs.frozen(slots=True, kw_only=True)
class ConsumeOptions:
    """Buffer size and request settings of a consume (ADR-37 defaults).

    Give ``max_messages`` or ``max_bytes``, not both; with neither, ``max_messages`` is 1000.
    Thresholds default to half of the size and may not exceed it.

    On a consumer with priority groups (ADR-42), ``group`` names the group every request
    pulls from; ``min_pending`` and ``min_ack_pending`` (``overflow``: served only while the
    consumer has at least that many messages pending, or unacknowledged) and ``priority``
    (``prioritized``: 0 is served first, 9 last) go with it.
    """

    max_messages: int | None = attrs.field(default=None, validator=at_least_one_or_none)
    max_bytes: int | None = attrs.field(default=None, validator=at_least_one_or_none)
    expires: float = 30.0
    idle_heartbeat: float | None = None
    threshold_messages: int | None = None
    threshold_bytes: int | None = None
    #: Heartbeat alarm after this many idle_heartbeat intervals of silence (ADR-37: 2).
    heartbeat_alarm_factor: float = HEARTBEAT_ALARM_FACTOR
    group: str | None = None
    min_pending: int | None = None
    min_ack_pending: int | None = None
    priority: int | None = None
    #: nats.go's ``StopAfter``: the consume ends (iteration stops) once this many messages
    #: were handed out, and never asks the server for more. Messages mode only.
    stop_after: int | None = attrs.field(default=None, validator=at_least_one_or_none)

    def __attrs_post_init__(self) -> None:
        self.priority_pull  # noqa: B018 (validates the group and its settings now)
        if self.max_messages is not None and self.max_bytes is not None:
            raise ValueError("give max_messages or max_bytes, not both (ADR-37)")
        if self.stop_after is not None and self.max_bytes is not None:
            raise ValueError("stop_after counts messages: give it with max_messages, not max_bytes")
        # (At least MIN_EXPIRES, 1 s, as ADR-37 says, is checked when the consume starts: a
        # pinned_client consumer whose pin lasts 1 s or less needs a shorter one.)
        if not self.expires > 0:
            raise ValueError(f"expires must be a positive number of seconds, not {self.expires}")
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
    def priority_pull(self) -> PriorityPull | None:
        """What each request asks of the consumer's priority group, if a group is set."""
        return priority_pull(self.group, self.min_pending, self.min_ack_pending, self.priority)

    @property
    def buffer_messages(self) -> int:
        return self.max_messages if self.max_messages is not None else DEFAULT_MAX_MESSAGES

    @property
    def heartbeat(self) -> float:
        """idle_heartbeat, by default half of expires within [0.5 s, 30 s] (ADR-37)."""
        if self.idle_heartbeat is not None:
            return self.idle_heartbeat
        return default_heartbeat(self.expires)

    @property
    def threshold(self) -> int:
        """Pending count (messages, or bytes in bytes mode) at or below which to pull."""
        if self.max_bytes is not None:
            return self.threshold_bytes if self.threshold_bytes is not None else self.max_bytes // 2
        if self.threshold_messages is not None:
            return self.threshold_messages
        return self.buffer_messages // 2


ConsumeEvent = HeartbeatsMissed | PullWarning | PinGained | PinLost


@attrs.frozen(slots=True)
class _Retry:
    pass


_Control = Connected | Disconnected | Reconnected | _Retry


class PulledConsumer(Protocol):
    """What a consume buffer needs of the consumer it pulls from (a :class:`PullConsumer`).

    The buffer names this, not the class: the pull consumer makes buffers, so it imports this
    module, and naming it back would make the two import each other.
    """

    @property
    def js(self) -> JetStreamAPI: ...
    @property
    def stream(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def ack_none(self) -> bool: ...
    @property
    def tracker(self) -> OutstandingAcks | None:
        """Counts what was handed out and not yet acked, if a subscription's drain asked."""

    #: The pin id of its ``pinned_client`` group, kept between fetches and consumes.
    pin_id: str | None

    @property
    def _next_subject(self) -> str:
        """The subject of its pull requests (``CONSUMER.MSG.NEXT``, with the API prefix)."""

    async def info(self) -> ConsumerInfo:
        """Ask the server for the consumer's info (and so whether it still exists)."""


class ConsumeBuffer(Actor[_Control]):
    """The consume buffer actor of one :meth:`PullConsumer.consume` call (see module docs).

    A trio driver over a :class:`~headrace.jetstream.pull_flow.PullFlow`, which decides every
    request and reaction: this class holds the messages, the timers and the tasks.
    """

    def __init__(self, consumer: PulledConsumer, options: ConsumeOptions) -> None:
        super().__init__(f"consume-buffer:{consumer.stream}/{consumer.name}", inbox_size=256)
        self.consumer = consumer
        self.options = options
        self._nc = consumer.js.nc
        self._next_subject = consumer._next_subject
        self._flow = PullFlow(
            batch=options.buffer_messages,
            max_bytes=options.max_bytes,
            threshold=options.threshold,
            expires=options.expires,
            heartbeat=options.heartbeat,
            alarm_factor=options.heartbeat_alarm_factor,
            refill=True,
            stream=consumer.stream,
            consumer=consumer.name,
            subject=self._next_subject,
            priority=options.priority_pull,
            pin_id=consumer.pin_id,
            stop_after=options.stop_after,
        )
        self._grouped = self._flow.priority is not None
        self._ack_none = consumer.ack_none
        self.inbox_subject = self._nc.new_inbox()
        self._buf: deque[Msg] = deque()
        # When the buffered messages arrived, as [time, count] runs in buffer order: read by
        # keep_alive(), so messages waiting here for a slow reader are not redelivered.
        self._arrivals: deque[list[float]] = deque()
        #: When the oldest message of the last batch taken arrived (or was last kept alive by
        #: ``+WPI``): its ack_wait runs from then, not from when it was taken. (The pipeline's
        #: source port, ``headrace.pipeline.message_source``, reads it.)
        self.taken_since: float | None = 0.0
        self._getters = trio.lowlevel.ParkingLot()
        self._hub: EventHub[ConsumeEvent] = EventHub()
        self._sub: Any = None

    # -- the flow's counts, read by tests and benchmarks --------------------------------------

    @property
    def pending_msgs(self) -> int:
        """Messages requested and not yet taken by the user."""
        return self._flow.pending_msgs

    @property
    def pending_bytes(self) -> int:
        """Bytes requested and not yet taken by the user (bytes mode)."""
        return self._flow.pending_bytes

    @property
    def _buffered_bytes(self) -> int:
        return self._flow.buffered_bytes

    @property
    def requests_sent(self) -> int:
        return self._flow.requests_sent

    @property
    def _ended(self) -> bool:
        """No more messages will be added (stopped, drained or failed)."""
        return self._flow.ended

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
        flow = self._flow
        left = flow.left
        if left is not None:
            if left <= 0:
                # (What a lost request's late answer left here is not handed out: unacked, it
                # comes again after ack_wait.)
                raise SubscriptionClosedError(f"{self.name} has ended: stop_after reached")
            max_msgs = left if max_msgs is None else min(max_msgs, left)
        while not buf:
            if flow.ended:
                if flow.error is not None:
                    raise flow.error
                raise SubscriptionClosedError(f"{self.name} has ended")
            await self._getters.park()
        if max_msgs is None or max_msgs >= len(buf):
            taken = list(buf)
            buf.clear()
        else:
            taken = [buf.popleft() for _ in range(max_msgs)]
        self._forget_arrivals(len(taken))
        flow.taken(len(taken), sum(map(wire_size, taken)) if flow.max_bytes is not None else 0)
        if flow.ended and flow.left == 0:
            self._end()  # stop_after reached: the actor stops, the inbox goes
        elif self._pull():
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
        """Publish the pull request the flow asks for, if any; return whether one was sent."""
        nc = self._nc
        request = self._flow.pull(trio.current_time(), nc.is_connected)
        if request is None:
            return False
        nc.publish_nowait(self._next_subject, request.encode(), self.inbox_subject)
        return True

    def _act(self, decision: Decision) -> None:
        """Do what the flow decided (on a status, a reconnect or a heartbeat alarm)."""
        if isinstance(decision, Pull):
            self._pull()
        elif isinstance(decision, Warn):
            self._hub.emit(PullWarning(self.consumer.name, decision.status, decision.description))
            self.tell(_Retry())  # wake the control loop so it recomputes its deadline
        elif isinstance(decision, Alarm):
            self._hub.emit(HeartbeatsMissed(self.consumer.name, decision.silence))
            self._pull()
        elif isinstance(decision, Unpinned):
            self.consumer.pin_id = None
            group = self._flow.priority.group if self._flow.priority is not None else ""
            self._hub.emit(
                PinLost(self.consumer.name, group, decision.pin_id, decision.description)
            )
            self._pull()
        elif isinstance(decision, Ended):
            self._end()
        # CheckConsumer comes only from the control loop, which handles it itself.

    # -- the reader's side (runs in the connection's reader task: must not block) -------------

    def _on_batch(self, batch: list[Msg]) -> None:
        # One call into the flow per read (and one per status, which are rare); the loops count
        # what they append, the flow does the arithmetic.
        now = trio.current_time()
        flow = self._flow
        buf = self._buf
        before = counted = len(buf)
        nbytes = 0
        if flow.max_bytes is not None:
            for msg in batch:
                if msg.reply is not None:
                    buf.append(msg)
                    nbytes += wire_size(msg)
                else:
                    if self._grouped:
                        self._note_pin(counted)
                    flow.received(len(buf) - counted, nbytes, now)
                    counted, nbytes = len(buf), 0
                    self._on_status(msg, now)
        else:
            for msg in batch:
                if msg.reply is not None:
                    buf.append(msg)
                else:
                    if self._grouped:
                        self._note_pin(counted)
                    flow.received(len(buf) - counted, 0, now)
                    counted = len(buf)
                    self._on_status(msg, now)
        if self._grouped:
            self._note_pin(counted)
        flow.received(len(buf) - counted, nbytes, now)
        added = len(buf) - before
        if added:
            self._arrivals.append([now, added])
            self._getters.unpark_all()

    def _note_pin(self, start: int) -> None:
        """The newest ``Nats-Pin-Id`` among the messages buffered from ``start`` on, if any,
        goes to the flow (statuses are handled in order, so a 423 after them still wins)."""
        buf = self._buf
        for msg in itertools.islice(reversed(buf), len(buf) - start):
            found = pin_id(msg.raw_headers, msg.headers if msg.raw_headers else None)
            if found is not None:
                if self._flow.pinned(found):
                    self.consumer.pin_id = found
                    assert self._flow.priority is not None
                    self._hub.emit(PinGained(self.consumer.name, self._flow.priority.group, found))
                return

    def _on_status(self, msg: Msg, now: float) -> None:
        status = msg.status
        if status is None:
            return  # neither a JetStream message nor a status: not ours to judge, drop it
        gone_msgs, gone_bytes = pending_counts(msg)
        self._act(self._flow.status(status, msg.description, gone_msgs, gone_bytes, now))

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
        self._flow.dropped()
        self._fail(error)

    def _fail(self, error: BaseException) -> None:
        self._flow.fail(error)
        self._end()

    def _end(self) -> None:
        self._flow.end()
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
                        self._flow.pause()
                    await self._control_loop()
                    nursery.cancel_scope.cancel()
        finally:
            stop_watching()
            if not self._sub.is_closed and not nc.is_closed:
                await self._sub.unsubscribe()

    @trio.lowlevel.enable_ki_protection  # a Ctrl-C goes to the app (shutdown.py)
    async def _forward(self, connection_events: EventWatcher[Any]) -> None:
        await forward_until_closed(connection_events, self.send)
        # The connection is closed for good (its events end with it): so is this consume.
        if not self._flow.ended:
            self._fail(self._nc._closed_error())

    async def _control_loop(self) -> None:
        inbox = self.inbox
        flow = self._flow
        while not flow.ended:
            with trio.move_on_at(flow.deadline(trio.current_time())):
                self._on_control(await inbox.receive())
                continue
            decision = flow.timer(trio.current_time())
            if isinstance(decision, CheckConsumer):
                if await self._consumer_gone():
                    return
                self._pull()
            else:
                self._act(decision)

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
            self._flow.pause()  # heartbeat timer paused, no requests
        elif isinstance(message, Connected | Reconnected) and self.state is not ActorState.DRAINING:
            self._act(self._flow.resume(trio.current_time()))
        # _Retry only wakes the loop, which recomputes its deadline.

    # -- stopping -----------------------------------------------------------------------------

    async def drain(self, timeout: float | None = None) -> None:
        """Stop requesting; let what the server already sent arrive; iteration then ends once
        the buffered messages have been read (ADR-37 drain)."""
        self.state = ActorState.DRAINING
        self._flow.pause()
        sub = self._sub
        try:
            if sub is not None and not sub.is_closed:
                await sub.drain(timeout)
        finally:
            self._end()  # whatever happened, iteration ends after what is buffered

    def close(self) -> None:
        """Stop at once: no more requests or messages; buffered messages can still be read."""
        self._flow.pause()
        self._end()
        self.stop()
