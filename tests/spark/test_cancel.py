"""Cancelling a Spark sink's write (the pipeline stopping hard) interrupts the batch's Spark job:
the cancelled call returns at once, the job is gone from Spark shortly after, nothing is
committed, and the next open and write work. The Spark job is made slow by a Python UDF that
sleeps per row; the tests wait on Spark's status tracker, not on the clock."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.jetstream import ConsumerConfig
from headrace.pipeline import BatchPolicy
from headrace_spark import SparkSink

from tests.pipeline.pipe_support import (
    FAST,
    add_stream,
    connect,
    consumer_info,
    fast_pipeline,
    publish,
    source,
    wait_consumer,
)
from tests.sinks.sink_support import seqs
from tests.spark.spark_support import (
    all_acked,
    commit_state,
    data_files,
    hidden_files,
    ledger_entries,
    staged,
)

pytestmark = pytest.mark.spark


async def wait_for_active_jobs(spark: Any, timeout: float = 60) -> list[int]:
    """The ids of Spark jobs that became active after the call (the batch's)."""
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getActiveJobsIds())
    with trio.fail_after(timeout):
        # polled: Spark has no event a test could wait on
        while not (jobs := sorted(set(tracker.getActiveJobsIds()) - before)):  # noqa: ASYNC110
            await trio.sleep(0.05)
    return jobs


async def wait_for_jobs_gone(spark: Any, jobs: list[int], timeout: float) -> None:
    """Until none of ``jobs`` is active, nor any stage (a cancelled job's tasks may take a
    moment longer to be killed)."""
    tracker = spark.sparkContext.statusTracker()
    with trio.fail_after(timeout):
        while set(jobs) & set(tracker.getActiveJobsIds()):  # noqa: ASYNC110
            await trio.sleep(0.05)
        stages = {s for job in jobs if (info := tracker.getJobInfo(job)) for s in info.stageIds}
        while stages & set(tracker.getActiveStageIds()):  # noqa: ASYNC110
            await trio.sleep(0.05)
    assert all(tracker.getJobInfo(job).status == "FAILED" for job in jobs)  # cancelled


def slow_transform(state: dict[str, float]) -> Any:
    """A transform adding ``doubled`` through a Python UDF that sleeps ``state['delay']`` per
    row: the Spark job is slow, not the test."""

    def transform(df: Any) -> Any:
        from pyspark.sql import functions as F

        delay = state["delay"]

        def doubled(seq):  # no hints: with them pyspark takes it for a pandas UDF
            time.sleep(delay)
            return seq * 2

        return df.withColumn("doubled", F.udf(doubled, "long")("stream_seq"))

    return transform


async def test_cancelling_a_write_interrupts_its_spark_job(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    state = {"delay": 1.5}  # 20 rows in one task: 30 s if nothing interrupts it
    sink = SparkSink(out, spark=spark, transform=slow_transform(state))
    await sink.open()
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sink.write_batch, seqs(*range(1, 21)))
            jobs = await wait_for_active_jobs(spark)
            cancelled_at = time.monotonic()
            scope.cancel()
    assert time.monotonic() - cancelled_at < 2  # write_batch returned at once
    # the job is interrupted, well before its 30 s of UDF
    await wait_for_jobs_gone(spark, jobs, timeout=10)
    assert time.monotonic() - cancelled_at < 12
    await sink.close()  # waits for the abandoned attempt to let go
    assert data_files(out) == []
    assert hidden_files(out) == []
    assert ledger_entries(out) == []
    assert sink.batches_committed == 0
    # (staging may still hold what a killed task wrote after the attempt was given up: it is
    # never read, and the next open clears it)

    state["delay"] = 0.0
    await sink.open()
    assert sink.recovered_removed == 0
    assert list((out / "_headrace" / "staging").iterdir()) == []
    await sink.write_batch(seqs(*range(1, 21), delivered=2))
    assert sink.duplicates_skipped == 0
    await sink.close()
    rows = spark.read.parquet(str(out)).select("stream_seq", "doubled").collect()
    assert sorted((r[0], r[1]) for r in rows) == [(n, 2 * n) for n in range(1, 21)]


async def test_stopping_a_pipeline_interrupts_the_spark_job(
    spark: Any, nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    n = 10
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    await publish(natspy, n)
    out = tmp_path / "out"
    state = {"delay": 3.0}  # 10 rows in one task: 30 s if nothing interrupts it
    sink = SparkSink(out, spark=spark, transform=slow_transform(state))
    # a short ack_wait, so that the second run gets the messages the first one dropped soon
    spec = source(config=ConsumerConfig(ack_wait=2))
    batches = BatchPolicy(max_messages=n, max_age=0.1)

    # The same pipeline twice (the output is shared by the pipeline's workers: its runs)
    slow = fast_pipeline("lake")
    slow.source(spec).sink(sink, name="lake", batch=batches)
    async with connect(nats_server.url, **FAST) as nc:
        async with slow.running(nc) as run:
            jobs = await wait_for_active_jobs(spark)
            stopped_at = time.monotonic()
            run.stop()
        # the pipeline is down once the sink closed, which waits for the abandoned attempt
        # to let go of the output: that is, for the job's interruption
        assert time.monotonic() - stopped_at < 10
        assert run.stopped_hard
        await wait_for_jobs_gone(spark, jobs, timeout=10)
        assert run.stats.batches_committed == 0 and run.stats.acks == 0
        assert data_files(out) == [] and hidden_files(out) == []
        state = await commit_state(natspy, out)
        assert state["commits"] == 0 and state["unpublished"] == {}, state
        info = await consumer_info(natspy)
        assert info.ack_floor.stream_seq == 0  # neither acked nor naked: owed again

        state["delay"] = 0.0
        fast = fast_pipeline("lake")
        fast.source(spec).sink(sink, name="lake", batch=batches)
        async with fast.running(nc) as run:
            info = await wait_consumer(natspy, all_acked(n), timeout=60)
            assert run.stats.acks == n
        state = await commit_state(natspy, out)
        assert state["commits"] == 1 and state["streams"]["S"]["floor"] == n, state
        # The interrupted attempt is garbage in staging until it is stale; never published.
        assert len(staged(out)) <= 1
    rows = spark.read.parquet(str(out)).select("stream_seq", "doubled", "num_delivered").collect()
    assert sorted((r[0], r[1]) for r in rows) == [(s, 2 * s) for s in range(1, n + 1)]
    assert {r[2] for r in rows} == {2}
