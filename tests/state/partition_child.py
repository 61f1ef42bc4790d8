"""A worker of a partitioned windowed pipeline (test_partitions.py): per-user minute counts
of the stream CLICKS, partitioned four ways by user, into a shared JSON-lines output; one line
on stdout per change of the partitions it holds."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import trio
from headrace.jetstream import ConsumerConfig
from headrace.nats import connect
from headrace.pipeline import JetStreamSource, Pipeline
from headrace.pipeline.partitions import Partitioning, run_partitioned
from headrace.sinks import JsonlSink
from headrace.state import TumblingWindow, count

PARTITIONING = Partitioning(4, "clicks.{partition}.>")


def make_pipeline(out: str, partitioning: Partitioning | None = None) -> Pipeline:
    pipe = Pipeline("partitioned", drain_timeout=10.0, partitioning=partitioning)
    (
        pipe.source(
            # max_ack_pending as the server's default: the kill tests' timing (a kill once a
            # tenth of the windows is out) was set at that pace; more in flight finished every
            # window before the kill under a loaded full run.
            JetStreamSource(
                stream="CLICKS",
                durable="counts",
                config=ConsumerConfig(ack_wait=2.0, max_ack_pending=1000),
            )
        )
        .map(json.loads)
        .key_by(lambda c: c["user"])
        .window(
            TumblingWindow(timedelta(minutes=1)),
            count(),
            event_time=lambda c: c["ts"],
            lateness=timedelta(seconds=30),
            name="per-minute",
            snapshot_interval=0.2,
        )
        .map(lambda r: r.to_dict())
        .sink(JsonlSink(out))
    )
    return pipe


async def main(url: str, out: str, worker: str) -> None:
    def said(gained: frozenset[int], lost: frozenset[int]) -> None:
        print(json.dumps({"gained": sorted(gained), "lost": sorted(lost)}), flush=True)

    async with connect(url) as nc:
        await run_partitioned(
            make_pipeline(out), nc, PARTITIONING, worker=worker, ttl=2.0, on_change=said
        )


#: For `headrace run tests/state/partition_child.py --workers N` (PARTITIONED_OUT: the output).
pipeline = make_pipeline(os.environ.get("PARTITIONED_OUT", "partitioned-out"), PARTITIONING)


if __name__ == "__main__":
    try:
        trio.run(main, *sys.argv[1:4])
    except KeyboardInterrupt:
        pass
