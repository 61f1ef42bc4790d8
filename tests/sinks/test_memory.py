"""MemorySink: keeping batches, injected failures, delays, and waiting for records."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from headrace.pipeline import SinkRunner
from headrace.sinks import MemorySink

from tests.sinks.sink_support import seqs


async def test_keeps_batches_and_records_in_order() -> None:
    sink = MemorySink()
    runner = SinkRunner(sink, "memory")
    await runner.open()
    first, second = seqs(1, 2), seqs(3)
    await runner.write_batch(first)
    await runner.write_batch(second)
    await runner.close()
    assert sink.batches == [first, second]
    assert sink.records == [*first.records, *second.records]
    assert sink.values == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert sink.keys == [("ORDERS", 1), ("ORDERS", 2), ("ORDERS", 3)]
    assert (sink.opens, sink.closes, sink.writes, sink.failures) == (1, 1, 2, 0)
    sink.clear()
    assert sink.batches == [] and sink.records == []


async def test_fails_the_next_writes() -> None:
    sink = MemorySink(fail_times=2)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="injected failure"):
            await sink.write_batch(seqs(1))
    assert sink.records == [] and sink.failures == 2
    await sink.write_batch(seqs(1))
    assert sink.keys == [("ORDERS", 1)]
    assert (sink.writes, sink.failures, sink.fail_times) == (3, 2, 0)


async def test_fails_with_a_given_class_or_instance() -> None:
    class DiskFull(OSError):
        pass

    sink = MemorySink(fail_times=1, fail_with=DiskFull)
    with pytest.raises(DiskFull):
        await sink.write_batch(seqs(1))
    boom = ValueError("boom")
    sink.fail_next(2, boom)
    for _ in range(2):
        with pytest.raises(ValueError, match="boom") as info:
            await sink.write_batch(seqs(2))
        assert info.value is boom
    await sink.write_batch(seqs(3))
    assert sink.keys == [("ORDERS", 3)]


def test_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="fail_times"):
        MemorySink(fail_times=-1)
    with pytest.raises(ValueError, match="delay"):
        MemorySink(delay=-0.1)
    with pytest.raises(ValueError, match="delay"):
        MemorySink(delay=float("nan"))


async def test_delay_per_write(autojump_clock: trio.testing.MockClock) -> None:
    sink = MemorySink(delay=2.5)
    start = trio.current_time()
    await sink.write_batch(seqs(1))
    assert trio.current_time() - start == pytest.approx(2.5)
    assert len(sink.records) == 1


async def test_delay_then_failure(autojump_clock: trio.testing.MockClock) -> None:
    sink = MemorySink(delay=1.0, fail_times=1)
    start = trio.current_time()
    with pytest.raises(RuntimeError):
        await sink.write_batch(seqs(1))
    assert trio.current_time() - start == pytest.approx(1.0)


async def test_slow_write_is_not_kept_when_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = MemorySink(delay=10.0)
    with trio.move_on_after(1.0):
        await sink.write_batch(seqs(1))
    assert sink.records == []


async def test_wait_for_wakes_on_writes() -> None:
    sink = MemorySink()
    woke: list[int] = []

    async def waiter(n: int) -> None:
        await sink.wait_for(n, timeout=5)
        woke.append(n)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter, 3)
        nursery.start_soon(waiter, 1)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == []
        await sink.write_batch(seqs(1, 2))
        await trio.testing.wait_all_tasks_blocked()
        assert woke == [1]
        await sink.write_batch(seqs(3))
    assert woke == [1, 3]
    assert sink._waiters == []


async def test_wait_for_returns_at_once_when_held() -> None:
    sink = MemorySink()
    await sink.write_batch(seqs(1, 2))
    with trio.fail_after(1):
        await sink.wait_for(2)
        await sink.wait_for(0)


async def test_wait_for_times_out(autojump_clock: trio.testing.MockClock) -> None:
    sink = MemorySink()
    await sink.write_batch(seqs(1))
    with pytest.raises(trio.TooSlowError, match="waited 3s for 2 records, it holds 1"):
        await sink.wait_for(2, timeout=3)
    assert sink._waiters == []


async def test_wait_for_without_timeout_cancelled_cleans_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = MemorySink()
    with trio.move_on_after(100):
        await sink.wait_for(1, timeout=None)
    assert sink._waiters == []
