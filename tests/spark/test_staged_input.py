"""The Spark writer's staged input (staged_input.py): a batch's table read by Spark from a
parquet file Arrow wrote must be the DataFrame ``createDataFrame(table)`` makes, the path is
taken only for types where that holds, and no input file outlives its write."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from headrace_spark import SparkSink, SparkSinkError
from headrace_spark.staged_input import INPUT, remove_stale_inputs, stageable, staged_frame

from tests.sinks.sink_support import seqs

pytestmark = pytest.mark.spark

AT = dt.datetime(2026, 11, 26, 12, 30, 15, 123456, tzinfo=dt.UTC)

#: Every type the staged path takes, with a null in each column.
COLUMNS: dict[str, tuple[pa.DataType, list[Any]]] = {
    "s": (pa.string(), ["a", "é", None]),
    "ls": (pa.large_string(), ["x", None, ""]),
    "b": (pa.binary(), [b"\x00\xff", b"", None]),
    "i8": (pa.int8(), [-128, 127, None]),
    "i16": (pa.int16(), [-32768, 1, None]),
    "i32": (pa.int32(), [2**31 - 1, 0, None]),
    "i64": (pa.int64(), [2**63 - 1, -(2**63), None]),
    "f32": (pa.float32(), [1.5, float("inf"), None]),
    "f64": (pa.float64(), [0.1, float("-inf"), None]),
    "flag": (pa.bool_(), [True, False, None]),
    "day": (pa.date32(), [dt.date(1970, 1, 1), dt.date(2026, 11, 26), None]),
    "money": (pa.decimal128(9, 2), [decimal.Decimal("1.25"), decimal.Decimal("-0.01"), None]),
    "at": (pa.timestamp("us", "UTC"), [AT, dt.datetime(1969, 12, 31, tzinfo=dt.UTC), None]),
    "at_ny": (pa.timestamp("ms", "America/New_York"), [AT, None, AT]),
    "tags": (pa.list_(pa.string()), [["a", None], [], None]),
    "headers": (pa.map_(pa.string(), pa.list_(pa.string())), [[("k", ["v", "w"])], [], None]),
    "pair": (
        pa.struct([("n", pa.int64()), ("t", pa.timestamp("us", "UTC"))]),
        [{"n": 1, "t": AT}, {"n": None, "t": None}, None],
    ),
}


def table_of(columns: dict[str, tuple[pa.DataType, list[Any]]]) -> pa.Table:
    return pa.table({name: pa.array(values, type) for name, (type, values) in columns.items()})


def test_stageable_types() -> None:
    assert stageable(table_of(COLUMNS).schema)
    for unsafe in (
        pa.timestamp("us"),  # naive: Spark would read it back as local-time TIMESTAMP_NTZ
        pa.list_(pa.timestamp("us")),
        pa.struct([("t", pa.timestamp("ns"))]),
        pa.uint32(),
        pa.float16(),
        pa.time64("us"),
        pa.duration("s"),
        pa.dictionary(pa.int32(), pa.string()),
        pa.null(),
    ):
        assert not stageable(pa.schema([("ok", pa.int64()), ("x", unsafe)])), unsafe
    assert not stageable(pa.schema([]))


def test_the_staged_frame_is_the_created_frame(spark: Any, tmp_path: Path) -> None:
    table = table_of(COLUMNS)
    created = spark.createDataFrame(table)
    with staged_frame(spark, table, tmp_path, "attempt") as staged:
        assert [(f.name, f.dataType) for f in staged.schema] == [
            (f.name, f.dataType) for f in created.schema
        ]
        assert staged.collect() == created.collect()
        assert (tmp_path / INPUT / "attempt.parquet").exists()
    assert not (tmp_path / INPUT / "attempt.parquet").exists()


async def test_the_sink_leaves_no_input_and_removes_stale_ones(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = SparkSink(out, spark=spark, stale_after=60, staged_input=True)
    await sink.open()
    inputs = out / "_headrace" / INPUT
    await sink.write_batch(seqs(1, 2, 3))
    assert inputs.is_dir() and list(inputs.iterdir()) == []  # the path was taken, and cleaned
    stale, fresh = inputs / "killed.parquet", inputs / "running.parquet"
    stale.write_bytes(b"left by a killed process")
    fresh.write_bytes(b"another worker's, being read")
    an_hour_ago = time.time() - 3600
    os.utime(stale, (an_hour_ago, an_hour_ago))
    await sink.write_batch(seqs(4, 5))
    assert sorted(p.name for p in inputs.iterdir()) == ["running.parquet"]
    await sink.close()
    rows = spark.read.parquet(str(out)).select("stream_seq").collect()
    assert sorted(r[0] for r in rows) == [1, 2, 3, 4, 5]


def test_remove_stale_inputs_without_a_directory(tmp_path: Path) -> None:
    assert remove_stale_inputs(tmp_path, 1.0) == 0


async def test_off_by_default_and_only_for_the_spark_writer(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = SparkSink(out, spark=spark)
    await sink.open()
    await sink.write_batch(seqs(1, 2))
    await sink.close()
    assert not (out / "_headrace" / INPUT).exists()  # createDataFrame: nothing staged
    with pytest.raises(SparkSinkError, match="staged_input"):
        SparkSink(tmp_path / "other", writer="arrow", staged_input=True)
