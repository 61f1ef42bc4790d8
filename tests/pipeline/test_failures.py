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
from headrace.pipeline import BatchPolicy, PipelineError, Record, RecordsRejected
from headrace.pipeline.ack_tracker import PoisonTerminated
from headrace.pipeline.sink_retry import SinkOutage, SinkRetry
from headrace.pipeline.stages import INBOX_BATCHES
from headrace.sinks import MemorySink

from tests.pipeline.pipe_support import (
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


# -- sink failures: an outage is backpressure, a bad record is poison ----------------------------


class BadRecordSink(MemorySink):
    """Fails every write whose batch holds a record with a payload in ``bad`` (the way a real
    sink fails on a value it cannot write: the whole write), and keeps the batch otherwise.
    ``transient`` goes on the error (None: the sink says nothing)."""

    def __init__(self, bad: set[bytes], transient: bool | None = None) -> None:
        super().__init__()
        self.bad = bad
        self.transient = transient
        self.attempts: list[list[int]] = []

    async def write_batch(self, batch: Any) -> None:
        self.attempts.append([r.stream_seq for r in batch])
        if any(r.data in self.bad for r in batch):
            error = ValueError("a value the sink cannot write")
            if self.transient is not None:
                error.transient = self.transient  # type: ignore[attr-defined]
            raise error
        await super().write_batch(batch)


class DownFor(MemorySink):
    """Every write fails (like a lake that is down) until ``up`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.up = trio.Event()
        self.failures = 0

    async def write_batch(self, batch: Any) -> None:
        if not self.up.is_set():
            self.failures += 1
            raise ConnectionError("the lake is down")
        await super().write_batch(batch)


async def test_a_sink_that_fails_twice_is_written_again_in_place(nats_server, peer):
    await publish(peer, 5)
    sink = TimedSink(fail_times=2, fail_with=DiskFull)
    pipe = fast_pipeline(sink_retry=SinkRetry(backoff=0.2, split_after=10))
    pipe.source(source()).sink(sink, name="lake", batch=BatchPolicy(max_messages=5, max_age=30))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await sink.wait_for(5)
        info = await wait_consumer(peer, all_done(5))
        stats = run.stats
        assert stats.naks == 0 and stats.redeliveries == 0  # held, not naked
        assert stats.batches_failed == 2 and stats.sink_retries == 2
        assert stats.batches_committed == 1 and stats.acks == 5
        assert stats.retrying == 0
        assert [e.stage for e in run.errors] == ["lake", "lake"]
        assert all(isinstance(e.error, DiskFull) for e in run.errors)
    assert sink.seen_delivered == [[1] * 5] * 3  # the same delivery, written three times
    assert sink.keys == [("S", i) for i in range(1, 6)]
    assert info.delivered.consumer_seq == 5 and info.num_redelivered == 0
    # the pause doubles: 0.2 s, then 0.4 s
    first, second, third = sink.write_times
    assert second - first >= 0.2
    assert third - second >= 0.4


async def test_a_sink_that_is_down_holds_the_stream_and_loses_nothing(nats_server, peer):
    """The lake is down for longer than the consumer's ack wait: the pipeline keeps what it
    holds alive (+WPI), stops taking more, naks and terminates nothing, and once the lake is
    back every message is written once. With a dead letter and max_deliveries=1 too: a sink
    that is down is not bad data."""
    await add_stream(peer, "DLQ", ["dlq.>"])
    await publish(peer, 40)
    sink = DownFor()
    pipe = fast_pipeline(
        "down", max_deliveries=1, dead_letter="dlq.down", sink_retry=SinkRetry(backoff=0.1)
    )
    spec = source(config=ConsumerConfig(ack_wait=1.0, max_ack_pending=1000))
    pipe.source(spec).sink(sink, name="lake", batch=BatchPolicy(max_messages=10, max_age=0.1))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await wait_stats(lambda: run.stats.in_progress > 0, what="+WPI while down", timeout=10)
        await wait_stats(lambda: sink.failures >= 8, what="failures", timeout=20)
        assert run.stats.retrying == 1
        assert run.stats.naks == 0 and run.stats.terms == 0 and run.stats.dead_lettered == 0
        sink.up.set()
        await sink.wait_for(40)
        info = await wait_consumer(peer, all_done(40))
        assert run.stats.retrying == 0
        assert run.stats.naks == 0 and run.stats.terms == 0 and run.stats.dead_lettered == 0
    assert sorted(sink.keys) == [("S", i) for i in range(1, 41)]
    assert info.num_redelivered == 0 and info.delivered.consumer_seq == 40


async def test_a_bad_record_is_isolated_and_only_it_is_dead_lettered(nats_server, peer):
    """One record the sink cannot write, in a batch of eight: the batch is split until that
    message fails alone; the seven others are committed once; only it goes to the dead letter
    (after its deliveries), with its headers and the error."""
    await add_stream(peer, "DLQ", ["dlq.>"])
    await publish(peer, 8, headers=lambda i: {"X-Trace": f"t{i}"})
    sink = BadRecordSink({b"5"})
    pipe = fast_pipeline(
        "orders",
        max_deliveries=2,
        dead_letter="dlq.orders",
        nak_delay=0.05,
        sink_retry=SinkRetry(backoff=0.05),
    )
    pipe.source(source()).sink(sink, name="lake", batch=BatchPolicy(max_messages=8, max_age=0.2))

    async def read_dead_letter() -> Any:
        sub = await peer.nc.jetstream().pull_subscribe("dlq.>", "reader", stream="DLQ")
        (msg,) = await sub.fetch(1, timeout=20)
        return msg

    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        dead = await peer.call(read_dead_letter)
        info = await wait_consumer(peer, all_done(8))
        assert run.stats.dead_lettered == 1 and run.stats.terms == 1
        assert run.stats.acks == 7
        assert run.stats.naks == 1  # the bad message, once, before its second delivery
    assert sorted(r.stream_seq for r in sink.records) == [1, 2, 3, 4, 5, 7, 8]
    assert sink.keys.count(("S", 6)) == 0
    assert all(seqs.count(6) <= 1 for seqs in sink.attempts)
    h = dead.headers
    assert dead.subject == "dlq.orders" and dead.data == b"5"
    assert h["Headrace-Pipeline"] == "orders"
    assert h["Headrace-Error"] == "ValueError: a value the sink cannot write"
    assert h["Headrace-Stream-Seq"] == "6" and h["Headrace-Delivered"] == "2"
    assert h["X-Trace"] == "t5"  # the message's own headers travel with it
    assert info.num_redelivered == 0


async def test_bad_records_spread_through_a_batch_are_found_though_both_halves_fail(
    nats_server, peer
):
    """16 records the sink cannot write (a plain exception: it says nothing) spread through
    a batch of 262: both halves fail, and so do the quarters, but finer parts commit, which
    proves the sink works: splitting goes on down to the 16 messages, each failing alone. Every
    other record is committed once; the 16 go to the dead letter; nothing is stuck. (One round
    of two failing halves used to be taken for an outage: the batch was retried whole, every
    30 s, for ever.)"""
    await add_stream(peer, "DLQ", ["dlq.>"])
    await publish(peer, 262)
    bad = {str(i).encode() for i in range(5, 256, 16)}
    assert len(bad) == 16  # spread evenly
    sink = BadRecordSink(bad)
    pipe = fast_pipeline(
        "spread",
        max_deliveries=1,
        dead_letter="dlq.spread",
        sink_retry=SinkRetry(backoff=0.01, backoff_max=0.05),
    )
    pipe.source(source()).sink(sink, name="lake", batch=BatchPolicy(max_messages=262, max_age=1))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await wait_consumer(peer, all_done(262), timeout=30)
        assert run.stats.dead_lettered == 16 and run.stats.acks == 262 - 16
    assert sorted(r.data for r in sink.records) == sorted(
        str(i).encode() for i in range(262) if str(i).encode() not in bad
    )
    assert len(sink.keys) == len(set(sink.keys)) == 262 - 16
    assert run.stats.naks == 0  # max_deliveries 1: poison at once once found alone


async def test_records_the_sink_says_are_bad_are_isolated_at_once(nats_server, peer):
    """An error with ``transient = False`` (bad data, as SparkSchemaError): the batch is split
    without retrying it whole, and a message failing so alone is poison at once."""
    await publish(peer, 4)
    sink = BadRecordSink({b"0"}, transient=False)
    pipe = fast_pipeline(max_deliveries=1, allow_termination=True, sink_retry=SinkRetry())
    pipe.source(source()).sink(sink, name="lake", batch=BatchPolicy(max_messages=4, max_age=30))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await wait_consumer(peer, all_done(4))
        assert run.stats.terms == 1 and run.stats.terminated_unkept == 1
        assert run.stats.sink_retries == 0  # no pause: nothing waited for
    assert sorted(r.stream_seq for r in sink.records) == [2, 3, 4]
    assert sink.attempts[:3] == [[1, 2, 3, 4], [1, 2], [3, 4]]


async def test_past_the_retry_deadline_the_pipeline_stops_and_naks_what_it_holds(nats_server, peer):
    await publish(peer, 6)
    sink = DownFor()
    pipe = fast_pipeline(sink_retry=SinkRetry(backoff=0.1, deadline=1.0))
    pipe.source(source()).sink(sink, name="lake", batch=BatchPolicy(max_messages=3, max_age=0.1))
    async with connect(nats_server.url, **FAST) as nc:
        with pytest.raises(SinkOutage, match="without one write succeeding") as caught:
            async with pipe.running(nc) as run:
                await run.wait_finished()
        assert isinstance(caught.value.__cause__, ConnectionError)
        assert run.stats.terms == 0 and run.stats.dead_lettered == 0
        assert run.stats.naks == 6  # everything held, naked to be delivered again
    # Nothing terminated, nothing acked; naked, so the next consumer of them gets all six at
    # once (not after the 30 s ack wait), as their second delivery.

    async def fetch_again() -> list[Any]:
        sub = await peer.nc.jetstream().pull_subscribe(None, "C", stream="S")
        got: list[Any] = []
        while len(got) < 6:
            got += await sub.fetch(6 - len(got), timeout=5)
        return got

    again = await peer.call(fetch_again)
    assert sorted(m.metadata.sequence.stream for m in again) == [1, 2, 3, 4, 5, 6]
    assert {m.metadata.num_delivered for m in again} == {2}


async def test_a_dead_letter_no_stream_stores_is_refused_when_the_pipeline_starts(
    nats_server, peer
):
    pipe = fast_pipeline("core-dlq", dead_letter="dead.letters")
    pipe.source(source()).sink(MemorySink(), batch=BatchPolicy(max_messages=1, max_age=30))
    async with connect(nats_server.url, **FAST) as nc:
        with pytest.raises(PipelineError, match="no stream stores its dead_letter subject") as e:
            async with pipe.running(nc):
                await trio.sleep_forever()
    assert "headrace stream add DLQ --subjects 'dead.letters'" in str(e.value)


async def test_a_consumer_that_gives_up_before_the_pipeline_is_refused(nats_server, peer):
    """max_deliver 3 under max_deliveries 5: the server would stop delivering a failing message
    before the pipeline made it poison, and it would be neither written nor dead-lettered."""
    pipe = fast_pipeline("gives-up", max_deliveries=5)
    spec = source(config=ConsumerConfig(max_deliver=3))
    pipe.source(spec).sink(MemorySink(), batch=BatchPolicy(max_messages=1, max_age=30))
    async with connect(nats_server.url, **FAST) as nc:
        with pytest.raises(PipelineError, match=r"at most 3 times \(max_deliver\)"):
            async with pipe.running(nc):
                await trio.sleep_forever()
    # The same consumer is fine for a pipeline that gives up first (or at the same delivery).
    pipe = fast_pipeline("gives-up", max_deliveries=3)
    sink = MemorySink()
    pipe.source(spec).sink(sink, batch=BatchPolicy(max_messages=1, max_age=30))
    await publish(peer, 1)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc):
        await sink.wait_for(1)


async def test_a_dead_letter_too_large_for_the_server_is_a_reference(nats_server, peer):
    """A poison message just under max_payload: its copy with headrace's headers would not fit,
    so a reference without the body is dead-lettered, saying so, instead of failing the
    pipeline."""
    await add_stream(peer, "DLQ", ["dlq.>"])
    big = b"x" * (1024 * 1024 - 100)  # max_payload is 1 MiB: the headers push it over
    await publish(peer, 1, data=lambda _i: big)
    sink = BadRecordSink({big}, transient=False)
    pipe = fast_pipeline(max_deliveries=1, dead_letter="dlq.big")
    pipe.source(source()).sink(sink, batch=BatchPolicy(max_messages=1, max_age=30))

    async def read_dead_letter() -> Any:
        sub = await peer.nc.jetstream().pull_subscribe("dlq.>", "reader", stream="DLQ")
        (msg,) = await sub.fetch(1, timeout=20)
        return msg

    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        dead = await peer.call(read_dead_letter)
        await wait_consumer(peer, all_done(1))
        assert run.stats.dead_lettered == 1 and run.stats.terms == 1
    assert dead.data == b""
    assert dead.headers["Headrace-Body"].startswith(f"omitted: {len(big)} bytes")
    assert dead.headers["Headrace-Stream-Seq"] == "1"


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


class HalfPickySink(MemorySink):
    """Each message becomes two records, "a" and "b"; the sink rejects the "b" of payload b"2"
    and, like every real sink, skips messages it has committed records of (by sequence)."""

    def __init__(self) -> None:
        super().__init__()
        self.committed: set[int] = set()

    async def write_batch(self, batch: Any) -> None:
        fresh = [r for r in batch if r.stream_seq not in self.committed]
        bad = [r for r in fresh if (r.value, r.data) == ("b", b"2")]
        rejected = [(r, ValueError("no b for 2")) for r in bad]
        good = [r for r in fresh if r not in bad]
        self.records.extend(good)
        self.committed.update(r.stream_seq for r in good)
        if rejected:
            raise RecordsRejected(rejected)


async def test_a_message_committed_in_part_and_rejected_in_part_is_poison_at_once(
    nats_server, peer
):
    """Delivered again, its committed record would make the sink skip it, and the rejected one
    would be acked unwritten: it goes to the dead letter on its first delivery instead."""
    await add_stream(peer, "DLQ", ["dlq.>"])
    await publish(peer, 4)  # payloads b"0" .. b"3"
    sink = HalfPickySink()
    pipe = fast_pipeline("half", dead_letter="dlq.half")
    pipe.source(source()).flat_map(lambda _value: ["a", "b"]).sink(
        sink, batch=BatchPolicy(max_messages=4, max_age=0.2)
    )
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        info = await wait_consumer(peer, all_done(4))
        stats = run.stats
        assert stats.acks == 3 and stats.naks == 0 and stats.dead_lettered == 1
    assert sorted((r.stream_seq, r.value) for r in sink.records) == [
        (1, "a"),
        (1, "b"),
        (2, "a"),
        (2, "b"),
        (3, "a"),
        (4, "a"),
        (4, "b"),
    ]
    assert info.num_redelivered == 0
    dead = await peer.call(peer.nc.jetstream().get_last_msg, "DLQ", "dlq.half")
    assert dead.headers["Headrace-Stream-Seq"] == "3"
    assert dead.headers["Headrace-Delivered"] == "1"
    assert "no b for 2" in dead.headers["Headrace-Error"]


class ConfusedSink(MemorySink):
    """Rejects a record that was never in its batch: a sink bug, not a partial commit."""

    async def write_batch(self, batch: Any) -> None:
        raise RecordsRejected([(fake_record("S", 999), ValueError("not mine"))])


async def test_rejecting_records_not_in_the_batch_fails_the_whole_batch(nats_server, peer):
    """A sink bug, not a partial commit: the batch's records fail as bad data (split, then
    each message alone), never acked."""
    await publish(peer, 3)
    sink = ConfusedSink()
    pipe = fast_pipeline(nak_delay=30, nak_delay_max=30)
    pipe.source(source()).sink(sink, name="lake", batch=BatchPolicy(max_messages=3, max_age=30))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await wait_stats(lambda: run.stats.naks == 3, what="three naks")
        assert run.stats.acks == 0
        assert run.stats.batches_failed >= 3
        assert all("rejected records not in the batch" in str(e.error) for e in run.errors), (
            run.errors
        )


async def test_poison_without_a_dead_letter_subject_is_terminated_and_reported(nats_server, peer):
    await publish(peer, 1)
    sink = BadRecordSink({b"0"}, transient=False)
    pipe = fast_pipeline(max_deliveries=1)
    pipe.source(source()).sink(sink, batch=BatchPolicy(max_messages=1, max_age=30))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        info = await wait_consumer(peer, all_done(1))
        assert run.stats.terms == 1 and run.stats.terminated_unkept == 1
        assert run.stats.dead_lettered == 0 and run.stats.naks == 0
        await wait_stats(
            lambda: any(isinstance(e.error, PoisonTerminated) for e in run.errors),
            what="the termination reported",
        )
    assert sink.attempts == [[1]]
    assert info.delivered.consumer_seq == 1


@pytest.mark.slow
async def test_poison_handling_is_never_cut_in_half_by_the_in_progress_scan(nats_server, peer):
    """A batch of 20 poison messages meets a server that stops answering (frozen) for longer
    than their ack wait: each message's dead-letter publish and +TERM run to their end once
    started, the messages waiting for theirs are kept alive (+WPI), and a message delivered
    again meanwhile is terminated, not copied again: each is dead-lettered exactly once and
    terminated. (Seen before: 40 copies of the 20.)"""
    await add_stream(peer, "DLQ", ["dlq.>"])
    await publish(peer, 20)
    frozen = trio.Event()

    def freeze_then_fail(value: Any) -> Any:
        if not frozen.is_set():
            nats_server.freeze()
            frozen.set()
        raise ValueError("a record no operator can take")

    pipe = fast_pipeline("halves", max_deliveries=1, dead_letter="dlq.halves")
    spec = source(config=ConsumerConfig(ack_wait=1.0))
    pipe.source(spec).map(freeze_then_fail).sink(
        MemorySink(), batch=BatchPolicy(max_messages=20, max_age=30)
    )
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        try:
            with trio.fail_after(10):
                await frozen.wait()
            await trio.sleep(2.0)  # frozen for four scan periods: the time is the point
        finally:
            nats_server.thaw()
        await wait_consumer(peer, all_done(20), timeout=20)
        stats = run.stats
        # The server, frozen past the ack wait, may have delivered them again once thawed
        # (before it read their +WPI): those are terminated again, never copied again.
        await wait_stats(lambda: stats.terms == 20 + stats.redeliveries, what=f"terms {stats}")
        assert stats.dead_lettered == 20 and stats.naks == 0, stats
    dlq = await peer.call(peer.nc.jetstream().stream_info, "DLQ")
    assert dlq.state.messages == 20  # each once


async def test_a_dead_letter_the_stream_refuses_is_not_terminated(nats_server, peer):
    """Nothing keeps it, so it must not be dropped: it is naked for a later delivery."""

    async def full_dlq() -> None:
        await peer.nc.jetstream().add_stream(
            name="DLQ", subjects=["dlq.>"], max_msgs=1, discard="new"
        )
        await peer.nc.jetstream().publish("dlq.full", b"occupied")

    await peer.call(full_dlq)
    await publish(peer, 1)
    sink = BadRecordSink({b"0"}, transient=False)
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


class SlowToOpen(MemorySink):
    """A sink whose open waits for ``let_open`` (a Spark session's JVM starting)."""

    def __init__(self) -> None:
        super().__init__()
        self.opening = trio.Event()
        self.let_open = trio.Event()

    async def open(self) -> None:
        self.opening.set()
        await self.let_open.wait()


async def test_nothing_is_taken_before_the_sinks_are_open(nats_server, peer):
    """A (re)started worker pulled while its sink opened and held what it took (+WPI) for as
    long as the open took, away from the workers that could write it (issue 23): now the
    consumer delivers nothing until every sink is open, then everything once."""
    await publish(peer, 20)
    sink = SlowToOpen()
    pipe = fast_pipeline("slowopen")
    pipe.source(source()).sink(sink, name="lake", batch=BatchPolicy(max_messages=20, max_age=0.1))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        with trio.fail_after(10):
            await sink.opening.wait()
        await wait_consumer(peer, lambda i: i.name == "C")  # bound, waiting for the sink
        with trio.move_on_after(1.0):  # an absence check: a second in which nothing comes
            while True:
                info = await consumer_info(peer)
                assert info.delivered.stream_seq == 0 and info.num_ack_pending == 0
                await trio.sleep(0.1)  # pacing the polls of the server's consumer state
        sink.let_open.set()
        await wait_consumer(peer, all_done(20))
        assert run.stats.acks == 20
    assert sorted(r.stream_seq for r in sink.records) == list(range(1, 21))


async def test_a_new_durable_is_made_with_room_for_the_batches(nats_server, peer):
    """spark.md's batch of 50,000 on a consumer left to the server's default (1,000) was
    refused after the consumer was made and messages delivered (issue 23). A durable the
    source creates now gets what the source may hold in flight."""
    await publish(peer, 30)
    sink = MemorySink()
    pipe = fast_pipeline("roomy")
    pipe.source(source()).sink(sink, batch=BatchPolicy(max_messages=5000, max_age=0.1))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        info = await wait_consumer(peer, all_done(30))
        assert info.config.max_ack_pending == run.max_in_flight(pipe.sources[0]) >= 10_000
    assert len(sink.records) == 30


async def test_a_durable_too_small_for_the_batches_is_refused_before_a_pull(nats_server, peer):
    """A durable that exists is bound as it is: one whose max_ack_pending cannot hold a batch
    is refused before anything is delivered, and the error says how to change it."""
    from headrace.jetstream import AckPolicy, ConsumerConfig, JetStream

    await publish(peer, 30)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        config = ConsumerConfig(
            durable_name="C", max_ack_pending=1000, ack_policy=AckPolicy.EXPLICIT
        )
        await js.create_consumer("S", config)
        pipe = fast_pipeline("tight")
        pipe.source(source()).sink(MemorySink(), batch=BatchPolicy(max_messages=5000))
        with pytest.raises(PipelineError, match="batches 5000 messages") as caught:
            async with pipe.running(nc):
                await trio.sleep_forever()
    assert "`headrace consumer update S C --max-ack-pending 10000`" in str(caught.value)
    info = await consumer_info(peer)
    assert info.delivered.stream_seq == 0  # refused before the first pull
