"""The ack ledger: the delivery guarantees of a pipeline, without I/O.

A JetStream message is acked only after every record derived from it was committed by every
sink it went to. One :class:`AckLedger` holds that bookkeeping for a run: every
:class:`Delivery` in flight, the arrival groups the +WPI scan walks, how many messages each
source has in the pipeline, each source's ack_wait, the poison messages still to dead-letter.
It never touches a socket, a clock or trio, h11-style: its driver (the ack tracker actor,
``ack_tracker.py``) tells it what happened, with the time as an explicit ``now``, and does
what it answers:

- :meth:`~AckLedger.admit` answers the records of messages taken from a source (and takes
  none for a redelivery of a message still held: :meth:`~AckLedger._held_again`);
- :meth:`~AckLedger.forked` and :meth:`~AckLedger.expanded` answer nothing: more records owed;
- :meth:`~AckLedger.release` and :meth:`~AckLedger.committed` answer the messages to ack now
  (one list, for one ``ack_all``);
- :meth:`~AckLedger.failed` answers a :class:`Failed`: the naks to send, with their delays,
  and the deliveries made poison, which wait in the ledger (:meth:`~AckLedger.take_poison`)
  until the driver has dead-lettered or terminated each (:meth:`~AckLedger.poison_settled`);
- :meth:`~AckLedger.abandon_all` answers the messages to nak without a delay;
- :meth:`~AckLedger.scan` answers an :class:`InProgressDue`: the held messages due for +WPI,
  and from when each source's consume buffer should send its own.

The results of a stateful operator (``ResultDelivery``: no message to ack) settle here too;
their owners are to be told, which the driver does from :attr:`AckLedger.settled_results`.

Failure: a delivery with a failed record (an operator failing it, a sink rejecting it, or a
sink stage isolating it as bad: sink outages never get here, see ``sink_retry.py``) is naked
once, with a backoff delay that grows with its delivery count, so the whole message is
redelivered (sinks that committed its other records see it again: they must be idempotent,
which the record metadata allows). Once it has been delivered ``max_deliveries`` times it is a
poison message: the driver publishes it with headers naming the pipeline, the error, the
original subject, stream and sequence to the dead-letter subject, and terminates it (+TERM)
only after the stream's PubAck, so a poison message is never just dropped. The ledger keeps it
alive with +WPI until then, and remembers what it dead-lettered lately, so that a message
delivered again before its +TERM landed is terminated again, not copied again.

Slow commits: +WPI (work in progress) is due for messages held longer than half of their
consumer's ack_wait, so that a slow sink does not cause redeliveries; the same scan says from
when each pull source's consume buffer should do so for messages still waiting there (a source
stops taking while its ``max_in_flight`` messages are in the pipeline). On a host that wakes
the scan late, the +WPI are due early by twice the lateness (up to a quarter ack wait:
:attr:`AckLedger.margin`). If one still comes too late, the server delivers the message again
while it is held: that redelivery is not taken again (``_held_again``): keep-alives and the
pipeline's work would otherwise grow with the redeliveries they failed to prevent, and starve
the host further.

The calls are per batch of records, not per message, and the hot ones (``admit``,
``committed``) allocate nothing beyond the records and the one list of messages to ack.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import attrs

from headrace.pipeline.record import Delivery, Record, ResultDelivery
from headrace.pipeline.stats import PipelineStats

if TYPE_CHECKING:
    from headrace.jetstream.message import JsMsg

#: Messages dead-lettered lately that are remembered, so that one is never copied twice.
REMEMBERED_DEAD_LETTERS = 10_000


class Redelivery(Protocol):
    """How failed messages come again: the pipeline's settings (``PipelineGraph``), read at
    each failure."""

    @property
    def max_deliveries(self) -> int: ...
    @property
    def nak_delay(self) -> float: ...
    @property
    def nak_delay_max(self) -> float: ...


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
class Poison:
    """Deliveries made poison together, by ``error``: each to be dead-lettered (or, without a
    dead letter, terminated) by the driver, then :meth:`AckLedger.poison_settled`."""

    deliveries: list[Delivery]
    error: BaseException


@attrs.frozen(slots=True)
class Failed:
    """What :meth:`AckLedger.failed` decided."""

    #: Messages to nak now, each with its delay (seconds).
    naks: list[tuple[JsMsg, float]]
    #: Deliveries made poison (queued in the ledger as one :class:`Poison`, if any).
    poison: list[Delivery]


@attrs.frozen(slots=True)
class InProgressDue:
    """What the +WPI scan found due."""

    #: Held messages (poison ones still to dead-letter included) to send +WPI for now.
    msgs: list[JsMsg]
    #: Per source: its consume buffer is to send +WPI for the messages that arrived there
    #: before this moment (the ``keep_alive(older_than)`` of a pull source).
    buffered_before: dict[str, float]


class AckLedger:
    """The one owner of every delivery's state in a run (see the module docs).

    The counts (``in_flight``, ``ack_wait``, ``margin``, ``poison_pending``) are public for the
    driver and tests to read; only the methods change them. ``default_ack_wait``: the ack wait
    assumed for a source whose consumer has not told its own. ``stats`` is counted in place:
    the ledger counts what it decides (acks, naks, +WPI, drops, redeliveries) as it answers,
    since its driver sends every answer at once.
    """

    def __init__(
        self, stats: PipelineStats, redelivery: Redelivery, *, default_ack_wait: float
    ) -> None:
        self.stats = stats
        self.redelivery = redelivery
        self.default_ack_wait = default_ack_wait
        #: ack_wait of each source's consumer (seconds), learned when it binds.
        self.ack_wait: dict[str, float] = {}
        #: Messages each source has in the pipeline (taken, not yet acked, naked or
        #: terminated).
        self.in_flight: dict[str, int] = {}
        # Deliveries by arrival, in the groups they arrived in, for the +WPI scan; settled groups
        # leave from the front as they complete, so only what is in flight is kept.
        self._groups: deque[_Group] = deque()
        # The groups in arrival order whose ``received`` is lower than every later one's: the
        # first is the oldest of all (a monotonic queue: ``received`` is a batch's ``since``,
        # which may be older than the batch before it, one from another source or from a
        # buffer it waited in). It tells when something may have been held for half an ack
        # wait, whatever the order of the groups.
        self._oldest: deque[_Group] = deque()
        #: Seconds each +WPI is due ahead of its time: how late the scan has lately woken (a
        #: starved host, a loop held up), doubled, up to a quarter of the ack wait, and that
        #: quarter once a held message was delivered again (its +WPI came too late for the
        #: server). Halves at each scan on time.
        self.margin = 0.0
        #: Poison messages whose dead-letter copy and +TERM are still to come, by
        #: ``id(delivery)``: kept alive by the +WPI scan meanwhile, or a slow dead letter would
        #: let the server deliver them again (and each be dead-lettered twice).
        self.poison_pending: dict[int, Delivery] = {}
        # The poison jobs the driver has not taken yet, oldest first (their deliveries are in
        # poison_pending too). Kept here, not in the driver's inbox: a failure is reported
        # synchronously and cannot wait for room, and nothing may be lost.
        self._poison_queue: deque[Poison] = deque()
        # (stream, sequence) of messages dead-lettered lately, oldest first: a message
        # delivered again before its +TERM landed (a server that did not answer for longer
        # than its ack_wait) is terminated again, not copied again.
        self._dead_lettered: dict[tuple[str, int], None] = {}
        #: Results of stateful operators settled since the driver last looked, each with
        #: whether it was committed (else it failed, and goes to the dead letter): their owners
        #: are to be told (``owner.result_settled``), which forget them at their next snapshot.
        self.settled_results: list[tuple[ResultDelivery, bool]] = []

    # -- what the ledger knows -----------------------------------------------------------------

    def learn_ack_wait(self, source: str, ack_wait: float) -> None:
        """A source bound its consumer, whose ack_wait is ``ack_wait`` seconds."""
        self.ack_wait[source] = ack_wait

    def half_ack_wait(self, source: str) -> float:
        """Half of ``source``'s ack_wait: a held message is due for +WPI after that long."""
        return self.ack_wait.get(source, self.default_ack_wait) / 2

    def scan_interval(self) -> float:
        """How often to scan for +WPI: a quarter of the shortest ack_wait."""
        waits = self.ack_wait.values()
        return (min(waits) if waits else self.default_ack_wait) / 4

    def held(self) -> Iterator[Delivery]:
        """The deliveries held (taken, not yet acked, naked or made poison), oldest first."""
        for group in self._groups:
            for delivery in group.deliveries:
                if not delivery.done:
                    yield delivery

    @property
    def poison_waiting(self) -> bool:
        """Whether poison jobs wait for :meth:`take_poison`."""
        return bool(self._poison_queue)

    # -- reports from the stages ---------------------------------------------------------------

    def admit(
        self, msgs: list[JsMsg], source: str, now: float, since: float | None = None
    ) -> list[Record]:
        """Messages taken from a source become deliveries and records. ``since``: when their
        ack_wait started (they may have waited in a consume buffer), if not ``now``.

        A redelivery of a message the pipeline still holds is not taken again
        (:meth:`_held_again`)."""
        received = now if since is None else since
        groups = self._groups
        oldest = self._oldest
        # ``now``, not ``since``: a batch's ``since`` is its oldest arrival (or last +WPI), and
        # a redelivery that came later in the same batch may be one of a held message. The
        # oldest group, not the first: groups are not always in the order of ``received``.
        if oldest and msgs and now - oldest[0].received >= self.half_ack_wait(source):
            msgs = self._held_again(msgs, source, now)
        group = _Group(received, [])
        deliveries = group.deliveries = [Delivery(m, received, source, group) for m in msgs]
        group.open = len(deliveries)
        groups.append(group)
        while oldest and oldest[-1].received >= received:
            oldest.pop()
        oldest.append(group)
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

    def _held_again(self, msgs: list[JsMsg], source: str, now: float) -> list[JsMsg]:
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
        for delivery in self.held():
            if delivery.source == source:
                meta = delivery.msg.metadata
                held[meta.stream, meta.stream_seq] = delivery
        if not held:
            return msgs
        half = self.half_ack_wait(source)
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
            # Our +WPI came too late for the server: make them due a quarter ack wait early.
            self.margin = self.scan_interval()
        return taken

    def forked(self, records: list[Record], copies: int) -> None:
        """Each of ``records`` goes on as ``copies`` records (a fan-out to several stages):
        its message waits for every copy."""
        for record in records:
            record.delivery.pending += copies - 1

    def expanded(self, record: Record, count: int) -> None:
        """``record`` became ``count`` records (a flat_map; at least one: none is a drop)."""
        record.delivery.pending += count - 1

    def release(self, records: list[Record]) -> list[JsMsg]:
        """Records that end without a sink (a filter dropped them, a flat_map made none):
        their messages are acked once nothing else is outstanding. The messages to ack now."""
        self.stats.dropped += len(records)
        return self._settle(records)

    def committed(self, records: list[Record], skipped: int = 0) -> list[JsMsg]:
        """A sink committed these records, ``skipped`` of them by finding them committed
        already (``Batch.skipped``). The messages to ack now."""
        self.stats.records_out += len(records) - skipped
        self.stats.records_skipped += skipped
        return self._settle(records)

    def _settle(self, records: list[Record]) -> list[JsMsg]:
        ready: list[JsMsg] = []
        in_flight = self.in_flight
        for record in records:
            delivery = record.delivery
            delivery.pending -= 1
            if delivery.pending <= 0 and not delivery.done:
                delivery.done = True
                group = delivery.group
                if group is None:  # a stateful operator's result: no message to ack
                    if isinstance(delivery, ResultDelivery):
                        self.settled_results.append((delivery, True))
                    continue
                group.leave()
                ready.append(delivery.msg)
                in_flight[delivery.source] -= 1
        if ready:
            self.stats.acks += len(ready)
            self.stats.ack_pending -= len(ready)
            self._forget_settled()
        return ready

    def _forget_settled(self) -> None:
        groups = self._groups
        oldest = self._oldest
        while groups and groups[0].open <= 0:
            gone = groups.popleft()
            if oldest and oldest[0] is gone:
                oldest.popleft()

    def nak_delay(self, delivered: int) -> float:
        """The delay of the nak of a message delivered ``delivered`` times: ``nak_delay``
        doubled at each delivery after the first, up to ``nak_delay_max``."""
        policy = self.redelivery
        delay: float = min(policy.nak_delay * 2 ** min(delivered - 1, 30), policy.nak_delay_max)
        return delay

    def failed(
        self, records: list[Record], error: BaseException, *, poison: bool = False
    ) -> Failed:
        """Processing these records failed: nak their messages (or, past ``max_deliveries``,
        treat them as poison). ``poison``: they are poison now, whatever their delivery count
        (a delivery would not bring them back: see ``SinkStage._attempt``)."""
        naks: list[tuple[JsMsg, float]] = []
        poison_now: list[Delivery] = []
        max_deliveries = self.redelivery.max_deliveries
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
                if isinstance(delivery, ResultDelivery):
                    self.settled_results.append((delivery, False))
                poison_now.append(delivery)
                continue
            delivery.group.leave()
            self.stats.ack_pending -= 1
            self.in_flight[delivery.source] -= 1
            msg = delivery.msg
            delivered = msg.metadata.num_delivered
            if poison or delivered >= max_deliveries:
                poison_now.append(delivery)
                continue
            naks.append((msg, self.nak_delay(delivered)))
        self.stats.naks += len(naks)
        if poison_now:
            for delivery in poison_now:
                self.poison_pending[id(delivery)] = delivery
            self._poison_queue.append(Poison(poison_now, error))
        self._forget_settled()
        return Failed(naks, poison_now)

    def abandon_all(self) -> list[JsMsg]:
        """Every message held, to nak without a delay (the pipeline is giving up: a sink
        outage past its deadline): they are delivered again, here or to another worker, and
        none is terminated. Poison messages still to dead-letter are not among them: naked,
        one that is poison at once (records on both sides of a sink's ``RecordsRejected``)
        would come back to a sink that skips it as committed, and its rejected records be
        acked unwritten; left alone, it stays pending on the server for its driver, or comes
        back after its ack wait."""
        naked: list[JsMsg] = []
        in_flight = self.in_flight
        for group in self._groups:
            for delivery in group.deliveries:
                if delivery.done:
                    continue
                delivery.done = True
                group.leave()
                in_flight[delivery.source] -= 1
                naked.append(delivery.msg)
        self.stats.naks += len(naked)
        self.stats.ack_pending -= len(naked)
        self._forget_settled()
        return naked

    def take_settled_results(self) -> list[tuple[ResultDelivery, bool]]:
        """The results settled since the last call (see :attr:`settled_results`), forgotten
        here."""
        settled, self.settled_results = self.settled_results, []
        return settled

    # -- poison messages -------------------------------------------------------------------

    def take_poison(self) -> Poison | None:
        """The oldest poison job not taken yet, if any. Its deliveries stay in
        :attr:`poison_pending` (kept alive) until each is :meth:`poison_settled`."""
        return self._poison_queue.popleft() if self._poison_queue else None

    def poison_settled(self, delivery: Delivery) -> None:
        """The driver is done with a poison delivery: copied and terminated, naked again, or
        given up on (its time ran out: the server delivers it again after its ack wait). No
        more +WPI for it."""
        self.poison_pending.pop(id(delivery), None)

    def copied_already(self, msg: JsMsg) -> bool:
        """Whether ``msg`` was dead-lettered lately: a delivery that came again before its
        +TERM landed, to terminate without a second copy."""
        meta = msg.metadata
        return (meta.stream, meta.stream_seq) in self._dead_lettered

    def dead_lettered(self, msg: JsMsg) -> None:
        """``msg``'s copy is stored in the dead letter (its +TERM comes next): counted, and
        remembered (the latest :data:`REMEMBERED_DEAD_LETTERS`)."""
        self.stats.dead_lettered += 1
        meta = msg.metadata
        remembered = self._dead_lettered
        remembered[meta.stream, meta.stream_seq] = None
        while len(remembered) > REMEMBERED_DEAD_LETTERS:
            del remembered[next(iter(remembered))]

    # -- +WPI ------------------------------------------------------------------------------

    def scan(self, now: float, late: float = 0.0) -> InProgressDue:
        """The +WPI due at ``now``, by a scan that woke ``late`` seconds after its time (which
        sets :attr:`margin`: a late scan makes the next ones due early). The held messages
        returned count as kept alive at ``now``."""
        self.margin = min(self.scan_interval(), max(self.margin / 2, 2 * late))
        # Due by then: sent now (see margin).
        due = now + self.margin
        buffered_before = {source: due - wait / 2 for source, wait in self.ack_wait.items()}
        msgs: list[JsMsg] = []
        for group in self._groups:
            if group.open <= 0:
                continue
            half = self.half_ack_wait(group.deliveries[0].source)
            if due - group.received < half:
                continue  # (not a break: sources' groups interleave, with their own ack_waits)
            open_ = [d for d in group.deliveries if not d.done]
            group.deliveries = open_  # keep only what is still in flight
            for delivery in open_:
                if due >= delivery.wpi_at:
                    msgs.append(delivery.msg)
                    delivery.wpi_at = now + half
        for delivery in self.poison_pending.values():
            half = self.half_ack_wait(delivery.source)
            if due - delivery.received >= half and due >= delivery.wpi_at:
                msgs.append(delivery.msg)
                delivery.wpi_at = now + half
        self.stats.in_progress += len(msgs)
        return InProgressDue(msgs, buffered_before)
