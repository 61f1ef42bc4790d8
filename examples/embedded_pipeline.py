"""A trio application with a headrace pipeline running next to its own tasks.

The app starts a private nats-server, creates an ORDERS stream, and in one nursery runs:

- its own publisher task, sending order events;
- its own reporter task, printing the pipeline's progress every half second;
- the pipeline: ORDERS -> decode -> keep large orders -> a jsonl sink (durable files), plus a
  second sink counting everything in memory (fan-out).

When the publisher is done and everything is committed, the app cancels the pipeline's scope:
the pipeline drains (its last batches are committed and acked) before the block ends.

Run: ``.venv/bin/python examples/embedded_pipeline.py [output-dir]``.
"""

from __future__ import annotations

import json
import sys
import tempfile

import trio
from headrace.jetstream import ConsumeOptions, JetStream, StreamConfig
from headrace.localserver import LocalServer
from headrace.nats import Connection, connect
from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline, PipelineRun
from headrace.sinks import JsonlSink, MemorySink

ORDERS = 5_000


def build(out_dir: str, counter: MemorySink) -> Pipeline:
    pipe = Pipeline("orders-example", dead_letter="orders.dead")
    orders = pipe.source(
        JetStreamSource(
            stream="ORDERS", durable="example", consume=ConsumeOptions(max_messages=1000)
        )
    )
    decoded = orders.map(json.loads, name="decode")
    decoded.filter(lambda order: order["qty"] >= 5, name="large").sink(
        JsonlSink(out_dir), name="large-orders", batch=BatchPolicy(max_messages=500, max_age=0.5)
    )
    decoded.sink(counter, name="count", batch=BatchPolicy(max_messages=1000, max_age=0.5))
    return pipe


async def publish_orders(nc: Connection) -> None:
    js = JetStream(nc)
    for i in range(ORDERS):
        order = {"id": i, "region": ["eu", "us", "apac"][i % 3], "qty": i % 10}
        await nc.publish(f"orders.{order['region']}", json.dumps(order).encode())
    await js.publish("orders.eu", json.dumps({"id": ORDERS, "region": "eu", "qty": 9}).encode())
    print(f"published {ORDERS + 1} orders")


async def report(run: PipelineRun) -> None:
    while True:
        await trio.sleep(0.5)
        s = run.stats
        print(f"  in {s.messages_in}  committed {s.records_out}  acked {s.acks}  lag {s.lag}")


async def main(out_dir: str) -> None:
    with LocalServer() as server:
        async with connect(server.url, name="embedded-example") as nc:
            await JetStream(nc).add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"]))
            counter = MemorySink()
            pipe = build(out_dir, counter)
            print(pipe.describe())
            async with trio.open_nursery() as nursery, pipe.running(nc) as run:
                nursery.start_soon(publish_orders, nc)
                nursery.start_soon(report, run)
                await counter.wait_for(ORDERS + 1, timeout=60)
                nursery.cancel_scope.cancel()  # our tasks stop; leaving the block drains
            s = run.stats
            print(
                f"done: {s.records_out} records committed, {s.acks} messages acked, "
                f"large orders in {out_dir}"
            )


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="headrace-example-")
    trio.run(main, target)
