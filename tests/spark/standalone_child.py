"""Child of test_standalone.py: a SparkSink whose own session runs on a Spark standalone
cluster (``spark://host:port``), in a process of its own (PySpark allows one SparkContext per
process, and the test process has a ``local[2]`` one).

    standalone_child.py MASTER_URL OUT

Two batches, the second overlapping the first (4 and 5 redelivered); then the output is counted
through the cluster, and the sink closes, stopping the session it started (``stop_session``).

stdout: one JSON object (``{"event": "done", ...}``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import trio
from headrace_spark import SparkSink

from tests.sinks.sink_support import batch, rec

APP_NAME = "headrace-standalone-child"


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def main(master: str, out: str) -> None:
    sink = SparkSink(
        out,
        master=master,
        app_name=APP_NAME,
        # Small and single: one worker of 1 core / 1 GiB on a shared machine.
        conf={"spark.executor.memory": "512m", "spark.cores.max": "1"},
        stop_session=True,
    )
    await sink.open()
    sc = sink.spark.sparkContext
    session = {"master": sc.master, "app_id": sc.applicationId, "app_name": sc.appName}
    await sink.write_batch(batch(*(rec(n) for n in (1, 2, 3, 4, 5))))
    await sink.write_batch(batch(*(rec(n, delivered=2) for n in (4, 5, 6, 7, 8))))
    counters = {
        "batches_committed": sink.batches_committed,
        "rows_written": sink.rows_written,
        "duplicates_skipped": sink.duplicates_skipped,
    }
    # Read back by the cluster's executor too: what it committed is what a reader there sees.
    rows_read = sink.spark.read.parquet(out).count()
    await sink.close()
    say(
        "done",
        **session,
        sink=counters,
        rows_read=rows_read,
        stopped=sink.spark is None,
    )


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:3])
