"""Failures on a real nats-server: naks and redelivery, poison messages and dead letters,
operator errors, restart policies and escalation, slow sinks (+WPI) and bounded memory.

nats-py is the independent peer: it publishes, reads the dead-letter subject and stream, and
reads the consumer's state (redeliveries, ack floor) as the server keeps it.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from headrace.actors import ActorState, Restart
from headrace.jetstream import ConsumeOptions, ConsumerConfig
from headrace.pipeline import BatchPolicy, Record
from headrace.pipeline.stages import INBOX_BATCHES
from headrace.sinks import MemorySink, RecordsRejected
from pipe_support import (
    FAST,
    add_stream,
    connect,
    consumer_info,
    fake_record,
    fast_pipeline,
    publish,
    source,
    wait_consumer,
    wait_stats,
)


class DiskFull(Exception):
    pass


def all_done(n: int):
    """Every message of 1..n acked or terminated, nothing pending (nats-py's view)."""
    return lambda info: info.ack_floor.stream_seq == n and info.num_ack_pending == 0


@pytest.fixture
async def peer(nats_server, natspy):
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    return natspy


class TimedSink(MemorySink):
    """A MemorySink that notes when each write started and what deliveries it saw."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.write_times: list[float] = []
        self.seen_delivered: list[list[int]] = []

    async def write_batch(self, batch: Any) -> None:
        self.write_times.append(trio.current_time())
        self.seen_delivered.append([r.num_delivered for r in batch])
        await super().write_batch(batch)


# -- sink failures: nak, redelivery, poison -----------------------------------------------------


async def test_a_sink_that_fails_twice_naks_and_gets_the_messages_again(nats_server, peer):
    await publish(peer, 5)
    sink = TimedSink(fail_times=2, fail_with=DiskFull)
    pipe = fast_pipeline(nak_delay=0.2, nak_delay_max=5)
    # count-cut batches: each delivery of the five messages makes one batch
    pipe.source(source()).sink(sink, name="lake", batch=BatchPolicy(max_messages=5, max_age=30))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await sink.wait_for(5)
        info = await wait_consumer(peer, all_done(5))
        stats = run.stats
        assert stats.naks == 10
        assert stats.batches_failed == 2
        assert stats.batches_committed == 1
        assert stats.redeliveries == 10
        assert stats.acks == 5
        assert [e.stage for e in run.errors] == ["lake", "lake"]
        assert all(isinstance(e.error, DiskFull) for e in run.errors)
    assert sink.seen_delivered == [[1] * 5, [2] * 5, [3] * 5]
    assert [r.num_delivered for r in sink.records] == [3] * 5
    assert sink.keys == [("S", i) for i in range(1, 6)]
    assert info.delivered.consumer_seq == 15  # three deliveries of five messages
    assert info.num_redelivered == 0
    # the nak delay grows with the delivery count: 0.2 s, then 0.4 s
    first, second, third = sink.write_times
    assert second - first >= 0.2
    assert third - second >= 0.4


async def test_a_sink_that_always_fails_dead_letters_into_a_stream(nats_server, peer):
    await add_stream(peer, "DLQ", ["dlq.>"])
    await publish(peer, 2, headers=lambda i: {"X-Trace": f"t{i}"})
    sink = MemorySink(fail_times=1000, fail_with=DiskFull("disk full\r\nreally"))
    pipe = fast_pipeline("orders", max_deliveries=3, dead_letter="dlq.orders")
    pipe.source(source()).sink(sink, batch=BatchPolicy(max_messages=2, max_age=30))

    async def read_dead_letters() -> list[Any]:
        sub = await peer.nc.jetstream().pull_subscribe("dlq.>", "reader", stream="DLQ")
        got: list[Any] = []
        while len(got) < 2:
            got += await sub.fetch(2 - len(got), timeout=10)
        return got

    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        dead = await peer.call(read_dead_letters)
        info = await wait_consumer(peer, all_done(2))
        assert run.stats.dead_lettered == 2
        assert run.stats.terms == 2
        assert run.stats.naks == 4  # two per message before the third delivery
        assert run.stats.acks == 0
    assert sink.writes == 3
    assert sink.records == []
    assert info.delivered.consumer_seq == 6  # never delivered again after the +TERM
    for i, msg in enumerate(sorted(dead, key=lambda m: int(m.headers["Headrace-Stream-Seq"]))):
        assert msg.subject == "dlq.orders"
        assert msg.data == b"%d" % i
        h = msg.headers
        assert h["Headrace-Pipeline"] == "orders"
        assert h["Headrace-Error"].startswith("DiskFull: disk full")
        assert "\n" not in h["Headrace-Error"] and "\r" not in h["Headrace-Error"]
        assert h["Headrace-Subject"] == "s.x"
        assert h["Headrace-Stream"] == "S"
        assert h["Headrace-Stream-Seq"] == str(i + 1)
        assert h["Headrace-Delivered"] == "3"
        assert h["X-Trace"] == f"t{i}"  # the message's own headers travel with it


class PickySink(MemorySink):
    """Commits every record but those whose payload is in ``bad`` (a poison value), and says
    so with RecordsRejected: the partial-failure contract."""

    def __init__(self, bad: set[bytes]) -> None:
        super().__init__()
        self.bad = bad

    async def write_batch(self, batch: Any) -> None:
        good = [r for r in batch if r.data not in self.bad]
        rejected = [(r, ValueError(f"poison {r.data!r}")) for r in batch if r.data in self.bad]
        self.records.extend(good)
        if rejected:
            raise RecordsRejected(rejected)


async def test_rejected_records_fail_alone_and_the_rest_is_acked(nats_server, peer):
    await add_stream(peer, "DLQ", ["dlq.>"])
    await publish(peer, 6)  # payloads b"0" .. b"5"
    sink = PickySink({b"2", b"4"})
    pipe = fast_pipeline("picky", max_deliveries=2, dead_letter="dlq.picky", nak_delay=0.05)
    pipe.source(source()).sink(sink, batch=BatchPolicy(max_messages=6, max_age=0.2))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        info = await wait_consumer(peer, all_done(6))
        stats = run.stats
        assert stats.acks == 4
        assert stats.naks == 2  # the two poison messages, once each
        assert stats.dead_lettered == 2  # then dead-lettered on their second delivery
        assert stats.batches_failed == 0
        assert isinstance(run.errors[0].error, RecordsRejected)
    assert sorted(r.stream_seq for r in sink.records) == [1, 2, 4, 6]
    assert info.num_redelivered == 0


class ConfusedSink(MemorySink):
    """Rejects a record that was never in its batch: a sink bug, not a partial commit."""

    async def write_batch(self, batch: Any) -> None:
        raise RecordsRejected([(fake_record("S", 999), ValueError("not mine"))])


async def test_rejecting_records_not_in_the_batch_fails_the_whole_batch(nats_server, peer):
    await publish(peer, 3)
    sink = ConfusedSink()
    pipe = fast_pipeline(nak_delay=30, nak_delay_max=30)
    pipe.source(source()).sink(sink, name="lake", batch=BatchPolicy(max_messages=3, max_age=30))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await wait_stats(lambda: run.stats.naks == 3, what="three naks")
        assert run.stats.acks == 0
        assert run.stats.batches_failed == 1
        (error,) = [e.error for e in run.errors]
        assert "rejected records not in the batch" in str(error)


async def test_dead_letters_without_a_stream_go_to_core_subscribers(nats_server, peer):
    await publish(peer, 1)
    received: list[Any] = []

    async def subscribe() -> Any:
        return await peer.nc.subscribe("dead.>")

    sub = await peer.call(subscribe)
    await peer.call(peer.nc.flush)
    sink = MemorySink(fail_times=1000)
    pipe = fast_pipeline("core-dlq", max_deliveries=2, dead_letter="dead.letters")
    pipe.source(source()).sink(sink, batch=BatchPolicy(max_messages=1, max_age=30))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        received.append(await peer.call(sub.next_msg, timeout=10))
        # terminated right after the dead letter is out (a flush confirms a core publish)
        await wait_stats(lambda: run.stats.terms == 1, timeout=2, what="the +TERM")
        await wait_consumer(peer, all_done(1))
        assert run.stats.dead_lettered == 1
    msg = received[0]
    assert msg.subject == "dead.letters"
    assert msg.data == b"0"
    assert msg.headers["Headrace-Pipeline"] == "core-dlq"
    assert msg.headers["Headrace-Error"].startswith("RuntimeError: MemorySink: injected failure")
    assert msg.headers["Headrace-Subject"] == "s.x"
    assert msg.headers["Headrace-Stream"] == "S"
    assert msg.headers["Headrace-Stream-Seq"] == "1"


async def test_poison_without_a_dead_letter_subject_is_terminated(nats_server, peer):
    await publish(peer, 1)
    sink = MemorySink(fail_times=1000)
    pipe = fast_pipeline(max_deliveries=1)
    pipe.source(source()).sink(sink, batch=BatchPolicy(max_messages=1, max_age=30))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        info = await wait_consumer(peer, all_done(1))
        assert run.stats.terms == 1
        assert run.stats.dead_lettered == 0
        assert run.stats.naks == 0
    assert sink.writes == 1
    assert info.delivered.consumer_seq == 1


async def test_a_dead_letter_the_stream_refuses_is_not_terminated(nats_server, peer):
    """Nothing keeps it, so it must not be dropped: it is naked for a later delivery."""

    async def full_dlq() -> None:
        await peer.nc.jetstream().add_stream(
            name="DLQ", subjects=["dlq.>"], max_msgs=1, discard="new"
        )
        await peer.nc.jetstream().publish("dlq.full", b"occupied")

    await peer.call(full_dlq)
    await publish(peer, 1)
    sink = MemorySink(fail_times=1000)
    pipe = fast_pipeline(max_deliveries=1, dead_letter="dlq.p", nak_delay_max=30)
    pipe.source(source()).sink(sink, batch=BatchPolicy(max_messages=1, max_age=30))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await wait_stats(lambda: run.stats.naks >= 1, what="a nak")
        assert run.stats.terms == 0
        assert run.stats.dead_lettered == 0
        await nc.flush()
        info = await consumer_info(peer)
        # naked (with nak_delay_max), not terminated: the server still owes it to us
        assert info.ack_floor.stream_seq == 0
        assert info.num_ack_pending == 1


# -- operator failures ---------------------------------------------------------------------------


async def test_an_operator_error_fails_only_that_records_message(nats_server, peer):
    await publish(peer, 10)

    def parse(data: bytes) -> int:
        value = int(data)
        if value == 3:
            raise ValueError("three is bad")
        return value

    sink = MemorySink()
    pipe = fast_pipeline(max_deliveries=2)
    pipe.source(source()).map(parse, name="parse").sink(
        sink, batch=BatchPolicy(max_messages=10, max_age=0.05)
    )
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await sink.wait_for(9)
        await wait_consumer(peer, all_done(10))
        assert run.stats.naks == 1
        assert run.stats.terms == 1
        assert run.stats.acks == 9
        assert run.stages["map:parse"].state is ActorState.RUNNING
    assert sink.values == [v for v in range(10) if v != 3]
    assert len(set(sink.keys)) == 9  # each committed once


async def test_an_operator_error_in_a_concurrent_map(nats_server, peer):
    await publish(peer, 10)

    async def parse(data: bytes) -> int:
        await trio.lowlevel.checkpoint()
        if int(data) % 4 == 1:
            raise ValueError("bad")
        return int(data)

    sink = MemorySink()
    pipe = fast_pipeline(max_deliveries=1)
    pipe.source(source()).map(parse, concurrency=4).sink(
        sink, batch=BatchPolicy(max_messages=10, max_age=0.05)
    )
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await sink.wait_for(7)
        await wait_consumer(peer, all_done(10))
        assert run.stats.terms == 3
    assert sink.values == [0, 2, 3, 4, 6, 7, 8]


async def test_crash_with_a_restart_policy_recovers(nats_server, peer):
    await publish(peer, 5)
    crashed = trio.Event()

    def parse(record: Record) -> int:
        if int(record.value) == 2 and not crashed.is_set():
            crashed.set()
            raise ValueError("transient")
        return int(record.value)

    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source()).map(
        parse, name="parse", record=True, on_error="crash", restart=Restart(backoff=0.01)
    ).sink(sink, batch=BatchPolicy(max_messages=100, max_age=0.05))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        with trio.fail_after(10):
            await crashed.wait()
        # later messages are processed by the restarted actor
        await publish(peer, 5, start=5)
        await sink.wait_for(10)
        await wait_consumer(peer, all_done(10))
        actor = run.stages["map:parse"]
        assert actor.restarts == 1
        assert actor.state is ActorState.RUNNING
        assert isinstance(actor.error, ValueError)
    assert sorted(sink.values) == list(range(10))
    assert len(set(sink.keys)) == 10
    # the failed batch (which held message 2) was naked and came back
    by_value = {r.value: r for r in sink.records}
    assert by_value[2].num_delivered == 2
    assert by_value[9].num_delivered == 1


async def test_escalation_stops_the_pipeline_with_the_original_error(nats_server, peer):
    await publish(peer, 3)

    def parse(data: bytes) -> int:
        raise KeyError(f"no such thing: {data!r}")

    sink = MemorySink()
    pipe = fast_pipeline("strict")
    pipe.source(source()).map(parse, name="parse", on_error="crash").sink(sink)
    async with connect(nats_server.url, **FAST) as nc:
        with trio.fail_after(10), pytest.raises(KeyError) as caught:
            async with pipe.running(nc) as run:
                await trio.sleep_forever()
        assert run.stages["map:parse"].state is ActorState.FAILED
    assert type(caught.value) is KeyError  # not an ExceptionGroup, not ActorFailed
    assert "no such thing" in str(caught.value)
    notes = getattr(caught.value, "__notes__", [])
    assert any("'map:parse'" in n and "'strict'" in n for n in notes), notes
    assert sink.records == []


async def test_restarts_exhausted_escalate_with_the_original_error(nats_server, peer):
    await publish(peer, 1)
    calls = []

    def parse(data: bytes) -> int:
        calls.append(data)
        raise ZeroDivisionError("always")

    pipe = fast_pipeline("p", nak_delay=0.01, nak_delay_max=0.01, max_deliveries=100)
    pipe.source(source()).map(
        parse,
        name="parse",
        on_error="crash",
        restart=Restart(max_restarts=2, within=60, backoff=0.01),
    ).sink(MemorySink(), batch=BatchPolicy(max_messages=1, max_age=30))
    async with connect(nats_server.url, **FAST) as nc:
        with trio.fail_after(10), pytest.raises(ZeroDivisionError) as caught:
            async with pipe.running(nc) as run:
                await trio.sleep_forever()
    assert run.stages["map:parse"].restarts == 2
    assert len(calls) == 3  # the message came back after each nak
    assert any("'map:parse'" in n for n in caught.value.__notes__)


async def test_a_failing_sink_with_a_restart_policy_is_not_restarted_for_write_errors(
    nats_server, peer
):
    """A write that raises is reported and naked; the sink actor itself keeps running."""
    await publish(peer, 2)
    sink = MemorySink(fail_times=1)
    pipe = fast_pipeline()
    pipe.source(source()).sink(
        sink, name="out", batch=BatchPolicy(max_messages=2, max_age=30), restart=Restart()
    )
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await sink.wait_for(2)
        assert run.stages["sink:out"].restarts == 0
        assert sink.opens == 1


async def test_a_sink_whose_open_fails_restarts(nats_server, peer):
    await publish(peer, 3)

    class Flaky(MemorySink):
        async def open(self) -> None:
            await super().open()
            if self.opens == 1:
                raise ConnectionError("storage not reachable yet")

    sink = Flaky()
    pipe = fast_pipeline()
    pipe.source(source()).sink(
        sink,
        name="out",
        batch=BatchPolicy(max_messages=3, max_age=30),
        restart=Restart(backoff=0.01),
    )
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await sink.wait_for(3)
        await wait_consumer(peer, all_done(3))
        assert run.stages["sink:out"].restarts == 1
    assert sink.opens == 2
    assert sink.closes >= 1


# -- slow sinks ---------------------------------------------------------------------------------


async def _slow_sink_run(nats_server, peer) -> tuple[MemorySink, Any, Any]:
    """ack_wait 2 s, 1.5 s per batch of two: the last batch waits 4.5 s, far past it."""
    await publish(peer, 6)
    sink = MemorySink(delay=1.5)
    pipe = fast_pipeline()
    pipe.source(source(config=ConsumerConfig(ack_wait=2))).sink(
        sink, batch=BatchPolicy(max_messages=2, max_age=30)
    )
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await sink.wait_for(6, timeout=20)
        info = await wait_consumer(peer, all_done(6))
    assert run.tracker.ack_wait == {"C": 2.0}
    return sink, run, info


@pytest.mark.slow
async def test_a_slow_sink_gets_in_progress_and_nothing_is_redelivered(nats_server, peer):
    sink, run, info = await _slow_sink_run(nats_server, peer)
    assert run.stats.in_progress > 0
    assert run.stats.redeliveries == 0
    assert info.num_redelivered == 0
    assert info.delivered.consumer_seq == 6  # each delivered once
    assert sink.keys == [("S", i) for i in range(1, 7)]


class SlowFirst(MemorySink):
    """Slow (``delay`` per write) for its first ``slow_records`` records, then quick."""

    def __init__(self, slow_records: int, delay: float) -> None:
        super().__init__()
        self.slow_records = slow_records
        self.slow_delay = delay

    async def write_batch(self, batch: Any) -> None:
        self.delay = self.slow_delay if len(self.records) < self.slow_records else 0.0
        await super().write_batch(batch)


@pytest.mark.slow
async def test_a_slow_sink_does_not_cause_redelivery_of_buffered_messages(nats_server, peer):
    """Messages waiting in the consume buffer behind a slow sink (longer than ack_wait) are
    kept alive with +WPI too, and their clock keeps running once admitted."""
    total = 150
    await publish(peer, total)
    sink = SlowFirst(slow_records=60, delay=0.05)
    pipe = fast_pipeline()
    spec = source(config=ConsumerConfig(ack_wait=1), consume=ConsumeOptions(max_messages=20))
    pipe.source(spec).sink(sink, batch=BatchPolicy(max_messages=1, max_age=30))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await wait_stats(lambda: run.stats.acks >= total, timeout=20, what="all acked")
        info = await wait_consumer(peer, all_done(total))
        assert run.stats.in_progress > 0  # +WPI did go out for admitted messages
    assert run.stats.redeliveries == 0
    assert info.delivered.consumer_seq == total
    assert sorted(sink.keys) == [("S", i) for i in range(1, total + 1)]


async def test_memory_stays_bounded_with_a_slow_sink(nats_server, peer):
    """In flight (taken, not yet acked) is bounded by the stages' inboxes and the consume
    buffer, not by the 400 messages the stream holds."""
    total, buffer, batch = 400, 10, 5
    await publish(peer, total)
    sink = MemorySink(delay=0.005)
    pipe = fast_pipeline()
    spec = source(consume=ConsumeOptions(max_messages=buffer))
    pipe.source(spec).sink(sink, batch=BatchPolicy(max_messages=batch, max_age=30))
    # source holds one list while it waits; the batcher's inbox holds INBOX_BATCHES lists,
    # each at most the consume buffer; the batcher one cut batch, the writer two.
    bound = (INBOX_BATCHES + 1) * buffer + 3 * batch
    peak = 0
    server_peak = 0
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        stats = run.stats
        with trio.fail_after(20):
            # stats have no change event: sample them while the sink works
            while len(sink.records) < total:
                peak = max(peak, stats.messages_in - stats.acks)
                if len(sink.records) == total // 2:
                    info = await consumer_info(peer)
                    server_peak = max(server_peak, info.num_ack_pending)
                await trio.sleep(0.002)
        await wait_consumer(peer, all_done(total))
    assert peak <= bound, f"{peak} records in flight, bound {bound}"
    assert peak > 2 * batch, "the sink never fell behind: the bound was not exercised"
    assert server_peak <= bound + buffer
    assert sink.keys == [("S", i) for i in range(1, total + 1)]
