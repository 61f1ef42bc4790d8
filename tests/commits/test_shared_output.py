"""A file output shared by workers (sinks/shared_output.py) on a real file system, claimed and
swept through a real nats-server."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.commits import (
    DEFAULT_BUCKET,
    Attempt,
    CommitCoordinator,
    CommitStateMissing,
    CommitStateUnavailable,
    Committed,
    Expired,
    OutputOwned,
    Overlap,
    SeqSet,
    StreamIdentity,
)
from headrace.commits.identity import now_ms
from headrace.jetstream import JetStream
from headrace.jetstream.kv import key_value
from headrace.nats import connect
from headrace.sinks.errors import OutputInUse
from headrace.sinks.output import DirectoryLock
from headrace.sinks.shared_output import (
    CONTROL,
    LOCK,
    STAGING,
    Manifest,
    SharedOutput,
    claim,
    sweep,
)

S = StreamIdentity("S", "2026-01-01T00:00:00.000000Z")
OWNER = "pipe/sink"
TIMEOUT = 20

_nonce = iter(range(1, 1 << 30))


def new_attempt(batch: str, started: int | None = None) -> Attempt:
    return Attempt(batch, now_ms() if started is None else started, f"{next(_nonce):08x}")


def shared(root: Path, **kwargs: Any) -> SharedOutput:
    return SharedOutput(root, kind="TestSink", fsync=False, **kwargs)


def stage(output: SharedOutput, attempt: Attempt, files: dict[str, str]) -> Path:
    """Write ``files`` (relative path -> text) as ``attempt``'s staged files."""
    where = output.staging(attempt)
    for relative, text in files.items():
        path = where / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return where


def tree(root: Path) -> dict[str, str]:
    """The data files of an output (the control directory left out)."""
    found = {}
    for path in root.rglob("*"):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and not relative.startswith(CONTROL + "/"):
            found[relative] = path.read_text()
    return found


def exclusive_lock_is_free(root: Path) -> bool:
    lock = DirectoryLock(root / CONTROL, LOCK, "TestSink")
    try:
        lock.acquire()
    except OutputInUse:
        return False
    lock.release()
    return True


@asynccontextmanager
async def workers(
    url: str, root: Path, names: list[str], *, owner: str = OWNER
) -> AsyncIterator[list[tuple[SharedOutput, CommitCoordinator]]]:
    """Workers ``names`` claiming the output at ``root``, each on its own connection."""
    async with AsyncExitStack() as stack:
        found = []
        for name in names:
            nc = await stack.enter_async_context(connect(url))
            output = shared(root)
            coordinator = await claim(
                output, JetStream(nc), owner=owner, worker=name, bucket=DEFAULT_BUCKET, replicas=1
            )
            stack.callback(output.release)
            found.append((output, coordinator))
        yield found


# -- claiming ------------------------------------------------------------------------------------


class Gate:
    """A thread limiter for ``trio.to_thread.run_sync`` that holds the ``hold``-th thread call of
    the code given it until the test opens it: claim()'s second call writes the manifest."""

    def __init__(self, hold: int) -> None:
        self.hold = hold
        self.calls = 0
        self.reached = trio.Event()
        self.opened = trio.Event()

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        self.calls += 1
        if self.calls == self.hold:
            self.reached.set()
            await self.opened.wait()

    def release_on_behalf_of(self, borrower: object) -> None:
        pass


async def test_two_workers_claiming_a_new_output_at_once_agree(nats_server, tmp_path):
    """Both find no manifest and make a commit state under their own id; the first manifest
    written wins, the other worker drops its state and takes the winner's."""
    async with connect(nats_server.url) as nc_a, connect(nats_server.url) as nc_b:
        outputs = [shared(tmp_path), shared(tmp_path)]
        gates = [Gate(hold=2), Gate(hold=2)]
        claimed: list[Any] = [None, None]
        done = [trio.Event(), trio.Event()]

        async def take(i: int, nc: Any) -> None:
            claimed[i] = await claim(
                outputs[i],
                JetStream(nc),
                owner=OWNER,
                worker=f"w{i}",
                bucket=DEFAULT_BUCKET,
                replicas=1,
                limiter=gates[i],  # type: ignore[arg-type]
            )
            done[i].set()

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(take, 0, nc_a)
                nursery.start_soon(take, 1, nc_b)
                for gate in gates:  # both read no manifest and made a state
                    await gate.reached.wait()
                kv = await key_value(JetStream(nc_a), DEFAULT_BUCKET)
                assert len(await kv.keys()) == 2
                gates[0].opened.set()
                await done[0].wait()  # the first writes its manifest and is done
                assert not done[1].is_set()
                gates[1].opened.set()
        a, b = claimed
        manifest = outputs[0].read_manifest()
        assert manifest is not None and manifest.owner == OWNER
        assert a.key == b.key == manifest.id
        assert await kv.keys() == [manifest.id]  # the loser's state is gone
        assert a.state == b.state == await b.refresh()
        for output in outputs:
            output.release()


async def test_claims_racing_freely_end_with_one_manifest_and_one_state(nats_server, tmp_path):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        for round_ in range(5):
            root = tmp_path / f"out{round_}"
            outputs = [shared(root) for _ in range(3)]
            claimed: list[Any] = [None] * 3

            async def take(i: int, outputs: list[SharedOutput] = outputs, out: Any = claimed):
                out[i] = await claim(
                    outputs[i], js, owner=OWNER, worker=f"w{i}", bucket=DEFAULT_BUCKET, replicas=1
                )

            with trio.fail_after(TIMEOUT):
                async with trio.open_nursery() as nursery:
                    for i in range(3):
                        nursery.start_soon(take, i)
            manifest = outputs[0].read_manifest()
            assert manifest is not None
            assert {c.key for c in claimed} == {manifest.id}
            for output in outputs:
                output.release()
        kv = await key_value(js, DEFAULT_BUCKET)
        assert len(await kv.keys()) == 5  # one state per output, no orphan


async def test_an_output_of_another_owner_is_refused(nats_server, tmp_path):
    async with workers(nats_server.url, tmp_path, ["w0"]) as [(first, _)]:
        async with connect(nats_server.url) as nc:
            other = shared(tmp_path)
            with pytest.raises(OutputOwned, match="not of 'other/sink'"):
                await claim(
                    other,
                    JetStream(nc),
                    owner="other/sink",
                    worker="w1",
                    bucket=DEFAULT_BUCKET,
                    replicas=1,
                )
            assert not other.lock.held
        first.release()
        assert exclusive_lock_is_free(tmp_path)  # the refused claim left no shared lock


async def test_a_manifest_without_its_state_is_refused(nats_server, tmp_path):
    async with workers(nats_server.url, tmp_path, ["w0"]) as [(first, coordinator)]:
        await coordinator.kv.delete(coordinator.key)
        first.release()
        async with connect(nats_server.url) as nc:
            again = shared(tmp_path)
            with pytest.raises(CommitStateMissing):
                await claim(
                    again,
                    JetStream(nc),
                    owner=OWNER,
                    worker="w1",
                    bucket=DEFAULT_BUCKET,
                    replicas=1,
                )
        assert exclusive_lock_is_free(tmp_path)


def test_an_output_of_the_single_process_mode_is_refused(tmp_path: Path) -> None:
    output = shared(tmp_path, exclusive_markers=("_headrace/ledger",))
    (tmp_path / CONTROL / "ledger").mkdir(parents=True)
    assert output.prepare() is None  # an empty ledger directory holds nothing
    output.release()
    (tmp_path / CONTROL / "ledger" / "0001.json").write_text("{}")
    with pytest.raises(OutputInUse, match=r"single-process TestSink \(_headrace/ledger exists\)"):
        output.prepare()
    assert not output.lock.held and exclusive_lock_is_free(tmp_path)


def test_the_shared_lock_admits_workers_and_excludes_an_exclusive_holder(tmp_path: Path) -> None:
    one, two = shared(tmp_path), shared(tmp_path)
    one.prepare()
    two.prepare()
    assert one.lock.held and two.lock.held
    assert not exclusive_lock_is_free(tmp_path)
    one.release()
    assert not exclusive_lock_is_free(tmp_path)  # two still holds it
    two.release()
    exclusive = DirectoryLock(tmp_path / CONTROL, LOCK, "OtherSink")
    exclusive.acquire()
    try:
        with pytest.raises(OutputInUse, match="held exclusively by a sink of another mode"):
            shared(tmp_path).prepare()
    finally:
        exclusive.release()
    three = shared(tmp_path)
    three.prepare()
    three.release()


def test_a_corrupt_manifest_is_refused(tmp_path: Path) -> None:
    from headrace.commits import CorruptCommitState

    output = shared(tmp_path)
    output.prepare()
    (tmp_path / CONTROL / "output.json").write_text('{"version": 9}')
    with pytest.raises(CorruptCommitState, match="not an output manifest"):
        output.read_manifest()
    output.release()
    made = output.new_manifest(OWNER, "b")
    assert Manifest.from_json(made.to_json(), tmp_path) == made


# -- publishing ----------------------------------------------------------------------------------

FILES = {
    "day=2026-11-25/part-x-00000.parquet": "one",
    "day=2026-11-26/part-x-00001.parquet": "two",
    "top.json": "three",
    "a/b/c/deep.txt": "four",
}


def test_publish_puts_files_at_their_paths_and_is_idempotent(tmp_path: Path) -> None:
    output = shared(tmp_path)
    output.prepare()
    old = {"day=2026-11-25/part-old-00000.parquet": "old", "gone.json": "old"}
    for relative, text in old.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    a = new_attempt("b1")
    staging = stage(output, a, {**FILES, "_SUCCESS": "", "day=2026-11-25/.part.crc": "x"})
    assert output.staged() == [(a, staging)]
    assert output.staged_files(a) == sorted(FILES)  # hidden and "_" names are not data
    output.sync_staged(a)

    replaces = [*old, "never-existed.json"]
    placed = output.publish(a.token, replaces)
    assert sorted(placed) == sorted(FILES)
    assert tree(tmp_path) == FILES  # moved in, the replaced files deleted
    assert not staging.exists() and output.staged() == []
    stats = {r: (tmp_path / r).stat() for r in FILES}

    assert output.publish(a.token, replaces) == []  # again: nothing to do, no error
    assert tree(tmp_path) == FILES
    assert {r: (tmp_path / r).stat() for r in FILES} == stats
    output.release()


def test_two_threads_publishing_one_attempt_at_once(tmp_path: Path) -> None:
    output = shared(tmp_path)
    output.prepare()
    files = {f"d{i % 7}/sub{i % 3}/part-{i:04d}.txt": f"file {i}" for i in range(400)}
    for round_ in range(5):
        a = new_attempt(f"r{round_}")
        staging = stage(output, a, files)
        start = threading.Barrier(2)

        def publish(a: Attempt = a, start: threading.Barrier = start) -> list[str]:
            start.wait(TIMEOUT)
            return output.publish(a.token)

        with ThreadPoolExecutor(2) as pool:
            results = [f.result(TIMEOUT) for f in [pool.submit(publish) for _ in range(2)]]
        assert tree(tmp_path) == files
        assert all(set(r) <= set(files) for r in results)
        assert set(results[0]) | set(results[1]) == set(files)
        assert not staging.exists()
        for relative in files:  # room for the next round
            (tmp_path / relative).unlink()
    output.release()


def test_discard(tmp_path: Path) -> None:
    output = shared(tmp_path)
    a = new_attempt("x")
    staging = stage(output, a, FILES)
    output.discard(a)
    assert not staging.exists()
    output.discard(a)  # again: nothing there, no error
    assert tree(tmp_path) == {}


# -- sweeping ------------------------------------------------------------------------------------


async def commit(
    coordinator: CommitCoordinator, output: SharedOutput, a: Attempt, first: int, last: int
) -> None:
    await trio.to_thread.run_sync(output.sync_staged, a)
    outcome = await coordinator.commit(a, {S: SeqSet([(first, last)])})
    assert isinstance(outcome, Committed) and not outcome.already, outcome


async def test_sweep_rolls_forward_what_a_dead_worker_committed(nats_server, tmp_path):
    async with workers(nats_server.url, tmp_path, ["dead", "live"]) as pair:
        (dead_out, dead), (live_out, live) = pair
        # The dead worker committed an attempt and a compaction, and died before publishing.
        old = {"day=1/part-old-0.parquet": "old", "day=1/part-old-1.parquet": "old"}
        for relative, text in old.items():
            (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / relative).write_text(text)
        a = new_attempt("a")
        stage(dead_out, a, FILES)
        await commit(dead, dead_out, a, 1, 10)
        c = new_attempt("compact")
        compacted = {"day=1/part-compact-0.parquet": "both"}
        stage(dead_out, c, compacted)

        def compaction(state: Any) -> Any:
            leased = state.take_lease("dead", "L", until=now_ms() + 60_000, now=now_ms())
            return leased.commit_compaction(c, "dead", list(old), at=now_ms(), lease="L")

        await dead.change(compaction)
        assert set(dead.state.unpublished) == {a.token, c.token}

        # Committed just now: its worker may be publishing it, so it is left alone...
        report = await sweep(live_out, live)
        assert report.rolled == 0 and tree(tmp_path) == old
        # ...until it is old enough (settle_after).
        report = await sweep(live_out, live, settle_after=0)
        assert (report.rolled, report.forgotten, report.removed) == (2, 2, 0)
        assert tree(tmp_path) == {**FILES, **compacted}  # the replaced files are gone
        assert live_out.staged() == []
        state = await live.refresh()
        assert state.unpublished == {}
        assert state.streams["S"].floor == 10  # the commit itself stands

        # A second sweep finds nothing to do.
        report = await sweep(live_out, live, settle_after=0)
        assert (report.rolled, report.removed) == (0, 0)


async def test_sweep_publishes_this_workers_own_cut_off_commit_only_if_not_published(
    nats_server, tmp_path
):
    async with workers(nats_server.url, tmp_path, ["w0"]) as [(output, coordinator)]:
        mine, cut_off = new_attempt("mine"), new_attempt("cut")
        stage(output, mine, {"mine.txt": "mine"})
        await commit(coordinator, output, mine, 1, 5)
        output.publish(mine.token)
        stage(output, cut_off, {"cut.txt": "cut"})
        await commit(coordinator, output, cut_off, 6, 9)
        # ``mine`` was published by this worker (its next commit takes it out): untouched.
        report = await sweep(output, coordinator, published=[mine.token])
        assert report.rolled == 1
        assert tree(tmp_path) == {"mine.txt": "mine", "cut.txt": "cut"}
        assert set(coordinator.state.unpublished) == {mine.token}


async def test_sweep_fences_then_deletes_a_stale_uncommitted_attempt(nats_server, tmp_path):
    async with workers(nats_server.url, tmp_path, ["stalled", "sweeper"]) as pair:
        (stalled_out, stalled), (sweeper_out, sweeper) = pair
        started = now_ms() - 10_000
        stale = new_attempt("stale", started)
        staging = stage(stalled_out, stale, FILES)
        fresh = new_attempt("fresh")
        fresh_staging = stage(stalled_out, fresh, {"f.txt": "f"})

        report = await sweep(sweeper_out, sweeper, stale_after=5)
        assert (report.removed, report.rolled) == (1, 0)
        assert not staging.exists() and fresh_staging.exists()  # the fresh one is left alone
        assert sweeper.state.horizon == started + 1

        # The stalled worker wakes up and tries to commit it: too late.
        outcome = await stalled.commit(stale, {S: SeqSet([(1, 10)])})
        assert outcome == Expired(started + 1)
        same_age = new_attempt("other", started)
        assert isinstance(await stalled.commit(same_age, {S: SeqSet([(1, 10)])}), Expired)
        # The fresh attempt still may.
        assert isinstance(await stalled.commit(fresh, {S: SeqSet([(1, 10)])}), Committed)
        assert tree(tmp_path) == {}


async def test_sweep_leaves_fresh_attempts_alone(nats_server, tmp_path):
    async with workers(nats_server.url, tmp_path, ["w0"]) as [(output, coordinator)]:
        recent = new_attempt("recent", now_ms() - 60_000)  # a minute old, stale after five
        fresh = new_attempt("fresh")
        for a in (recent, fresh):
            stage(output, a, {f"{a.batch}.txt": a.batch})
        report = await sweep(output, coordinator)
        assert report == type(report)()
        assert [a for a, _ in output.staged()] == sorted([recent, fresh], key=lambda a: a.token)
        assert coordinator.state.horizon == 0


def _age(path: Path, seconds: float) -> None:
    moment = time.time() - seconds
    os.utime(path, (moment, moment))


@pytest.mark.parametrize("make", [Path.mkdir, Path.touch], ids=["directory", "file"])
async def test_sweep_removes_what_is_not_an_attempt_only_when_old(
    nats_server, tmp_path, make: Callable[[Path], None]
):
    async with workers(nats_server.url, tmp_path, ["w0"]) as [(output, coordinator)]:
        staging_root = tmp_path / CONTROL / STAGING
        young, old = staging_root / "copy-of-something", staging_root / "left.over"
        for path in (young, old):
            make(path)
        _age(old, 3600)
        assert [a for a, _ in output.staged()] == [None, None]
        await sweep(output, coordinator, stale_after=300)
        assert young.exists()
        assert not old.exists()


async def test_sweep_forgets_a_committed_attempt_already_published(nats_server, tmp_path):
    """Its worker published it and died before its next commit took it out."""
    async with workers(nats_server.url, tmp_path, ["dead", "live"]) as pair:
        (dead_out, dead), (live_out, live) = pair
        a = new_attempt("a")
        stage(dead_out, a, FILES)
        await commit(dead, dead_out, a, 1, 10)
        dead_out.publish(a.token)
        report = await sweep(live_out, live, settle_after=0)
        assert (report.rolled, report.forgotten) == (1, 1)
        assert tree(tmp_path) == FILES and live.state.unpublished == {}


@pytest.mark.slow
async def test_a_commit_cut_off_in_doubt_is_published_by_the_next_sweep(nats_server, tmp_path):
    """The server freezes while the commit is written: after its deadline the coordinator
    gives up (transient: the batch comes again), but the write it had sent lands once the
    server thaws. The worker's next sweep finds its own committed attempt unpublished, and
    publishes it; the batch coming again would find its records committed."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        output = shared(tmp_path)
        coordinator = await claim(
            output, js, owner=OWNER, worker="w0", bucket=DEFAULT_BUCKET, replicas=1
        )
        try:
            a = new_attempt("a")
            stage(output, a, FILES)
            coordinator.deadline, js.timeout = 1.0, 0.3
            nats_server.freeze()
            try:
                with trio.fail_after(TIMEOUT), pytest.raises(CommitStateUnavailable):
                    await coordinator.commit(a, {S: SeqSet([(1, 10)])})
            finally:
                nats_server.thaw()
            coordinator.deadline, js.timeout = 60.0, 5.0
            assert coordinator.in_doubt >= 1 and tree(tmp_path) == {}
            report = await sweep(output, coordinator)
            assert report.rolled == 1 and tree(tmp_path) == FILES
            state = coordinator.state
            assert state.unpublished == {} and state.commits == 1
            again = await coordinator.commit(new_attempt("redo"), {S: SeqSet([(1, 10)])})
            assert isinstance(again, Overlap) and again.count == 10
        finally:
            output.release()
