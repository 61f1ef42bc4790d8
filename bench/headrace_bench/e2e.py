"""``headrace bench e2e``: JetStream into Spark parquet files, every message acked after its
batch was committed, headrace against the loop a user would write with nats-py and PySpark.

Setup: one private nats-server with JetStream (file storage, like ``bench pipeline``); stream
``ORDERS`` (subjects ``orders.>``) is loaded with N JSON orders of about 150 bytes, each with two
headers, every publish acknowledged by the stream.

Each implementation then runs in its own process (so that its peak RSS is its own) with its own
durable pull consumer on that stream, its own SparkSession (``local[*]`` unless
``--spark-master``) and its own output directory:

- ``headrace-e2e``: ``Pipeline``: ``JetStreamSource`` (consume buffer 10000, ``max_ack_pending``
  at least twice the batch) into ``SparkSink(path=...)`` with ``BatchPolicy(max_messages=batch,
  max_age=1)``; the sink builds an Arrow table per batch, has Spark write it, fsyncs it, commits
  it (the output's shared commit state in JetStream, as every pipeline's sink does) and only
  then does the pipeline ack the batch's messages.
- ``headrace-e2e-arrow``: the same with ``SparkSink(path=..., writer="arrow")``: Arrow's parquet
  writer writes the table, no Spark job per batch; the same files for Spark to read.
- ``naive``: nats-py ``pull_subscribe`` + ``fetch(1000)`` until ``batch`` messages are held (or
  the stream is exhausted), one ``pyspark.sql.Row`` per message, ``spark.createDataFrame(rows,
  schema)``, ``.write.mode("append").parquet(path)``, then ``await msg.ack()`` for each message.

Before its clock starts each process starts its session (timed separately: ``session_s``) and
runs the same warm-up (``warmup_s``): a few small writes through both the Arrow and the Row path,
so that the JVM's class loading and first JIT compilations are charged to neither. Then each
calls ``headrace.pipeline.tune_gc()`` (what the ``headrace`` commands do; the naive loop gets it
too, so the ratio is the code's and not the collector settings'). The clock runs from the start
of the pipeline (the first pull) to the last ack being out: for headrace the pipeline's drain,
which flushes its acks; for nats-py a flush after the last ack.

Afterwards each process checks, off the clock, with Spark's own reader: the output holds N rows
and N distinct stream sequences; and with the server: the consumer's ack floor is N, nothing
pending, nothing redelivered. ``verified`` says whether all of that held.

Peak RSS: ``VmHWM`` of the Python process and of its JVM (the ``java`` child PySpark starts),
both reset after the warm-up (``/proc/<pid>/clear_refs``), so they cover the measured run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from headrace.localserver import LocalServer
from headrace.pipeline import tune_gc

from headrace_bench.consume import (
    BenchmarkError,
    _cpu_seconds,
    _failure,
    _last_json,
    _peak_rss_mb,
    _run_child,
    _settled_problems,
    _stored,
)

IMPLS = ("headrace-e2e", "headrace-e2e-arrow", "naive")
#: The headrace implementations and the sink writer each uses.
WRITER_OF = {"headrace-e2e": "spark", "headrace-e2e-arrow": "arrow"}
STREAM = "ORDERS"
SUBJECTS = "orders.>"
REGIONS = ("eu", "us", "apac", "latam")
#: Records per Spark batch, both implementations (``--batch``).
BATCH = 100_000
#: headrace's consume buffer (``--buffer``).
BUFFER = 10_000
#: headrace's batch age limit, seconds.
MAX_AGE = 1.0
#: What the naive loop asks nats-py for per fetch.
NAIVE_FETCH = 1000
MAX_ACK_PENDING = 100_000
LOAD_WINDOW = 2000
WARMUP_ROUNDS = 3
WARMUP_ROWS = 10_000
SETTLE = 10.0
CHILD_TIMEOUT = 900.0
#: Printed next to the figures, not asserted.
TARGET_MSG_PER_S = 100_000
TARGET_RATIO = 5.0
HEADERS = {"Content-Type": "application/json", "Order-Source": "web"}
_ME = [sys.executable, "-m", "headrace_bench.e2e"]


class SparkUnavailable(BenchmarkError):
    """pyspark or a Java runtime is missing."""


def _have_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _have_java() -> bool:
    return bool(os.environ.get("JAVA_HOME") or shutil.which("java"))


def check_spark(master: str = "local[*]") -> None:
    """:class:`SparkUnavailable` unless pyspark (and, for a session of our own, Java) is here."""
    if not _have_module("pyspark") or not _have_module("headrace_spark"):
        raise SparkUnavailable(
            "bench e2e needs pyspark and the Spark sink: pip install 'headrace[spark]'"
        )
    if not master.startswith("sc://") and not _have_java():
        raise SparkUnavailable(
            "bench e2e needs a Java 17+ runtime for Spark and there is no 'java' on PATH nor "
            "JAVA_HOME (Debian/Ubuntu: apt install openjdk-17-jre-headless)"
        )


def order(i: int) -> tuple[str, bytes]:
    """The subject and JSON body of order ``i`` (147-153 bytes)."""
    region = REGIONS[i % len(REGIONS)]
    body = {
        "order_id": f"o-{i:09d}",
        "customer": f"c-{(i * 7919) % 100_000:05d}",
        "sku": f"SKU-{(i * 31) % 5000:04d}",
        "qty": 1 + i % 9,
        "price": round(1 + (i % 10_000) / 100, 2),
        "currency": "EUR",
        "region": region,
        "ts": f"2026-11-26T{i // 3_600_000 % 24:02d}:{i // 60_000 % 60:02d}:"
        f"{i // 1000 % 60:02d}.{i % 1000:03d}Z",
    }
    return f"orders.{region}", json.dumps(body, separators=(",", ":")).encode()


# -- the loader (in the parent) ---------------------------------------------------------------


async def _load(url: str, n: int) -> dict[str, Any]:
    """Create the stream and publish N orders, at most LOAD_WINDOW unacknowledged."""
    from headrace.jetstream import JetStream, StreamConfig, publish_acked
    from headrace.nats import connect

    async with connect(url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECTS]))
        messages = ((*order(i), HEADERS) for i in range(n))
        load = await publish_acked(nc, messages, window=LOAD_WINDOW)
        stored = await _stored(js, n, load.refused, STREAM)
    return {
        "stored": stored,
        "load_msg_per_s": round(load.msg_per_s),
        "payload_bytes": load.payload_bytes,
    }


# -- Spark, in the children -------------------------------------------------------------------


def _start_spark(master: str) -> tuple[Any, float]:
    from headrace_spark import start_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    started = time.perf_counter()
    spark = start_session(master, app_name="headrace-bench-e2e")
    return spark, time.perf_counter() - started


def _naive_schema() -> Any:
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    return StructType(
        [
            StructField("subject", StringType(), False),
            StructField("data", BinaryType(), False),
            StructField("headers", MapType(StringType(), StringType()), True),
            StructField("stream", StringType(), False),
            StructField("stream_seq", LongType(), False),
            StructField("consumer_seq", LongType(), False),
            StructField("num_delivered", IntegerType(), False),
            StructField("timestamp", TimestampType(), False),
        ]
    )


def _warm_up(spark: Any, where: Path, rows: int = WARMUP_ROWS) -> float:
    """The same few small writes in every process, through the Spark sink's two paths (a table
    from Arrow batches, and from a parquet file Arrow staged) and the Row path (the naive
    loop's), so that none pays the JVM's first-use costs."""
    import pyarrow as pa
    from headrace_spark import HEADERS_TYPE, METADATA_SCHEMA, staged_frame
    from pyspark.sql import Row

    started = time.perf_counter()
    now = dt.datetime.now(dt.UTC)
    schema = _naive_schema()
    headers = {k: [v] for k, v in HEADERS.items()}
    for r in range(WARMUP_ROUNDS):
        bodies = [order(i)[1] for i in range(rows)]
        table = pa.table(
            {
                "subject": pa.array(["orders.eu"] * rows, pa.string()),
                "data": pa.array(bodies, pa.binary()),
                "headers": pa.array([headers] * rows, HEADERS_TYPE),
                "stream": pa.array([STREAM] * rows, pa.string()),
                "stream_seq": pa.array(range(rows), pa.int64()),
                "consumer_seq": pa.array(range(rows), pa.int64()),
                "num_delivered": pa.array([1] * rows, pa.int32()),
                "timestamp": pa.array([now] * rows, pa.timestamp("us", "UTC")),
            },
            schema=METADATA_SCHEMA,
        )
        spark.createDataFrame(table).coalesce(1).write.parquet(str(where / f"arrow-{r}"))
        with staged_frame(spark, table, where, f"input-{r}") as staged:
            staged.write.parquet(str(where / f"staged-{r}"))
        py_rows = [
            Row(
                subject="orders.eu",
                data=body,
                headers=HEADERS,
                stream=STREAM,
                stream_seq=i,
                consumer_seq=i,
                num_delivered=1,
                timestamp=now,
            )
            for i, body in enumerate(bodies)
        ]
        spark.createDataFrame(py_rows, schema).write.mode("append").parquet(str(where / "rows"))
        spark.read.parquet(str(where / f"arrow-{r}")).select("stream_seq").distinct().count()
    return time.perf_counter() - started


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        for child in children:
            found.append(int(child))
            todo.append(int(child))
    return found


def _jvm_pid() -> int | None:
    """The ``java`` process PySpark started for this session (local masters), if any."""
    for pid in _descendants(os.getpid()):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
                return pid
        except OSError:
            continue
    return None


def _reset_peak_rss(pid: int | str) -> None:
    """Reset ``VmHWM`` to the current RSS (Linux: ``5`` into ``clear_refs``); best effort."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _verify(spark: Any, out: Path) -> tuple[int, int, float]:
    """Rows and distinct stream sequences in the output, read back by Spark; and how long
    that took."""
    started = time.perf_counter()
    if not any(out.rglob("*.parquet")):
        return 0, 0, 0.0  # nothing written (Spark would say it cannot infer a schema)
    df = spark.read.parquet(str(out))
    rows = df.count()
    distinct = df.select("stream_seq").distinct().count()
    return rows, distinct, time.perf_counter() - started


def _output_problems(n: int, rows: int, distinct: int) -> list[str]:
    problems = []
    if rows != n:
        problems.append(f"the output holds {rows} rows, not {n}")
    if distinct != n:
        problems.append(f"the output holds {distinct} distinct stream sequences, not {n}")
    return problems


def _output_mb(out: Path) -> float:
    size = sum(
        f.stat().st_size
        for f in out.rglob("*.parquet")
        if "_headrace" not in f.parts and not f.name.startswith(".")
    )
    return round(size / 1e6, 1)


# -- the two implementations ------------------------------------------------------------------


async def _run_headrace(
    impl: str, url: str, n: int, batch: int, buffer: int, spark: Any, out: Path
) -> dict[str, Any]:
    from headrace.jetstream import ConsumeOptions, ConsumerConfig, JetStream
    from headrace.nats import connect
    from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline
    from headrace_spark import CommitInfo, SparkSink

    name = f"e2e_headrace_{os.getpid()}"
    done = trio.Event()
    commits: list[CommitInfo] = []

    def on_commit(info: CommitInfo) -> None:  # in the sink's worker thread
        commits.append(info)
        if sum(c.rows for c in commits) >= n:
            trio.from_thread.run_sync(done.set)

    sink = SparkSink(path=out, spark=spark, on_commit=on_commit, writer=WRITER_OF[impl])
    pipe = Pipeline("bench-e2e", drain_timeout=120)
    source = JetStreamSource(
        stream=STREAM,
        durable=name,
        config=ConsumerConfig(max_ack_pending=max(MAX_ACK_PENDING, 2 * batch)),
        consume=ConsumeOptions(max_messages=buffer),
    )
    policy = BatchPolicy(max_messages=batch, max_age=MAX_AGE)
    pipe.source(source).sink(sink, name="spark", batch=policy)
    failed: list[str] = []
    async with connect(url) as nc:
        started = time.perf_counter()
        cpu = _CpuClock()
        async with pipe.running(nc) as run:
            give_up = trio.current_time() + CHILD_TIMEOUT / 2
            while not done.is_set():
                # A failing sink is retried forever (the messages come back): report it.
                if run.stats.batches_failed or trio.current_time() > give_up:
                    errors = [f"{e.stage}: {e.error!r}" for e in run.errors[-2:]]
                    failed.append("stopped: " + ("; ".join(errors) or "timed out"))
                    run.stop()
                    break
                with trio.move_on_after(0.1):
                    await done.wait()
        elapsed = time.perf_counter() - started  # the drain flushed the last acks
        spent = cpu.spent()
        stats = run.stats
        python_rss, jvm_rss = _peak_rss_mb(), _jvm_peak_rss_mb()
        js = JetStream(nc)
        server = await _settled_problems(
            n, True, lambda: js.consumer_info(STREAM, name), trio.sleep, SETTLE
        )
        await js.delete_consumer(STREAM, name)
    committed = sum(c.rows for c in commits)
    problems = [] if committed == n else [f"committed {committed} rows, not {n}"]
    return {
        "impl": impl,
        "msgs": stats.acks,
        "seconds": elapsed,
        "problems": failed + problems + server,
        "batches": len(commits),
        "batch_rows": [c.rows for c in commits],
        "write_s": round(sum(c.seconds for c in commits), 3),
        "first_write_s": round(commits[0].seconds, 3) if commits else None,
        "buffer": buffer,
        "peak_rss_mb": python_rss,
        "jvm_peak_rss_mb": jvm_rss,
        **spent,
    }


async def _run_naive(url: str, n: int, batch: int, spark: Any, out: Path) -> dict[str, Any]:
    import nats  # type: ignore[import-not-found,unused-ignore]
    from nats.js.api import (  # type: ignore[import-not-found,unused-ignore]
        AckPolicy,
        ConsumerConfig,
    )
    from pyspark.sql import Row

    name = f"e2e_naive_{os.getpid()}"
    nc = await nats.connect(url, pending_size=256 * 1024 * 1024)
    js = nc.jetstream()
    config = ConsumerConfig(
        ack_policy=AckPolicy.EXPLICIT, max_ack_pending=max(MAX_ACK_PENDING, 2 * batch)
    )
    sub = await js.pull_subscribe(SUBJECTS, durable=name, stream=STREAM, config=config)
    schema = _naive_schema()
    path = str(out)
    fetch_s = rows_s = write_s = ack_s = 0.0
    batch_rows: list[int] = []
    got = acked = 0
    pending: list[Any] = []

    async def flush_batch() -> None:
        nonlocal rows_s, write_s, ack_s, acked
        t0 = time.perf_counter()
        rows = []
        for m in pending:
            md = m.metadata
            rows.append(
                Row(
                    subject=m.subject,
                    data=m.data,
                    headers=m.headers,
                    stream=md.stream,
                    stream_seq=md.sequence.stream,
                    consumer_seq=md.sequence.consumer,
                    num_delivered=md.num_delivered,
                    timestamp=md.timestamp,
                )
            )
        t1 = time.perf_counter()
        spark.createDataFrame(rows, schema).write.mode("append").parquet(path)
        t2 = time.perf_counter()
        for m in pending:
            await m.ack()
        t3 = time.perf_counter()
        rows_s += t1 - t0
        write_s += t2 - t1
        ack_s += t3 - t2
        acked += len(pending)
        batch_rows.append(len(pending))
        pending.clear()

    started = time.perf_counter()
    cpu = _CpuClock()
    while got < n:
        t0 = time.perf_counter()
        try:
            msgs = await sub.fetch(NAIVE_FETCH, timeout=5)
        except TimeoutError:
            break  # stalled: reported below
        finally:
            fetch_s += time.perf_counter() - t0
        pending.extend(msgs)
        got += len(msgs)
        if len(pending) >= batch:
            await flush_batch()
    if pending:
        await flush_batch()
    await nc.flush(30)
    elapsed = time.perf_counter() - started
    spent = cpu.spent()
    python_rss, jvm_rss = _peak_rss_mb(), _jvm_peak_rss_mb()
    server = await _settled_problems(
        n, True, lambda: js.consumer_info(STREAM, name), asyncio.sleep, SETTLE
    )
    await js.delete_consumer(STREAM, name)
    await nc.close()
    problems = [] if acked == n else [f"acked {acked} messages, not {n}"]
    return {
        "impl": "naive",
        "msgs": acked,
        "seconds": elapsed,
        "problems": problems + server,
        "batches": len(batch_rows),
        "batch_rows": batch_rows,
        "fetch_s": round(fetch_s, 3),
        "rows_s": round(rows_s, 3),
        "write_s": round(write_s, 3),
        "ack_s": round(ack_s, 3),
        "fetch": NAIVE_FETCH,
        "peak_rss_mb": python_rss,
        "jvm_peak_rss_mb": jvm_rss,
        **spent,
    }


_JVM: list[int | None] = [None]


class _CpuClock:
    """CPU seconds of this Python process (all its threads) and of its JVM while the clock
    runs: with nats-server's (measured by the parent), where each run's time goes."""

    def __init__(self) -> None:
        self._python = time.process_time()
        pid = _JVM[0]
        self._jvm = _cpu_seconds(pid) if pid is not None else None

    def spent(self) -> dict[str, float]:
        spent = {"python_cpu_s": round(time.process_time() - self._python, 3)}
        pid = _JVM[0]
        if pid is not None and self._jvm is not None:
            spent["jvm_cpu_s"] = round(_cpu_seconds(pid) - self._jvm, 3)
        return spent


def _jvm_peak_rss_mb() -> float | None:
    pid = _JVM[0]
    return _peak_rss_mb(pid) if pid is not None else None


def _child(args: argparse.Namespace) -> dict[str, Any]:
    spark, session_s = _start_spark(args.spark_master)
    _JVM[0] = _jvm_pid()
    work = Path(args.work)
    try:
        warm = work / f"warmup-{args.impl}-{os.getpid()}"
        warmup_s = _warm_up(spark, warm, min(WARMUP_ROWS, max(1000, args.messages)))
        out = work / f"out-{args.impl}-{os.getpid()}"
        tune_gc()
        _reset_peak_rss("self")
        if _JVM[0] is not None:
            _reset_peak_rss(_JVM[0])
        if args.impl in WRITER_OF:
            result: dict[str, Any] = trio.run(
                _run_headrace,
                args.impl,
                args.url,
                args.messages,
                args.batch,
                args.buffer,
                spark,
                out,
            )
        else:
            result = asyncio.run(_run_naive(args.url, args.messages, args.batch, spark, out))
        rows, distinct, verify_s = _verify(spark, out)
        result["problems"] += _output_problems(args.messages, rows, distinct)
        result.update(
            rows=rows,
            distinct_stream_seq=distinct,
            output_mb=_output_mb(out),
            session_s=round(session_s, 3),
            warmup_s=round(warmup_s, 3),
            verify_s=round(verify_s, 3),
        )
    finally:
        spark.stop()
    return result


# -- the parent -------------------------------------------------------------------------------


def _finish(
    raw: dict[str, Any], n: int, batch: int, payload_bytes: int, master: str
) -> dict[str, Any]:
    """The child's raw figures as a result line (the shape of the other benchmarks')."""
    problems = raw.pop("problems", [])
    seconds = raw.pop("seconds")
    result: dict[str, Any] = {"bench": "e2e", "impl": raw.pop("impl"), "ack": True}
    result["msgs"] = raw.pop("msgs")
    result["expected"] = n
    result["verified"] = not problems
    if problems:  # no figure to trust
        result["error"] = "; ".join(problems)
    else:
        result["seconds"] = round(seconds, 3)
        result["msg_per_s"] = round(n / seconds) if seconds > 0 else 0
        result["mb_per_s"] = round(payload_bytes / seconds / 1e6, 2) if seconds > 0 else 0
        for key in ("python_cpu_s", "jvm_cpu_s", "server_cpu_s"):
            if key in raw:
                result[f"{key}_per_100k"] = round(raw[key] * 100_000 / n, 3)
    result["batch"] = batch
    result["spark_master"] = master
    result.update(raw)
    return result


def _print_table(results: list[dict[str, Any]], load: dict[str, Any]) -> None:
    avg = load["payload_bytes"] / max(1, load["stored"])
    print(
        f"stream loaded: {load['stored']:,} JSON orders (avg {avg:.0f} B, 2 headers) at "
        f"{load['load_msg_per_s']:,} msg/s"
    )
    for r in results:
        if "error" in r:
            print(f"{r['impl']:>18}: FAILED: {r['error']}")
            continue
        print(
            f"{r['impl']:>18}: {r['msg_per_s']:>9,} msg/s  {r['mb_per_s']:6.2f} MB/s  "
            f"{r['seconds']:7.2f} s  {r['batches']} batches  peak RSS python "
            f"{r.get('peak_rss_mb')} MB, JVM {r.get('jvm_peak_rss_mb')} MB  "
            f"(session {r['session_s']:.1f} s, warm-up {r['warmup_s']:.1f} s)  verified"
        )
        cpu = [
            (name, r[f"{name}_cpu_s_per_100k"])
            for name in ("python", "jvm", "server")
            if f"{name}_cpu_s_per_100k" in r
        ]
        if cpu:
            parts = ", ".join(f"{name} {v:.2f}" for name, v in cpu)
            wall = 100_000 / r["msg_per_s"] if r["msg_per_s"] else 0.0
            print(
                f"{'':>18}  CPU s/100k: {parts}; sum {sum(v for _, v in cpu):.2f} in "
                f"{wall:.2f} s of wall"
            )
    for ours in results:
        if ours["impl"] in WRITER_OF and ours.get("msg_per_s"):
            line = (
                f"{ours['impl']:>18}: targets >= {TARGET_MSG_PER_S:,} msg/s (measured "
                f"{ours['msg_per_s']:,})"
            )
            if "ratio_vs_naive" in ours:
                line += f", >= {TARGET_RATIO:g}x naive (measured {ours['ratio_vs_naive']}x)"
            print(line)


def run(
    messages: int,
    *,
    batch: int = BATCH,
    buffer: int = BUFFER,
    spark_master: str = "local[*]",
    as_json: bool = False,
) -> list[dict[str, Any]]:
    """Load the stream, run each implementation in its own process, print JSON lines or a
    table; returns the lines (a child that failed has ``error`` and no figures)."""
    check_spark(spark_master)
    if messages < 1 or batch < 1 or buffer < 1:
        raise BenchmarkError("--messages, --batch and --buffer must be at least 1")
    results: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="headrace-bench-e2e-") as work,
        LocalServer(jetstream=True) as server,
    ):
        load = trio.run(_load, server.url, messages)
        for impl in IMPLS:
            cmd = [*_ME, "child", "--impl", impl, "--url", server.url, "--work", work]
            cmd += ["--messages", str(messages), "--batch", str(batch)]
            cmd += ["--buffer", str(buffer), "--spark-master", spark_master]
            # nats-server's CPU over the child's life: its session start, warm-up and read-back
            # need none to speak of (heartbeats), so nearly all of it is the measured run's.
            server_cpu = _cpu_seconds(server.pid) if server.pid is not None else None
            child = _run_child(cmd, timeout=CHILD_TIMEOUT)
            raw = _last_json(child)
            if raw is not None and server_cpu is not None and server.pid is not None:
                raw["server_cpu_s"] = round(_cpu_seconds(server.pid) - server_cpu, 3)
            if child.returncode != 0 or raw is None:
                failed: dict[str, Any] = {"bench": "e2e", "impl": impl, "ack": True, "msgs": 0}
                failed.update(expected=messages, verified=False, error=_failure(child))
                results.append(failed)
                continue
            result = _finish(raw, messages, batch, load["payload_bytes"], spark_master)
            result["avg_payload"] = round(load["payload_bytes"] / messages, 1)
            results.append(result)
    peer = next((r for r in results if r["impl"] == "naive"), None)
    for ours in results:
        if ours["impl"] not in WRITER_OF or "msg_per_s" not in ours:
            continue
        if peer and ours["msg_per_s"] and peer.get("msg_per_s"):
            ours["ratio_vs_naive"] = round(ours["msg_per_s"] / peer["msg_per_s"], 2)
        ours["target_msg_per_s"] = TARGET_MSG_PER_S
        ours["target_ratio_vs_naive"] = TARGET_RATIO
    if as_json:
        for r in results:
            print(json.dumps(r), flush=True)
    else:
        _print_table(results, load)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m headrace_bench.e2e")
    parser.add_argument("role", nargs="?", choices=["child"])
    parser.add_argument("--impl", choices=IMPLS, default="headrace-e2e")
    parser.add_argument("--url")
    parser.add_argument("--work")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--buffer", type=int, default=BUFFER)
    parser.add_argument("--spark-master", default="local[*]")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.role == "child":
        print(json.dumps(_child(args)), flush=True)
    else:
        run(
            args.messages,
            batch=args.batch,
            buffer=args.buffer,
            spark_master=args.spark_master,
            as_json=args.json,
        )


if __name__ == "__main__":
    main()
