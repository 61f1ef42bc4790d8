"""A Spark sink in a pipeline on a real nats-server: a failed Spark job fails the batch (naked,
reported as a SparkWriteError), its messages come again, and in the end every message is in the
output exactly once and acked (as nats-py, the independent peer, sees the consumer); a record
that does not fit the schema fails alone and is terminated, its batch committed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs
import pytest
from headrace.pipeline import BatchPolicy, Record, RecordsRejected
from headrace.pipeline.ack_tracker import PoisonTerminated
from headrace_spark import SparkSchemaError, SparkSink, SparkWriteError

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

pytestmark = pytest.mark.spark


def fail_once(flag: Path) -> Any:
    """A transform adding ``checked`` through a Python UDF whose worker dies while ``flag``
    exists, removing it: the first Spark job fails as a lost executor fails it, every later one
    works. A file, since the UDF runs in Spark's Python workers, not in this process. (A UDF
    that raises would say the rows are bad: the sink would split the batch at once.)"""

    def transform(df: Any) -> Any:
        from pyspark.sql import functions as F

        path = str(flag)

        def checked(seq):  # no hints: with them pyspark takes it for a pandas UDF
            try:
                os.remove(path)
            except FileNotFoundError:
                return seq
            os._exit(17)  # the worker dies, as in a lost executor

        return df.withColumn("checked", F.udf(checked, "long")("stream_seq"))

    return transform


async def test_a_failed_spark_job_is_written_again_and_its_messages_once(
    spark: Any, nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    n = 30
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    await publish(natspy, n, headers=lambda i: {"X-Index": str(i)})
    flag = tmp_path / "fail-once"
    flag.touch()
    out = tmp_path / "out"
    sink = SparkSink(out, spark=spark, transform=fail_once(flag))
    pipe = fast_pipeline("lake")
    pipe.source(source()).sink(sink, name="lake", batch=BatchPolicy(max_messages=10, max_age=0.2))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        info = await wait_consumer(natspy, all_acked(n), timeout=60)
        stats = run.stats
        assert stats.batches_failed == 1 and stats.sink_retries == 1
        assert stats.naks == 0 and stats.redeliveries == 0  # written again, not naked
        assert stats.acks == n
        assert [e.stage for e in run.errors] == ["lake"]
        error = run.errors[0].error
        assert isinstance(error, SparkWriteError)
        assert str(error).startswith("Spark could not write batch S-")
        assert str(out) in str(error)
        assert "exited unexpectedly" in str(error)
        assert error.transient is None  # not the records' fault, nor surely an outage
        assert error.__cause__ is not None  # Spark's own error
    assert not flag.exists()
    assert info.num_redelivered == 0
    assert info.delivered.stream_seq == n

    df = spark.read.parquet(str(out))
    rows = df.select("stream_seq", "checked", "num_delivered", "headers", "data").collect()
    assert sorted(r["stream_seq"] for r in rows) == list(range(1, n + 1))  # none twice
    assert all(r["checked"] == r["stream_seq"] for r in rows)
    assert {r["num_delivered"] for r in rows} == {1}  # every message delivered once
    by_seq = {r["stream_seq"]: r for r in rows}
    assert by_seq[7]["headers"] == {"X-Index": ["6"]}
    assert bytes(by_seq[7]["data"]) == b"6"


@attrs.frozen
class Item:
    sku: str
    qty: int


def decode_item(record: Record) -> Any:
    return json.loads(record.data)


async def test_a_poison_record_fails_alone_and_is_terminated(
    spark: Any, nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    n, poison = 10, 4  # the fourth message's qty is not a number
    await natspy.connect(nats_server.url)
    await add_stream(natspy)

    def payload(i: int) -> bytes:
        qty: Any = "four" if i + 1 == poison else i
        return json.dumps({"sku": f"s{i + 1}", "qty": qty}).encode()

    await publish(natspy, n, data=payload)
    out = tmp_path / "out"
    sink = SparkSink(out, spark=spark, schema=Item, decode=decode_item, keep_metadata=True)
    pipe = fast_pipeline("items", max_deliveries=2)
    pipe.source(source()).sink(sink, name="lake", batch=BatchPolicy(max_messages=n, max_age=0.2))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        info = await wait_consumer(natspy, all_acked(n), timeout=60)
        stats = run.stats
        assert stats.acks == n - 1
        assert stats.terms == 1  # after its second delivery (max_deliveries=2)
        assert stats.naks == 1
        first, *later = [e.error for e in run.errors]
        assert isinstance(first, RecordsRejected)  # the batch of ten: nine committed
        ((record, why),) = first.rejected
        assert record.stream_seq == poison
        assert isinstance(why, SparkSchemaError) and why.column == "qty"
        assert f"S #{poison}" in str(first) and "'four'" in str(first)
        # alone in its batch when it came again: rejected again, then terminated (and said:
        # no dead letter keeps it)
        assert [type(e) for e in later] == [RecordsRejected, PoisonTerminated]
        assert stats.terminated_unkept == 1
        assert stats.batches_failed == 0
    assert info.num_redelivered == 0
    rows = spark.read.parquet(str(out)).select("sku", "qty", "stream_seq").collect()
    assert sorted(r["stream_seq"] for r in rows) == [s for s in range(1, n + 1) if s != poison]
    assert all(r["sku"] == f"s{r['stream_seq']}" for r in rows)
