"""A pipeline embedded in a trio application: next to sibling tasks, stopped by cancellation
(which drains), hard-stopped when the drain cannot finish, and ``pipe.running(nc)`` as a block
whose own exceptions come out unchanged.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
from headrace.jetstream import ConsumerConfig, StreamNotFound
from headrace.pipeline import BatchPolicy
from headrace.sinks import MemorySink

from tests.pipeline.pipe_support import (
    FAST,
    GatedSink,
    add_stream,
    connect,
    fast_pipeline,
    publish,
    source,
    wait_consumer,
    wait_stats,
)


class Oops(Exception):
    pass


@pytest.fixture
async def peer(nats_server, natspy):
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    return natspy


async def assert_drained(peer: Any, run_stats: Any, published: int) -> Any:
    """What the pipeline took was committed and acked, and the server agrees; the rest is
    still there for the next run."""
    taken = run_stats.messages_in
    assert run_stats.acks == taken, run_stats
    assert run_stats.ack_pending == 0
    # The runtime's flush proves the server has read the acks, but a consumer applies them
    # from its own queue: wait for the floor, then check the rest.
    info = await wait_consumer(
        peer, lambda i: i.ack_floor.stream_seq == taken and i.num_ack_pending == 0
    )
    assert info.num_pending == published - taken
    assert info.num_redelivered == 0
    return info


async def test_next_to_sibling_tasks_and_cancelled_with_its_scope(nats_server, peer):
    sink = MemorySink(delay=0.01)
    pipe = fast_pipeline(drain_timeout=10)
    pipe.source(source()).sink(sink, batch=BatchPolicy(max_messages=5, max_age=0.05))
    published = 0
    ticks = 0

    async def publisher() -> None:
        nonlocal published
        while True:
            await publish(peer, 5, start=published)
            published += 5
            await trio.sleep(0.01)

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.005)

    async with connect(nats_server.url, **FAST) as nc:
        with trio.fail_after(pipe.drain_timeout + 10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(publisher)
                nursery.start_soon(ticker)
                nursery.start_soon(pipe.run, nc)
                await sink.wait_for(40)
                nursery.cancel_scope.cancel()  # the caller's scope: the pipeline drains
        assert nursery.cancel_scope.cancelled_caught
    assert ticks > 1
    assert len(sink.records) >= 40
    # everything the sink holds was committed once and acked; the rest was never taken
    assert sorted(sink.keys) == [("S", i) for i in range(1, len(sink.records) + 1)]
    taken = len(sink.records)
    info = await wait_consumer(
        peer, lambda i: i.ack_floor.stream_seq == taken and i.num_ack_pending == 0
    )
    assert info.num_pending == published - taken


async def test_cancelling_drains_what_was_taken(nats_server, peer):
    """Cancelled while batches are in flight: they are cut, committed and acked, inside
    the drain timeout, not stopped hard."""
    await publish(peer, 200)
    sink = MemorySink(delay=0.02)
    pipe = fast_pipeline(drain_timeout=10)
    pipe.source(source()).map(int).sink(sink, batch=BatchPolicy(max_messages=7, max_age=30))
    async with connect(nats_server.url, **FAST) as nc:
        with trio.CancelScope() as scope:
            async with pipe.running(nc) as run:
                await sink.wait_for(14)
                assert run.stats.messages_in > len(sink.records), "nothing in flight"
                scope.cancel()
                await trio.sleep_forever()
        assert scope.cancelled_caught
        assert run.draining and run.stopping
    stats = run.stats
    assert len(sink.records) == stats.messages_in  # an open batch was cut, not dropped
    assert sink.values == list(range(stats.messages_in))
    await assert_drained(peer, stats, 200)
    assert all(
        state == "stopped"
        for name, state in run.states().items()
        if ":" in name or name == "ack-tracker"
    ), run.states()


async def test_leaving_the_block_drains_the_batches_held(nats_server, peer):
    await publish(peer, 30)
    sink = MemorySink(delay=0.05)
    pipe = fast_pipeline(drain_timeout=5)
    pipe.source(source()).sink(sink, batch=BatchPolicy(max_messages=10, max_age=30))
    async with connect(nats_server.url, **FAST) as nc:
        async with pipe.running(nc) as run:
            await sink.wait_for(10)
            # leaving the block drains: the two batches still held are committed
        await assert_drained(peer, run.stats, 30)
    assert len(sink.records) == 30
    assert run.stats.batches_committed == 3


async def test_a_drain_that_cannot_finish_stops_hard_and_the_rest_is_redelivered(nats_server, peer):
    await publish(peer, 10)
    stuck = GatedSink()  # its gate never opens: a sink that hangs
    pipe = fast_pipeline("p", drain_timeout=0.3)
    spec = source(config=ConsumerConfig(ack_wait=1))
    pipe.source(spec).sink(stuck, batch=BatchPolicy(max_messages=10, max_age=30))
    async with connect(nats_server.url, **FAST) as nc:
        with trio.fail_after(5):
            async with pipe.running(nc) as run:
                with trio.fail_after(5):
                    await stuck.entered.wait()
            # left the block: the drain timed out, the pipeline stopped hard
        assert stuck.records == []
        assert run.stats.acks == 0
        assert stuck.closes == 1  # closed even so

        # A second run of the same durable gets what was never committed.
        sink = MemorySink()
        again = fast_pipeline("p")
        again.source(spec).sink(sink, batch=BatchPolicy(max_messages=10, max_age=0.05))
        async with again.running(nc) as run2:
            await sink.wait_for(10)
            await wait_consumer(
                peer, lambda i: i.ack_floor.stream_seq == 10 and i.num_ack_pending == 0
            )
    assert sink.keys == [("S", i) for i in range(1, 11)]
    assert all(r.num_delivered == 2 for r in sink.records)
    assert run2.stats.redeliveries == 10


async def test_a_hanging_sync_sink_stops_hard_after_drain_timeout(nats_server, peer):
    await publish(peer, 3)
    release = threading.Event()
    entered = threading.Event()

    class Hangs:
        def write_batch(self, batch: Any) -> None:
            entered.set()
            release.wait(30)

    # A watchdog lets the thread go after 1.5 s (drain_timeout is 0.3 s), so a failing
    # test ends.
    watchdog = threading.Timer(1.5, release.set)
    watchdog.start()
    try:
        pipe = fast_pipeline(drain_timeout=0.3)
        pipe.source(source()).sink(Hangs(), name="hangs", batch=BatchPolicy(max_messages=3))
        async with connect(nats_server.url, **FAST) as nc:
            async with pipe.running(nc):
                await trio.to_thread.run_sync(entered.wait, 5)
            stopped_at_watchdog = release.is_set()
    finally:
        release.set()
        watchdog.cancel()
    assert not stopped_at_watchdog, "the pipeline waited for the hung thread"


async def test_drain_timed_out_is_reported_and_stop_ends_at_once(nats_server, peer):
    """An async sink that never returns: the drain times out (and says so); a second run is
    ended by stop() long before its drain_timeout."""
    await publish(peer, 3)
    entered = trio.Event()

    class Stuck:
        async def write_batch(self, batch: Any) -> None:
            entered.set()
            await trio.sleep_forever()

    pipe = fast_pipeline(drain_timeout=0.2)
    pipe.source(source()).sink(Stuck(), name="stuck", batch=BatchPolicy(max_messages=3))
    async with connect(nats_server.url, **FAST) as nc:
        with trio.fail_after(10):
            async with pipe.running(nc) as run:
                await entered.wait()
        assert run.drain_timed_out and not run.stopped_hard
        assert run.stats.ack_pending == 3  # not acked: redelivered after ack_wait

        entered = trio.Event()
        slow = fast_pipeline(drain_timeout=600)
        # (another durable: the first one's three messages wait for their ack_wait)
        slow.source(source(durable="D")).sink(
            Stuck(), name="stuck", batch=BatchPolicy(max_messages=3)
        )
        with trio.fail_after(10):
            async with slow.running(nc) as run2:
                await entered.wait()
                run2.stop()
                await run2.wait_finished()
        assert run2.stopped_hard and not run2.drain_timed_out


async def test_a_source_on_a_missing_stream_names_itself(nats_server):
    pipe = fast_pipeline()
    pipe.source(source(stream="NOPE"), name="orders").sink(MemorySink(), name="mem")
    async with connect(nats_server.url, **FAST) as nc:
        with pytest.raises(StreamNotFound) as caught, trio.fail_after(10):
            async with pipe.running(nc):
                await trio.sleep_forever()
    notes = "\n".join(caught.value.__notes__)
    assert "source 'orders' reads stream 'NOPE'" in notes


async def test_running_exposes_stats_states_and_describe(nats_server, peer):
    await publish(peer, 20)
    sink = MemorySink()
    pipe = fast_pipeline("live")
    pipe.source(source()).map(int, name="parse").sink(
        sink, name="mem", batch=BatchPolicy(max_messages=5, max_age=0.05)
    )
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await sink.wait_for(20)
        await wait_stats(lambda: run.stats.acks == 20, what="acks")
        assert run.pipeline is pipe
        assert run.stats.messages_in == 20
        assert run.stats.snapshot()["records_out"] == 20
        states = run.states()
        for name in (
            "source:C",
            "map:parse",
            "batcher:mem",
            "sink:mem",
            "ack-tracker",
            "consume-buffer:S/C",
            "consumer-lifecycle:S/C",
            "connection-supervisor",
        ):
            assert states[name] == "running", states
        chart = run.describe()
        assert '"map:parse (running)"' in chart
        assert '"sink:mem (running)"' in chart
        assert not run.draining
    assert run.states()["sink:mem"] == "stopped"
    assert run.states()["map:parse"] == "stopped"


async def test_an_exception_in_the_body_propagates_unchanged_after_the_drain(nats_server, peer):
    await publish(peer, 50)
    sink = MemorySink(delay=0.01)
    pipe = fast_pipeline()
    pipe.source(source()).sink(sink, batch=BatchPolicy(max_messages=5, max_age=30))
    error = Oops("from the body")
    async with connect(nats_server.url, **FAST) as nc:
        with pytest.raises(Oops) as caught:
            async with pipe.running(nc) as run:
                await sink.wait_for(5)
                raise error
    assert caught.value is error
    assert type(caught.value) is Oops  # not an ExceptionGroup
    assert run.stopping
    assert len(sink.records) == run.stats.messages_in
    await assert_drained(peer, run.stats, 50)


async def test_an_exception_in_a_sibling_task_drains_the_pipeline(nats_server, peer):
    await publish(peer, 30)
    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source()).sink(sink, batch=BatchPolicy(max_messages=5, max_age=0.05))

    async def sibling() -> None:
        await sink.wait_for(10)
        raise Oops("sibling")

    async with connect(nats_server.url, **FAST) as nc:
        with pytest.RaisesGroup(Oops):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sibling)
                async with pipe.running(nc) as run:
                    await trio.sleep_forever()
    assert len(sink.records) == run.stats.messages_in
    await assert_drained(peer, run.stats, 30)


async def test_an_idle_pipeline_stops_at_once(nats_server, peer):
    pipe = fast_pipeline(drain_timeout=30)
    pipe.source(source()).sink(MemorySink())
    async with connect(nats_server.url, **FAST) as nc:
        with trio.fail_after(5):
            async with pipe.running(nc) as run:
                await wait_stats(lambda: all(s.internal_actors for s in run.sources))
    assert run.stats.messages_in == 0
