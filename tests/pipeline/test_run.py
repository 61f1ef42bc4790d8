"""Pipelines end to end on a real nats-server, checked with nats-py as the independent peer.

Messages are published with nats-py; the consumer's state (ack floor, ack pending,
redeliveries) is read with nats-py too, so acks are checked as the server saw them.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.jetstream import ConsumerConfig
from headrace.pipeline import Batch, BatchPolicy, Record
from headrace.sinks import JsonlSink, MemorySink

from tests.pipeline.pipe_support import (
    FAST,
    GatedSink,
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

SMALL = BatchPolicy(max_messages=10, max_age=0.05)


def all_acked(n: int):
    return lambda info: info.ack_floor.stream_seq == n and info.num_ack_pending == 0


def as_int(data: bytes) -> int:
    return int(data)


@pytest.fixture
async def peer(nats_server, natspy):
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    return natspy


# -- end to end ---------------------------------------------------------------------------------


async def test_into_memory_sink_every_message_committed_once_and_acked(nats_server, peer):
    await publish(peer, 50)
    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source()).map(as_int).sink(sink, batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await sink.wait_for(50)
        info = await wait_consumer(peer, all_acked(50))
        stats = run.stats
        assert stats.messages_in == 50
        assert stats.records_out == 50
        assert stats.acks == 50
        assert stats.ack_pending == 0
        assert stats.naks == stats.terms == stats.errors == 0
        assert stats.batches_committed == len(sink.batches)
    assert sink.values == list(range(50))
    assert sink.keys == [("S", seq) for seq in range(1, 51)]
    assert all(len(b) <= 10 for b in sink.batches)
    assert info.num_redelivered == 0
    assert info.num_pending == 0
    assert sink.opens == 1 and sink.closes == 1


async def test_messages_published_while_running(nats_server, peer):
    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source()).sink(sink, batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc):
        for round_ in range(3):
            await publish(peer, 7, start=round_ * 7)
            await sink.wait_for((round_ + 1) * 7)
        await wait_consumer(peer, all_acked(21))
    assert [r.value for r in sink.records] == [b"%d" % i for i in range(21)]


async def test_push_source_end_to_end(nats_server, peer):
    await publish(peer, 30)
    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source(durable="C", pull=False)).map(as_int).sink(sink, batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc):
        await sink.wait_for(30)
        await wait_consumer(peer, all_acked(30))
    assert sink.values == list(range(30))


async def test_into_jsonl_sink(nats_server, peer, tmp_path: Path):
    await publish(peer, 40, data=lambda i: json.dumps({"i": i}).encode())
    out = tmp_path / "out"
    pipe = fast_pipeline()
    pipe.source(source()).map(json.loads).sink(
        JsonlSink(out, fsync=False), name="files", batch=SMALL
    )
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        # JsonlSink has no event to wait on: the acks are the signal (polled stats).
        await wait_stats(lambda: run.stats.acks == 40, what="40 acks")
        await wait_consumer(peer, all_acked(40))
    lines = [
        json.loads(line)
        for path in sorted(out.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert sorted(line["stream_seq"] for line in lines) == list(range(1, 41))
    by_seq = {line["stream_seq"]: line for line in lines}
    assert by_seq[1]["value"] == {"i": 0}
    assert by_seq[40]["value"] == {"i": 39}
    assert {line["stream"] for line in lines} == {"S"}
    assert {line["consumer"] for line in lines} == {"C"}
    # one file per batch, named by its sequence range and its commit's attempt (in a pipeline
    # the directory is shared by the pipeline's workers: docs/scaling.md)
    for path in out.glob("*.jsonl"):
        seqs = [json.loads(line)["stream_seq"] for line in path.read_text().splitlines()]
        assert path.name.startswith(f"part-S-{min(seqs)}-{max(seqs)}."), path.name
        assert seqs == sorted(seqs)
    assert list((out / "_headrace" / "staging").iterdir()) == []


# -- operators ----------------------------------------------------------------------------------


async def test_map_filter_flat_map(nats_server, peer):
    await publish(peer, 30)
    sink = MemorySink()
    pipe = fast_pipeline()
    (
        pipe.source(source())
        .map(as_int)
        .filter(lambda v: v % 2 == 0)  # drops 15
        .flat_map(lambda v: [v] * (v % 3))  # 0, 1 or 2 records
        .sink(sink, batch=SMALL)
    )
    expected = [v for v in range(30) if v % 2 == 0 for _ in range(v % 3)]
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await sink.wait_for(len(expected))
        # every message is acked: those kept, those a filter dropped, those flat_map emptied
        info = await wait_consumer(peer, all_acked(30))
        assert run.stats.acks == 30
        assert run.stats.dropped == 15 + 5  # odd values, then even multiples of 3
        assert run.stats.records_out == len(expected)
    assert sink.values == expected
    assert info.num_redelivered == 0
    # two records of one message carry its sequence and go in one batch
    counts = Counter(sink.keys)
    assert set(counts.values()) == {1, 2}
    for batch in sink.batches:
        for seq, n in Counter(r.stream_seq for r in batch).items():
            assert n == counts[("S", seq)]


async def test_a_filtered_out_message_is_acked_when_dropped(nats_server, peer):
    """Nothing reaches the sink at all, yet every message is acked."""
    await publish(peer, 10)
    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source()).filter(lambda _: False).sink(sink)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await wait_consumer(peer, all_acked(10))
        assert run.stats.dropped == 10
    assert sink.records == []
    assert sink.writes == 0


async def test_flat_map_acks_only_after_all_records_committed_by_all_sinks(nats_server, peer):
    await publish(peer, 1)
    fast = MemorySink()
    slow = GatedSink()
    pipe = fast_pipeline()
    split = pipe.source(source()).flat_map(lambda data: [data, data, data])
    split.sink(fast, name="fast", batch=SMALL)
    split.sink(slow, name="slow", batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await fast.wait_for(3)
        with trio.fail_after(5):
            await slow.entered.wait()
        await nc.flush()  # an ack, had one been sent, has reached the server
        info = await consumer_info(peer)
        assert info.num_ack_pending == 1
        assert info.ack_floor.stream_seq == 0
        assert run.stats.acks == 0
        slow.gate.set()
        await slow.wait_for(3)
        await wait_consumer(peer, all_acked(1))
        assert run.stats.acks == 1
        assert run.stats.records_out == 6


async def test_fan_out_acks_after_both_sinks_committed(nats_server, peer):
    await publish(peer, 5)
    fast = MemorySink()
    slow = GatedSink()
    pipe = fast_pipeline()
    src = pipe.source(source())
    src.sink(fast, name="fast", batch=BatchPolicy(max_messages=5, max_age=5))
    src.map(as_int).sink(slow, name="slow", batch=BatchPolicy(max_messages=5, max_age=5))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await fast.wait_for(5)
        with trio.fail_after(5):
            await slow.entered.wait()
        await nc.flush()
        info = await consumer_info(peer)
        assert info.num_ack_pending == 5, "acked after only one of two sinks committed"
        assert info.ack_floor.stream_seq == 0
        slow.gate.set()
        await slow.wait_for(5)
        await wait_consumer(peer, all_acked(5))
        assert run.stats.acks == 5
    assert fast.values == [b"%d" % i for i in range(5)]
    assert slow.values == list(range(5))


async def test_merge_of_two_streams(nats_server, peer):
    await add_stream(peer, "T", ["t.>"])
    await publish(peer, 10, "s.x")
    await publish(peer, 10, "t.x", start=100)
    sink = MemorySink()
    pipe = fast_pipeline()
    a = pipe.source(source("S", "C"))
    b = pipe.source(source("T", "D"))
    pipe.merge(a, b).map(as_int).sink(sink, batch=BatchPolicy(max_messages=100, max_age=0.05))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc):
        await sink.wait_for(20)
        await wait_consumer(peer, all_acked(10), "S", "C")
        await wait_consumer(peer, all_acked(10), "T", "D")
    assert sorted(sink.values) == list(range(10)) + list(range(100, 110))
    assert sorted(sink.keys) == sorted(
        [("S", i) for i in range(1, 11)] + [("T", i) for i in range(1, 11)]
    )
    # each stream's records keep their order through the merge
    for stream in ("S", "T"):
        seqs = [seq for s, seq in sink.keys if s == stream]
        assert seqs == sorted(seqs)
    # a batch's ranges and key follow from its records, stream by stream
    for batch in sink.batches:
        expected = []
        for stream in sorted({r.stream for r in batch}):
            seqs = [r.stream_seq for r in batch if r.stream == stream]
            expected.append((stream, min(seqs), max(seqs)))
        assert batch.ranges == expected
        assert batch.key == "+".join(f"{s}-{lo}-{hi}" for s, lo, hi in expected)
        assert batch.sink == "memorysink"


# -- operator concurrency -----------------------------------------------------------------------


class Tracker:
    """An async operator with per-value latency that records how calls overlapped."""

    def __init__(self, latency) -> None:
        self.latency = latency
        self.in_flight: Counter[str] = Counter()
        self.total = 0
        self.max_total = 0
        self.max_per_subject = 0
        self.finished: list[int] = []

    async def __call__(self, record: Record) -> int:
        value = int(record.value)
        subject = record.subject
        self.in_flight[subject] += 1
        self.total += 1
        self.max_total = max(self.max_total, self.total)
        self.max_per_subject = max(self.max_per_subject, self.in_flight[subject])
        try:
            await trio.sleep(self.latency(value))
        finally:
            self.in_flight[subject] -= 1
            self.total -= 1
        self.finished.append(value)
        return value


async def _run_concurrently(
    nats_server: Any, peer: Any, ordered: str, subject: Any = "s.x"
) -> tuple[Tracker, MemorySink]:
    """24 records through a map with concurrency 8; even values take longer the smaller
    they are, so that finishing order differs from arrival order."""

    async def slowly(record: Record) -> int:
        return await op(record)

    await publish(peer, 24, subject=subject)
    op = Tracker(lambda v: 0.002 * (24 - v) if v % 2 == 0 else 0.0)
    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source()).map(slowly, concurrency=8, ordered=ordered, record=True).sink(
        sink, batch=BatchPolicy(max_messages=1000, max_age=0.05)
    )
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc):
        await sink.wait_for(24)
        await wait_consumer(peer, all_acked(24))
    return op, sink


async def test_concurrency_ordered_all(nats_server, peer):
    op, sink = await _run_concurrently(nats_server, peer, "all")
    assert op.max_total > 1, "never ran concurrently"
    assert op.max_total <= 8
    assert op.finished != sorted(op.finished), "latencies did not reorder the calls"
    assert sink.values == list(range(24))


async def test_concurrency_ordered_subject(nats_server, peer):
    op, sink = await _run_concurrently(
        nats_server, peer, "subject", subject=lambda i: f"s.{'abc'[i % 3]}"
    )
    assert op.max_per_subject == 1, "two records of one subject ran at once"
    assert op.max_total > 1, "subjects did not run concurrently"
    by_subject: dict[str, list[int]] = {}
    for record in sink.records:
        by_subject.setdefault(record.subject, []).append(record.value)
    assert by_subject == {f"s.{c}": [v for v in range(24) if "abc"[v % 3] == c] for c in "abc"}
    # and per subject the calls ran in order, too
    for c in "abc":
        calls = [v for v in op.finished if "abc"[v % 3] == c]
        assert calls == sorted(calls)


async def test_concurrency_ordered_none(nats_server, peer):
    op, sink = await _run_concurrently(nats_server, peer, "none")
    assert sorted(sink.values) == list(range(24))
    # records leave as their calls finish, not in arrival order
    assert sink.values == op.finished
    assert sink.values != sorted(sink.values)


async def test_sync_operator_with_concurrency_runs_in_threads(nats_server, peer):
    import threading

    threads: set[int] = set()
    main = threading.get_ident()

    def square(data: bytes) -> int:
        threads.add(threading.get_ident())
        return int(data) ** 2

    await publish(peer, 20)
    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source()).map(square, concurrency=4).sink(sink, batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc):
        await sink.wait_for(20)
    assert sink.values == [i * i for i in range(20)]
    assert main not in threads


# -- record metadata ----------------------------------------------------------------------------


async def test_records_carry_their_metadata(nats_server, peer):
    await publish(
        peer,
        3,
        subject=lambda i: f"s.k{i}",
        headers=lambda i: {"X-Id": f"id-{i}"},
    )
    seen: list[tuple[Any, ...]] = []

    def look(record: Record) -> Record:
        seen.append((record.stream, record.stream_seq, record.subject))
        return record.value

    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source()).map(look, record=True).map(lambda b: b.decode()).sink(sink, batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc):
        await sink.wait_for(3)
    assert seen == [("S", i + 1, f"s.k{i}") for i in range(3)]
    for i, record in enumerate(sink.records):
        assert record.value == str(i)
        assert record.data == b"%d" % i  # the payload, whatever the operators made of it
        assert record.stream == "S"
        assert record.stream_seq == i + 1
        assert record.consumer == "C"
        assert record.num_delivered == 1
        assert record.subject == f"s.k{i}"
        assert record.headers is not None
        assert record.headers.get("X-Id") == f"id-{i}"
        assert record.timestamp.tzinfo is not None
        assert repr(record) == f"Record({str(i)!r}, S#{i + 1})"


async def test_ephemeral_source(nats_server, peer):
    await publish(peer, 5)
    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source(durable=None, config=ConsumerConfig(ack_wait=10))).sink(sink, batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await sink.wait_for(5)
        await wait_stats(lambda: run.stats.acks == 5, what="acks")
    consumers = {r.consumer for r in sink.records}
    assert len(consumers) == 1 and consumers != {"C"}


# -- batches ------------------------------------------------------------------------------------


def test_batch_ranges_and_key() -> None:
    records = [
        fake_record("B", 7),
        fake_record("A", 5),
        fake_record("A", 3),
        fake_record("B", 9),
        fake_record("A", 4),
    ]
    batch = Batch(records, "lake")
    assert len(batch) == 5
    assert list(batch) == records
    assert batch.ranges == [("A", 3, 5), ("B", 7, 9)]
    assert batch.key == "A-3-5+B-7-9"
    assert repr(batch) == "<Batch A-3-5+B-7-9 5 records>"
    assert Batch([fake_record("S", 1)]).key == "S-1-1"
    assert Batch([]).key == "empty"
    assert Batch([]).ranges == []
    # the same range cut differently is the same key: what a redelivered batch needs
    assert Batch([fake_record("S", n) for n in (2, 1, 3)]).key == "S-1-3"


def test_batch_policy_validation() -> None:
    with pytest.raises(ValueError):
        BatchPolicy(max_messages=0)
    with pytest.raises(ValueError):
        BatchPolicy(max_bytes=0)
    with pytest.raises(ValueError):
        BatchPolicy(max_age=0)


async def test_batches_cut_by_bytes(nats_server, peer):
    await publish(peer, 20, data=lambda i: b"x" * 100)
    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source()).sink(
        sink, batch=BatchPolicy(max_messages=1000, max_bytes=450, max_age=0.05)
    )
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc):
        await sink.wait_for(20)
    assert all(len(b) <= 5 for b in sink.batches)
    assert max(len(b) for b in sink.batches) == 5


async def test_async_callable_object_as_operator(nats_server, peer):
    class Double:
        async def __call__(self, data: bytes) -> int:
            await trio.lowlevel.checkpoint()
            return int(data) * 2

    await publish(peer, 3)
    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source()).map(Double()).sink(sink, batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc):
        await sink.wait_for(3)
    values = sink.values
    for v in values:
        if hasattr(v, "close"):
            v.close()  # no "never awaited" warning from the test itself
    assert values == [0, 2, 4]
