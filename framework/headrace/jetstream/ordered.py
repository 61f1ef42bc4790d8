"""The ordered consumer (ADR-17): every message of a subject, in stream order, exactly once.

An ephemeral push consumer with flow control, heartbeats, no acks and one delivery per message.
The subscription checks each delivery's consumer sequence (it must be the previous one plus
one) and each heartbeat's ``Nats-Last-Consumer``. On a gap, when its consumer is deleted, or
when heartbeats stop (the consumer may be gone: a server restart, a lost ephemeral), it drops
the old consumer and creates a new one starting at the stream sequence after the last message
it handed out, so the user sees neither a hole nor a repeat.

A push consumer's deletion sends nothing to its deliver subject (a pull gets ``409 Consumer
Deleted``), so the subscription also listens to the server's advisory for its consumer,
``$JS.EVENT.ADVISORY.CONSUMER.DELETED.<stream>.<consumer>``: a deleted consumer is replaced at
once, not after three missed heartbeats (15 s at the default heartbeat; issue 24). Where the
user may not subscribe to advisories, the heartbeats still tell, later.

Configuration checks (ADR-17), an error when violated: no durable name, no deliver subject, ack
policy none (default), max_deliver 1 (default), flow control on (default), memory storage
(default), no replica count (set to 1). Set without error: idle_heartbeat 5 s unless given,
ack_wait 22 h.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import trio

from headrace.errors import (
    ConnectionLostError,
    NatsError,
    NatsTimeoutError,
    SubscriptionClosedError,
)
from headrace.jetstream.consumer_config import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
)
from headrace.jetstream.errors import (
    JetStreamError,
    JetStreamUnavailable,
    PushStatusError,
    SubscribeError,
)
from headrace.jetstream.events import ConsumerRecreated, HeartbeatsMissed
from headrace.jetstream.lifecycle import DeletePolicy
from headrace.jetstream.message import JsMsg
from headrace.jetstream.names import check_stream
from headrace.jetstream.push import ACK_PREFIX, Inlet, PushSubscription
from headrace.jetstream.subscribe import check_filter
from headrace.protocol.events import Msg

if TYPE_CHECKING:
    from headrace.jetstream.api import JetStreamAPI
    from headrace.nats.subscription import Subscription

DEFAULT_HEARTBEAT = 5.0
#: The server's advisory of a consumer's deletion (``.<stream>.<consumer>`` follows).
DELETED_ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.DELETED"
ORDERED_ACK_WAIT = 22 * 3600.0


def ordered_config(config: ConsumerConfig) -> ConsumerConfig:
    """Validate and complete a user's config for an ordered consumer (ADR-17 checks)."""
    problems = []
    if config.durable_name:
        problems.append("durable_name must not be set (ordered consumers are ephemeral)")
    if config.deliver_subject:
        problems.append("deliver_subject must not be set (the subscription picks an inbox)")
    if config.ack_policy not in (None, AckPolicy.NONE):
        problems.append("ack_policy must be none (ordered consumers are not acked)")
    if config.max_deliver not in (None, 1):
        problems.append("max_deliver must be 1")
    if config.flow_control is False:
        problems.append("flow_control must be on")
    if config.mem_storage is False:
        problems.append("mem_storage must be on")
    if config.num_replicas is not None:
        problems.append("num_replicas must not be set (it is 1)")
    if config.deliver_group:
        problems.append("deliver_group must not be set (ordered consumers are private)")
    if problems:
        raise SubscribeError("invalid ordered consumer config: " + "; ".join(problems))
    return attrs.evolve(
        config,
        ack_policy=AckPolicy.NONE,
        max_deliver=1,
        flow_control=True,
        mem_storage=True,
        num_replicas=1,
        idle_heartbeat=config.idle_heartbeat or DEFAULT_HEARTBEAT,
        ack_wait=ORDERED_ACK_WAIT,
    )


class OrderedSubscription(PushSubscription):
    """Made by ``js.subscribe(subject, ordered=True)``; see the module docs."""

    def __init__(
        self,
        js: JetStreamAPI,
        stream: str,
        info: ConsumerInfo,
        *,
        subject: str | None,
        config: ConsumerConfig,
        heartbeat_factor: float,
    ) -> None:
        super().__init__(
            js,
            stream,
            info,
            queue=None,
            created=True,
            delete_policy=DeletePolicy.ALWAYS,
            heartbeat_factor=heartbeat_factor,
        )
        self.gaps = None  # the ordered consumer checks sequences itself, and acts on gaps
        self._subject = subject
        self._config = config
        self._last_consumer = 0
        #: Stream sequence of the last message handed to the user.
        self.last_stream_seq = 0
        self._reset_reason: str | None = None
        self._generation = 0
        # A "new messages only" consumer starts after the stream's last message at creation:
        # that is where a recreation before the first message must start too.
        if config.deliver_policy is DeliverPolicy.NEW:
            self.last_stream_seq = info.delivered.stream_seq
        self.recreated = 0
        if self.heartbeat is not None:
            self.heartbeat._on_alarm = self._on_heartbeat_alarm
        self._deleted_watch: Subscription | None = None

    @classmethod
    async def create(
        cls,
        js: JetStreamAPI,
        subject: str | None,
        *,
        stream: str | None,
        config: ConsumerConfig,
        heartbeat_factor: float,
    ) -> OrderedSubscription:
        if stream is not None:
            check_stream("stream", stream)
        if not subject and not stream:
            raise SubscribeError("give a subject or a stream name")
        check_filter(subject, config)
        cfg = ordered_config(config)
        stream = stream or await js.find_stream(subject or "")
        inlet = Inlet()
        sub, info = await cls._make_consumer(js, stream, subject, cfg, inlet)
        ordered = cls(
            js, stream, info, subject=subject, config=cfg, heartbeat_factor=heartbeat_factor
        )
        ordered._attach(sub, inlet)
        ordered._watch_deletion()
        return ordered

    def _watch_deletion(self) -> None:
        """Listen for the advisory of the current consumer's deletion (see the module docs)."""
        name = self.consumer
        subject = f"{DELETED_ADVISORY}.{self.stream}.{name}"

        def deleted(batch: list[Msg]) -> None:  # (any message on it is the news)
            if name == self.consumer and self._reset_reason is None:
                self._reset_reason = "consumer deleted"
                self._queue.interrupt()  # wake a waiting reader: it recreates the consumer

        self._deleted_watch = self._nc.subscribe_nowait(subject, handler=deleted)

    def _unwatch_deletion(self) -> None:
        watch, self._deleted_watch = self._deleted_watch, None
        if watch is not None and not watch.is_closed:
            self._nc.unsubscribe_nowait(watch)

    def _close(self) -> None:
        self._unwatch_deletion()
        super()._close()

    @staticmethod
    async def _make_consumer(
        js: JetStreamAPI,
        stream: str,
        subject: str | None,
        config: ConsumerConfig,
        inlet: Inlet,
        start_seq: int | None = None,
    ) -> tuple[Subscription, ConsumerInfo]:
        nc = js.nc
        deliver = nc.new_inbox()
        sub = nc.subscribe_nowait(deliver, handler=inlet)
        wanted = attrs.evolve(
            config,
            deliver_subject=deliver,
            filter_subject=config.filter_subject
            or (subject if subject and not config.filter_subjects else None),
        )
        if start_seq is not None:
            wanted = attrs.evolve(
                wanted,
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=start_seq,
                opt_start_time=None,
            )
        try:
            return sub, await js.create_consumer(stream, wanted)
        except BaseException:
            await sub.unsubscribe()
            raise

    # -- reading ------------------------------------------------------------------------------

    def _on_heartbeat_alarm(self, alarm: HeartbeatsMissed) -> None:
        self._reset_reason = self._reset_reason or "heartbeats missed"
        self._queue.interrupt()  # wake a waiting reader: it recreates the consumer

    async def _take(self, max_msgs: int | None) -> list[JsMsg]:
        self._before_take(max_msgs)
        nc = self._nc
        while True:
            if self._reset_reason is not None:
                await self._recreate(self._reset_reason)
            try:
                batch = await self._queue.get_batch(max_msgs)
            except trio.EndOfChannel:
                raise SubscriptionClosedError(f"{self!r} has ended") from None
            out: list[JsMsg] = []
            for msg in batch:
                reply = msg.reply
                if reply is not None and reply.startswith(ACK_PREFIX):
                    jm = JsMsg(msg, nc, ack_none=True)
                    meta = jm.metadata
                    if meta.consumer_seq != self._last_consumer + 1:
                        self._reset_reason = (
                            f"gap: consumer sequence {meta.consumer_seq} after "
                            f"{self._last_consumer}"
                        )
                        break  # drop the rest: the new consumer sends it again, in order
                    self._last_consumer = meta.consumer_seq
                    self.last_stream_seq = meta.stream_seq
                    out.append(jm)
                    continue
                try:
                    self._check_status(msg)
                except PushStatusError as exc:
                    if not out:
                        raise
                    self._pending_error = exc  # hand out what came first
                    break
                if self._reset_reason is not None:
                    break
            if out:
                return out

    def _check_status(self, msg: Msg) -> None:
        self._on_status(msg)  # flow control and stalled answers, errors
        headers = msg.headers if msg.status == 100 and not msg.reply else None
        if headers is None:
            return
        try:
            last = int(headers.get("Nats-Last-Consumer", "0"))
        except ValueError:
            return
        if last > self._last_consumer:
            self._reset_reason = (
                f"gap: heartbeat says consumer sequence {last}, last seen {self._last_consumer}"
            )

    async def _recreate(self, reason: str) -> None:
        """Replace the consumer, resuming after the last message handed out."""
        old_sub, old_name = self._sub, self.consumer
        self._generation += 1
        self._unwatch_deletion()  # (deleting it ourselves below is no news)
        self._queue.discard()
        if old_sub is not None and not old_sub.is_closed:
            await old_sub.unsubscribe()
        try:
            await self.js.delete_consumer(self.stream, old_name)
        except (JetStreamError, NatsError, trio.TooSlowError):
            pass  # already gone, or unreachable: an ephemeral expires on its own
        # Nothing handed out yet (and not "new only"): start as the user asked (deliver all,
        # last per subject, by time...), not at sequence 1.
        start = self.last_stream_seq + 1 if self.last_stream_seq else None
        wait = 0.25
        while True:
            inlet = Inlet()  # one per attempt: a "failed" create may have succeeded
            try:
                sub, info = await self._make_consumer(
                    self.js, self.stream, self._subject, self._config, inlet, start_seq=start
                )
                break
            except (JetStreamUnavailable, NatsTimeoutError, ConnectionLostError):
                # JetStream not reachable yet (a restart, an election): keep trying (ADR-17
                # wants the subscription to recover, not to fail), with a growing pause.
                await trio.sleep(wait)
                wait = min(wait * 2, 2.0)
        self.info = info
        self.consumer = info.name
        self.lifecycle.consumer = info.name
        self._last_consumer = 0
        self._reset_reason = None
        self._attach(sub, inlet)
        self._watch_deletion()
        if self.heartbeat is not None:
            self.heartbeat.activity()
        self.recreated += 1
        self._hub.emit(ConsumerRecreated(old_name, info.name, start or 0, reason))
