"""Leases on partitions (headrace.state.leases).

The decisions (LeaseTable) are checked by simulation: workers run the same step as the driver
(hand over, say they are alive, read, plan, write by compare-and-set, settle) against a fake KV
that keeps one record per key and refuses a write on a stale revision, on a shared clock, with
reads and writes of one step split apart at random (a worker that read, stalled and wrote
late), workers stalling, dying and joining. At every instant no partition is owned by two
workers, and what a worker owns KV says is its own; after quiet rounds every partition is owned
once and the counts differ by at most one, and nothing moves any more.

The driver (PartitionLeases) runs against a real nats-server: convergence of two and three
workers, a stalled worker's partitions taken over after the ttl, release_all handing over at
once, a stale worker's renewal refused, the run loop with its callback.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import attrs
import pytest
import trio
from headrace.jetstream import JetStream
from headrace.nats import connect
from headrace.state import LeaseChanges, LeaseError, LeaseTable, PartitionLeases
from headrace.state.leases import (
    DEFAULT_LEASE_BUCKET,
    Lease,
    LeaseView,
    check_ttl,
    fair_shares,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PROPERTY = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: The simulation costs about 6 ms an example: at most 500 of them, whatever the profile.
SIMULATION = settings(PROPERTY, max_examples=min(settings().max_examples, 500))
TTL = 3.0
PERIOD = TTL / 3


# -- fair shares ------------------------------------------------------------------------------


@PROPERTY
@given(
    counts=st.dictionaries(st.sampled_from("abcdefg"), st.integers(0, 20), min_size=1),
    partitions=st.integers(1, 64),
)
def test_fair_shares_add_up_differ_by_one_and_favour_who_holds_most(counts, partitions):
    shares = fair_shares(counts, partitions)
    assert set(shares) == set(counts)
    assert sum(shares.values()) == partitions
    assert max(shares.values()) - min(shares.values()) <= 1
    for a in counts:
        for b in counts:
            if counts[a] > counts[b]:
                assert shares[a] >= shares[b]


def test_fair_shares_leave_a_balanced_split_as_it_is():
    assert fair_shares({"a": 2, "b": 3, "c": 2}, 7) == {"a": 2, "b": 3, "c": 2}
    assert fair_shares({"a": 0, "b": 0, "c": 0}, 8) == {"a": 3, "b": 3, "c": 2}


# -- the table, by example --------------------------------------------------------------------


def lease(owner: str, expires: float, revision: int = 1) -> Lease:
    return Lease(owner, expires, revision)


def test_validation():
    with pytest.raises(ValueError, match="ttl"):
        LeaseTable(4, "a", ttl=0)
    for bad in (-1.0, math.inf, math.nan, True):
        with pytest.raises(ValueError, match="ttl"):
            check_ttl(bad)
    with pytest.raises(ValueError, match="partitions"):
        LeaseTable(0, "a")
    with pytest.raises(ValueError, match="id"):
        LeaseTable(4, "")


def test_alone_a_worker_takes_every_free_or_expired_partition():
    table = LeaseTable(4, "a", ttl=10)
    plan = table.plan(100.0, {1: lease("b", 99.0), 2: None})
    assert plan.acquire == (0, 1, 2, 3)
    assert plan.renew == plan.give_up == ()


def test_renewal_once_a_third_of_the_ttl_has_passed():
    table = LeaseTable(2, "a", ttl=9)
    table.plan(0.0, {})
    table.won(0, 5, now=0.0)
    table.won(1, 6, now=1.0)
    leases = {0: lease("a", 9.0, 5), 1: lease("a", 10.0, 6)}
    assert table.plan(2.9, leases).renew == ()
    assert table.plan(3.0, leases).renew == (0,)
    assert table.plan(4.0, leases).renew == (0, 1)
    assert table.owned(8.9) == {0, 1}
    assert table.owned(9.0) == {1}


def test_a_newcomer_makes_the_holder_give_up_its_highest_partitions():
    table = LeaseTable(8, "a", ttl=10)
    mine = {p: lease("a", 10.0, p + 1) for p in range(8)}
    for p in range(8):
        table.won(p, p + 1, now=0.0)
    assert table.changes(1.0).gained == set(range(8))
    # b is known only from its member record: it holds nothing yet.
    plan = table.plan(1.0, mine, {"b": 11.0})
    assert plan.give_up == (7, 6, 5, 4)
    assert table.owned(1.0) == {0, 1, 2, 3}
    assert set(table.yielding) == {4, 5, 6, 7}
    changes = table.changes(1.0)
    assert changes.lost == {4, 5, 6, 7} and changes.kept == {0, 1, 2, 3}
    # The next plan (before the hand-over) neither gives up more nor takes them back.
    again = table.plan(2.0, mine, {"b": 12.0})
    assert again.give_up == again.acquire == ()
    for p in (4, 5, 6, 7):
        table.handed_over(p)
    assert table.yielding == {}


def test_without_a_member_record_an_idle_worker_is_unknown():
    table = LeaseTable(4, "a", ttl=10)
    leases = {p: lease("a", 10.0, p + 1) for p in range(4)}
    for p in range(4):
        table.won(p, p + 1, now=0.0)
    assert table.plan(1.0, leases).give_up == ()
    assert table.plan(1.0, leases, {"b": 0.5}).give_up == ()  # b's record expired


def test_within_one_the_worker_with_a_partition_too_many_gives_one():
    # 7 partitions over a, b, c holding 3, 3, 1: shares 3, 2, 2 (a before b by id).
    leases = {p: lease("a", 10.0) for p in (0, 1, 2)}
    leases |= {p: lease("b", 10.0) for p in (3, 4, 5)}
    leases |= {6: lease("c", 10.0)}
    for worker, give in (("a", ()), ("b", (5,)), ("c", ())):
        table = LeaseTable(7, worker, ttl=10)
        plan = table.plan(1.0, leases)
        assert plan.give_up == give
        assert plan.acquire == ()


def test_a_lease_ours_in_kv_is_adopted_and_one_taken_is_dropped():
    table = LeaseTable(3, "a", ttl=10)
    table.plan(0.0, {})
    table.won(0, 1, now=0.0)
    table.won(1, 2, now=0.0)
    table.changes(0.0)
    # 0 was taken after it expired (by the clock of b); 2 is ours (a write whose answer was
    # lost); a stale read of 1 does not lower its revision.
    table.plan(1.0, {0: lease("b", 20.0, 7), 1: lease("a", 10.0, 1), 2: lease("a", 10.0, 3)})
    assert table.held == {1: lease("a", 10.0, 2), 2: lease("a", 10.0, 3)}
    assert table.changes(1.0) == LeaseChanges(
        gained=frozenset({2}), kept=frozenset({1}), lost=frozenset({0})
    )


def test_leave_gives_up_everything():
    table = LeaseTable(2, "a", ttl=10)
    table.plan(0.0, {})
    table.won(0, 1, now=0.0)
    table.changes(0.0)
    assert set(table.leave()) == {0}
    assert table.owned(0.0) == frozenset()
    assert table.changes(0.0).lost == {0}


# -- the table, simulated ---------------------------------------------------------------------


@attrs.define
class FakeKV:
    """One record per partition and per member; a write names the revision it expects (None:
    the key must be free) and is refused if the key moved on."""

    leases: dict[int, Lease] = attrs.Factory(dict)
    members: dict[str, float] = attrs.Factory(dict)
    last: int = 0

    def write(self, p: int, owner: str, expires: float, expected: int | None) -> int | None:
        current = self.leases.get(p)
        if (current.revision if current is not None else None) != expected:
            return None
        self.last += 1
        self.leases[p] = Lease(owner, expires, self.last)
        return self.last

    def delete(self, p: int, expected: int) -> bool:
        current = self.leases.get(p)
        if current is None or current.revision != expected:
            return False
        del self.leases[p]
        return True


@attrs.define
class SimWorker:
    """The driver's step (PartitionLeases.step), split into its read and its writes."""

    table: LeaseTable
    pending: tuple[float, dict[int, Lease], Any] | None = None
    changes: list[LeaseChanges] = attrs.Factory(list)

    @property
    def id(self) -> str:
        return self.table.worker

    def begin(self, kv: FakeKV, now: float) -> None:
        for p, held in self.table.yielding.items():
            kv.delete(p, held.revision)
            self.table.handed_over(p)
        kv.members[self.id] = self.table.expiry(now)
        view = dict(kv.leases)
        plan = self.table.plan(now, view, dict(kv.members))
        self.pending = (now, view, plan)

    def finish(self, kv: FakeKV) -> None:
        assert self.pending is not None
        now, view, plan = self.pending
        self.pending = None
        for p in plan.renew:
            self._write(kv, p, self.table.held[p].revision, now)
        for p in plan.acquire:
            found = view.get(p)
            self._write(kv, p, None if found is None else found.revision, now)
        self.changes.append(self.table.changes(now))

    def _write(self, kv: FakeKV, p: int, expected: int | None, now: float) -> None:
        revision = kv.write(p, self.id, self.table.expiry(now), expected)
        if revision is None:
            self.table.refused(p)
        else:
            self.table.won(p, revision, now)


@attrs.define
class Sim:
    partitions: int
    kv: FakeKV = attrs.Factory(FakeKV)
    now: float = 0.0
    alive: dict[str, SimWorker] = attrs.Factory(dict)
    joined: int = 0

    def join(self) -> None:
        worker = f"w{self.joined}"
        self.joined += 1
        self.alive[worker] = SimWorker(LeaseTable(self.partitions, worker, ttl=TTL))

    def check(self) -> None:
        """No partition owned by two workers at this instant; what a worker owns, KV says is
        its own."""
        owners: dict[int, str] = {}
        for worker in self.alive.values():
            for p in worker.table.owned(self.now):
                assert p not in owners, f"p{p} owned by {owners[p]} and {worker.id} at {self.now}"
                owners[p] = worker.id
                assert self.kv.leases[p].owner == worker.id

    def round(self) -> list[LeaseChanges]:
        """Every live worker steps once, a period spread over them."""
        made = []
        for worker in list(self.alive.values()):
            self.now += PERIOD / len(self.alive)
            if worker.pending is None:
                worker.begin(self.kv, self.now)
            worker.finish(self.kv)
            made.append(worker.changes[-1])
            self.check()
        return made


ACTIONS = st.tuples(
    st.sampled_from(["step", "begin", "finish", "wait", "kill", "join"]),
    st.integers(0, 7),
    st.sampled_from([0.0, 0.01, PERIOD / 2, PERIOD, TTL / 2, TTL]),
)


@SIMULATION
@given(
    partitions=st.integers(1, 12),
    initial=st.integers(1, 4),
    actions=st.lists(ACTIONS, max_size=60),
)
def test_simulated_workers_never_share_a_partition_and_settle_balanced(
    partitions, initial, actions
):
    sim = Sim(partitions)
    for _ in range(initial):
        sim.join()
    for kind, which, pause in actions:
        sim.now += pause
        names = sorted(sim.alive)
        worker = sim.alive[names[which % len(names)]] if names else None
        if kind == "join" and len(sim.alive) < 5:
            sim.join()
        elif kind == "kill" and worker is not None and len(sim.alive) > 1:
            del sim.alive[worker.id]
        elif kind == "begin" and worker is not None and worker.pending is None:
            worker.begin(sim.kv, sim.now)
        elif kind == "finish" and worker is not None and worker.pending is not None:
            worker.finish(sim.kv)
        elif kind == "step" and worker is not None:
            if worker.pending is None:
                worker.begin(sim.kv, sim.now)
            worker.finish(sim.kv)
        sim.check()

    # Quiet rounds: the dead's leases and member records expire, the rest rebalance.
    for _ in range(30):
        sim.round()
    owned = {w.id: w.table.owned(sim.now) for w in sim.alive.values()}
    every = [p for ps in owned.values() for p in ps]
    assert sorted(every) == list(range(partitions)), owned
    counts = [len(ps) for ps in owned.values()]
    assert max(counts) - min(counts) <= 1, owned
    for p, lease_ in sim.kv.leases.items():
        if lease_.live(sim.now):
            assert p in owned[lease_.owner]
    # And it stays so: nothing moves in further rounds.
    for _ in range(5):
        assert not any(c.changed for c in sim.round())


# -- the driver, on a real server -------------------------------------------------------------


async def open_leases(
    js: JetStream, n: int, *, partitions: int = 8, ttl: float = 1.0, pipeline: str = "pipe"
) -> list[PartitionLeases]:
    return [
        await PartitionLeases.open(js, pipeline, partitions, worker=f"w{i}", ttl=ttl)
        for i in range(n)
    ]


async def stored(js: JetStream, pipeline: str = "pipe") -> dict[int, dict[str, Any]]:
    """The lease records as KV holds them now, by partition."""
    kv = (await PartitionLeases.open(js, pipeline, 1, worker="reader")).kv
    found = {}
    for key in await kv.keys(f"{pipeline}.lease.>"):
        found[int(key.rsplit(".p", 1)[1])] = json.loads((await kv.get(key)).value)
    return found


def balanced(workers: list[PartitionLeases], partitions: int = 8) -> bool:
    now = time.time()
    owned = [w.owned(now) for w in workers]
    every = sorted(p for ps in owned for p in ps)
    counts = [len(ps) for ps in owned]
    return every == list(range(partitions)) and max(counts) - min(counts) <= 1


async def step_until_balanced(
    workers: list[PartitionLeases], *, within: float = 10.0, pause: float = 0.02
) -> int:
    """Step the workers round-robin until they split the partitions; how many rounds."""
    rounds = 0
    with trio.fail_after(within):
        while not balanced(workers):
            for worker in workers:
                await worker.step(time.time())
            rounds += 1
            await trio.sleep(pause)  # pacing the loop
    return rounds


async def check_stored(js: JetStream, workers: list[PartitionLeases]) -> None:
    """KV holds one unexpired lease per partition, of the worker that owns it."""
    records = await stored(js)
    now = time.time()
    assert sorted(records) == list(range(8))
    for p, record in records.items():
        assert record["expires"] > now
        assert record["partition"] == p and record["partitions"] == 8
        assert [w.worker for w in workers if p in w.owned(now)] == [record["owner"]]


@pytest.mark.parametrize("n", [2, 3])
async def test_workers_converge_to_a_balanced_split(nats_server, n):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        workers = await open_leases(js, n, ttl=10.0)
        assert workers[0].kv.bucket == DEFAULT_LEASE_BUCKET
        rounds = await step_until_balanced(workers)
        assert rounds <= 4
        await check_stored(js, workers)
        counts = sorted(len(w.owned()) for w in workers)
        assert counts == ([4, 4] if n == 2 else [2, 3, 3])
        # Quiet: nothing moves.
        for _ in range(3):
            for worker in workers:
                assert not (await worker.step(time.time())).changed


@pytest.mark.slow
async def test_a_stalled_worker_loses_its_partitions_to_the_others_after_the_ttl(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        workers = await open_leases(js, 3, ttl=1.0)
        await step_until_balanced(workers)
        stalled, rest = workers[2], workers[:2]
        had = stalled.owned()
        assert had
        expiry = {p: stalled.table.held[p].expires for p in had}
        with trio.fail_after(5.0):  # the others step on, the stalled one does not
            while not balanced(rest):
                for worker in rest:
                    now = time.time()
                    await worker.step(now)
                    for p in worker.owned(now) & had:
                        assert now >= expiry[p], "taken before the stalled lease expired"
                await trio.sleep(0.02)
        assert time.time() >= min(expiry.values())
        await check_stored(js, rest)
        assert stalled.owned() == frozenset()
        # Back, it finds them gone (reported lost), and joins in again.
        changes = await stalled.step(time.time())
        assert changes.lost == had and changes.owned == frozenset()
        await step_until_balanced(workers)


async def test_release_all_hands_the_partitions_over_at_once(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        a, b = await open_leases(js, 2, ttl=30.0)
        await step_until_balanced([a, b])
        held = b.owned()
        assert await b.release_all() == held
        assert b.owned() == frozenset()
        changes = await a.step(time.time())  # one step, long before the ttl
        assert changes.gained == held
        assert a.owned() == frozenset(range(8))
        await check_stored(js, [a])


async def test_a_stale_worker_cannot_renew_a_lease_that_was_taken(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        a, b = await open_leases(js, 2, ttl=1.0)
        first = time.time()
        assert (await a.step(first)).gained == frozenset(range(8))
        # a reads, then stalls past its ttl; b takes everything meanwhile.
        stale = await a.read(first + 0.5)
        with trio.fail_after(5.0):
            while b.owned() != frozenset(range(8)):
                await b.step(time.time())
                await trio.sleep(0.05)
        # a wakes and writes what it decided before: every renewal is refused.
        changes = await a.apply(stale, first + 0.5)
        assert changes.lost == frozenset(range(8))
        assert changes.owned == frozenset()
        await check_stored(js, [a, b])


async def test_a_lease_of_another_partition_count_stops_the_worker(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        (eight,) = await open_leases(js, 1, ttl=10.0)
        await eight.step(time.time())
        sixteen = await PartitionLeases.open(js, "pipe", 16, worker="other", ttl=10.0)
        with pytest.raises(LeaseError, match="of 8"):
            await sixteen.step(time.time())
        # Another pipeline's leases are its own.
        elsewhere = await PartitionLeases.open(js, "other.pipe", 16, worker="other")
        assert (await elsewhere.step(time.time())).gained == frozenset(range(16))
        with pytest.raises(ValueError, match="ttl"):
            await PartitionLeases.open(js, "pipe", 8, ttl=0)
        # A record that does not decode stops it too.
        await eight.kv.put("pipe.lease.p3", b"{not json")
        with pytest.raises(LeaseError, match="does not decode"):
            await eight.step(time.time())


async def test_run_tells_the_callback_and_hands_over_after_it(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        a, b = await open_leases(js, 2, ttl=1.5)
        in_use: dict[str, set[int]] = {"w0": set(), "w1": set()}
        taken_while_in_use: list[int] = []
        split = trio.Event()

        def owner(name: str, other: str) -> Any:
            async def on_change(gained: frozenset[int], lost: frozenset[int]) -> None:
                assert not gained & lost
                assert gained.isdisjoint(in_use[name]) and lost <= in_use[name]
                taken_while_in_use.extend(gained & in_use[other])
                in_use[name] |= gained
                await trio.sleep(0.01)  # stopping: the hand-over waits for it
                in_use[name] -= lost
                if sorted(map(len, in_use.values())) == [4, 4]:
                    split.set()

            return on_change

        async with trio.open_nursery() as nursery:
            await nursery.start(a.run, owner("w0", "w1"))
            assert in_use["w0"] == set(range(8))  # started after its first step
            await nursery.start(b.run, owner("w1", "w0"))
            with trio.fail_after(10.0):
                await split.wait()
            nursery.cancel_scope.cancel()
        assert not taken_while_in_use
        assert in_use["w0"].isdisjoint(in_use["w1"])
        assert in_use["w0"] | in_use["w1"] == set(range(8))
        for worker in (a, b):
            assert await worker.release_all() == frozenset(in_use[worker.worker])
        assert await stored(js) == {}


async def test_read_gives_the_records_as_stored(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        (a,) = await open_leases(js, 1, ttl=10.0)
        now = time.time()
        await a.step(now)
        view = await a.read(now + 20)  # everything expired by then
        assert isinstance(view, LeaseView)
        assert view.members == {"w0": pytest.approx(now + 10)}
        assert all(not lease_.live(now + 20) for lease_ in view.leases.values())
