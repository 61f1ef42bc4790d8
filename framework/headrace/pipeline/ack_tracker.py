"""The ack tracker actor: delivery guarantees of a pipeline.

A JetStream message is acked only after every record derived from it was committed by every
sink it went to. The other actors report, synchronously and per batch (trio runs one task at a
time, so there is no race): records admitted at the source, dropped by a filter, committed by a
sink, or failed. The tracker does the bookkeeping on the :class:`Delivery` objects and sends the
acks of a committed batch in one write (``ack_all``).

Failure: a delivery with a failed record (an operator failing it, a sink rejecting it, or a
sink stage isolating it as bad: sink outages never get here, see ``sink_retry.py``) is naked
once, with a backoff delay that grows with its delivery count, so the whole message is
redelivered (sinks that committed its other records see it again: they must be idempotent,
which the record metadata allows). Once it has been delivered ``max_deliveries`` times it is a
poison message: published with headers naming the pipeline, the error, the original subject,
stream and sequence to the dead-letter subject (which a stream must store: checked at start),
and terminated (+TERM) only after the stream's PubAck, so a poison message is never just
dropped. Without a dead letter it is terminated and reported (:class:`PoisonTerminated`).
Poison handling runs apart from the +WPI scan, one message at a time, shielded, so a stop
never cuts it in half.

Slow commits: the tracker's own task sends +WPI (work in progress) for messages held longer than
half of their consumer's ack_wait, so that a slow sink does not cause redeliveries. The same scan
asks each pull source's consume buffer to do so for messages still waiting there (a source stops
taking while its ``max_in_flight`` messages are in the pipeline). On a host that wakes the scan
late, the +WPI go out early by twice the lateness (up to a quarter ack wait). If one still comes
too late, the server delivers the message again while it is held: that redelivery is not taken
again (``_held_again``): keep-alives and the pipeline's work would otherwise grow with the
redeliveries they failed to prevent, and starve the host further.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio

from headrace.actors.actor import Actor
from headrace.errors import HeadraceError, MaxPayloadExceeded, NatsError
from headrace.jetstream.errors import JetStreamError, StreamLookupError
from headrace.jetstream.message import JsMsg, ack_all
from headrace.jetstream.transient import retry_transient
from headrace.pipeline.errors import PipelineError
from headrace.pipeline.record import Delivery, Record, ResultDelivery
from headrace.pipeline.stats import PipelineStats

if TYPE_CHECKING:
    from headrace.jetstream.context import JetStream
    from headrace.pipeline.nodes import PipelineGraph

DEFAULT_ACK_WAIT = 30.0
#: How long one poison message's dead-letter publish and +TERM may take, shielded from a stop.
POISON_TIMEOUT = 10.0
#: Messages dead-lettered lately that are remembered, so that one is never copied twice.
REMEMBERED_DEAD_LETTERS = 10_000


class PoisonTerminated(HeadraceError):
    """A poison message was terminated without a dead-letter copy (the pipeline has no
    ``dead_letter``): its data is only in the stream now."""


class _Group:
    """Deliveries that arrived together, with how many are not settled yet."""

    __slots__ = ("deliveries", "open", "received")

    def __init__(self, received: float, deliveries: list[Delivery]) -> None:
        self.received = received
        self.deliveries = deliveries
        self.open = len(deliveries)

    def leave(self) -> None:
        """One of its deliveries is settled. Once all are, it lets go of them: each delivery
        points back at its group, and a cycle is freed only by a full collection (rare under
        ``tune_gc``), so acked messages would pile up; nor is a settled message kept while an
        older group is still open."""
        self.open -= 1
        if self.open <= 0:
            self.deliveries = []


@attrs.frozen(slots=True)
class _Poison:
    deliveries: list[Delivery]
    error: BaseException


@attrs.frozen(slots=True)
class _Wake:
    """A source learned its ack_wait: the scan interval may have become shorter."""


#: A source's way to send +WPI for the messages waiting in its consume buffer that arrived
#: before a moment (``trio.current_time()`` units); returns how many it sent.
KeepAlive = Callable[[float], int]


class AckTracker(Actor[_Poison | _Wake]):
    """The one owner of every delivery's state in a run (see the module docs).

    Stages report facts to it, synchronously and one way (``admit``, ``forked``, ``expanded``,
    ``release``, ``committed``, ``failed``); it acks a message once all its records are
    committed, naks it with a growing delay when one failed, and dead-letters or terminates it
    after ``max_deliveries``. Its task keeps slow messages alive with +WPI and runs the poison
    handling, shielded. A plugin author never calls it: a sink only returns or raises.
    """

    def __init__(self, pipeline: PipelineGraph, js: JetStream, stats: PipelineStats) -> None:
        super().__init__("ack-tracker", inbox_size=math.inf)
        self.pipeline = pipeline
        self.js = js
        self.stats = stats
        #: ack_wait of each source's consumer (seconds), learned when it binds.
        self.ack_wait: dict[str, float] = {}
        #: Messages each source has in the pipeline (taken, not yet acked, naked or
        #: terminated), and the sources waiting for that number to fall.
        self.in_flight: dict[str, int] = {}
        self._room = trio.lowlevel.ParkingLot()
        # Deliveries by arrival, in the groups they arrived in, for the +WPI scan; settled groups
        # leave from the front as they complete, so only what is in flight is kept.
        self._groups: deque[_Group] = deque()
        #: How each pull source keeps alive the messages still waiting in its consume buffer
        #: (``keep_alive(older_than) -> +WPI sent``), called by the same scan: the one narrow
        #: way the tracker reaches back to a source, instead of holding its buffer.
        self.keep_alives: dict[str, KeepAlive] = {}
        self._rescan = trio.Event()
        #: Seconds each +WPI is sent ahead of its due time: how late the scan has lately
        #: woken (a starved host, a loop held up), doubled, up to a quarter of the ack wait,
        #: and that quarter once a held message was delivered again (its +WPI came too late
        #: for the server). Halves at each scan on time.
        self._margin = 0.0
        #: Poison messages whose dead-letter copy and +TERM are still to come: kept alive by
        #: the +WPI scan meanwhile, or a slow dead letter would let the server deliver them
        #: again (and each be dead-lettered twice).
        self._poison_pending: dict[int, Delivery] = {}
        #: (stream, sequence) of messages dead-lettered lately, oldest first: a message
        #: delivered again before its +TERM landed (a server that did not answer for longer
        #: than its ack_wait) is terminated again, not copied again.
        self._dead_lettered: dict[tuple[str, int], None] = {}
        #: Told of failures worth a line in the run's errors (``PipelineRun.report_error``).
        self.report: Callable[[str, BaseException], None] = lambda _stage, _error: None
        self._changed = trio.Event()

    def changed(self) -> trio.Event:
        """An event set at the next ack, nak or +TERM the tracker sends: the moments the
        consumer's state on the server can move (``PipelineRun.wait_caught_up`` asks the
        server then). Take it before looking, so that no change is missed in between."""
        return self._changed

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def learn_ack_wait(
        self, source: str, ack_wait: float, keep_alive: KeepAlive | None = None
    ) -> None:
        """A source bound its consumer: scan for +WPI at a quarter of its ack_wait;
        ``keep_alive``: how to keep alive what waits in its consume buffer (pull sources)."""
        self.ack_wait[source] = ack_wait
        if keep_alive is not None:
            self.keep_alives[source] = keep_alive
        self.tell(_Wake())

    # -- reports from the other actors (synchronous) ------------------------------------------

    def admit(self, msgs: list[JsMsg], source: str, since: float | None = None) -> list[Record]:
        """Messages taken from a source become deliveries and records. ``since``: when their
        ack_wait started (they may have waited in a consume buffer), if not now.

        A redelivery of a message the pipeline still holds is not taken again
        (:meth:`_held_again`)."""
        now = trio.current_time() if since is None else since
        groups = self._groups
        if (
            groups
            and msgs
            and now - groups[0].received >= self.ack_wait.get(source, DEFAULT_ACK_WAIT) / 2
        ):
            msgs = self._held_again(msgs, source)
        group = _Group(now, [])
        deliveries = group.deliveries = [Delivery(m, now, source, group) for m in msgs]
        group.open = len(deliveries)
        self._groups.append(group)
        self.in_flight[source] = self.in_flight.get(source, 0) + len(msgs)
        stats = self.stats
        stats.messages_in += len(msgs)
        stats.ack_pending += len(msgs)
        if msgs:
            last = msgs[-1].metadata
            stats.lag = last.num_pending
            if last.num_delivered > 1 or msgs[0].metadata.num_delivered > 1:
                stats.redeliveries += sum(1 for m in msgs if m.metadata.num_delivered > 1)
        # m.msg.data, not the JsMsg's data property: one call less per message.
        return [Record(m.msg.data, d) for m, d in zip(msgs, deliveries, strict=True)]

    def _held_again(self, msgs: list[JsMsg], source: str) -> list[JsMsg]:
        """``msgs`` without the redeliveries of messages ``source`` still holds.

        A message is delivered again while held when its ``+WPI`` came too late (a host
        starved of CPU, a loop stalled past ``ack_wait``). Taken again, it went through the
        pipeline a second time, was kept alive a second time, and its sink skipped it as
        committed: work that starved the host further and made more keep-alives late (issue
        23: 86,641 deliveries and 1.29 M keep-alives for 10,000 messages, a poison batch being
        split with a 2 s ack_wait). Instead the held delivery takes the newest one's place:
        its ack, nak or ``+WPI`` answers the server's latest delivery (the server keeps one
        pending entry per message; an ack or ``+WPI`` on an older delivery's subject acts on
        the same one). Looked for only when something has been held for half an ack wait or
        more: before that, nothing held can have been delivered again."""
        if not any(m.metadata.num_delivered > 1 for m in msgs):
            return msgs
        held: dict[tuple[str, int], Delivery] = {}
        for group in self._groups:
            for delivery in group.deliveries:
                if not delivery.done and delivery.source == source:
                    meta = delivery.msg.metadata
                    held[meta.stream, meta.stream_seq] = delivery
        if not held:
            return msgs
        half = self.ack_wait.get(source, DEFAULT_ACK_WAIT) / 2
        now = trio.current_time()
        taken: list[JsMsg] = []
        for msg in msgs:
            meta = msg.metadata
            holder = held.get((meta.stream, meta.stream_seq)) if meta.num_delivered > 1 else None
            if holder is None or meta.num_delivered <= holder.msg.metadata.num_delivered:
                taken.append(msg)
                continue
            holder.msg = msg
            holder.wpi_at = now + half  # (the server's timer started again with it)
            self.stats.redelivered_held += 1
        if len(taken) < len(msgs):
            # Our +WPI came too late for the server: send them a quarter ack wait early.
            self._margin = self._scan_interval()
        return taken

    def forked(self, records: list[Record], copies: int) -> None:
        """Each of ``records`` goes on as ``copies`` records (a fan-out to several stages):
        its message waits for every copy."""
        for record in records:
            record.delivery.pending += copies - 1

    def expanded(self, record: Record, count: int) -> None:
        """``record`` became ``count`` records (a flat_map; at least one: none is a drop)."""
        record.delivery.pending += count - 1

    def release(self, records: list[Record]) -> None:
        """Records that end without a sink (a filter dropped them, a flat_map made none):
        their messages are acked once nothing else is outstanding."""
        self.stats.dropped += len(records)
        self._settle(records)

    def committed(self, records: list[Record], skipped: int = 0) -> None:
        """A sink committed these records, ``skipped`` of them by finding them committed
        already (``Batch.skipped``)."""
        self.stats.records_out += len(records) - skipped
        self.stats.records_skipped += skipped
        self._settle(records)

    def _settle(self, records: list[Record]) -> None:
        ready: list[JsMsg] = []
        in_flight = self.in_flight
        for record in records:
            delivery = record.delivery
            delivery.pending -= 1
            if delivery.pending <= 0 and not delivery.done:
                delivery.done = True
                group = delivery.group
                if group is None:  # a stateful operator's result: no message to ack
                    self._result_settled(delivery, committed=True)
                    continue
                group.leave()
                ready.append(delivery.msg)
                in_flight[delivery.source] -= 1
        if ready:
            ack_all(ready)
            self.stats.acks += len(ready)
            self.stats.ack_pending -= len(ready)
            self._forget_settled()
            self._touch()
            if self._room:
                self._room.unpark_all()

    @staticmethod
    def _result_settled(delivery: Delivery, *, committed: bool) -> None:
        if isinstance(delivery, ResultDelivery):
            delivery.owner.result_settled(delivery.result_seq, committed=committed)

    def _forget_settled(self) -> None:
        groups = self._groups
        while groups and groups[0].open <= 0:
            groups.popleft()

    def failed(
        self,
        records: list[Record],
        error: BaseException,
        actor: str | None = None,
        node: str | None = None,
        *,
        poison: bool = False,
    ) -> None:
        """Processing these records failed in ``actor`` (of node ``node``): nak their messages
        (or, past ``max_deliveries``, treat them as poison). ``poison``: they are poison now,
        whatever their delivery count (a delivery would not bring them back: see
        ``SinkStage._attempt``)."""
        self.stats.failure(actor or self.name, node or actor or self.name, error, records)
        at_once = poison
        poison_now: list[Delivery] = []
        for record in records:
            delivery = record.delivery
            delivery.pending -= 1
            if delivery.done:
                continue
            delivery.failed = True
            delivery.done = True
            if delivery.group is None:
                # A result failed in a sink: it cannot come again by a nak. Its copy goes to
                # the dead letter (poison at once), and its operator forgets it.
                self._result_settled(delivery, committed=False)
                poison_now.append(delivery)
                continue
            delivery.group.leave()
            self.stats.ack_pending -= 1
            self.in_flight[delivery.source] -= 1
            msg = delivery.msg
            delivered = msg.metadata.num_delivered
            if at_once or delivered >= self.pipeline.max_deliveries:
                poison_now.append(delivery)
                continue
            delay = min(
                self.pipeline.nak_delay * 2 ** min(delivered - 1, 30), self.pipeline.nak_delay_max
            )
            msg.nak_nowait(delay)
            self.stats.naks += 1
        if poison_now:
            for delivery in poison_now:
                self._poison_pending[id(delivery)] = delivery
            self.tell(_Poison(poison_now, error))
        self._forget_settled()
        self._touch()
        if self._room:
            self._room.unpark_all()

    def abandon_all(self) -> int:
        """Nak, without a delay, every message held (the pipeline is giving up: a sink outage
        past its deadline): they are delivered again, here or to another worker, and none is
        terminated. How many."""
        naked = 0
        for group in self._groups:
            for delivery in group.deliveries:
                if delivery.done:
                    continue
                delivery.done = True
                group.leave()
                self.in_flight[delivery.source] -= 1
                delivery.msg.nak_nowait()
                naked += 1
        self.stats.naks += naked
        self.stats.ack_pending -= naked
        self._forget_settled()
        self._touch()
        if self._room:
            self._room.unpark_all()
        return naked

    async def wait_room(self, source: str, limit: int) -> int:
        """Wait while ``source`` has ``limit`` or more messages in the pipeline (the bound on
        memory, whatever the stages' inboxes could hold); how many it may take now."""
        while self.in_flight.get(source, 0) >= limit:
            await self._room.park()
        return limit - self.in_flight.get(source, 0)

    # -- the actor's task: poison messages and +WPI ---------------------------------------------

    async def run(self) -> None:
        await self._check_dead_letter()
        # Poison jobs are handled one after another, each whole (its dead-letter publish and
        # its +TERM); the +WPI scan runs beside them on its own deadline, so neither cuts the
        # other short (a dead-letter publish cancelled by the scan's timer was stored and never
        # terminated, and the rest of its batch neither terminated nor naked).
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._scan_loop)
            while True:
                job = await self.inbox.receive()
                if isinstance(job, _Poison):
                    await self._poison(job)
                else:  # a source bound: its ack_wait may call for an earlier scan
                    self._rescan.set()

    @trio.lowlevel.enable_ki_protection  # a Ctrl-C goes to the app (shutdown.py)
    async def _scan_loop(self) -> None:
        next_scan = trio.current_time() + self._scan_interval()
        while True:
            with trio.move_on_at(next_scan):
                await self._rescan.wait()
                self._rescan = trio.Event()
                next_scan = min(next_scan, trio.current_time() + self._scan_interval())
                continue
            now = trio.current_time()
            self._margin = min(self._scan_interval(), max(self._margin / 2, 2 * (now - next_scan)))
            self._send_in_progress()
            next_scan = trio.current_time() + self._scan_interval()

    async def _check_dead_letter(self) -> None:
        """A dead letter must be kept: a stream must store the subject (checked once, when the
        pipeline starts), so that a poison message is terminated only once its copy is."""
        subject = self.pipeline.dead_letter
        if subject is None:
            return
        try:
            await retry_transient(lambda: self.js.find_stream(subject))
        except StreamLookupError:
            raise PipelineError(
                f"pipeline {self.pipeline.name!r}: no stream stores its dead_letter subject "
                f"{subject!r}, so a poison message's copy would be kept nowhere. Create a stream "
                "capturing it (e.g. headrace stream add DLQ --subjects "
                f"'{subject}'), or leave dead_letter unset"
            ) from None

    def _scan_interval(self) -> float:
        waits = self.ack_wait.values()
        return (min(waits) if waits else DEFAULT_ACK_WAIT) / 4

    def _send_in_progress(self) -> None:
        now = trio.current_time()
        # Due by then: sent now (see _margin).
        due = now + self._margin
        for source, keep_alive in self.keep_alives.items():
            sent = keep_alive(due - self.ack_wait.get(source, DEFAULT_ACK_WAIT) / 2)
            self.stats.in_progress += sent
        for group in self._groups:
            if group.open <= 0:
                continue
            half = self.ack_wait.get(group.deliveries[0].source, DEFAULT_ACK_WAIT) / 2
            if due - group.received < half:
                continue  # (not a break: sources' groups interleave, with their own ack_waits)
            open_ = [d for d in group.deliveries if not d.done]
            group.deliveries = open_  # keep only what is still in flight
            for delivery in open_:
                if due >= delivery.wpi_at:
                    delivery.msg.in_progress_nowait()
                    delivery.wpi_at = now + half
                    self.stats.in_progress += 1
        for delivery in self._poison_pending.values():
            half = self.ack_wait.get(delivery.source, DEFAULT_ACK_WAIT) / 2
            if due - delivery.received >= half and due >= delivery.wpi_at:
                delivery.msg.in_progress_nowait()
                delivery.wpi_at = now + half
                self.stats.in_progress += 1

    async def _poison(self, job: _Poison) -> None:
        dead_letter = self.pipeline.dead_letter
        reason = f"{type(job.error).__name__}: {job.error}"[:500]
        for delivery in job.deliveries:
            # Each message whole: its copy stored, then its +TERM, not cut apart by a stop.
            try:
                with trio.CancelScope(shield=True), trio.move_on_after(POISON_TIMEOUT):
                    await self._one_poison(delivery.msg, dead_letter, reason)
            finally:
                self._poison_pending.pop(id(delivery), None)
                self._touch()  # terminated, or naked again: either way the consumer moved

    async def _one_poison(self, msg: JsMsg, dead_letter: str | None, reason: str) -> None:
        key = (msg.metadata.stream, msg.metadata.stream_seq)
        if dead_letter is not None and key in self._dead_lettered:
            # Copied already; this is a delivery that came again before the +TERM landed.
            msg.term_nowait(f"poison message in pipeline {self.pipeline.name}: {reason}"[:200])
            self.stats.terms += 1
            return
        if dead_letter is not None:
            try:
                await self._dead_letter(dead_letter, msg, reason)
            except (JetStreamError, NatsError) as exc:
                # Not kept anywhere: terminating it now would lose it. Redeliver later.
                self.stats.failure(self.name, self.name, exc, msg=msg)
                msg.nak_nowait(self.pipeline.nak_delay_max)
                self.stats.naks += 1
                return
            self.stats.dead_lettered += 1
            self._dead_lettered[key] = None
            while len(self._dead_lettered) > REMEMBERED_DEAD_LETTERS:
                del self._dead_lettered[next(iter(self._dead_lettered))]
        else:
            # Terminated with no copy anywhere but the stream: said loudly, counted, and
            # `headrace run` exits non-zero at the end unless the pipeline allows it.
            self.stats.terminated_unkept += 1
            self.report(
                self.name,
                PoisonTerminated(
                    f"poison message {msg.metadata.stream} #{msg.metadata.stream_seq} "
                    f"terminated without a dead letter: {reason}"
                ),
            )
        msg.term_nowait(f"poison message in pipeline {self.pipeline.name}: {reason}"[:200])
        self.stats.terms += 1

    async def _dead_letter(self, subject: str, msg: JsMsg, reason: str) -> None:
        meta = msg.metadata
        headers = {
            "Headrace-Pipeline": self.pipeline.name,
            "Headrace-Error": reason.replace("\r", " ").replace("\n", " "),
            "Headrace-Subject": msg.subject,
            "Headrace-Stream": meta.stream,
            "Headrace-Stream-Seq": str(meta.stream_seq),
            "Headrace-Delivered": str(meta.num_delivered),
        }
        if msg.headers is not None:
            for name, value in msg.headers.multi_items():
                if name.startswith("Nats-"):
                    continue  # the server's own (de-duplication, expectations): not to replay
                headers.setdefault(name, value)
        try:
            await self.js.publish(subject, msg.data, headers=headers)
        except MaxPayloadExceeded:
            # The copy does not fit (the message was just under max_payload, and the headers
            # above made it larger): a reference, without the body, rather than nothing. The
            # body stays in the stream at the sequence the headers name.
            headers["Headrace-Body"] = (
                f"omitted: {len(msg.data)} bytes, over the server's max_payload with these "
                "headers; the message is in its stream at Headrace-Stream-Seq"
            )
            await self.js.publish(subject, b"", headers=headers)
