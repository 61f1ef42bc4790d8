"""The jsonl sink with its directory shared by workers (``commits="shared"``), against a real
nats-server holding the commit state: two sinks of one pipeline (two workers) writing the same
messages keep each once, a message delivered twice into a batch is written once, and a
directory is written in one mode for its life. The sinks' sync methods run in worker threads,
as the pipeline runs them."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.commits import OutputOwned
from headrace.jetstream import JetStream, StreamConfig
from headrace.nats import connect
from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline
from headrace.pipeline.sink import SinkContext
from headrace.sinks import JsonlSink, OutputInUse

from tests.natspy_peer import wait_consumer
from tests.sinks.sink_support import batch, read_output, rec


async def call(fn: Any, *args: Any) -> Any:
    return await trio.to_thread.run_sync(fn, *args)


async def bound(js: JetStream, out: Path, **kw: Any) -> JsonlSink:
    sink = JsonlSink(out, fsync=False, **kw)
    sink.bind(SinkContext(js, pipeline="p", sink="lake"))
    await call(sink.open)
    return sink


async def test_two_workers_write_each_message_once(nats_server: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"]))
        a, b = await bound(js, out), await bound(js, out)
        await call(a.write_batch, batch(*(rec(s) for s in range(1, 11))))
        # b got 6-15 (6-10 again: a redelivery after a stall): only 11-15 are new.
        await call(b.write_batch, batch(*(rec(s, delivered=2) for s in range(6, 16))))
        # a message delivered twice into one batch (taken together after a stall)
        await call(a.write_batch, batch(rec(16), rec(17), rec(16, delivered=2)))
        assert b.duplicates_skipped == 5 and a.duplicates_skipped == 1
        assert a.shared is not None and a.shared.coordinator.state.commits == 3  # (a wrote last)
        await call(a.close)
        await call(b.close)
    lines = [line for lines in read_output(out).values() for line in lines]
    seqs = collections.Counter(line["stream_seq"] for line in lines)
    assert sorted(seqs) == list(range(1, 18)) and set(seqs.values()) == {1}
    names = sorted(p.name for p in out.glob("*.jsonl"))
    assert len(names) == 3 and all(n.startswith("part-ORDERS-") for n in names), names
    assert list((out / "_headrace" / "staging").iterdir()) == []


async def test_a_directory_keeps_its_mode(nats_server: Any, tmp_path: Path) -> None:
    shared, local = tmp_path / "shared", tmp_path / "local"
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"]))
        sink = await bound(js, shared)
        await call(sink.close)
        with pytest.raises(OutputInUse, match="shared by the workers of a pipeline"):
            JsonlSink(shared, commits="local").open()

        alone = JsonlSink(local)  # not bound: the single-process mode
        alone.open()
        alone.write_batch(batch(rec(1)))
        alone.close()
        with pytest.raises(OutputInUse, match="single-process JsonlSink"):
            await bound(js, local)


async def test_another_pipeline_is_refused(nats_server: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"]))
        mine = await bound(js, out)
        other = JsonlSink(out, fsync=False)
        other.bind(SinkContext(js, pipeline="other", sink="lake"))
        with pytest.raises(OutputOwned, match="is the output of 'p/lake', not of 'other/lake'"):
            await call(other.open)
        await call(mine.close)


@pytest.mark.slow
async def test_a_filtered_stream_keeps_the_state_small(
    nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    """A filter drops every other message: the sink commits only odd sequences, so without the
    consumer's ack floor the state would keep one interval per message. Reported by the idle
    worker, the floor covers them all."""
    n = 400
    out = tmp_path / "out"
    await natspy.connect(nats_server.url)

    async def create() -> None:
        js = natspy.nc.jetstream()
        await js.add_stream(name="ORDERS", subjects=["orders.>"])
        for i in range(n):
            await js.publish("orders.new", b"%d" % i)

    await natspy.call(create)
    sink = JsonlSink(out, fsync=False)
    pipe = Pipeline("filtered", drain_timeout=10)
    pipe.source(JetStreamSource(stream="ORDERS", durable="f")).filter(
        lambda data: int(data) % 2 == 0
    ).sink(sink, name="lake", batch=BatchPolicy(max_messages=20, max_age=0.1))
    async with connect(nats_server.url) as nc, pipe.running(nc):
        await wait_consumer(
            natspy, lambda i: i.ack_floor.stream_seq == n, "ORDERS", "f", timeout=30
        )
        assert sink.shared is not None
        sink.shared.floor_interval = 0.5  # (10 s by default)
        coordinator = sink.shared.coordinator
        with trio.fail_after(30):
            while coordinator.state.streams["ORDERS"].floor < n:  # noqa: ASYNC110
                await trio.sleep(0.1)  # the idle worker's upkeep: no event to wait on
        stream = coordinator.state.streams["ORDERS"]
        assert stream.floor == n and not stream.seqs, stream
    lines = [line for lines in read_output(out).values() for line in lines]
    assert sorted(line["stream_seq"] for line in lines) == list(range(1, n + 1, 2))


async def test_records_found_committed_are_visible_before_they_are_acked(
    nats_server: Any, tmp_path: Path
) -> None:
    """Worker A dies between its commit and putting its files in place; its messages come
    again to worker B, which finds them committed. B's write_batch returns (the pipeline then
    acks them) only once A's files are in place: acked means visible, whoever acks."""
    out = tmp_path / "out"
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"]))
        a, b = await bound(js, out), await bound(js, out)
        assert a.shared is not None

        def dies(token: str, replaces: Any = ()) -> list[str]:
            raise RuntimeError("killed between the commit and the rename")

        a.shared.output.publish = dies  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="killed between"):
            await call(a.write_batch, batch(*(rec(s) for s in range(1, 11))))
        assert read_output(out) == {}  # committed, staged, not visible
        await call(b.write_batch, batch(*(rec(s, delivered=2) for s in range(1, 11))))
        assert b.duplicates_skipped == 10
        lines = [line for lines in read_output(out).values() for line in lines]
        assert sorted(line["stream_seq"] for line in lines) == list(range(1, 11))
        await call(b.close)
