"""A soak: for three minutes (``HEADRACE_SOAK_SECONDS``), messages are published while a
pipeline writes them to a jsonl sink that fails one batch in ten at random, half of the time
before it writes anything and half of the time after its write was committed and published
(the answer lost on the way back). The output must be exact: every message once, nothing
dead-lettered or terminated, and every message acked.

The failures carry no ``transient`` verdict, as an unknown sink's would not: they are retried in
place, and batches that fail twice are split, which must neither lose nor duplicate a record.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.jetstream import ConsumerConfig
from headrace.pipeline import Batch, BatchPolicy, SinkRetry
from headrace.sinks import JsonlSink

from tests.pipeline.pipe_support import (
    FAST,
    add_stream,
    connect,
    fast_pipeline,
    source,
    wait_consumer,
)

SECONDS = float(os.environ.get("HEADRACE_SOAK_SECONDS", "180"))
#: Messages published every PERIOD seconds while the soak lasts.
BURST, PERIOD = 250, 0.25


class FlakyLake(JsonlSink):
    """Fails one write in ten, before or after its commit (seeded: a failure can be replayed
    from the seed in the assertion message)."""

    def __init__(self, out: Path, seed: int) -> None:
        super().__init__(out, fsync=False)
        self.random = random.Random(seed)
        self.failed_before = self.failed_after = 0

    def write_batch(self, batch: Batch) -> None:
        roll = self.random.random()
        if roll < 0.05:
            self.failed_before += 1
            raise OSError("the lake refused the write")
        super().write_batch(batch)
        if roll < 0.10:
            self.failed_after += 1
            raise TimeoutError("the lake's answer was lost")


@pytest.mark.slow
async def test_a_sink_failing_one_batch_in_ten_keeps_the_output_exact(
    nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    await add_stream(natspy, "DLQ", ["dlq.>"])
    seed = random.randrange(2**32)
    out = tmp_path / "out"
    lake = FlakyLake(out, seed)
    pipe = fast_pipeline(
        "soak", dead_letter="dlq.soak", max_deliveries=3, sink_retry=SinkRetry(backoff=0.05)
    )
    spec = source(config=ConsumerConfig(ack_wait=2.0, max_ack_pending=2000))
    pipe.source(spec).sink(lake, name="lake", batch=BatchPolicy(max_messages=200, max_age=0.1))

    async def publish_for(seconds: float) -> int:
        js = natspy.nc.jetstream()
        total = 0
        deadline = trio.current_time() + seconds

        async def burst(base: int) -> None:
            body = [json.dumps({"i": i}).encode() for i in range(base, base + BURST)]
            await asyncio.gather(*(js.publish("s.x", b) for b in body))

        while trio.current_time() < deadline:
            await natspy.call(burst, total)
            total += BURST
            await trio.sleep(PERIOD)  # the publishing rate, not a wait for anything
        return total

    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        published = await publish_for(SECONDS)
        await wait_consumer(
            natspy,
            lambda i: i.ack_floor.stream_seq == published and i.num_ack_pending == 0,
            timeout=120,
        )
        stats = run.stats
    where = f"(seed {seed}: {lake.failed_before} failed before, {lake.failed_after} after)"
    assert lake.failed_before > 0 and lake.failed_after > 0, where
    assert stats.dead_lettered == 0 and stats.terms == 0 and stats.terminated_unkept == 0, where
    assert stats.sink_retries > 0, (stats, where)
    # Every message was delivered (its first delivery once) and acked. Not `acks == published`:
    # on a starved machine (CI: four test processes on two cores) a +WPI can come after the 2 s
    # ack_wait, the server then delivers the message again, and both deliveries are acked
    # (the sink writes it once: checked below). Seen once, 250 redeliveries in 154,000.
    assert stats.messages_in - stats.redeliveries == published, (stats, where)
    assert stats.acks >= published, (stats, where)
    seqs = collections.Counter(
        json.loads(line)["stream_seq"]
        for path in out.glob("*.jsonl")
        for line in path.read_text("utf-8").splitlines()
    )
    twice = [seq for seq, n in seqs.items() if n > 1]
    assert twice == [], f"{len(twice)} written more than once {where}: {twice[:10]}"
    missing = sorted(set(range(1, published + 1)) - set(seqs))
    assert missing == [], f"{len(missing)} missing {where}: {missing[:10]}"
    dlq = await natspy.call(natspy.nc.jetstream().stream_info, "DLQ")
    assert dlq.state.messages == 0, where
