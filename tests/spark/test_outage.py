"""Spark failing every write for 20 s (four times the consumer's ack wait), then working again,
in a pipeline with a dead letter and two deliveries allowed: an outage is backpressure. Nothing
is terminated or dead-lettered, nothing is delivered again, and every message is in the output
exactly once (read back by Spark).

Spark's Python worker dies on every row while a flag file exists (as on an executor that is
lost): a failure Spark does not call the rows' fault, and that fails every half of a split
batch alike, which is how the pipeline tells an outage from bad records."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.jetstream import ConsumerConfig
from headrace.pipeline import BatchPolicy, SinkRetry
from headrace_spark import SparkSink

from tests.pipeline.pipe_support import (
    FAST,
    add_stream,
    connect,
    fast_pipeline,
    publish,
    source,
    wait_consumer,
)
from tests.spark.spark_support import all_acked

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: How long Spark fails: the point of the test.
OUTAGE = 20.0


def down_while(flag: Path) -> Any:
    """A transform whose Python UDF kills its worker while ``flag`` exists."""

    def transform(df: Any) -> Any:
        from pyspark.sql import functions as F

        path = str(flag)

        def checked(seq):  # no hints: with them pyspark takes it for a pandas UDF
            if os.path.exists(path):
                os._exit(17)  # the worker dies, as on a lost executor
            return seq

        return df.withColumn("checked", F.udf(checked, "long")("stream_seq"))

    return transform


async def test_spark_down_for_twenty_seconds_loses_and_duplicates_nothing(
    spark: Any, nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    n = 200
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    await add_stream(natspy, "DLQ", ["dlq.>"])
    await publish(natspy, n)
    flag = tmp_path / "down"
    flag.touch()
    out = tmp_path / "out"
    sink = SparkSink(out, spark=spark, transform=down_while(flag))
    pipe = fast_pipeline(
        "outage",
        dead_letter="dlq.outage",
        max_deliveries=2,
        sink_retry=SinkRetry(backoff=0.5, backoff_max=4.0),
    )
    spec = source(config=ConsumerConfig(ack_wait=5.0))
    pipe.source(spec).sink(sink, name="lake", batch=BatchPolicy(max_messages=50, max_age=0.2))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await trio.sleep(OUTAGE)  # Spark is down: the time is what is being tested
        stats = run.stats
        assert stats.batches_committed == 0 and stats.retrying == 1, stats
        assert stats.sink_retries >= 3, stats
        flag.unlink()
        info = await wait_consumer(natspy, all_acked(n), timeout=120)
        stats = run.stats
        assert stats.terms == 0 and stats.dead_lettered == 0 and stats.naks == 0, stats
        assert stats.redeliveries == 0 and stats.acks == n, stats
        assert stats.in_progress > 0, "held messages were not kept alive past ack_wait"
    assert info.num_redelivered == 0
    dlq = await natspy.call(natspy.nc.jetstream().stream_info, "DLQ")
    assert dlq.state.messages == 0
    rows = spark.read.parquet(str(out)).select("stream_seq", "checked").collect()
    assert sorted(r["stream_seq"] for r in rows) == list(range(1, n + 1))  # each once
    assert all(r["checked"] == r["stream_seq"] for r in rows)
