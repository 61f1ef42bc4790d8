"""``PipelineRun.wait_caught_up`` and ``run_until_caught_up`` on a real nats-server.

What "caught up" means is the server's word (the consumer's ack floor, pipeline/caught_up.py):
each test checks what the run's own counters cannot see (a message naked and waiting for its
redelivery leaves ``stats.ack_pending`` at 0) and reads the consumer with nats-py afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from headrace.jetstream import ConsumerConfig
from headrace.jetstream.errors import ConsumerDeleted, ConsumerNotFound
from headrace.pipeline import (
    Batch,
    BatchPolicy,
    CatchUpTimeout,
    NotCaughtUp,
    Record,
    run_until_caught_up,
)
from headrace.sinks import MemorySink

from tests.pipeline.pipe_support import (
    FAST,
    GatedSink,
    add_stream,
    connect,
    consumer_info,
    fast_pipeline,
    publish,
    source,
)

ONE = BatchPolicy(max_messages=1, max_age=0.01)
SMALL = BatchPolicy(max_messages=10, max_age=0.02)


@pytest.fixture
async def peer(nats_server, natspy):
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    return natspy


async def test_an_empty_stream_is_caught_up_at_once(nats_server, peer):
    pipe = fast_pipeline()
    pipe.source(source()).sink(MemorySink(), batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        with trio.fail_after(5):
            stats = await run.wait_caught_up()
    assert stats.messages_in == 0


async def test_every_message_held_when_called_is_acked(nats_server, peer):
    await publish(peer, 30)
    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source()).sink(sink, batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        with trio.fail_after(10):
            stats = await run.wait_caught_up()
        # Returned when caught up, not later: read before the drain that leaving starts.
        assert len(sink.records) == 30
        assert stats.acks == 30
        info = await consumer_info(peer)
        assert info.ack_floor.stream_seq == 30 and info.num_ack_pending == 0


async def test_a_naked_message_waiting_for_its_redelivery_is_not_caught_up(nats_server, peer):
    """Message 2 fails on its first delivery and is naked with a 1 s delay: meanwhile the run
    holds nothing (``ack_pending`` 0, ``lag`` 0), yet it is not caught up until the
    redelivery is committed and acked."""
    await publish(peer, 3)
    sink = MemorySink()
    pipe = fast_pipeline(nak_delay=1.0, nak_delay_max=1.0)

    def once_bad(record: Record) -> Any:
        if record.value == b"1" and record.delivery.msg.metadata.num_delivered == 1:
            raise ValueError("not yet")
        return record.value

    pipe.source(source()).map(once_bad, record=True).sink(sink, batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        with trio.fail_after(10):
            stats = await run.wait_caught_up()
        assert sorted(sink.values) == [b"0", b"1", b"2"]
        assert stats.naks == 1 and stats.redeliveries == 1 and stats.acks == 3
        info = await consumer_info(peer)
        assert info.ack_floor.stream_seq == 3 and info.num_ack_pending == 0


async def test_a_poison_message_dead_lettered_is_caught_up(nats_server, peer):
    await add_stream(peer, "DLQ", ["dlq.>"])
    await publish(peer, 4)
    sink = MemorySink()
    pipe = fast_pipeline(max_deliveries=2, dead_letter="dlq.p")

    def bad_two(value: bytes) -> bytes:
        if value == b"2":
            raise ValueError("poison")
        return value

    pipe.source(source()).map(bad_two).sink(sink, batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        with trio.fail_after(10):
            stats = await run.wait_caught_up()
        assert stats.dead_lettered == 1 and stats.terms == 1
        assert sorted(sink.values) == [b"0", b"1", b"3"]


async def test_messages_published_after_the_call_are_not_waited_for(nats_server, peer):
    """The late message is stuck in its sink for good; the wait returns all the same."""
    await publish(peer, 3)

    class StuckOnLate(GatedSink):
        async def write_batch(self, batch: Batch) -> None:
            if any(r.value == b"late" for r in batch.records):
                await super().write_batch(batch)  # waits for the gate, never opened here
            else:
                await MemorySink.write_batch(self, batch)

    sink = StuckOnLate()
    pipe = fast_pipeline(drain_timeout=0.5)
    pipe.source(source()).sink(sink, batch=ONE)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        mark = await run.catch_up_mark()
        await publish(peer, 1, data=lambda _i: b"late")
        with trio.fail_after(5):
            await sink.entered.wait()  # the late message is held, unsettled
            stats = await run.wait_caught_up(mark)
        assert stats.acks == 3
        assert [s.seq for s in mark.sources] == [3]
        sink.gate.set()


@pytest.mark.parametrize(
    ("filters", "subject"),
    [("s.mine", lambda _i: "s.mine"), ("s.mine.*", lambda i: f"s.mine.{i % 2}"),
     (["s.one", "s.two"], lambda i: f"s.{'one' if i % 2 else 'two'}")],
    ids=["literal", "wildcard", "several"],
)  # fmt: skip
async def test_a_filtered_consumer_is_marked_by_its_own_subjects(
    nats_server, peer, filters, subject
):
    """The stream's last messages are not the consumer's: its mark is its own last message
    (the ack floor of a filtered consumer never reaches the stream's last sequence), found
    among the messages it has not delivered yet (``max_ack_pending`` 3 holds them back)."""
    await publish(peer, 3, subject)
    sink = GatedSink()
    pipe = fast_pipeline()
    held = source(filter_subjects=filters, config=ConsumerConfig(max_ack_pending=3))
    pipe.source(held).sink(sink, batch=BatchPolicy(max_messages=3, max_age=0.02))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        with trio.fail_after(5):
            await sink.entered.wait()  # a batch is held: what follows is pending
            await publish(peer, 2, subject, start=3)
            await publish(peer, 5, "s.other")
            assert (await consumer_info(peer)).num_pending == 2
            mark = await run.catch_up_mark()
            sink.gate.set()
            await run.wait_caught_up(mark)
        assert [s.seq for s in mark.sources] == [5]
        assert len(sink.records) == 5


async def test_a_deleted_consumer_raises(nats_server, peer):
    """Whichever notices first: the source (its pull answered 409, and the run fails) or the
    waiter (the consumer's info is not found)."""
    await publish(peer, 2)
    sink = GatedSink()
    pipe = fast_pipeline(drain_timeout=0.5)
    pipe.source(source()).sink(sink, batch=SMALL)
    with pytest.raises((ConsumerDeleted, ConsumerNotFound)):
        async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
            with trio.fail_after(5):
                await sink.entered.wait()
                mark = await run.catch_up_mark()

                async def delete() -> None:
                    await peer.nc.jetstream().delete_consumer("S", "C")

                await peer.call(delete)
                await run.wait_caught_up(mark)


async def test_a_failed_run_raises_its_error_not_a_hang(nats_server, peer):
    await publish(peer, 2)

    def crash(value: bytes) -> bytes:
        raise KeyError("broken")

    pipe = fast_pipeline()
    pipe.source(source()).map(crash, on_error="crash").sink(MemorySink(), batch=SMALL)
    with pytest.raises(KeyError), trio.fail_after(10):
        async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
            await run.wait_caught_up()


async def test_a_finished_run_is_not_caught_up(nats_server, peer):
    await publish(peer, 2)
    sink = GatedSink()
    pipe = fast_pipeline(drain_timeout=0.2)
    pipe.source(source(config=ConsumerConfig(ack_wait=30))).sink(sink, batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        with trio.fail_after(5):
            await sink.entered.wait()
            mark = await run.catch_up_mark()
            run.stop()
            await run.wait_finished()
            with pytest.raises(NotCaughtUp):
                await run.wait_caught_up(mark)


async def test_run_until_caught_up_drains_and_returns_the_stats(nats_server, peer):
    await publish(peer, 25)
    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source()).sink(sink, batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc:
        with trio.fail_after(10):
            stats = await run_until_caught_up(pipe, nc, timeout=10)
    assert stats.acks == 25 and stats.ack_pending == 0
    assert sink.closes == 1  # drained and closed
    assert sorted(sink.values) == sorted(b"%d" % i for i in range(25))


async def test_run_until_caught_up_times_out_with_a_typed_error(nats_server, peer):
    await publish(peer, 1)
    sink = GatedSink()  # never opened: the one message is never committed
    pipe = fast_pipeline(drain_timeout=0.2)
    pipe.source(source()).sink(sink, batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc:
        with trio.fail_after(10), pytest.raises(CatchUpTimeout):
            await run_until_caught_up(pipe, nc, timeout=0.5)
