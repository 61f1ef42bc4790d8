"""Clicks per user per minute, exactly once: a windowed pipeline module for `headrace run`.

The stream CLICKS (subjects ``clicks.>``) holds JSON clicks ``{"user": "u7", "ts": 1700000000.5,
"page": "/cart"}``, where ``ts`` is when the click happened (seconds since the epoch), not when
it reached the stream. The durable pull consumer ``clicks-per-minute`` feeds a pipeline that
keys the clicks by user and counts them in one-minute tumbling windows of that event time.
A window is closed, and its count written, once clicks 30 seconds newer than its end have
been seen (the lateness: clicks may arrive out of order by that much). A click older than that
goes to the dead letter ``dead.clicks`` with the reason, never silently dropped::

    python examples/clickstream_windows.py --nats nats://127.0.0.1:4222 --clicks 100000
    headrace run examples/clickstream_windows.py --nats nats://127.0.0.1:4222

Each count is one line in a JSON-lines file under ``CLICKS_OUT`` (``clicks-out``)::

    {"stream": "clickstream.per-minute", "stream_seq": 17, ...,
     "value": {"key": "u7", "start": "2023-11-14T22:13:00+00:00",
               "end": "2023-11-14T22:14:00+00:00", "value": 42, "count": 42}}

Exactly once across crashes: the open windows are snapshotted to the KV bucket
``headrace_state`` every second, with the stream sequences they hold; a click is acked only
once a snapshot holds it, and a window's count is written only once the snapshot that closed
it is saved, numbered (``stream_seq``), so that a count written before a crash and sent again
after it is written once. Kill the worker at any moment and start it again: every
(user, minute) is in the output once, with the right count (docs/state.md).

Settings come from the environment: ``CLICKS_STREAM`` (CLICKS), ``CLICKS_DURABLE``
(clicks-per-minute), ``CLICKS_OUT`` (clicks-out), ``CLICKS_LATENESS`` (30, seconds) and
``CLICKS_ACK_WAIT`` (30, seconds: the consumer's ack_wait, after which the clicks a crashed or
stalled worker held are delivered again; an existing consumer must have the same);
``CLICKS_BACKEND`` (memory; ``disk`` keeps the open windows in a SQLite file, for more users
than memory holds) and ``CLICKS_STATE_DIR`` (where that file goes; the temporary directory).
"""

from __future__ import annotations

import argparse
import json
import os
import random
from datetime import timedelta
from typing import Any

import trio
from headrace.jetstream import (
    ConsumerConfig,
    JetStream,
    StreamConfig,
    StreamNotFound,
    publish_acked,
)
from headrace.nats import connect
from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline
from headrace.sinks import JsonlSink
from headrace.state import TumblingWindow, WindowResult, count


def user_of(click: dict[str, Any]) -> str:
    return str(click["user"])


def click_time(click: dict[str, Any]) -> float:
    return float(click["ts"])


def as_row(result: WindowResult) -> dict[str, Any]:
    return result.to_dict()


def make_pipeline() -> Pipeline:
    stream = os.environ.get("CLICKS_STREAM", "CLICKS")
    durable = os.environ.get("CLICKS_DURABLE", "clicks-per-minute")
    out = os.environ.get("CLICKS_OUT", "clicks-out")
    lateness = float(os.environ.get("CLICKS_LATENESS", "30"))
    ack_wait = float(os.environ.get("CLICKS_ACK_WAIT", "30"))
    backend = os.environ.get("CLICKS_BACKEND", "memory")
    state_dir = os.environ.get("CLICKS_STATE_DIR") or None
    pipe = Pipeline("clickstream", dead_letter="dead.clicks", max_deliveries=3)
    clicks = pipe.source(
        JetStreamSource(
            stream=stream,
            durable=durable,
            config=ConsumerConfig(ack_wait=ack_wait, max_ack_pending=20_000),
        ),
        name="clicks",
    )
    (
        clicks.map(json.loads, name="decode")
        .key_by(user_of)
        .window(
            TumblingWindow(timedelta(minutes=1)),
            count(),
            event_time=click_time,
            lateness=timedelta(seconds=lateness),
            name="per-minute",
            backend="disk" if backend == "disk" else "memory",
            state_dir=state_dir,
        )
        .map(as_row, name="row")
        .sink(JsonlSink(out), name="counts", batch=BatchPolicy(max_messages=1000, max_age=1.0))
    )
    return pipe


pipeline = make_pipeline()


def sample_clicks(n: int, *, users: int = 50, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` clicks, 10 ms apart from 2023-11-14T22:13:20Z, each moved by up to 5 s either
    way (out of order), by ``users`` users."""
    rng = random.Random(seed)
    pages = ("/", "/search", "/item", "/cart", "/pay")
    start = 1_700_000_000.0
    return [
        {
            "user": f"u{rng.randrange(users)}",
            "ts": round(start + i * 0.01 + rng.uniform(-5.0, 5.0), 6),
            "page": rng.choice(pages),
        }
        for i in range(n)
    ]


async def _publish(url: str, clicks: list[dict[str, Any]], stream: str) -> None:
    async with connect(url, name="clicks-publisher") as nc:
        js = JetStream(nc)
        try:
            await js.stream_info(stream)
        except StreamNotFound:
            await js.add_stream(StreamConfig(name=stream, subjects=["clicks.>"]))
            await js.add_stream(StreamConfig(name="DEAD_CLICKS", subjects=["dead.clicks"]))
            print(f"created streams {stream} (clicks.>) and DEAD_CLICKS (dead.clicks)")
        messages = ((f"clicks.{c['user']}", json.dumps(c).encode(), None) for c in clicks)
        await publish_acked(nc, messages)
        print(f"published {len(clicks)} clicks")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="create the CLICKS stream and publish clicks")
    parser.add_argument("--nats", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    parser.add_argument("--clicks", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    clicks = sample_clicks(args.clicks, seed=args.seed)
    trio.run(_publish, args.nats, clicks, os.environ.get("CLICKS_STREAM", "CLICKS"))
