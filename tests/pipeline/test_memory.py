"""What a pipeline holds is bounded by ``max_in_flight``, not by what it has consumed.

A settled message (acked, naked, terminated) must be freed by reference counting alone, at
once: ``headrace run`` tunes the garbage collector (``tune_gc``) so that full collections are
rare, and anything acked that only a full collection frees (a reference cycle) piles up with
every message consumed. These tests run with the collector off, so a cycle anywhere between a
delivery and what the pipeline keeps shows up.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from headrace.jetstream.consume import ConsumeOptions
from headrace.pipeline import Batch, BatchPolicy, Delivery

from tests.pipeline.pipe_support import (
    FAST,
    GatedSink,
    connect,
    fast_pipeline,
    source,
    wait_consumer,
)


@pytest.fixture
def no_gc() -> Iterator[None]:
    """The garbage collector off for the test (as good as never running, for a cycle)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def rss_bytes() -> int:
    """This process's resident set size, from /proc/self/status."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class SamplingSink:
    """Keeps nothing of what it writes but a weak reference to some of the deliveries (every
    ``every``-th record), and the largest RSS seen."""

    def __init__(self, every: int, warm: int = 0) -> None:
        self.every = every
        self.count = 0
        #: Set once ``warm`` records were written.
        self.warm = warm
        self.warmed = trio.Event()
        self.sampled: list[weakref.ref[Delivery]] = []
        self.bytes = 0
        self.peak_rss = 0

    async def write_batch(self, batch: Batch) -> None:
        for record in batch:
            if self.count % self.every == 0:
                self.sampled.append(weakref.ref(record.delivery))
            self.count += 1
            self.bytes += len(record.data)
        self.peak_rss = max(self.peak_rss, rss_bytes())
        if self.count >= self.warm:
            self.warmed.set()

    def alive(self, refs: list[weakref.ref[Delivery]] | None = None) -> int:
        return sum(1 for ref in (self.sampled if refs is None else refs) if ref() is not None)


async def add_memory_stream(natspy: Any, name: str = "S", subject: str = "s.>") -> None:
    async def go() -> None:
        await natspy.nc.jetstream().add_stream(name=name, subjects=[subject], storage="memory")

    await natspy.call(go)


async def publish_fast(
    natspy: Any, n: int, size: int, stream: str = "S", subject: str = "s.x"
) -> None:
    """``n`` messages of ``size`` bytes, as core publishes (no PubAck to wait for each), then
    the stream polled, briefly and under a time limit, until it holds them all."""

    async def go() -> None:
        for i in range(n):
            await natspy.nc.publish(subject, b"%08d" % i + b"x" * (size - 8))
        await natspy.nc.flush()

    async def stored() -> int:
        info = await natspy.nc.jetstream().stream_info(stream)
        return int(info.state.messages)

    await natspy.call(go)
    with trio.fail_after(30):
        while await natspy.call(stored) < n:  # noqa: ASYNC110 - server state has no event
            await trio.sleep(0.05)


@pytest.fixture
async def peer(nats_server: Any, natspy: Any) -> Any:
    await natspy.connect(nats_server.url)
    await add_memory_stream(natspy)
    return natspy


def all_acked(n: int) -> Any:
    return lambda info: info.ack_floor.stream_seq == n and info.num_ack_pending == 0


async def test_a_delivery_is_freed_when_acked_without_a_collection(
    nats_server: Any, peer: Any, no_gc: None
) -> None:
    """With the collector off, the deliveries of messages acked are gone, by reference
    counting alone, while the pipeline runs on: none of the first half sampled is left once
    everything is acked, and none at all once the pipeline has ended."""
    n = 4000
    await publish_fast(peer, n, 100)
    sink = SamplingSink(every=7)
    pipe = fast_pipeline("memory")
    pipe.source(source()).sink(sink, batch=BatchPolicy(max_messages=100, max_age=0.05))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await wait_consumer(peer, all_acked(n), timeout=30)
        assert run.stats.acks == n and sink.count == n
        first_half = sink.sampled[: len(sink.sampled) // 2]
        assert sink.alive(first_half) == 0
    assert sink.alive() == 0


async def test_an_open_group_ahead_keeps_no_settled_message(
    nats_server: Any, peer: Any, no_gc: None
) -> None:
    """Two sources, one held at its sink (its first messages stay unsettled, ahead of all the
    other's in the ack tracker's arrival order): the other source's messages, acked, are freed
    all the same, not kept until the held ones settle."""
    await add_memory_stream(peer, "T", "t.>")
    await publish_fast(peer, 5, 100)
    held = GatedSink()
    sink = SamplingSink(every=7)
    pipe = fast_pipeline("two")
    small = BatchPolicy(max_messages=100, max_age=0.05)
    pipe.source(source(), name="held").sink(held, name="held", batch=small)
    pipe.source(source("T"), name="flowing").sink(sink, name="flowing", batch=small)
    n = 3000
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        with trio.fail_after(10):
            await held.entered.wait()
        await publish_fast(peer, n, 100, "T", "t.x")
        await wait_consumer(peer, all_acked(n), stream="T", timeout=30)
        assert run.stats.ack_pending == 5 and sink.count == n
        assert sink.alive(sink.sampled[: len(sink.sampled) // 2]) == 0
        held.gate.set()
        await wait_consumer(peer, all_acked(5), timeout=10)
    assert sink.alive() == 0


async def test_memory_stays_bounded_by_what_is_in_flight(
    nats_server: Any, peer: Any, no_gc: None
) -> None:
    """20,000 messages of 10 KB (200 MB) through a pipeline holding at most 400 (4 MB) at once,
    with the collector off: the process grows by a small part of what went through, not by
    all of it, and the deliveries sampled are freed as they are acked."""
    n, size = 20_000, 10_000
    await publish_fast(peer, n, size)
    sink = SamplingSink(every=97, warm=2_000)
    pipe = fast_pipeline("memory")
    spec = source(consume=ConsumeOptions(max_messages=200))
    pipe.source(spec).sink(sink, batch=BatchPolicy(max_messages=200, max_age=0.05))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        with trio.fail_after(60):
            await sink.warmed.wait()  # buffers and inboxes at their size
        start = rss_bytes()
        sink.peak_rss = start
        await wait_consumer(peer, all_acked(n), timeout=60)
        assert run.stats.acks == n and sink.bytes == n * size
        early_alive = sink.alive(sink.sampled[: len(sink.sampled) // 2])
    grown = sink.peak_rss - start
    volume = n * size
    print(f"RSS grew by {grown / 1e6:.1f} MB for {volume / 1e6:.0f} MB consumed")
    assert grown < volume // 10, f"RSS grew by {grown} bytes for {volume} bytes consumed"
    assert early_alive == 0
    assert sink.alive() == 0
