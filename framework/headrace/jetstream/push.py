"""Push subscriptions with automatic status management (ADR-15 "Automatic Status Management").

The server pushes a push consumer's messages to its deliver subject. A push subscription reads
them and hides the statuses: it hands the user only JetStream messages, while its actors deal
with the rest:

- the heartbeat monitor raises an alarm after 3x ``idle_heartbeat`` of silence;
- the flow-control responder answers each flow-control request, and the stalled-consumer
  header of heartbeats, at the point the request is reached in the message order;
- the gap detector checks that consumer sequences follow one another (not for queue groups);
- the consumer lifecycle deletes what this subscription created, by the rule in
  :mod:`headrace.jetstream.lifecycle`.

Arrivals are stamped for the heartbeat monitor by the connection's reader, once per socket read,
and buffered (bounded; a full buffer drops and reports, as a core subscription does: the server
redelivers what is not acked). Statuses other than 100 on a push subscription are errors
(ADR-15 "Miscellaneous Error Statuses") and are raised from iteration.

Acks the server refuses (no permission to publish to ``$JS.ACK``) end the subscription at once
with :class:`AckRefused`: the connection reports each refused publish
(:meth:`Connection.on_publish_denied`), and without this every message would be redelivered
after ack_wait, for ever, with nothing said.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import trio

from headrace._trio import EventHub, EventWatcher
from headrace.actors.actor import Actor
from headrace.errors import PermissionViolation, SubscriptionClosedError
from headrace.jetstream.ack_reply import parse_ack_reply
from headrace.jetstream.consumer_config import AckPolicy, ConsumerInfo
from headrace.jetstream.errors import AckRefused, InvalidAckReply, PushStatusError
from headrace.jetstream.events import JetStreamEvent, MessagesDropped
from headrace.jetstream.flow_control import FlowControlRequest, FlowControlResponder
from headrace.jetstream.gaps import GapDetector, HeartbeatSeen, Observed
from headrace.jetstream.heartbeat import ALARM_FACTOR, HeartbeatMonitor
from headrace.jetstream.lifecycle import ConsumerLifecycle, DeletePolicy
from headrace.jetstream.message import JsMsg, OutstandingAcks
from headrace.nats.delivery import DeliveryQueue, SlowConsumerPolicy
from headrace.nats.events import forward_until_closed
from headrace.protocol.events import Msg

if TYPE_CHECKING:
    from headrace.jetstream.api import JetStreamAPI
    from headrace.nats.subscription import BatchHandler, Subscription

ACK_PREFIX = "$JS.ACK."
DEFAULT_PENDING_MSGS = 64 * 1024
DEFAULT_PENDING_BYTES = 64 * 1024 * 1024


class Inlet:
    """Holds the batches of a NATS subscription made before its consumer exists (ADR-15), until
    the push subscription is built and takes over."""

    def __init__(self) -> None:
        self._held: list[list[Msg]] = []
        self._target: BatchHandler | None = None

    def __call__(self, batch: list[Msg]) -> None:
        if self._target is not None:
            self._target(batch)
        else:
            self._held.append(batch)

    def connect(self, target: BatchHandler) -> None:
        self._target = target
        held, self._held = self._held, []
        for batch in held:
            target(batch)


class PushSubscription:
    """A subscription to a push consumer; iterate it for :class:`JsMsg` messages.

    Made by :meth:`JetStream.subscribe`, which runs ADR-15's workflow and starts the actors in
    the nursery of its ``async with`` block.
    """

    def __init__(
        self,
        js: JetStreamAPI,
        stream: str,
        info: ConsumerInfo,
        *,
        queue: str | None,
        created: bool,
        delete_policy: DeletePolicy = DeletePolicy.AUTO,
        heartbeat_factor: float = ALARM_FACTOR,
        max_pending_msgs: int = DEFAULT_PENDING_MSGS,
        max_pending_bytes: int = DEFAULT_PENDING_BYTES,
    ) -> None:
        self.js = js
        self.stream = stream
        self.info = info
        self.queue = queue
        self.created = created
        self._nc = js.nc
        config = info.config
        self.consumer = info.name
        self._ack_none = config.ack_policy is AckPolicy.NONE
        # Tracked only for explicit acks: with ack policy "all" one ack settles many messages,
        # so counting would make a drain wait out its timeout.
        self._acks = (
            OutstandingAcks()
            if config.ack_policy is AckPolicy.EXPLICIT or (config.ack_policy is None)
            else None
        )
        self._pending_error: BaseException | None = None
        self._refused: AckRefused | None = None
        self._hub: EventHub[JetStreamEvent] = EventHub()
        self._queue = DeliveryQueue(max_pending_msgs, max_pending_bytes, SlowConsumerPolicy.DROP)
        self._sub: Subscription | None = None
        self._reported_drop = False
        self.heartbeat: HeartbeatMonitor | None = None
        if config.idle_heartbeat:
            self.heartbeat = HeartbeatMonitor(
                self._nc, self.consumer, config.idle_heartbeat, self._hub, factor=heartbeat_factor
            )
        self.flow_control: FlowControlResponder | None = None
        if config.flow_control or config.idle_heartbeat:
            # Stalled-consumer headers arrive on heartbeats even without flow control requests.
            self.flow_control = FlowControlResponder(self._nc, self.consumer, self._hub)
        self.gaps: GapDetector | None = None
        if queue is None:
            self.gaps = GapDetector(
                self.consumer, self._hub, last_consumer=info.delivered.consumer_seq
            )
        self.lifecycle = ConsumerLifecycle(
            js,
            stream,
            self.consumer,
            created=created,
            durable=bool(config.durable_name),
            queue=queue,
            pull=False,
            policy=delete_policy,
            hub=self._hub,
            stop_delivery=self._stop_delivery,
            acks=self._acks,
        )

    def __repr__(self) -> str:
        return f"<PushSubscription {self.stream}/{self.consumer}>"

    @property
    def actors(self) -> list[Actor[object]]:
        """The actors of this subscription, by name (for listings and health)."""
        found: list[object] = [self.heartbeat, self.flow_control, self.gaps, self.lifecycle]
        return [a for a in found if isinstance(a, Actor)]

    def events(self, buffer: int = 256) -> EventWatcher[JetStreamEvent]:
        return self._hub.watch(buffer)

    # -- wiring -------------------------------------------------------------------------------

    def _attach(self, sub: Subscription, inlet: Inlet) -> None:
        """Take over the NATS subscription on the deliver subject (made before the consumer,
        ADR-15): what the inlet held, and from now on every batch, comes here."""
        self._sub = sub
        inlet.connect(self._on_batch)

    async def _start(self, nursery: trio.Nursery) -> None:
        for actor in self.actors:
            await actor.start(nursery)
        nursery.start_soon(self._end_with_connection)

    async def _end_with_connection(self) -> None:
        """When the connection closes for good, nothing more will arrive: iteration and
        ``next_msg`` raise :class:`~headrace.errors.ConnectionClosedError` after what is
        buffered (its cause the connection's last error, if it did not close as asked), as a
        pull consume does. Iteration used to just end when the application closed the
        connection, and ``next_msg`` to raise a bare ``SubscriptionClosedError`` (issue 24):
        an end that looked like a drain. A subscription drained or unsubscribed first ends
        as before. Meanwhile refused acks are watched for (this task lives as long as the
        subscription)."""
        stop_watching = self._nc.on_publish_denied(ACK_PREFIX, self._on_publish_denied)
        try:
            with self._nc.events() as events:
                await forward_until_closed(events)
        finally:
            stop_watching()
        self._queue.close(self._nc._closed_error())

    def _on_publish_denied(self, violation: PermissionViolation) -> None:
        """The server refused a ``$JS.ACK`` publish: if it is this consumer's, end now, dropping
        what is buffered (it would be refused the same way, and comes back after ack_wait)."""
        try:
            meta = parse_ack_reply(violation.subject)
        except InvalidAckReply:
            return
        if meta.stream != self.stream or meta.consumer != self.consumer or self._refused:
            return
        error = AckRefused(self.stream, self.consumer, violation.subject)
        error.__cause__ = violation
        self._refused = error
        self._queue.discard()
        self._queue.close(error)

    def _on_batch(self, batch: list[Msg]) -> None:
        """Runs in the connection's reader: stamp, buffer, never block."""
        if self.heartbeat is not None:
            self.heartbeat.activity()
        dropped = self._queue.put_nowait(batch)
        if dropped and not self._reported_drop:
            self._reported_drop = True
            self._hub.emit(MessagesDropped(self.consumer, dropped))
        elif not dropped:
            self._reported_drop = False

    # -- reading ------------------------------------------------------------------------------

    def __aiter__(self) -> PushSubscription:
        return self

    async def __anext__(self) -> JsMsg:
        try:
            return (await self._take(1))[0]
        except SubscriptionClosedError:
            raise StopAsyncIteration from None

    async def next_msg(self, timeout: float | None = None) -> JsMsg:
        with trio.fail_after(math.inf if timeout is None else timeout):
            return (await self._take(1))[0]

    async def next_batch(self, max_msgs: int | None = None) -> list[JsMsg]:
        return await self._take(max_msgs)

    def _before_take(self, max_msgs: int | None) -> None:
        if max_msgs is not None and max_msgs < 1:
            raise ValueError(f"max_msgs must be at least 1, not {max_msgs}")
        if self._refused is not None:
            raise self._refused
        if self._pending_error is not None:
            error, self._pending_error = self._pending_error, None
            raise error

    async def _take(self, max_msgs: int | None) -> list[JsMsg]:
        self._before_take(max_msgs)
        nc, ack_none, tracker = self._nc, self._ack_none, self._acks
        while True:
            try:
                batch = await self._queue.get_batch(max_msgs)
            except trio.EndOfChannel:
                if self._refused is not None:
                    raise self._refused  # noqa: B904 - its cause is the PermissionViolation
                raise SubscriptionClosedError(f"{self!r} has ended") from None
            if self._refused is not None:
                raise self._refused
            out: list[JsMsg] = []
            seqs: list[tuple[int, int]] | None = [] if self.gaps is not None else None
            for msg in batch:
                reply = msg.reply
                if reply is not None and reply.startswith(ACK_PREFIX):
                    jm = JsMsg(msg, nc, ack_none, tracker)
                    out.append(jm)
                    if seqs is not None:
                        meta = jm.metadata
                        seqs.append((meta.consumer_seq, meta.stream_seq))
                    continue
                if seqs:
                    # What came before this status is observed first: a heartbeat's
                    # Nats-Last-Consumer counts the messages ahead of it in this batch.
                    self._observe(Observed(seqs))
                    seqs = []
                try:
                    self._on_status(msg)
                except PushStatusError as exc:
                    if not out:
                        raise
                    # Hand out what came first; the error is raised by the next call.
                    self._pending_error = exc
                    break
            if seqs:
                self._observe(Observed(seqs))
            if out:
                if tracker is not None:
                    tracker.delivered(len(out))
                return out

    def _observe(self, observation: Observed | HeartbeatSeen) -> None:
        gaps = self.gaps
        if gaps is not None and not gaps.tell(observation):
            gaps.observe(observation)  # inbox full or not running: observe in place

    def _on_status(self, msg: Msg) -> None:
        status = msg.status
        if status is None:
            return  # a plain message someone published to the deliver subject: not ours
        if status != 100:
            raise PushStatusError(status, msg.description)
        if msg.reply:  # a flow control request: answer it now that it reached the user
            self._answer(FlowControlRequest(msg.reply))
            return
        headers = msg.headers
        if headers is None:
            return
        stalled = headers.get("Nats-Consumer-Stalled")
        if stalled:
            self._answer(FlowControlRequest(stalled, stalled=True))
        try:
            last_consumer = int(headers.get("Nats-Last-Consumer", "0"))
            last_stream = int(headers.get("Nats-Last-Stream", "0"))
        except ValueError:
            return
        self._observe(HeartbeatSeen(last_consumer, last_stream))

    def _answer(self, request: FlowControlRequest) -> None:
        responder = self.flow_control
        if responder is None or not responder.tell(request):
            self._nc.publish_nowait(request.subject, b"")

    # -- ending -------------------------------------------------------------------------------

    async def _stop_delivery(self, drain: bool, deadline: float) -> None:
        sub = self._sub
        if sub is None or sub.is_closed:
            self._queue.close()
            return
        if drain:
            await sub.drain(max(deadline - trio.current_time(), 0.001))
            self._queue.close()
            await self._queue.wait_empty()
        else:
            await sub.unsubscribe()
            self._queue.close()

    async def unsubscribe(self) -> None:
        """Stop now and delete the consumer if this subscription should (raises if deleting
        fails, ADR-15). Buffered messages can still be read."""
        if self.lifecycle.running:
            await self.lifecycle.end(drain=False)

    async def drain(self, timeout: float = 30.0) -> None:
        """Stop interest, deliver what is buffered, wait for outstanding acks (up to
        ``timeout``), then delete the consumer if this subscription should."""
        if self.lifecycle.running:
            await self.lifecycle.end(drain=True, timeout=timeout)

    # -- the pipeline's source port (headrace.pipeline.message_source) -------------------------

    #: A batch's ack wait is taken to start when it is taken: arrivals are not stamped per
    #: message here (see :meth:`keep_alive`).
    taken_since: float | None = None

    def keep_alive(self, arrived_before: float) -> int:
        """Sends nothing, and says so (0). Unlike a pull consumer's buffer, which holds only
        what its own requests asked for, a push subscription's buffer is filled by the server
        up to the consumer's ``max_ack_pending``, and its arrivals are not stamped one by one;
        a reader slower than the ack wait is redelivered what waits here (NOTES.md)."""
        return 0

    def _close(self) -> None:
        self._queue.close()
        self._hub.close()
