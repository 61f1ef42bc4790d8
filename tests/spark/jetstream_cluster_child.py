"""Child of test_jetstream_cluster.py: the ``jetstream`` Spark format on a session of its own,
on a Spark standalone cluster (``spark://``) or through Spark Connect (``sc://``), in a process
of its own (PySpark allows one SparkContext per process, and a Connect session cannot be made
where a classic one runs, as in the test process).

    jetstream_cluster_child.py standalone MASTER NATS_URL WORK
        a streaming query (readStream jetstream, maxMessagesPerTrigger 1000, availableNow) ->
        a watermark on ``timestamp`` -> counts per 500 ms window -> the memory sink (complete
        mode); then a batch read's count
    jetstream_cluster_child.py connect SC_URL NATS_URL WORK
        the format registered through Connect; a batch read's count, an availableNow query into
        parquet (read back), a batch write of 500 rows to stream OUT and an availableNow
        stream-to-stream copy of EVENTS into stream COPY

Stream EVENTS (subjects ``events.>``) is the test's. stdout: JSON lines, the last one
``{"event": "done", ...}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import headrace_spark
from headrace_spark.session import is_connect, start_session

STREAM = "EVENTS"
WINDOW = "500 milliseconds"
WATERMARK = "2 seconds"
PER_TRIGGER = 1000
APP_NAME = "headrace-jetstream-cluster-child"
#: Rows the Connect child writes to stream OUT.
WRITTEN = 500


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def source(spark: Any, nats: str, streaming: bool, **options: str) -> Any:
    reader = spark.readStream if streaming else spark.read
    return (
        reader.format("jetstream")
        .option("servers", nats)
        .option("stream", STREAM)
        .options(**options)
        .load()
    )


def progress_of(query: Any) -> list[dict[str, Any]]:
    """The query's progress reports, as plain dicts (classic and Connect alike)."""
    found = []
    for p in query.recentProgress:
        raw = json.loads(p.json)
        raw["numInputRows"] = p.numInputRows  # Connect's JSON may leave it to the sources
        found.append(json.loads(json.dumps(raw, default=str)))
    return found


def windowed_counts(spark: Any, nats: str) -> dict[str, Any]:
    """readStream -> watermark -> counts per window -> memory (complete): the counts per window
    start (microseconds since the epoch), and what the query's progress said."""
    from pyspark.sql import functions as F

    events = source(
        spark,
        nats,
        True,
        startingOffsets="earliest",
        maxMessagesPerTrigger=str(PER_TRIGGER),
        numPartitions="2",
    )
    counts = (
        events.withWatermark("timestamp", WATERMARK)
        .groupBy(F.window("timestamp", WINDOW))
        .count()
        .select(F.unix_micros(F.col("window.start")).alias("start"), "count")
    )
    query = (
        counts.writeStream.format("memory")
        .queryName("window_counts")
        .outputMode("complete")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    progress = progress_of(query)
    rows = spark.sql("SELECT start, count FROM window_counts").collect()
    return {
        "windows": {str(r["start"]): r["count"] for r in rows},
        "batches": [p["numInputRows"] for p in progress],
        "watermarks": [p.get("eventTime", {}).get("watermark") for p in progress],
        "max_event_times": [p.get("eventTime", {}).get("max") for p in progress],
    }


def standalone(master: str, nats: str, work: str) -> None:
    spark = start_session(
        master,
        app_name=APP_NAME,
        # Small and single: one worker of 1 core / 1 GiB on a shared machine.
        conf={"spark.executor.memory": "512m", "spark.cores.max": "1"},
    )
    headrace_spark.register(spark)
    sc = spark.sparkContext
    result = windowed_counts(spark, nats)
    df = source(spark, nats, False)
    result["batch_count"] = df.count()
    result["batch_distinct_seq"] = df.select("seq").distinct().count()
    say("done", master=sc.master, app_id=sc.applicationId, app_name=sc.appName, **result)
    spark.stop()


def connect(url: str, nats: str, work: str) -> None:
    from pyspark.sql import functions as F

    where = Path(work)
    spark = start_session(url, app_name=APP_NAME)
    headrace_spark.register(spark)
    say("registered", connect=is_connect(spark))

    df = source(spark, nats, False)
    batch_count = df.count()
    batch_distinct = df.select("seq").distinct().count()

    out = where / "parquet"
    query = (
        source(spark, nats, True, startingOffsets="earliest", maxMessagesPerTrigger="1000")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(where / "parquet-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    batches = [p["numInputRows"] for p in progress_of(query)]
    back = spark.read.parquet(str(out))
    parquet = {"rows": back.count(), "distinct_seq": back.select("seq").distinct().count()}

    rows = spark.range(WRITTEN).select(
        F.format_string("out.%d", F.col("id") % 5).alias("subject"),
        F.format_string("row-%d", F.col("id")).alias("data"),
    )
    rows.write.format("jetstream").option("servers", nats).mode("append").save()

    copy = (
        source(spark, nats, True, startingOffsets="earliest")
        .select(F.concat(F.lit("copy."), F.col("subject")).alias("subject"), "data", "headers")
        .writeStream.format("jetstream")
        .option("servers", nats)
        .option("checkpointLocation", str(where / "copy-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    copy.awaitTermination(300)
    copied = [p["numInputRows"] for p in progress_of(copy)]
    say(
        "done",
        connect=is_connect(spark),
        batch_count=batch_count,
        batch_distinct_seq=batch_distinct,
        stream_batches=batches,
        parquet=parquet,
        written=WRITTEN,
        copy_batches=copied,
    )
    spark.stop()


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"standalone": standalone, "connect": connect}[command](*args)
