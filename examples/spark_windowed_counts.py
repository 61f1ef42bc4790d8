"""Clicks from JetStream, counted per user and per minute of event time, by Spark.

Spark reads the stream CLICKS through headrace's ``jetstream`` format, parses each message's
JSON, and counts clicks per user in one-minute windows of the event's own time, with a
two-minute watermark: a window is written once the stream has shown events two minutes past
its end, and clicks that arrive later than that are dropped by Spark (and counted in the
query's progress, ``numRowsDroppedByWatermark``). The counts go to parquet, exactly once: the
query's checkpoint holds the stream sequence it has read up to, and the file sink its own
commit log::

    python examples/spark_windowed_counts.py                         # a private nats-server
    python examples/spark_windowed_counts.py --nats nats://127.0.0.1:4222 --out clicks-out

It runs the query twice on one checkpoint, as a scheduled job would: the first run counts
ten minutes of clicks, the second reads only what was published since (late clicks for a
window already written, which are dropped), and the counts read back must equal what was
published on time. It exits 1 if they do not.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import headrace_spark
from headrace.localserver import LocalServer

STREAM = "CLICKS"
START = dt.datetime(2026, 11, 27, 9, 0, tzinfo=dt.UTC)
USERS = ("ada", "grace", "linus", "barbara")


def clicks(minutes: int, per_minute: int, seed: int = 7) -> list[dict[str, Any]]:
    """``per_minute`` clicks in each of ``minutes`` minutes from :data:`START`, out of order
    within each minute (event time is not arrival order)."""
    rng = random.Random(seed)
    events = []
    for minute in range(minutes):
        for _ in range(per_minute):
            when = START + dt.timedelta(minutes=minute, seconds=rng.uniform(0, 59.999))
            events.append({"user": rng.choice(USERS), "at": when.isoformat()})
        events[-per_minute:] = rng.sample(events[-per_minute:], per_minute)
    return events


def expected_counts(events: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    """(user, window start in ISO 8601) -> clicks."""
    counts: Counter[tuple[str, str]] = Counter()
    for event in events:
        at = dt.datetime.fromisoformat(event["at"])
        counts[event["user"], at.replace(second=0, microsecond=0).isoformat()] += 1
    return counts


async def publish(url: str, events: list[dict[str, Any]], *, create: bool = False) -> None:
    """Publish ``events`` to ``clicks.<user>`` with nats-py (any client would do)."""
    import nats

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        if create:
            await js.add_stream(name=STREAM, subjects=["clicks.>"], allow_direct=True)
        for event in events:
            await js.publish_async(f"clicks.{event['user']}", json.dumps(event).encode())
        await js.publish_async_completed()
    finally:
        await nc.close()


def run_counts(spark: Any, url: str, checkpoint: str, out: str) -> dict[str, Any]:
    """Run the windowed count once over everything stored (``availableNow``) and return the
    query's last progress."""
    from pyspark.sql import functions as F

    clicks_df = (
        spark.readStream.format("jetstream")
        .option("servers", url)
        .option("stream", STREAM)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", 2000)
        .load()
    )
    event = F.from_json(F.col("data").cast("string"), "user string, at timestamp")
    counts = (
        clicks_df.select(event.alias("e"))
        .select("e.user", "e.at")
        .withWatermark("at", "2 minutes")
        .groupBy(F.window("at", "1 minute"), "user")
        .count()
        .select(
            "user",
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "count",
        )
    )
    query = (
        counts.writeStream.format("parquet")
        .outputMode("append")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return {
        "batches": len(query.recentProgress),
        "rows": sum(p["numInputRows"] for p in query.recentProgress),
        "dropped_late": sum(
            op.get("numRowsDroppedByWatermark", 0)
            for p in query.recentProgress
            for op in p.get("stateOperators", [])
        ),
    }


def read_counts(spark: Any, out: str) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for row in spark.read.parquet(out).collect():
        start = row["window_start"].replace(tzinfo=dt.UTC).isoformat()
        counts[row["user"], start] += row["count"]
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats", help="a server URL (default: a private nats-server)")
    parser.add_argument("--out", help="the output directory (default: a temporary one)")
    parser.add_argument("--per-minute", type=int, default=500)
    args = parser.parse_args(argv)

    from headrace_spark import start_session

    server = None if args.nats else LocalServer().start()
    url = args.nats or server.url  # type: ignore[union-attr]
    work = Path(args.out or tempfile.mkdtemp(prefix="clicks-"))
    spark = start_session("local[2]", app_name="windowed-counts")
    headrace_spark.register(spark)
    try:
        on_time = clicks(10, args.per_minute)
        # One click at minute 13 moves the watermark (13 - 2 = minute 11) past all ten windows.
        closing = {"user": "ada", "at": (START + dt.timedelta(minutes=13)).isoformat()}
        asyncio.run(publish(url, [*on_time, closing], create=True))
        first = run_counts(spark, url, str(work / "checkpoint"), str(work / "counts"))
        # Late clicks for minute 3, whose window was written: dropped, not counted twice.
        late = [{"user": "grace", "at": (START + dt.timedelta(minutes=3, seconds=5)).isoformat()}]
        asyncio.run(publish(url, late * 25))
        second = run_counts(spark, url, str(work / "checkpoint"), str(work / "counts"))
        got = read_counts(spark, str(work / "counts"))
        want = expected_counts(on_time)
        print(json.dumps({"first_run": first, "second_run": second, "windows": len(got)}))
        if got != want:
            extra, missing = sorted((got - want).items()), sorted((want - got).items())
            print(f"MISMATCH: counted but not published {extra[:5]}, not counted {missing[:5]}")
            return 1
        print(f"OK: {len(want)} windows, {sum(want.values())} clicks, each counted once")
        return 0
    finally:
        spark.stop()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
