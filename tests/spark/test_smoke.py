"""The shared session works and the sink's quiet defaults are in force."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from headrace_spark.session import ARROW_LOCAL_RELATION_THRESHOLD

pytestmark = pytest.mark.spark


def test_session_is_utc_and_local(spark: Any) -> None:
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.sparkContext.master == "local[2]"
    assert spark.range(10).count() == 10


def _plan_of(df: Any) -> str:
    return str(df._jdf.queryExecution().logical().getClass().getSimpleName())


def test_an_arrow_batch_is_converted_in_the_task_not_kept_in_the_plan(spark: Any) -> None:
    """With Spark's default threshold, a batch under 48 MiB becomes a LocalRelation: its rows
    sit in the driver's plan, walked by every optimizer rule and Java-serialized into the task
    (twice the JVM's CPU per batch, measured). The embedded session streams it instead."""
    table = pa.table({"stream_seq": pa.array(range(1000), pa.int64())})
    assert _plan_of(spark.createDataFrame(table)) == "LogicalRDD"
    before = spark.conf.get(ARROW_LOCAL_RELATION_THRESHOLD)
    try:
        spark.conf.set(ARROW_LOCAL_RELATION_THRESHOLD, "48MB")  # Spark's own default
        assert _plan_of(spark.createDataFrame(table)) == "LocalRelation"
    finally:
        spark.conf.set(ARROW_LOCAL_RELATION_THRESHOLD, before)
    assert spark.createDataFrame(table).count() == 1000
