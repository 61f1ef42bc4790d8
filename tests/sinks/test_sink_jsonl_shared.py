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
from headrace.jetstream import JetStream, StreamConfig
from headrace.nats import connect
from headrace.pipeline.sink import SinkContext
from headrace.sinks import JsonlSink, OutputInUse
from sink_support import batch, read_output, rec


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
