"""Child of test_connect.py: a SparkSink on a Spark Connect server (``sc://``), in a
process of its own (a Spark Connect session sets process-wide state in PySpark, and cannot be
made where a classic session runs, as in the test process).

    connect_child.py write URL OUT
        two batches, the second overlapping the first, then a compaction; the output read
        back through Connect, before and after
    connect_child.py cancel URL OUT MARKER
        a batch whose Spark job hangs in a UDF (which creates MARKER when it starts) is
        cancelled; the sink then closes, and a new sink writes the same batch

stdout: one JSON object (``{"event": "done", ...}``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import trio
from headrace.sinks import CONTROL
from headrace_spark import SparkSink
from headrace_spark.session import is_connect

from tests.sinks.sink_support import seqs


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def counters(sink: SparkSink) -> dict[str, int]:
    return {
        "batches_committed": sink.batches_committed,
        "rows_written": sink.rows_written,
        "duplicates_skipped": sink.duplicates_skipped,
    }


def read_back(spark: Any, out: str) -> list[dict[str, Any]]:
    rows = spark.read.parquet(out).orderBy("stream_seq").collect()
    return [
        {
            "stream": r["stream"],
            "stream_seq": r["stream_seq"],
            "subject": r["subject"],
            "data": r["data"].decode(),
            "num_delivered": r["num_delivered"],
            "timestamp": r["timestamp"].isoformat(),
        }
        for r in rows
    ]


def what_is_in(root: Path) -> dict[str, list[str]]:
    """Files outside the control directory, staging directories, ledger entries."""
    data = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not p.relative_to(root).as_posix().startswith(f"{CONTROL}/")
    )
    return {
        "data": data,
        "staging": sorted(p.name for p in (root / CONTROL / "staging").iterdir()),
        "ledger": sorted(p.name for p in (root / CONTROL / "ledger").iterdir()),
    }


async def write(url: str, out: str) -> None:
    sink = SparkSink(out, master=url, app_name="headrace-connect-child")
    await sink.open()
    await sink.write_batch(seqs(1, 2, 3, 4, 5))
    await sink.write_batch(seqs(4, 5, 6, 7, 8, delivered=2))  # 4 and 5 are redeliveries
    found = counters(sink)
    files = what_is_in(Path(out))["data"]
    rows = read_back(sink.spark, out)
    report = await sink.compact(min_files=2)
    await sink.close()
    say(
        "done",
        connect=is_connect(sink.spark),
        timezone=sink.spark.conf.get("spark.sql.session.timeZone"),
        sink=found,
        files=files,
        rows=rows,
        compaction=[report.directories, report.files_before, report.files_after],
        compacted_files=what_is_in(Path(out))["data"],
        compacted_rows=read_back(sink.spark, out),
    )


async def cancel(url: str, out: str, marker: str) -> None:
    from pyspark.sql.functions import col, udf
    from pyspark.sql.types import LongType

    def hang(seq):  # type: ignore[no-untyped-def]  # no hints: Connect's UDF warns on them
        # On the server's Python worker: say it started, then take far longer than the test.
        import pathlib
        import time as t

        pathlib.Path(marker).touch()
        t.sleep(600)
        return seq

    def slow(df: Any) -> Any:
        # Made here, with the session: udf() picks the Connect flavour then.
        return df.withColumn("stream_seq", udf(hang, LongType())(col("stream_seq")))

    sink = SparkSink(out, master=url, transform=slow)
    await sink.open()
    with trio.CancelScope() as scope:

        async def cancel_when_started() -> None:
            # The job runs in the server's worker; the marker file is the only sign of it.
            with trio.fail_after(60):
                while not await trio.Path(marker).exists():  # noqa: ASYNC110
                    await trio.sleep(0.05)
            scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_when_started)
            started = time.monotonic()
            await sink.write_batch(seqs(1, 2, 3))
    cancelled_after = time.monotonic() - started
    # close() waits for the abandoned write: it returns once the server interrupted the job.
    closing = time.monotonic()
    await sink.close()
    closed_after = time.monotonic() - closing
    files = what_is_in(Path(out))

    again = SparkSink(out, spark=sink.spark)
    await again.open()
    await again.write_batch(seqs(1, 2, 3))
    found = counters(again)
    await again.close()
    say(
        "done",
        cancelled=scope.cancelled_caught,
        cancelled_after=cancelled_after,
        closed_after=closed_after,
        **files,
        sink=found,
        rows=read_back(sink.spark, out),
    )
    sink.spark.stop()


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    trio.run(write if command == "write" else cancel, *args)
