"""Sync sinks run on one thread of their own for their whole life (pipeline/sink_thread.py).

The sinks here are written the natural way for a database: a ``sqlite3`` connection opened in
``open()`` with the default ``check_same_thread``, used in ``write_batch`` and closed in
``close()``. sqlite3 refuses a connection used from a thread other than the one that made it,
so every call of the sink must land on one thread, whatever else the application runs in
trio's threads meanwhile.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from headrace.pipeline import Batch, BatchPolicy, SinkContext, SinkRunner
from headrace.pipeline.sink_thread import THREAD_NAME_PREFIX

from tests.pipeline.pipe_support import (
    FAST,
    add_stream,
    connect,
    fast_pipeline,
    publish,
    source,
    wait_consumer,
)

N = 300
BATCH = BatchPolicy(max_messages=10, max_age=0.02)


class SqliteSink:
    """A sqlite3 sink as anyone would write it; it notes the thread of every call."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name
        self.db: sqlite3.Connection | None = None
        self.threads: dict[str, set[int]] = {}
        self.thread_names: set[str] = set()
        self.maintained = trio.Event()

    def _note(self, method: str) -> None:
        self.threads.setdefault(method, set()).add(threading.get_ident())
        self.thread_names.add(threading.current_thread().name)

    def bind(self, context: SinkContext) -> None:
        self._note("bind")

    def open(self) -> None:
        self._note("open")
        self.db = sqlite3.connect(self.path)
        self.db.execute("CREATE TABLE IF NOT EXISTS rows (seq INTEGER, value BLOB)")
        self.db.commit()

    def write_batch(self, batch: Batch) -> None:
        self._note("write_batch")
        assert self.db is not None
        self.db.executemany(
            "INSERT INTO rows VALUES (?, ?)", [(r.stream_seq, r.value) for r in batch]
        )
        self.db.commit()

    def maintain(self) -> None:
        self._note("maintain")
        assert self.db is not None
        self.db.execute("SELECT count(*) FROM rows").fetchone()
        # Back to the loop from the sink's thread, as docs/sinks.md says a sync sink may.
        trio.from_thread.run_sync(self.maintained.set)

    def close(self) -> None:
        self._note("close")
        assert self.db is not None
        self.db.close()
        self.db = None

    def seqs(self) -> list[int]:
        with sqlite3.connect(self.path) as db:
            return sorted(seq for (seq,) in db.execute("SELECT seq FROM rows"))


@pytest.fixture
async def peer(nats_server: Any, natspy: Any) -> Any:
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    await add_stream(natspy, "DLQ", ["dlq.>"])
    return natspy


async def busy_app(stop: trio.Event, done: list[int]) -> None:
    """The application's own use of trio's threads, all the while: two tasks, each one short
    call after another, so trio's cache hands out its threads in changing order."""

    async def one() -> None:
        while not stop.is_set():
            done.append(await trio.to_thread.run_sync(sum, range(2000)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        nursery.start_soon(one)


@pytest.mark.slow
async def test_two_sqlite_sinks_each_keep_one_thread(
    nats_server: Any, peer: Any, tmp_path: Path
) -> None:
    """Two sqlite3 sinks fed by one source while the app uses trio.to_thread: every message is
    written once to each, none is naked or dead-lettered, and each sink's bind, open,
    write_batch, maintain and close all ran on one thread, its own, not the loop's."""
    await publish(peer, N)
    lake = SqliteSink(tmp_path / "lake.db", "lake")
    audit = SqliteSink(tmp_path / "audit.db", "audit")
    pipe = fast_pipeline("sqlite", max_deliveries=2, dead_letter="dlq.sqlite")
    flow = pipe.source(source())
    flow.sink(lake, name="lake", batch=BATCH)
    flow.sink(audit, name="audit", batch=BATCH)
    app_calls: list[int] = []
    stop = trio.Event()
    async with trio.open_nursery() as app:
        app.start_soon(busy_app, stop, app_calls)
        async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
            await wait_consumer(
                peer, lambda i: i.ack_floor.stream_seq == N and i.num_ack_pending == 0
            )
            with trio.fail_after(10):  # idle a second: maintain() is called
                await lake.maintained.wait()
                await audit.maintained.wait()
            stats = run.stats
        stop.set()
    assert (stats.acks, stats.records_out) == (N, 2 * N)
    assert stats.errors == stats.naks == stats.terms == stats.dead_lettered == 0
    assert stats.batches_failed == 0
    assert lake.seqs() == list(range(1, N + 1))
    assert audit.seqs() == list(range(1, N + 1))
    assert len(app_calls) > 10  # the app did use trio's threads meanwhile
    loop = threading.get_ident()
    for sink in (lake, audit):
        assert set(sink.threads) == {"bind", "open", "write_batch", "maintain", "close"}
        (ident,) = set.union(*sink.threads.values())
        assert ident != loop
        assert sink.thread_names == {THREAD_NAME_PREFIX + sink.name}
    assert lake.threads["open"] != audit.threads["open"]


async def test_the_thread_is_let_go_after_close(
    nats_server: Any, peer: Any, tmp_path: Path
) -> None:
    """Once the pipeline has ended, no thread serves its sink any more (trio's cache has it
    back, under its own name), and a sink opened again gets a thread again."""
    await publish(peer, 20)
    lake = SqliteSink(tmp_path / "lake.db", "lake")
    pipe = fast_pipeline("sqlite")
    pipe.source(source()).sink(lake, name="lake", batch=BATCH)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await wait_consumer(peer, lambda i: i.ack_floor.stream_seq == 20)
        lane = run.stages["sink:lake"].runner.thread
        assert lane is not None and not lane.stopping
        serving = [t.name for t in threading.enumerate()]
        assert serving.count(THREAD_NAME_PREFIX + "lake") == 1
    assert lane.stopping and lane.ended.is_set() and lane.pending == 0
    assert not [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX)]
    assert lake.seqs() == list(range(1, 21))

    # The same sink again (as a restart does): a new thread for the new life.
    runner = SinkRunner(lake, "lake")
    await runner.open()
    await runner.close()
    assert runner.thread is not None and runner.thread is not lane
    assert runner.thread.ended.is_set()
    assert not [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX)]


# -- cancellation and the thread's life, on a SinkRunner alone ---------------------------------


class StuckSink:
    """A sync sink whose write waits for ``release`` (a driver stuck in I/O); it notes each call
    and the thread it ran on."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.entered = trio.Event()
        self.release = threading.Event()

    def open(self) -> None:
        self.calls.append(("open", threading.get_ident()))

    def write_batch(self, batch: Any) -> None:
        self.calls.append(("write_batch", threading.get_ident()))
        trio.from_thread.run_sync(self.entered.set)
        self.release.wait()

    def close(self) -> None:
        self.calls.append(("close", threading.get_ident()))


async def test_a_hard_stop_abandons_the_call_and_skips_what_it_gave_up() -> None:
    """A write stuck in the sink is abandoned when cancelled; a close given up before it began
    never runs; the next life waits for the stuck thread, then runs on a thread of its own."""
    sink = StuckSink()
    runner = SinkRunner(sink, "stuck")
    await runner.open()
    lane = runner.thread
    assert lane is not None
    write_scope, close_scope = trio.CancelScope(), trio.CancelScope()

    async def write() -> None:
        with write_scope:
            await runner.write_batch(None)

    async def close() -> None:
        with close_scope:
            await runner.close()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            await sink.entered.wait()
            write_scope.cancel()  # a hard stop: the write is abandoned to its thread
        assert write_scope.cancelled_caught
        async with trio.open_nursery() as nursery:
            nursery.start_soon(close)
            await trio.testing.wait_all_tasks_blocked()
            close_scope.cancel()  # the stop's time for close ran out: given up, not begun
        assert close_scope.cancelled_caught
    assert lane.stopping and lane.pending == 2 and not lane.ended.is_set()

    reopened = trio.Event()

    async def reopen() -> None:
        await runner.open()
        reopened.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reopen)
            await trio.testing.wait_all_tasks_blocked()
            assert not reopened.is_set()  # waits: the last life's thread is still stuck
            sink.release.set()
            await reopened.wait()
        await runner.close()
    assert lane.ended.is_set() and lane.pending == 0
    names = [name for name, _ in sink.calls]
    assert names == ["open", "write_batch", "open", "close"]  # the given-up close never ran
    first, second = {i for n, i in sink.calls[:2]}, {i for n, i in sink.calls[2:]}
    assert len(first) == len(second) == 1
    assert runner.thread is not lane and runner.thread is not None
    assert runner.thread.ended.is_set()


async def test_a_failed_open_lets_the_thread_go_and_errors_come_back_whole() -> None:
    class BrokenOpen:
        def open(self) -> None:
            raise sqlite3.OperationalError("unable to open database file")

        def write_batch(self, batch: Any) -> None:  # pragma: no cover - never called
            raise AssertionError("written without an open")

    runner = SinkRunner(BrokenOpen(), "broken")
    with pytest.raises(sqlite3.OperationalError, match="unable to open database file"):
        await runner.open()
    assert runner.thread is not None and runner.thread.stopping
    with trio.fail_after(10):
        await runner.thread.ended.wait()
    assert not [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX)]
