"""The ack ledger (``pipeline/ack_ledger.py``) without I/O: no server, no trio, fake messages.

A few exact cases first (a fork to two sinks, a failure past ``max_deliveries``, a held
redelivery merged), then a state machine in which a model server delivers messages, delivers
again what was naked and what was held past its ack wait, stages fork, expand, release, commit
and fail records, the pipeline gives up, time passes and the +WPI scan runs, while the
invariants are checked after every step (like the pull flow's machine in
tests/jetstream/test_pull_flow.py). Last, the ack tracker driving the ledger, with poison jobs
beyond its inbox of one.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import attrs
import pytest
import trio
from headrace.pipeline import ack_ledger
from headrace.pipeline.ack_ledger import AckLedger
from headrace.pipeline.ack_tracker import INBOX_SIZE, AckTracker
from headrace.pipeline.record import Delivery, Record, ResultDelivery
from headrace.pipeline.stats import PipelineStats
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

DEFAULT_ACK_WAIT = 30.0


@attrs.define
class Meta:
    stream: str
    stream_seq: int
    num_delivered: int
    num_pending: int = 0
    consumer: str = "C"
    timestamp: float = 0.0


@attrs.define
class Body:
    data: bytes


class FakeMsg:
    """One delivery of a message, as the ledger reads it, counting what is sent on it (the
    ledger answers; the test sends, as the tracker does)."""

    def __init__(self, stream: str, seq: int, delivered: int = 1, pending: int = 0) -> None:
        self.metadata = Meta(stream, seq, delivered, pending)
        self.subject = f"in.{stream}.{seq}"
        self.msg = Body(b"%d" % seq)
        self.data = self.msg.data
        self.headers = None
        self.acks = 0
        self.naks: list[float | None] = []  # the delays
        self.terms = 0
        self.wpis = 0

    def __repr__(self) -> str:
        meta = self.metadata
        return f"<FakeMsg {meta.stream}#{meta.stream_seq} x{meta.num_delivered}>"

    @property
    def key(self) -> tuple[str, int]:
        return self.metadata.stream, self.metadata.stream_seq

    # (What the tracker calls.)
    def nak_nowait(self, delay: float | None = None) -> bool:
        self.naks.append(delay)
        return True

    def term_nowait(self, reason: str | None = None) -> bool:
        self.terms += 1
        return True

    def in_progress_nowait(self) -> bool:
        self.wpis += 1
        return True


@attrs.frozen
class Settings:
    max_deliveries: int = 3
    nak_delay: float = 1.0
    nak_delay_max: float = 4.0
    # (For the tracker.)
    name: str = "p"
    dead_letter: str | None = None


class Boom(Exception):
    pass


def ledger(**settings: Any) -> AckLedger:
    made = AckLedger(PipelineStats(), Settings(**settings), default_ack_wait=DEFAULT_ACK_WAIT)
    made.learn_ack_wait("A", 4.0)
    return made


def msgs(*seqs: int, delivered: int = 1, stream: str = "S") -> list[Any]:
    return [FakeMsg(stream, seq, delivered) for seq in seqs]


# -- exact cases --------------------------------------------------------------------------------


def test_a_fork_to_two_sinks_acks_only_after_both_commit():
    book = ledger()
    (record,) = book.admit(msgs(1), "A", now=0.0)
    book.forked([record], 2)
    assert book.committed([record]) == []
    assert book.in_flight == {"A": 1}
    assert book.committed([record]) == [record.delivery.msg]
    assert book.in_flight == {"A": 0} and book.stats.acks == 1 and book.stats.ack_pending == 0
    assert list(book.held()) == []
    assert book.committed([record]) == [], "acked twice"


def test_an_expansion_waits_for_every_record_and_a_drop_counts():
    book = ledger()
    (record,) = book.admit(msgs(1), "A", now=0.0)
    book.expanded(record, 3)
    parts = [record.derive(n) for n in range(3)]
    assert book.committed(parts[:2]) == []
    assert book.release(parts[2:]) == [record.delivery.msg]
    assert (book.stats.records_out, book.stats.dropped) == (2, 1)


def test_a_failure_past_max_deliveries_is_poison_kept_alive_until_settled():
    book = ledger(max_deliveries=3, nak_delay=1.0, nak_delay_max=4.0)
    records = book.admit(msgs(1, delivered=1) + msgs(2, delivered=2), "A", now=0.0)
    failed = book.failed(records, Boom())
    # A nak per message, its delay doubling with the delivery count; nothing is poison yet.
    assert failed.naks == [(records[0].delivery.msg, 1.0), (records[1].delivery.msg, 2.0)]
    assert failed.poison == [] and book.take_poison() is None
    (record,) = book.admit(msgs(2, delivered=3), "A", now=1.0)
    failed = book.failed([record], Boom())
    assert failed.naks == [] and failed.poison == [record.delivery]
    assert book.in_flight == {"A": 0} and book.stats.ack_pending == 0
    assert book.stats.naks == 2
    # Waiting to be dead-lettered, it is kept alive like a held message.
    assert book.poison_waiting and list(book.poison_pending.values()) == [record.delivery]
    assert book.scan(2.9).msgs == []
    assert book.scan(3.0).msgs == [record.delivery.msg]
    job = book.take_poison()
    assert job is not None and job.deliveries == [record.delivery]
    assert not book.poison_waiting and book.take_poison() is None
    assert not book.copied_already(record.delivery.msg)
    book.dead_lettered(record.delivery.msg)
    assert book.copied_already(record.delivery.msg) and book.stats.dead_lettered == 1
    book.poison_settled(record.delivery)
    assert book.poison_pending == {} and book.scan(100.0).msgs == []


def test_the_nak_delay_is_capped():
    book = ledger(nak_delay=1.0, nak_delay_max=60.0)
    assert [book.nak_delay(n) for n in (1, 2, 3, 7, 8, 1000)] == [1, 2, 4, 60, 60, 60]


def test_a_poison_flag_makes_poison_at_once():
    book = ledger()
    (record,) = book.admit(msgs(1), "A", now=0.0)
    assert book.failed([record], Boom(), poison=True).poison == [record.delivery]


def test_a_redelivery_of_a_held_message_is_merged_after_half_an_ack_wait():
    book = ledger()  # A: ack_wait 4
    (held,) = book.admit(msgs(1), "A", now=0.0)
    # Before half an ack wait nothing held can have come again: not looked for.
    assert len(book.admit(msgs(9, delivered=2), "A", now=1.0)) == 1
    again = FakeMsg("S", 1, delivered=2)
    records = book.admit([again, *msgs(2)], "A", now=5.0)
    assert [r.delivery.msg.key for r in records] == [("S", 2)]
    assert held.delivery.msg is again, "the held delivery answers for the newest one"
    assert book.stats.redelivered_held == 1 and book.stats.messages_in == 3
    assert book.in_flight == {"A": 3}
    # The +WPI it missed is sent a quarter ack wait early from now on.
    assert book.margin == book.scan_interval() == 1.0
    # Its +WPI clock starts again with the redelivery.
    assert again not in book.scan(5.5, late=0.0).msgs
    assert book.committed([held]) == [again]
    # A delivery no newer than the one held (the server sends none) is not merged.
    (newer,) = book.admit(msgs(5, delivered=3), "A", now=20.0)
    assert len(book.admit(msgs(5, delivered=3), "A", now=30.0)) == 1
    assert newer.delivery.msg.metadata.num_delivered == 3


def test_abandon_all_naks_what_is_held_but_leaves_poison_to_its_handler():
    book = ledger()
    a, b, c = book.admit(msgs(1, 2, 3), "A", now=0.0)
    assert book.committed([a]) == [a.delivery.msg]
    book.failed([b], Boom(), poison=True)
    assert book.abandon_all() == [c.delivery.msg]
    assert book.in_flight == {"A": 0} and book.stats.ack_pending == 0
    assert book.take_poison() is not None
    assert book.committed([c]) == [], "an abandoned message acked"


def test_a_scan_says_from_when_each_consume_buffer_keeps_alive_and_a_late_scan_sets_the_margin():
    book = ledger()
    book.learn_ack_wait("B", 10.0)
    found = book.scan(100.0, late=0.25)
    assert book.margin == 0.5  # twice the lateness ...
    assert found.buffered_before == {"A": 100.5 - 2.0, "B": 100.5 - 5.0}
    book.scan(101.0, late=3.0)
    assert book.margin == book.scan_interval() == 1.0  # ... up to a quarter ack wait,
    book.scan(102.0)
    assert book.margin == 0.5  # halved at each scan on time


class Owner:
    def __init__(self) -> None:
        self.settled: list[tuple[int, bool]] = []

    def result_settled(self, seq: int, *, committed: bool) -> None:
        self.settled.append((seq, committed))


def test_a_stateful_result_settles_to_its_owner_not_to_an_ack():
    book = ledger()
    owner = Owner()
    one = Record("r1", ResultDelivery(FakeMsg("p.op", 1), 0.0, "op", owner, 1))  # type: ignore[arg-type]
    two = Record("r2", ResultDelivery(FakeMsg("p.op", 2), 0.0, "op", owner, 2))  # type: ignore[arg-type]
    assert book.committed([one]) == []
    assert book.settled_results == [(one.delivery, True)]
    failed = book.failed([two], Boom())
    assert failed.poison == [two.delivery], "a result cannot come again: poison at once"
    assert book.take_settled_results() == [(one.delivery, True), (two.delivery, False)]
    assert book.settled_results == [] and book.in_flight == {} and book.stats.ack_pending == 0


def test_dead_letters_are_remembered_up_to_a_bound(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(ack_ledger, "REMEMBERED_DEAD_LETTERS", 3)
    book = ledger()
    for msg in msgs(1, 2, 3, 4):
        book.dead_lettered(msg)
    assert [book.copied_already(m) for m in msgs(1, 2, 3, 4)] == [False, True, True, True]


# -- the state machine --------------------------------------------------------------------------

#: The sources and their consumers' ack waits (B's learned or not: then the default); each
#: source reads its own stream. Every time is a binary fraction, so that the test's arithmetic
#: and the ledger's agree to the last bit.
SOURCES = {"A": 4.0, "B": 10.0}
MAX_DELIVERIES = 2  # (low, so that messages reach it in a few steps)


def stream(source: str) -> str:
    return "S" + source


class LedgerMachine(RuleBasedStateMachine):
    """The ledger between a model server and model stages.

    The server delivers new messages, delivers again each naked one, and delivers again a held
    one once its ack wait has run out since it was last kept alive. The stages hold records
    (``live``: one entry per copy a stage holds), fork, expand, release, commit and fail them;
    the test sends what the ledger answers, counting it on the fake messages.
    """

    def __init__(self) -> None:
        super().__init__()
        self.stats = PipelineStats()
        self.ledger = AckLedger(
            self.stats, Settings(max_deliveries=MAX_DELIVERIES), default_ack_wait=DEFAULT_ACK_WAIT
        )
        self.now = 100.0
        self.live: list[Record] = []
        self.deliveries: list[Delivery] = []
        self.by_msg: dict[int, Delivery] = {}  # id(FakeMsg) -> the delivery it answers for
        self.history: dict[int, list[FakeMsg]] = {}  # id(delivery) -> its messages, oldest first
        #: When each delivery's ack wait last started (taken, delivered again, kept alive).
        self.alive_at: dict[int, float] = {}
        self.failed_ids: set[int] = set()
        self.poisoned: set[int] = set()
        self.pending_poison: set[int] = set()  # poisoned, not yet settled by its handler
        self.poison_jobs: deque[list[int]] = deque()
        self.latest: dict[tuple[str, int], int] = {}  # the server's delivery count per message
        self.waiting: list[tuple[str, int]] = []  # naked: the server delivers them again
        self.next_seq = dict.fromkeys(SOURCES, 1)
        self.merged = 0
        self.naked = 0
        #: Messages the tracker copied to the dead letter (their +TERM may have been lost).
        self.copied: set[tuple[str, int]] = set()

    @initialize(learn_b=st.booleans(), first=st.integers(1, 4))
    def bind(self, learn_b: bool, first: int) -> None:
        """The sources bind (B's ack wait learned or not), and A takes its first messages."""
        self.ledger.learn_ack_wait("A", SOURCES["A"])
        if learn_b:
            self.ledger.learn_ack_wait("B", SOURCES["B"])
        self.admit("A", [self.new_msg("A") for _ in range(first)], None, {})

    # -- helpers --------------------------------------------------------------------------------

    def ack_wait(self, source: str) -> float:
        return self.ledger.ack_wait.get(source, DEFAULT_ACK_WAIT)

    def held(self) -> list[Delivery]:
        return [d for d in self.deliveries if not d.done]

    def outstanding(self, delivery: Delivery) -> int:
        return sum(1 for r in self.live if r.delivery is delivery)

    def take(self, data: st.DataObject) -> list[Record]:
        """Some records the stages hold, taken out of ``live``."""
        picks = data.draw(
            st.lists(st.integers(0, len(self.live) - 1), min_size=1, max_size=6, unique=True)
        )
        records = [self.live[i] for i in picks]
        for i in sorted(picks, reverse=True):
            del self.live[i]
        return records

    def sent_nak(self, msg: FakeMsg) -> None:
        self.naked += 1
        self.waiting.append(msg.key)

    # -- the server -----------------------------------------------------------------------------

    @rule(
        source=st.sampled_from(["A", "A", "B"]),  # (A's short ack wait runs out more often)
        new=st.integers(0, 3),
        buffered=st.sampled_from([None, 0.5, 3.0]),
        due=st.booleans(),
        data=st.data(),
    )
    def deliver(
        self, source: str, new: int, buffered: float | None, due: bool, data: st.DataObject
    ) -> None:
        """New messages, redeliveries of naked ones and of held ones whose ack wait ran out
        (``due``: all of those, else some), in any order; ``buffered``: the batch's oldest
        message waited that long in a consume buffer (its ``since``), while a redelivery in it
        may have come just now (3 s is over half of A's ack wait: the merge must not look at
        ``since``)."""
        since = None if buffered is None else self.now - buffered
        mine = stream(source)
        naked = [k for k in self.waiting if k[0] == mine]
        expired = [
            d
            for d in self.held()
            # the server sent them by now; the batch's own ``since`` may be older (it is its
            # oldest arrival)
            if d.source == source and self.now - self.alive_at[id(d)] >= self.ack_wait(source)
        ]
        again, lapsed = naked, expired
        if not due:
            again = data.draw(st.lists(st.sampled_from(naked), unique=True)) if naked else []
            lapsed = data.draw(st.lists(st.sampled_from(expired), unique=True)) if expired else []
        batch: list[FakeMsg] = []
        for key in again:
            self.waiting.remove(key)
        for key in [*again, *(d.msg.key for d in lapsed)]:
            self.latest[key] += 1
            batch.append(FakeMsg(*key, self.latest[key]))
        batch.extend(self.new_msg(source) for _ in range(new))
        batch = data.draw(st.permutations(batch))
        self.admit(source, batch, since, {d.msg.key: d for d in lapsed})

    def new_msg(self, source: str) -> FakeMsg:
        key = (stream(source), self.next_seq[source])
        self.next_seq[source] += 1
        self.latest[key] = 1
        return FakeMsg(*key)

    def admit(
        self,
        source: str,
        batch: list[FakeMsg],
        since: float | None,
        lapsed_keys: dict[tuple[str, int], Delivery],
    ) -> None:
        """``batch`` admitted; ``lapsed_keys``: the held deliveries it delivers again."""
        start = self.now if since is None else since
        for msg in batch:
            msg.metadata.num_pending = 7
        in_flight = self.ledger.in_flight.get(source, 0)

        records = self.ledger.admit(batch, source, self.now, since)  # type: ignore[arg-type]

        taken = [m for m in batch if m.key not in lapsed_keys]
        assert [r.delivery.msg for r in records] == taken, "a held message taken again"
        assert [r.value for r in records] == [m.msg.data for m in taken]
        for record in records:
            delivery = record.delivery
            assert delivery.received == start and delivery.source == source
            self.deliveries.append(delivery)
            self.by_msg[id(delivery.msg)] = delivery
            self.history[id(delivery)] = [delivery.msg]  # type: ignore[list-item]
            self.alive_at[id(delivery)] = start
            self.live.append(record)
        for msg in batch:
            if msg.key in lapsed_keys:
                holder = lapsed_keys[msg.key]
                assert holder.msg is msg, "the held delivery answers for the newest one"
                self.by_msg[id(msg)] = holder
                self.history[id(holder)].append(msg)
                self.alive_at[id(holder)] = self.now
                self.merged += 1
        if lapsed_keys:
            event("a held message delivered again, merged")
            assert self.ledger.margin == self.ledger.scan_interval()
        assert self.ledger.in_flight[source] == in_flight + len(records)
        if batch:
            assert self.stats.lag == 7

    @rule(seconds=st.sampled_from([0.25, 1.0, 2.0, 4.0, 6.0, 12.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    # -- the stages -----------------------------------------------------------------------------

    @precondition(lambda self: self.live)
    @rule(copies=st.integers(2, 3), data=st.data())
    def fork(self, copies: int, data: st.DataObject) -> None:
        records = self.take(data)
        self.ledger.forked(records, copies)
        self.live.extend(records * copies)

    @precondition(lambda self: self.live)
    @rule(count=st.integers(1, 3), data=st.data())
    def expand(self, count: int, data: st.DataObject) -> None:
        record = self.live.pop(data.draw(st.integers(0, len(self.live) - 1)))
        self.ledger.expanded(record, count)
        self.live.extend(record.derive((record.value, n)) for n in range(count))

    @precondition(lambda self: self.live)
    @rule(commit=st.booleans(), data=st.data())
    def settle(self, commit: bool, data: st.DataObject) -> None:
        """A sink commits records (some skipped), or a filter drops them."""
        records = self.take(data)
        before = {id(d) for d in self.held()}
        if commit:
            skipped = data.draw(st.integers(0, len(records)))
            acks = self.ledger.committed(records, skipped)
        else:
            acks = self.ledger.release(records)
        for msg in acks:
            msg.acks += 1  # type: ignore[attr-defined]
        acked = [self.by_msg[id(m)] for m in acks]
        expected = {
            id(r.delivery)
            for r in records
            if id(r.delivery) in before and self.outstanding(r.delivery) == 0
        }
        assert len({id(d) for d in acked}) == len(acked), "a message acked twice in one call"
        assert {id(d) for d in acked} == expected, "acked early, or not once all settled"
        for delivery, msg in zip(acked, acks, strict=True):
            assert delivery.msg is msg, "acked on an older delivery"
            if len(self.history[id(delivery)]) > 1:
                event("a merged message acked")

    @precondition(lambda self: self.live)
    @rule(poison=st.sampled_from([False, False, False, True]), data=st.data())
    def fail(self, poison: bool, data: st.DataObject) -> None:
        records = self.take(data)
        before = {id(d) for d in self.held()}
        outcome = self.ledger.failed(records, Boom(), poison=poison)
        self.failed_ids |= {id(r.delivery) for r in records}
        fresh = {id(r.delivery): r.delivery for r in records if id(r.delivery) in before}
        to_poison = {
            i for i, d in fresh.items() if poison or d.msg.metadata.num_delivered >= MAX_DELIVERIES
        }
        assert {id(d) for d in outcome.poison} == to_poison
        assert {id(self.by_msg[id(m)]) for m, _ in outcome.naks} == set(fresh) - to_poison
        assert len(outcome.naks) + len(outcome.poison) == len(fresh)
        for msg, delay in outcome.naks:
            delivered = msg.metadata.num_delivered
            assert delay == min(1.0 * 2 ** (delivered - 1), 4.0)
            msg.nak_nowait(delay)
            self.sent_nak(msg)
        if any(d.msg.metadata.num_delivered >= MAX_DELIVERIES for d in outcome.poison):
            event("poison by its delivery count")
        if outcome.poison:
            self.poisoned |= to_poison
            self.pending_poison |= to_poison
            self.poison_jobs.append([id(d) for d in outcome.poison])

    @precondition(lambda self: self.ledger.poison_waiting)
    @rule(data=st.data())
    def handle_poison(self, data: st.DataObject) -> None:
        """What the tracker does with a poison job: copy and terminate each message, or nak
        it when its copy was refused, or give up when its time ran out."""
        job = self.ledger.take_poison()
        assert job is not None
        assert [id(d) for d in job.deliveries] == self.poison_jobs.popleft()
        for delivery in job.deliveries:
            assert id(delivery) in self.ledger.poison_pending
            msg = delivery.msg
            if msg.key in self.copied:
                # Copied before, its +TERM lost, delivered again and poison again: terminated
                # without a second copy.
                assert self.ledger.copied_already(msg)
                msg.term_nowait()
                event("a message copied before is terminated, not copied again")
            else:
                assert not self.ledger.copied_already(msg)
                ending = data.draw(
                    st.sampled_from(["copied", "copied, +TERM lost", "refused", "timed out"])
                )
                if ending.startswith("copied"):
                    self.ledger.dead_lettered(msg)
                    self.copied.add(msg.key)
                    assert self.ledger.copied_already(msg)
                if ending == "copied":
                    msg.term_nowait()
                else:  # naked, or left to come back after its ack wait: either way, again
                    self.waiting.append(msg.key)
            self.ledger.poison_settled(delivery)
            self.pending_poison.discard(id(delivery))

    @rule()
    def abandon_all(self) -> None:
        held = self.held()
        naked = self.ledger.abandon_all()
        assert [id(self.by_msg[id(m)]) for m in naked] == [id(d) for d in held]
        assert naked == [d.msg for d in held]
        for msg in naked:
            msg.nak_nowait()
            self.sent_nak(msg)
        assert not any(self.ledger.in_flight.values())

    # -- +WPI -----------------------------------------------------------------------------------

    @rule(
        seconds=st.sampled_from([0.0, 1.0, 2.0]), late=st.sampled_from([0.0, 0.0, 0.125, 0.5, 2.0])
    )
    def scan(self, seconds: float, late: float) -> None:
        """The +WPI scan, ``seconds`` after the last step, ``late`` after its time."""
        self.now += seconds
        found = self.ledger.scan(self.now, late)
        margin = self.ledger.margin
        assert 0 <= margin <= self.ledger.scan_interval()
        due = self.now + margin
        assert found.buffered_before == {
            s: due - wait / 2 for s, wait in self.ledger.ack_wait.items()
        }
        sent = {id(m) for m in found.msgs}
        assert len(sent) == len(found.msgs), "two +WPI for one message in one scan"
        kept = self.held() + list(self.ledger.poison_pending.values())
        expected = 0
        for delivery in kept:
            is_due = due - self.alive_at[id(delivery)] >= self.ack_wait(delivery.source) / 2
            assert (id(delivery.msg) in sent) == is_due, (delivery, is_due)
            if is_due:
                expected += 1
                delivery.msg.in_progress_nowait()
                self.alive_at[id(delivery)] = self.now
        assert expected == len(found.msgs), "+WPI for a message not held"
        if expected:
            event("+WPI due")

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def every_message_ends_once(self) -> None:
        for delivery in self.deliveries:
            msg = delivery.msg
            ends = msg.acks + len(msg.naks) + (id(delivery) in self.poisoned)
            assert ends == (1 if delivery.done else 0), (delivery, ends)
            if id(delivery) in self.failed_ids:
                assert msg.acks == 0, "a message with a failed record acked"
            history = self.history[id(delivery)]
            assert history[-1] is msg
            for older in history[:-1]:
                assert (older.acks, older.naks) == (0, []), "sent on an older delivery"

    @invariant()
    def counts_agree(self) -> None:
        held = self.held()
        for source in SOURCES:
            mine = sum(1 for d in held if d.source == source)
            assert self.ledger.in_flight.get(source, 0) == mine
        assert [id(d) for d in self.ledger.held()] == [id(d) for d in held]
        keys = [d.msg.key for d in held]
        assert len(set(keys)) == len(keys), "one message held twice"
        stats = self.stats
        assert stats.ack_pending == len(held)
        assert stats.messages_in == len(self.deliveries)
        assert stats.acks == sum(d.msg.acks for d in self.deliveries)
        assert stats.naks == self.naked
        assert stats.redelivered_held == self.merged
        assert set(self.ledger.poison_pending) == self.pending_poison
        assert self.ledger.poison_waiting == bool(self.poison_jobs)
        assert 0 <= self.ledger.margin <= self.ledger.scan_interval()


TestLedgerMachine = LedgerMachine.TestCase


# -- the tracker drives it ------------------------------------------------------------------------


class FakeJetStream:
    def __init__(self, refuse: frozenset[int] = frozenset()) -> None:
        self.published: list[tuple[str, bytes, dict[str, str]]] = []
        self.refuse = refuse
        #: Set: publishes go through at once; else each waits for it (a slow dead letter).
        self.gate = trio.Event()
        self.gate.set()
        self.publishing = trio.Event()

    async def find_stream(self, subject: str) -> str:
        return "DLQ"

    async def publish(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        from headrace.jetstream.errors import JetStreamError

        self.publishing.set()
        await self.gate.wait()
        await trio.lowlevel.checkpoint()
        if int(headers["Headrace-Stream-Seq"]) in self.refuse:
            raise JetStreamError("refused")
        self.published.append((subject, data, headers))


async def test_poison_beyond_the_trackers_inbox_is_all_dead_lettered_or_naked():
    """Failures are told synchronously and the inbox holds one wake-up: 40 poison jobs told
    before the tracker's task runs are all taken from the ledger, none lost."""
    assert INBOX_SIZE == 1
    js = FakeJetStream(refuse={7})
    tracker = AckTracker(Settings(dead_letter="dlq"), js, PipelineStats())  # type: ignore[arg-type]
    tracker.learn_ack_wait("A", 4.0)
    fakes = msgs(*range(1, 41), delivered=Settings().max_deliveries)
    records = tracker.admit(fakes, "A")
    for record in records:
        tracker.failed([record], Boom("bad"), "op", "op")
    assert tracker.ledger.poison_waiting and len(tracker.ledger.poison_pending) == 40
    async with trio.open_nursery() as nursery:
        await tracker.start(nursery)
        with trio.fail_after(5):
            while tracker.ledger.poison_pending:
                await tracker.changed().wait()  # set as each one is settled
        tracker.stop()
    assert sorted(int(h["Headrace-Stream-Seq"]) for _, _, h in js.published) == [
        n for n in range(1, 41) if n != 7
    ]
    assert [(m.terms, len(m.naks)) for m in fakes] == [
        (0, 1) if m.metadata.stream_seq == 7 else (1, 0) for m in fakes
    ]
    stats = tracker.stats
    assert (stats.dead_lettered, stats.terms, stats.naks) == (39, 39, 1)
    assert tracker.in_flight == {"A": 0} and stats.ack_pending == 0


async def test_a_stop_takes_effect_between_poison_jobs_and_loses_none():
    """A stop while poison jobs wait, the first one's dead letter slow: that job ends whole
    (its copy stored, then its +TERM: shielded), the tracker stops before the next one, and
    the rest stay in the ledger, neither terminated nor naked: the server delivers them again
    after their ack wait, and the next run dead-letters them."""
    js = FakeJetStream()
    js.gate = trio.Event()  # the dead letter waits
    tracker = AckTracker(Settings(dead_letter="dlq"), js, PipelineStats())  # type: ignore[arg-type]
    tracker.learn_ack_wait("A", 4.0)
    fakes = msgs(*range(1, 6), delivered=Settings().max_deliveries)
    for record in tracker.admit(fakes, "A"):
        tracker.failed([record], Boom("bad"), "op", "op")
    async with trio.open_nursery() as nursery:
        await tracker.start(nursery)
        with trio.fail_after(5):
            await js.publishing.wait()  # the first job is in its dead-letter publish
            tracker.stop()
            js.gate.set()
            await tracker.wait_stopped()
    assert [int(h["Headrace-Stream-Seq"]) for _, _, h in js.published] == [1]
    assert [(m.terms, len(m.naks)) for m in fakes] == [(1, 0)] + [(0, 0)] * 4
    assert len(tracker.ledger.poison_pending) == 4
