"""Child of test_jetstream_faults.py: Spark queries of the ``jetstream`` format in a process of
their own, so that the test can SIGKILL the driver.

    jetstream_child.py stream SERVERS STREAM CHECKPOINT
        (--parquet OUT | --to-subject SUBJECT --to-stream STREAM) [--trigger now|every]
        [--max N] [--partitions N] [--max-in-flight N] [--restarts N] [--standby] [--master M]
        [--fail-half N]
    jetstream_child.py write SERVERS SUBJECT ROWS [--master M] [--fail-half N]
        [--stream-from STREAM --checkpoint DIR --to-subject SUBJECT --to-stream STREAM ...]

``stream``: ``readStream.format("jetstream")`` from STREAM (earliest on) into parquet files (the
file sink, exactly once by its ``_spark_metadata`` log) or ``writeStream.format("jetstream")``
on SUBJECT (stored in STREAM), checkpointed in CHECKPOINT. ``--trigger now`` is
``Trigger.AvailableNow`` (the query ends by itself); ``every`` a 100 ms processing-time trigger
(the query runs until SIGTERM, which stops it). ``--restarts N``: a query that fails is
started again on its checkpoint, up to N times (what an application does that keeps its query
running). ``--standby``: the session started and warmed up, the child says ``{"event":
"ready"}`` and starts the query only on SIGUSR1 (a driver waiting to take over).

``write``: ``df.write.format("jetstream")`` of ROWS rows (data ``row-<i>:`` and 1 KiB) in two
partitions on SUBJECT; with ``--stream-from``, then a streaming query as above (AvailableNow)
from that stream, in the same session.

``--fail-half N``: the rows written to a jetstream sink pass through a Python UDF that fails the
first attempt of each task after N rows, once some of them were published; the retry (a master
of ``local[n,maxFailures]``) publishes them all again.

stdout, one JSON object a line (each with ``t``, seconds since the start):
``{"event": "started", "id": <query id>}`` when a query starts; ``{"event": "batch", "batch":
..., "rows": ..., "end": <last sequence read>}`` per finished micro-batch (a
StreamingQueryListener: the last ones of a query that ends may be missing); ``{"event":
"ended", "error": null | "...", "end": <last sequence read>}`` when a query ended;
``{"event": "written", "error": ...}`` after a batch write. The exit code is 0, or 3 when the
last query or the write failed.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from headrace_spark import register
from headrace_spark.session import start_session

_PRINT = threading.Lock()
_START = time.monotonic()


def say(event: str, **fields: Any) -> None:
    """One event line; ``t``: seconds since this process started."""
    t = round(time.monotonic() - _START, 2)
    with _PRINT:
        print(json.dumps({"event": event, **fields, "t": t}), flush=True)


def failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:3000]}"


class Published:
    """A core NATS subscription on a plain socket (the UDF runs in Spark's Python worker, where a
    blocking client is simplest): whether a message of a given task was published yet."""

    def __init__(self, url: str, subject: str, timeout: float) -> None:
        where = urlsplit(url)
        self.sock = socket.create_connection((where.hostname, where.port), timeout=timeout)
        self.file = self.sock.makefile("rb")
        self.file.readline()  # INFO
        self.sock.sendall(
            b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\n'
            + f"SUB {subject} 1\r\nPING\r\n".encode()
        )
        while self.file.readline().strip() != b"PONG":
            pass  # (+OK, INFO): the subscription is in place once PONG comes

    def wait_partition(self, partition: int) -> None:
        """Until a message whose Nats-Msg-Id names ``partition`` (``...:<partition>:<row>``)
        passes; a socket timeout if none does."""
        while True:
            line = self.file.readline()
            if not line:
                raise RuntimeError("the NATS connection of the UDF closed")
            if line.startswith(b"PING"):
                self.sock.sendall(b"PONG\r\n")
            if not line.startswith(b"HMSG"):
                continue
            header_len, total = (int(x) for x in line.split()[-2:])
            block = self.file.read(total + 2)[:header_len]
            for header in block.split(b"\r\n")[1:]:
                name, _, value = header.partition(b":")
                if name.strip() == b"Nats-Msg-Id" and value.strip().split(b":")[-2] == (
                    str(partition).encode()
                ):
                    return

    def close(self) -> None:
        self.sock.close()


def failing_udf(half: int, url: str, subject: str) -> Any:
    """An identity UDF on ``data`` that fails a task's first attempt after ``half`` rows, once
    the sink published at least one of them (so the failed attempt left messages in the
    stream, which the retry publishes again)."""
    from pyspark.sql import functions as F

    watching: dict[int, Published] = {}
    seen: dict[int, int] = {}

    def passthrough(data):  # no hints: with them pyspark takes it for a pandas UDF
        from pyspark import TaskContext

        context = TaskContext.get()
        if context.attemptNumber() > 0:
            return data
        attempt = context.taskAttemptId()
        if attempt not in watching:
            # Before the first row leaves the UDF: nothing of this task is published yet.
            watching[attempt] = Published(url, subject, timeout=60)
        seen[attempt] = seen.get(attempt, 0) + 1
        if seen[attempt] > half:
            watching[attempt].wait_partition(context.partitionId())
            watching.pop(attempt).close()
            raise RuntimeError(f"injected: the first attempt fails after {half} rows")
        return data

    return F.udf(passthrough, "binary")


def session(master: str, fail_half: int) -> Any:
    conf = {}
    if fail_half:
        # Small Arrow batches into the writer, so that it publishes rows of the first attempt
        # before the UDF raises (by default a partition of a few thousand rows is one batch).
        conf["spark.sql.execution.arrow.maxRecordsPerBatch"] = "50"
    spark = start_session(master, app_name="headrace-jetstream-child", conf=conf)
    register(spark)
    return spark


class Progress:
    """A StreamingQueryListener printing one ``batch`` event per finished micro-batch."""

    def __new__(cls) -> Any:
        from pyspark.sql.streaming import StreamingQueryListener

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                p = event.progress
                if not p.sources[0].endOffset:
                    return
                end = json.loads(p.sources[0].endOffset)["seq"]
                say("batch", batch=p.batchId, rows=p.numInputRows, end=end, ms=p.durationMs)

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        return Listener()


def start_query(spark: Any, args: argparse.Namespace, source: str, trigger: str) -> Any:
    """The streaming query ``args`` describe, reading ``source``, started."""
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("jetstream")
        .option("servers", args.servers)
        .option("stream", source)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", str(args.max))
    )
    if args.partitions:
        reader = reader.option("numPartitions", str(args.partitions))
    df = reader.load()
    if args.parquet:
        writer = df.writeStream.format("parquet").option("path", args.parquet)
    else:
        data = F.col("data")
        if args.fail_half:
            data = failing_udf(args.fail_half, args.servers, args.to_subject)(data)
        rows = df.select(F.lit(args.to_subject).alias("subject"), data.alias("data"))
        writer = (
            rows.writeStream.format("jetstream")
            .option("servers", args.servers)
            .option("stream", args.to_stream)
            .option("maxInFlight", str(args.max_in_flight))
        )
    writer = writer.option("checkpointLocation", args.checkpoint).queryName("faults")
    if trigger == "now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="100 milliseconds")
    query = writer.start()
    say("started", id=query.id)
    return query


def run_query(
    spark: Any, args: argparse.Namespace, source: str, trigger: str, runs: int
) -> str | None:
    """Run the query until it ends (AvailableNow), SIGTERM stops it, or it fails ``runs``
    times; the last failure, if any."""
    listener = Progress()
    spark.streams.addListener(listener)
    stop = threading.Event()
    current: list[Any] = []

    def on_term(*_: Any) -> None:
        stop.set()

    def stopper() -> None:
        stop.wait()
        if current:
            current[-1].stop()

    signal.signal(signal.SIGTERM, on_term)
    threading.Thread(target=stopper, daemon=True).start()
    error: str | None = None
    for run in range(runs):
        query = start_query(spark, args, source, trigger)
        current.append(query)
        if stop.is_set():  # SIGTERM came between two runs
            query.stop()
        try:
            query.awaitTermination()
        except Exception as exc:
            error = failure(exc)
        else:
            error = None
        last = query.lastProgress
        end = json.loads(last["sources"][0]["endOffset"])["seq"] if last else None
        say("ended", run=run, error=error, end=end, stopped=stop.is_set())
        if error is None or stop.is_set():
            break
    # The listener's last events may still be on their way, and this process about to end:
    # "ended" said the last sequence read.
    spark.streams.removeListener(listener)
    return error


def stand_by(spark: Any, args: argparse.Namespace) -> None:
    """Warm up, say ``ready``, and wait for SIGUSR1: a driver started while another still
    runs the query, to take it over from its checkpoint once that one is gone."""
    go = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: go.set())
    # The first read of the format in a session starts Spark's Python workers and plans
    # through Python: a few seconds, spent here rather than in the first micro-batch. (One
    # message, by a batch read: the checkpoint is not touched.)
    (
        spark.read.format("jetstream")
        .option("servers", args.servers)
        .option("stream", args.stream)
        .option("endingOffsets", "1")
        .load()
        .count()
    )
    if args.to_subject:  # the sink's too: a write of no rows
        from pyspark.sql import functions as F

        (
            spark.range(0, numPartitions=1)
            .select(F.lit(args.to_subject).alias("subject"), F.lit(b"").alias("data"))
            .write.format("jetstream")
            .option("servers", args.servers)
            .mode("append")
            .save()
        )
    say("ready")
    go.wait()


def run_stream(args: argparse.Namespace) -> int:
    spark = session(args.master, args.fail_half)
    if args.standby:
        stand_by(spark, args)
    error = run_query(spark, args, args.stream, args.trigger, 1 + args.restarts)
    return 0 if error is None else 3


def run_write(args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    spark = session(args.master, args.fail_half)
    df = spark.range(0, args.rows, numPartitions=2).select(
        F.lit(args.subject).alias("subject"),
        # About 1 KiB a row: a Python worker flushes its output in 64 KiB blocks, and the rows
        # before the UDF's failure must reach the sink.
        F.concat(F.lit("row-"), F.col("id").cast("string"), F.lit(":" + "x" * 1000))
        .cast("binary")
        .alias("data"),
    )
    if args.fail_half:
        udf = failing_udf(args.fail_half, args.servers, args.subject)
        df = df.select("subject", udf("data").alias("data"))
    try:
        df.write.format("jetstream").option("servers", args.servers).mode("append").save()
    except Exception as exc:
        say("written", error=failure(exc))
        return 3
    say("written", error=None)
    if args.stream_from is None:
        return 0
    error = run_query(spark, args, args.stream_from, "now", 1)
    return 0 if error is None else 3


def main() -> int:
    parser = argparse.ArgumentParser()
    modes = parser.add_subparsers(dest="mode", required=True)
    stream = modes.add_parser("stream")
    stream.add_argument("servers")
    stream.add_argument("stream")
    stream.add_argument("checkpoint")
    into = stream.add_mutually_exclusive_group(required=True)
    into.add_argument("--parquet")
    into.add_argument("--to-subject")
    stream.add_argument("--trigger", choices=["now", "every"], default="now")
    stream.add_argument("--restarts", type=int, default=0)
    stream.add_argument("--standby", action="store_true")
    write = modes.add_parser("write")
    write.add_argument("servers")
    write.add_argument("subject")
    write.add_argument("rows", type=int)
    write.add_argument("--stream-from")
    write.add_argument("--checkpoint")
    write.add_argument("--to-subject")
    write.set_defaults(parquet=None)
    for mode in (stream, write):
        mode.add_argument("--to-stream", help="the stream the sink's subject is stored in")
        mode.add_argument("--max", type=int, default=10_000, help="maxMessagesPerTrigger")
        mode.add_argument("--partitions", type=int, default=0, help="numPartitions")
        mode.add_argument("--max-in-flight", type=int, default=512, help="the sink's PubAcks")
        mode.add_argument("--master", default="local[2]")
        mode.add_argument("--fail-half", type=int, default=0)
    args = parser.parse_args()
    return run_stream(args) if args.mode == "stream" else run_write(args)


if __name__ == "__main__":
    sys.exit(main())
