"""Orders from JetStream to JSON-lines files: a pipeline module for `headrace run`.

The stream ORDERS (subjects ``orders.>``) is consumed by the durable pull consumer
``orders-lake``; each message is decoded from JSON, orders without an ``id`` are dropped (and
acked), and the rest are written by the ``jsonl`` sink ``lake`` in batches of up to 1000, one
file per batch, acked once the file is on disk::

    headrace graph examples/orders_pipeline.py
    python examples/orders_pipeline.py --nats nats://127.0.0.1:4222 --orders 10000   # stream + data
    headrace run examples/orders_pipeline.py --nats nats://127.0.0.1:4222
    headrace run examples/orders_pipeline.py:make_pipeline --sink lake=stdout           # to stdout

``pipeline`` is the object ``headrace run`` picks by default; ``make_pipeline`` is the same as a
factory. Settings come from the environment: ``ORDERS_STREAM`` (ORDERS), ``ORDERS_DURABLE``
(orders-lake) and ``ORDERS_OUT`` (the output directory, ``orders-out``). A message that cannot
be decoded is retried, then terminated and published to ``dead.orders`` (a subject outside the
stream, so a dead letter is not consumed again).

Run as a script, the module creates the stream if it is missing and publishes sample orders.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import trio
from headrace.jetstream import ConsumerConfig, JetStream, StreamConfig, StreamNotFound
from headrace.nats import connect
from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline
from headrace.sinks import JsonlSink


def decode(data: bytes) -> Any:
    return json.loads(data)


def is_order(order: Any) -> bool:
    return isinstance(order, dict) and "id" in order


def make_pipeline() -> Pipeline:
    stream = os.environ.get("ORDERS_STREAM", "ORDERS")
    durable = os.environ.get("ORDERS_DURABLE", "orders-lake")
    out = os.environ.get("ORDERS_OUT", "orders-out")
    pipe = Pipeline("orders-to-lake", dead_letter="dead.orders", max_deliveries=3)
    orders = pipe.source(
        JetStreamSource(
            stream=stream,
            durable=durable,
            config=ConsumerConfig(ack_wait=30.0, max_ack_pending=20_000),
        ),
        name="orders",
    )
    (
        orders.map(decode)
        .filter(is_order)
        .sink(JsonlSink(out), name="lake", batch=BatchPolicy(max_messages=1000, max_age=1.0))
    )
    return pipe


pipeline = make_pipeline()


async def _publish(url: str, count: int, stream: str) -> None:
    async with connect(url, name="orders-publisher") as nc:
        js = JetStream(nc)
        try:
            await js.stream_info(stream)
        except StreamNotFound:
            await js.add_stream(StreamConfig(name=stream, subjects=["orders.>"]))
            print(f"created stream {stream} (orders.>)")
        regions = ("eu", "us", "apac")
        for i in range(count):
            order = {"id": i, "region": regions[i % 3], "qty": i % 7 + 1}
            await nc.publish(f"orders.{regions[i % 3]}", json.dumps(order).encode())
        await nc.flush()
        print(f"published {count} orders")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="create the ORDERS stream and publish orders")
    parser.add_argument("--nats", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    parser.add_argument("--orders", type=int, default=10_000)
    args = parser.parse_args()
    trio.run(_publish, args.nats, args.orders, os.environ.get("ORDERS_STREAM", "ORDERS"))
