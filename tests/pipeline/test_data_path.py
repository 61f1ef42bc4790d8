"""Shortcuts on the data path (issue 14) that must not change what a pipeline does.

A map changes its records' values in place when no other stage holds them (one object less per
message); where a fan-out hands the same records to several branches it must not, or one branch
would see another's values. The batcher adds whole slices when there is no byte limit; its cuts
must still come only between messages. Run with the server-less harness: the stages are the
production ones, only the server is in memory."""

from __future__ import annotations

import pytest
from headrace.pipeline import JetStreamSource, Pipeline
from headrace.pipeline.stages import OperatorStage
from headrace.sinks import MemorySink
from headrace.testing import TestMessage, run_pipeline

FED = [TestMessage("n.x", str(i)) for i in range(1, 6)]


def source(durable: str = "n") -> JetStreamSource:
    return JetStreamSource(stream="N", durable=durable, filter_subjects="n.>")


def _in_place(pipe: Pipeline) -> dict[str, bool]:
    """Which maps change values in place, as the stages decide it."""
    return {
        n.name: OperatorStage(n, None)._in_place  # type: ignore[arg-type]
        for n in pipe.nodes
        if n.kind == "map"
    }


async def test_a_fan_out_keeps_each_branch_s_values() -> None:
    """source -> (map x10 -> sink a) and (filter -> merge -> map +1 -> sink b): the records
    of the source go to two branches, so neither map may change them."""
    pipe = Pipeline("fan-out", nak_delay=0.05)
    numbers = pipe.source(source(), name="numbers").map(int, name="parse")
    numbers.map(lambda v: v * 10, name="tenfold").sink(MemorySink(), name="a")
    other = numbers.filter(lambda v: v > 0, name="positive")
    pipe.merge(other, pipe.source(source("n2"), name="again").map(int, name="parse2"), name="both")
    pipe.nodes[-1].map(lambda v: v + 1, name="plus-one").sink(MemorySink(), name="b")
    assert _in_place(pipe) == {
        "parse": True,  # the source's records go to it alone
        "tenfold": False,  # "parse" sends its records to two branches
        "parse2": True,
        "plus-one": False,  # through a filter and a merge from that same fan-out
    }
    async with run_pipeline(pipe, FED) as run:
        await run.settled()
    assert sorted(run.values("a")) == [10, 20, 30, 40, 50]
    assert sorted(run.values("b")) == [2, 2, 3, 3, 4, 4, 5, 5, 6, 6]


async def test_a_chain_of_maps_without_fan_out_changes_values_in_place() -> None:
    pipe = Pipeline("chain", nak_delay=0.05)
    lake = MemorySink()
    (
        pipe.source(source(), name="numbers")
        .map(int, name="parse")
        .map(lambda v: v * 2, name="double")
        .map(lambda r: (r.stream_seq, r.value), name="as-record", record=True)  # must copy
        .sink(lake, name="lake")
    )
    assert _in_place(pipe) == {"parse": True, "double": True, "as-record": False}
    async with run_pipeline(pipe, FED) as run:
        await run.settled()
    assert sorted(run.values("lake")) == [(1, 2), (2, 4), (3, 6), (4, 8), (5, 10)]
    assert sorted(a.stream_seq for a in run.acked) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("ordered", ["all", "none"])
async def test_in_place_maps_with_concurrency(ordered: str) -> None:
    pipe = Pipeline("concurrent", nak_delay=0.05)
    (
        pipe.source(source(), name="numbers")
        .map(int, name="parse", concurrency=3, ordered=ordered)  # type: ignore[arg-type]
        .sink(MemorySink(), name="lake")
    )
    assert _in_place(pipe) == {"parse": True}
    async with run_pipeline(pipe, FED) as run:
        await run.settled()
    assert sorted(run.values("lake")) == [1, 2, 3, 4, 5]


class BatchLog:
    """A sink that keeps each batch's records, as (stream_seq, value) per batch."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[int, object]]] = []

    def write_batch(self, batch: object) -> None:
        self.batches.append([(r.stream_seq, r.value) for r in batch.records])  # type: ignore[attr-defined]


@pytest.mark.parametrize("max_bytes", [None, 10**9], ids=["by-count", "by-count-and-bytes"])
async def test_batches_are_cut_between_messages_only(max_bytes: int | None) -> None:
    """A flat_map makes three records per message; batches of at most 4 records are cut only
    between messages, so each holds whole messages and passes 4 only to finish one. Both the
    batcher's paths (with a byte limit, record by record; without, slice by slice) agree."""
    from headrace.pipeline import BatchPolicy

    log = BatchLog()
    pipe = Pipeline("cuts", nak_delay=0.05)
    (
        pipe.source(source(), name="numbers")
        .flat_map(lambda data: [data, data, data], name="triple")
        .sink(log, name="log", batch=BatchPolicy(max_messages=4, max_bytes=max_bytes, max_age=5))
    )
    fed = [TestMessage("n.x", str(i)) for i in range(1, 21)]
    async with run_pipeline(pipe, fed) as run:
        await run.settled()
    assert sorted(seq for batch in log.batches for seq, _ in batch) == sorted(
        seq for seq in range(1, 21) for _ in range(3)
    )
    for batch in log.batches:
        seqs = [seq for seq, _ in batch]
        assert all(seqs.count(seq) == 3 for seq in seqs), batch  # whole messages only
        assert len(batch) <= 4 + 2, batch  # past 4 only to finish the message at the cut
    assert all(len(batch) >= 4 for batch in log.batches[:-1])  # cut when full, not before
