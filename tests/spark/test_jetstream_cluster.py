"""The ``jetstream`` Spark format off the test's local session: on a real Spark standalone
cluster (a master and one worker from the jars PySpark ships, test_standalone.py's
``cluster`` fixture), where the reads run in the executor's Python workers, and through Spark
Connect (``sc://``, conftest's ``connect_url``), where the format is registered from the client
and runs in the server's. Each in a child process (jetstream_cluster_child.py): PySpark allows
one SparkContext per process, and no Connect session where a classic one runs.

The counts are checked against what nats-py, the independent peer, published and reads back:
every message's stream sequence and store time (from its ack subject, to the nanosecond), so the
counts per window are computed here without Spark.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import Counter
from pathlib import Path

import attrs
import pytest
import trio

from tests.natspy_peer import NatsPyPeer
from tests.servers import NatsServer
from tests.spark.jetstream_cluster_child import APP_NAME, PER_TRIGGER, STREAM, WRITTEN
from tests.spark.spark_procs import run_child
from tests.spark.test_standalone import (  # noqa: F401 (cluster: that module's fixture, reused)
    Cluster,
    cluster,
    log_tail,
    log_text,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.spark_children]

#: Messages per burst, and the bursts, 0.6 s apart: the 500 ms windows see several of them.
BURST = 1000
BURSTS = 3
MESSAGES = BURST * BURSTS
WINDOW_US = 500_000
WATERMARK_MS = 2000
CHILD_TIMEOUT = 900


async def load_events(natspy: NatsPyPeer, url: str, *extra: tuple[str, str]) -> None:
    """Stream EVENTS (``events.>``, Direct Get allowed), plus ``extra`` (name, subjects)
    streams, and the events published through nats-py in bursts."""
    await natspy.connect(url)

    async def setup() -> None:
        js = natspy.nc.jetstream()
        await js.add_stream(name=STREAM, subjects=["events.>"], allow_direct=True)
        for name, subjects in extra:
            await js.add_stream(name=name, subjects=[subjects], allow_direct=True)

    async def burst(first: int) -> None:
        js = natspy.nc.jetstream()
        for start in range(first, first + BURST, 100):
            await asyncio.gather(
                *(js.publish(f"events.{i % 3}", b"e%d" % i) for i in range(start, start + 100))
            )

    await natspy.call(setup)
    for k in range(BURSTS):
        if k:
            await trio.sleep(0.6)  # the next burst in later windows
        await natspy.call(burst, k * BURST)


@attrs.frozen
class Stored:
    seq: int
    micros: int  # the store time, microseconds since the epoch
    subject: str
    data: bytes


async def read_stream(natspy: NatsPyPeer, subjects: str, n: int) -> list[Stored]:
    """The ``n`` messages of ``subjects``, read through a nats-py ordered consumer; each one's
    store time truncated to microseconds from the nanoseconds of its ack subject."""

    async def read() -> list[Stored]:
        js = natspy.nc.jetstream()
        sub = await js.subscribe(subjects, ordered_consumer=True)
        found = []
        while len(found) < n:
            msg = await sub.next_msg(timeout=10)
            tokens = msg.reply.split(".")  # $JS.ACK.<stream>.<consumer>.<n>.<seq>.<cseq>.<ns>.<p>
            found.append(Stored(int(tokens[-4]), int(tokens[-2]) // 1000, msg.subject, msg.data))
        await sub.unsubscribe()
        return found

    return await natspy.call(read)


async def stream_messages(natspy: NatsPyPeer, stream: str) -> int:
    async def count() -> int:
        return int((await natspy.nc.jetstream().stream_info(stream)).state.messages)

    return await natspy.call(count)


def iso_ms(millis: int) -> str:
    """Spark's progress reports' time format (milliseconds, UTC)."""
    when = dt.datetime.fromtimestamp(millis / 1000, dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis % 1000:03d}Z"


def close_ms(reported: str | None, millis: int) -> bool:
    """``reported`` (Spark's time) is ``millis`` give or take 1 ms (Spark rounds as it goes
    from microseconds to milliseconds)."""
    return reported in {iso_ms(millis - 1), iso_ms(millis), iso_ms(millis + 1)}


async def test_streaming_windowed_counts_on_a_standalone_cluster(
    cluster: Cluster,  # noqa: F811 (the imported fixture)
    nats_server: NatsServer,
    natspy: NatsPyPeer,
    tmp_path: Path,
) -> None:
    """readStream jetstream (1000 messages a trigger, availableNow) -> a 2 s watermark on the
    source's ``timestamp`` -> counts per 500 ms window -> memory, on the cluster; then a batch
    read. The counts are the stream's, window by window, the watermark follows the store times,
    and the tasks ran in the worker's executor."""
    await load_events(natspy, nats_server.url)
    times = {m.seq: m.micros for m in await read_stream(natspy, "events.>", MESSAGES)}
    assert sorted(times) == list(range(1, MESSAGES + 1))

    done = await run_child(
        "jetstream_cluster_child.py",
        "standalone",
        cluster.url,
        nats_server.url,
        str(tmp_path),
        cwd=tmp_path,
        timeout=CHILD_TIMEOUT,
    )
    (result,) = done.events("done")
    logs = "\n".join(
        [done.transcript(), log_tail(cluster.master_log), log_tail(cluster.worker_log)]
    )

    # The session ran on the cluster (a standalone application, not local-...).
    assert result["master"] == cluster.url, logs
    app_id = result["app_id"]
    assert app_id.startswith("app-"), logs

    # Exact counts, window by window, as computed from nats-py's store times.
    expected = Counter(t - t % WINDOW_US for t in times.values())
    assert len(expected) >= 2, expected  # the bursts span several windows
    assert result["windows"] == {str(k): v for k, v in expected.items()}, logs
    assert result["batch_count"] == result["batch_distinct_seq"] == MESSAGES, logs

    # Three micro-batches of 1000 sequences (maxMessagesPerTrigger), each one's largest event
    # time the largest store time of its sequences, and the watermark of each batch after the
    # first that of the batches before it, less the delay.
    batches = result["batches"]
    assert [n for n in batches if n] == [PER_TRIGGER] * (MESSAGES // PER_TRIGGER), logs
    data = [i for i, n in enumerate(batches) if n]
    highest = 0
    for k, i in enumerate(data):
        ends = range(k * PER_TRIGGER + 1, (k + 1) * PER_TRIGGER + 1)
        batch_max = max(times[s] for s in ends) // 1000
        assert close_ms(result["max_event_times"][i], batch_max), (k, result)
        if k:
            assert close_ms(result["watermarks"][i], highest - WATERMARK_MS), (k, result)
        highest = max(highest, batch_max)

    # The application's executor, launched on our worker, ran the tasks: the micro-batches'
    # reads (two partitions each) and aggregations, and the batch read.
    master_log = log_text(cluster.master_log)
    assert f"Registered app {APP_NAME} with ID {app_id}" in master_log, logs
    assert f"Launching executor {app_id}/0 on worker" in master_log, logs
    (executor_dir,) = (cluster.work_dir / app_id).iterdir()
    executor_log = (executor_dir / "stderr").read_text("utf-8", "replace")
    finished = executor_log.count("INFO Executor: Finished task")
    assert finished >= 3 * 2 + 1, executor_log[-5000:]
    # ... in the executor's Python workers, where the source's read() runs.
    assert "Starting Python task execution" in executor_log, executor_log[-5000:]


async def test_format_through_spark_connect(
    connect_url: str, nats_server: NatsServer, natspy: NatsPyPeer, tmp_path: Path
) -> None:
    """Registered from a Connect client (the data source class travels to the server, whose
    Python workers import headrace_spark): a batch read, an availableNow query into parquet,
    a batch write and an availableNow stream-to-stream copy, every count exact."""
    await load_events(natspy, nats_server.url, ("OUT", "out.>"), ("COPY", "copy.>"))
    done = await run_child(
        "jetstream_cluster_child.py",
        "connect",
        connect_url,
        nats_server.url,
        str(tmp_path),
        cwd=tmp_path,
        timeout=CHILD_TIMEOUT,
    )
    (result,) = done.events("done")
    transcript = done.transcript()
    assert result["connect"] is True, transcript
    assert result["batch_count"] == result["batch_distinct_seq"] == MESSAGES, transcript
    assert sum(result["stream_batches"]) == MESSAGES, transcript
    assert [n for n in result["stream_batches"] if n] == [1000] * 3, transcript
    assert result["parquet"] == {"rows": MESSAGES, "distinct_seq": MESSAGES}, transcript
    assert sum(result["copy_batches"]) == MESSAGES, transcript
    # What was written is in the streams once each: the rows, and the copy of every event.
    assert await stream_messages(natspy, "OUT") == WRITTEN == result["written"]
    written = await read_stream(natspy, "out.>", WRITTEN)
    assert sorted((m.subject, m.data) for m in written) == sorted(
        (f"out.{i % 5}", b"row-%d" % i) for i in range(WRITTEN)
    )
    assert await stream_messages(natspy, "COPY") == MESSAGES
    copied = await read_stream(natspy, "copy.>", MESSAGES)
    assert sorted((m.subject, m.data) for m in copied) == sorted(
        (f"copy.events.{i % 3}", b"e%d" % i) for i in range(MESSAGES)
    )
    assert await stream_messages(natspy, STREAM) == MESSAGES  # read, not consumed
