"""The commit coordinator against a real nats-server: opening, compare-and-set races between
workers, writes whose answer is lost, a replicated bucket losing its leader, and nats-py (the
independent client) reading what it wrote."""

from __future__ import annotations

import json
import random
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
import trio
from headrace.commits import (
    DEFAULT_BUCKET,
    Attempt,
    CommitCoordinator,
    CommitState,
    CommitStateMissing,
    Committed,
    Expired,
    OutputOwned,
    Overlap,
    SeqSet,
    StreamIdentity,
    StreamRecreated,
    seqbits,
)
from headrace.commits.coordinator import HISTORY
from headrace.jetstream import JetStream
from headrace.jetstream.kv import KeyValueConfig, Operation, create_key_value, key_value
from headrace.nats import connect

from tests.waiting import FAST, once_placed

S = StreamIdentity("S", "2026-01-01T00:00:00.000000Z")
OWNER = "pipe/sink"
OUTPUT = "out1"
TIMEOUT = 20


def members(part: SeqSet) -> set[int]:
    return {n for a, b in part.intervals for n in range(a, b + 1)}


def committed_seqs(state: CommitState, stream: str = "S") -> set[int]:
    known = state.streams.get(stream)
    if known is None:
        return set()
    return set(range(1, known.floor + 1)) | members(known.seqs)


_nonce = iter(range(1, 1 << 30))


def new_attempt(batch: str, started: int | None = None) -> Attempt:
    now = int(time.time() * 1000)
    return Attempt(batch, now if started is None else started, f"{next(_nonce):08x}")


@asynccontextmanager
async def coordinators(
    url: str | list[str], count: int, *, create: bool = True, **kwargs: Any
) -> AsyncIterator[list[CommitCoordinator]]:
    """``count`` workers of output ``OUTPUT``, each on its own connection."""
    async with AsyncExitStack() as stack:
        found = []
        for i in range(count):
            nc = await stack.enter_async_context(connect(url))
            found.append(
                await CommitCoordinator.open(
                    JetStream(nc),
                    output=OUTPUT,
                    owner=OWNER,
                    worker=f"w{i}",
                    create=create,
                    **kwargs,
                )
            )
        yield found


# -- opening ---------------------------------------------------------------------------------------


async def test_open_creates_the_bucket_and_state_then_reads_them(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        first = await CommitCoordinator.open(
            js, output=OUTPUT, owner=OWNER, worker="w0", create=True
        )
        assert first.state == CommitState(output=OUTPUT, owner=OWNER)
        status = await (await key_value(js, DEFAULT_BUCKET)).status()
        assert status.history == HISTORY and status.values == 1
        a = new_attempt("a")
        assert isinstance(await first.commit(a, {S: SeqSet([(1, 5)])}), Committed)

        # Opening again (with or without create) reads the state: nothing is overwritten.
        for create in (False, True):
            again = await CommitCoordinator.open(
                js, output=OUTPUT, owner=OWNER, worker="w1", create=create
            )
            assert again.state == first.state and again.revision == first.revision
            assert again.state.unpublished[a.token].worker == "w0"
        # A second output in the same bucket is a second key.
        other = await CommitCoordinator.open(
            js, output="out2", owner=OWNER, worker="w0", create=True
        )
        assert other.state.commits == 0
        assert sorted(await other.kv.keys()) == ["out1", "out2"]


async def test_an_output_of_another_owner_is_refused(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await CommitCoordinator.open(js, output=OUTPUT, owner=OWNER, worker="w0", create=True)
        for create in (False, True):
            with pytest.raises(OutputOwned, match="is written by 'pipe/sink', not by 'other/sink'"):
                await CommitCoordinator.open(
                    js, output=OUTPUT, owner="other/sink", worker="w1", create=create
                )


async def test_a_missing_bucket_or_state_is_not_made_up(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        with pytest.raises(CommitStateMissing, match="bucket 'headrace_commits' does not exist"):
            await CommitCoordinator.open(js, output=OUTPUT, owner=OWNER, worker="w0")
        with pytest.raises(CommitStateMissing):  # nothing was created on the way
            await CommitCoordinator.open(js, output=OUTPUT, owner=OWNER, worker="w0")
        await create_key_value(js, KeyValueConfig(bucket=DEFAULT_BUCKET, history=HISTORY))
        with pytest.raises(CommitStateMissing, match="key 'out1' in bucket 'headrace_commits'"):
            await CommitCoordinator.open(js, output=OUTPUT, owner=OWNER, worker="w0")

        # Deleted while the output is written: the next read or write says so.
        coordinator = await CommitCoordinator.open(
            js, output=OUTPUT, owner=OWNER, worker="w0", create=True
        )
        await coordinator.kv.delete(OUTPUT)
        with pytest.raises(CommitStateMissing, match="deleted"):
            await coordinator.commit(new_attempt("a"), {S: SeqSet([(1, 2)])})
        with pytest.raises(CommitStateMissing):
            await coordinator.refresh()
        with pytest.raises(CommitStateMissing):
            await CommitCoordinator.open(js, output=OUTPUT, owner=OWNER, worker="w1")


async def test_workers_opening_a_new_output_at_once_share_one_state(nats_server):
    """Eight workers start together on an output nobody made yet: one creates the bucket and
    the state, the others read them (no one overwrites another's fresh state)."""
    async with AsyncExitStack() as stack:
        conns = [await stack.enter_async_context(connect(nats_server.url)) for _ in range(8)]
        opened: list[Any] = [None] * len(conns)

        async def open_one(i: int) -> None:
            opened[i] = await CommitCoordinator.open(
                JetStream(conns[i]), output=OUTPUT, owner=OWNER, worker=f"w{i}", create=True
            )

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                for i in range(len(conns)):
                    nursery.start_soon(open_one, i)
        assert len({c.revision for c in opened}) == 1
        assert all(c.state == opened[0].state for c in opened)
        assert len(await opened[0].kv.history(OUTPUT)) == 1


# -- committing ------------------------------------------------------------------------------------


async def test_the_same_attempt_twice_commits_once(nats_server):
    async with coordinators(nats_server.url, 1) as (coordinator,):
        a = new_attempt("a")
        first = await coordinator.commit(a, {S: SeqSet([(1, 10)])})
        assert isinstance(first, Committed) and not first.already
        revision = coordinator.revision
        second = await coordinator.commit(a, {S: SeqSet([(1, 10)])})
        assert isinstance(second, Committed) and second.already
        assert coordinator.revision == revision and coordinator.commits == 1
        assert (await coordinator.refresh()).commits == 1
        assert len(await coordinator.kv.history(OUTPUT)) == 2  # created, then one commit


async def test_floors_fences_forgets_and_a_recreated_stream(nats_server):
    async with coordinators(nats_server.url, 2) as (one, two):
        a = new_attempt("a")
        await one.commit(a, {S: SeqSet([(1, 3), (6, 8)])})
        await two.refresh()
        b = new_attempt("b")
        await one.commit(b, {S: SeqSet([(20, 21)])})
        # ``two`` has not read the second commit: its changes go to the current state.
        state = await two.report_floors({S: 5})
        assert state.streams["S"].floor == 8 and state.streams["S"].seqs == SeqSet([(20, 21)])
        assert await two.report_floors({S: 4}) is two.state  # lower: nothing written
        assert len(state.unpublished) == 2
        assert list((await two.forget([a.token])).unpublished) == [b.token]
        horizon = a.started + 1
        assert (await one.fence(horizon)).horizon == horizon
        old = new_attempt("old", a.started)
        assert await one.commit(old, {S: SeqSet([(9, 9)])}) == Expired(horizon)
        recreated = StreamIdentity("S", "2026-02-01T00:00:00.000000Z")
        await one.refresh()
        revision = one.revision
        with pytest.raises(StreamRecreated):
            await one.commit(new_attempt("c"), {recreated: SeqSet([(1, 1)])})
        assert (await one.refresh()).streams["S"].created == S.created
        assert one.revision == revision  # nothing was written


async def test_a_change_that_changes_nothing_on_a_stale_view_is_still_applied(nats_server):
    """``two`` read the state before ``one`` committed. Raising the floor of the stream ``one``
    recorded, or forgetting ``one``'s attempt (a sweep), changes nothing on ``two``'s view:
    the coordinator must not conclude that it changes nothing on the current state."""
    async with coordinators(nats_server.url, 2) as (one, two):
        a = new_attempt("a")
        await one.commit(a, {S: SeqSet([(1, 3), (6, 8)])})
        floored = await two.report_floors({S: 5})
        assert "S" in floored.streams, "the floor report was dropped"
        assert floored.streams["S"].floor == 8
        forgotten = await two.forget([a.token])
        assert a.token not in forgotten.unpublished, "the forget was dropped"
        assert a.token not in (await one.refresh()).unpublished


async def test_racing_workers_win_each_contested_sequence_once(nats_server):
    """Two workers commit overlapping batches at the same moment, round after round: one
    wins, the other is told exactly which of its sequences the winner committed."""
    rounds = 100
    rng = random.Random(7)
    winners: set[int] = set()
    losers_only: set[int] = set()
    async with coordinators(nats_server.url, 2) as pair:
        for r in range(rounds):
            base = 100 * r
            window = range(base + 1, base + 60)
            sets = [set(rng.sample(window, 30)) for _ in pair]
            contested = sets[0] & sets[1]
            if not contested:
                sets[1].add(next(iter(sets[0])))
                contested = sets[0] & sets[1]
            outcomes: list[Any] = [None, None]

            async def run(
                i: int, r: int = r, sets: list[set[int]] = sets, out: list[Any] = outcomes
            ) -> None:
                out[i] = await pair[i].commit(new_attempt(f"r{r}w{i}"), {S: SeqSet.of(sets[i])})

            with trio.fail_after(TIMEOUT):
                async with trio.open_nursery() as nursery:
                    for i in range(2):
                        nursery.start_soon(run, i)
            won = [i for i, o in enumerate(outcomes) if isinstance(o, Committed)]
            assert len(won) == 1, outcomes
            (w,) = won
            loser = outcomes[1 - w]
            assert isinstance(loser, Overlap), outcomes
            assert not outcomes[w].already
            assert loser.committed == {"S": SeqSet.of(contested)}
            winners |= sets[w]
            losers_only |= sets[1 - w] - sets[w]
        state = await pair[0].refresh()
    assert committed_seqs(state) == winners
    assert not committed_seqs(state) & losers_only
    assert state.commits == rounds
    # Each loss came from a refused compare-and-set: the loser's view never held the winner's
    # batch of the round before it read again.
    assert sum(c.refused for c in pair) >= rounds
    assert sum(c.overlaps for c in pair) == rounds
    assert sum(c.commits for c in pair) == rounds


async def test_many_workers_committing_disjoint_batches_all_succeed(nats_server):
    workers, batches = 8, 25
    async with coordinators(nats_server.url, workers) as group:
        last: dict[int, str] = {}

        async def work(i: int) -> None:
            previous: list[str] = []
            for b in range(batches):
                first = 1 + 1000 * i + 10 * b
                a = new_attempt(f"w{i}b{b}")
                outcome = await group[i].commit(
                    a, {S: SeqSet([(first, first + 9)])}, forget=previous
                )
                assert isinstance(outcome, Committed) and not outcome.already, outcome
                previous = [a.token]
            last[i] = previous[0]

        started = trio.current_time()
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(workers):
                    nursery.start_soon(work, i)
        elapsed = trio.current_time() - started
        state = await group[0].refresh()
    expected = {1 + 1000 * i + n for i in range(workers) for n in range(10 * batches)}
    assert committed_seqs(state) == expected
    assert state.commits == workers * batches
    # Each worker's next commit took its previous attempt out: one unpublished per worker.
    assert {t: u.worker for t, u in state.unpublished.items()} == {
        t: f"w{i}" for i, t in last.items()
    }
    max_refusals = max(c.max_refusals for c in group)
    refused = sum(c.refused for c in group)
    print(
        f"\n{workers} workers x {batches} commits in {elapsed:.2f}s: {refused} refusals, "
        f"at most {max_refusals} for one commit"
    )
    assert max_refusals < group[0].max_attempts // 4
    assert all(c.in_doubt == 0 for c in group)


async def test_natspy_reads_the_state_and_its_write_is_seen(nats_server, natspy):
    async with coordinators(nats_server.url, 1) as (coordinator,):
        await coordinator.commit(new_attempt("a"), {S: SeqSet([(1, 3), (7, 9)])})
        await natspy.connect(nats_server.url)

        async def read() -> Any:
            kv = await natspy.nc.jetstream().key_value(DEFAULT_BUCKET)
            return await kv.get(OUTPUT)

        entry = await natspy.call(read)
        assert entry.value == coordinator.state.to_json()
        assert entry.revision == coordinator.revision
        stored = json.loads(entry.value)
        # 7-9 above the floor 3 (bit 0 is 4): bits 3 to 5
        assert stored["streams"]["S"] == {
            "created": S.created,
            "floor": 3,
            "above": seqbits.encode(0b111000),
        }

        # nats-py, as another worker, fences (a compare-and-set on the revision it read).
        horizon = int(time.time() * 1000) + 60_000
        fenced = CommitState.from_json(entry.value).fence(horizon).to_json()

        async def write() -> int:
            kv = await natspy.nc.jetstream().key_value(DEFAULT_BUCKET)
            return await kv.update(OUTPUT, fenced, last=entry.revision)

        await natspy.call(write)
        # Our view is stale: the write is refused, the state read again, the attempt expired.
        outcome = await coordinator.commit(new_attempt("b"), {S: SeqSet([(4, 6)])})
        assert outcome == Expired(horizon)
        assert coordinator.refused == 1 and coordinator.state.horizon == horizon


# -- writes whose answer is lost -----------------------------------------------------------------


class Observed(CommitCoordinator):
    """The real coordinator, telling the test when it starts to read the state again."""

    reading: trio.Event

    async def _read(self) -> None:
        self.reading.set()
        await super()._read()


async def test_a_write_in_doubt_is_not_applied_twice(nats_server):
    """The server is frozen (SIGSTOP) while a commit is written: the write goes out, its answer
    does not come, the coordinator counts it in doubt and reads again, which cannot succeed
    either. The server is thawed: the write it had queued lands, the read sees it, and the
    change applied again finds its attempt committed instead of committing it twice."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        coordinator = await Observed.open(js, output=OUTPUT, owner=OWNER, worker="w0", create=True)
        coordinator.reading = trio.Event()
        js.timeout = 0.5  # the write's answer is given up on sooner (the coordinator's reads too)
        a = new_attempt("a")
        outcome: list[Any] = []

        async def commit() -> None:
            outcome.append(await coordinator.commit(a, {S: SeqSet([(1, 10)])}))

        async with trio.open_nursery() as nursery:
            nats_server.freeze()
            try:
                nursery.start_soon(commit)
                with trio.fail_after(TIMEOUT):
                    await coordinator.reading.wait()
                assert coordinator.in_doubt == 1 and not outcome
            finally:
                nats_server.thaw()
        js.timeout = 5
        (result,) = outcome
        # The first write landed (the server read it after the thaw): the retry saw it.
        assert isinstance(result, Committed) and result.already, result
        # ... and counts it as this worker's commit: the state's count and the workers' agree.
        assert coordinator.commits == 1
        state = await coordinator.refresh()
        assert list(state.unpublished) == [a.token] and state.commits == 1
        history = await coordinator.kv.history(OUTPUT)
        assert [e.operation for e in history] == [Operation.PUT, Operation.PUT]


# -- a replicated bucket ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("client_on", ["leader", "follower"])
async def test_a_replicated_bucket_survives_its_leader(nats_cluster, natspy, client_on):
    """Bucket with 3 replicas; the node leading its stream is killed. The worker (connected to
    that node, or to another) commits again within the coordinator's deadline."""
    async with connect(nats_cluster.urls, **FAST) as admin:
        js = JetStream(admin, timeout=10)
        # A fresh cluster sometimes needs a moment before it places R3.
        await once_placed(
            lambda: CommitCoordinator.open(
                js, output=OUTPUT, owner=OWNER, worker="admin", replicas=3, create=True
            )
        )
        info = await js.stream_info("KV_" + DEFAULT_BUCKET)
        assert info.config.num_replicas == 3
        assert info.cluster is not None and info.cluster.leader
        leader = info.cluster.leader
    victim = int(leader.removeprefix("n"))
    others = [i for i in range(3) if i != victim]
    node = victim if client_on == "leader" else others[0]
    async with connect(nats_cluster[node].url, **FAST) as nc:
        coordinator = await CommitCoordinator.open(
            JetStream(nc), output=OUTPUT, owner=OWNER, worker="w0"
        )
        first = await coordinator.commit(new_attempt("a"), {S: SeqSet([(1, 10)])})
        assert isinstance(first, Committed)
        await trio.to_thread.run_sync(nats_cluster.kill_node, victim)
        started = trio.current_time()
        with trio.fail_after(coordinator.deadline):
            second = await coordinator.commit(new_attempt("b"), {S: SeqSet([(11, 20)])})
        elapsed = trio.current_time() - started
        assert isinstance(second, Committed), second
        print(f"\ncommitted {elapsed:.2f}s after the leader was killed ({client_on})")
        state = await coordinator.refresh()
        assert committed_seqs(state) == set(range(1, 21)) and state.commits == 2
        info = await JetStream(nc).stream_info("KV_" + DEFAULT_BUCKET)
        assert info.cluster is not None and info.cluster.leader not in (None, leader)

    await natspy.connect(nats_cluster[others[1]].url)

    async def read() -> Any:
        kv = await natspy.nc.jetstream().key_value(DEFAULT_BUCKET)
        return await kv.get(OUTPUT)

    entry = await natspy.call(read)
    assert entry.value == state.to_json()
