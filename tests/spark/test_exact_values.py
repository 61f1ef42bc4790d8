"""A value is written as it is, or its record is rejected: never changed on the way to its column.

pyarrow's typed conversion truncates 1611.5 into an integer column as 1611, turns an int into
microseconds for a timestamp column, a datetime into its date, a float beyond a float32 into
inf. The sink must instead set such a record aside (``RecordsRejected``, naming its column) and
commit the rest; whole-valued floats are exact and written as ints. Checked on the table the
sink builds (both writers write that table) and read back through Spark from both writers.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from headrace.pipeline import RecordsRejected
from headrace_spark import SparkSchemaError, SparkSink, TableBuilder

from tests.sinks.sink_support import batch, rec
from tests.spark.spark_support import read_rows

UTC = dt.UTC
AT = dt.datetime(2026, 11, 26, 12, 30, 15, 123456, tzinfo=UTC)
DAY = dt.date(2026, 11, 26)

#: A value that does not fit its column exactly, and the column: each must be rejected.
UNFIT: list[tuple[Any, pa.DataType]] = [
    (1611.5, pa.int64()),  # a fraction: pyarrow wrote 1611
    (1611.5, pa.int32()),
    (-0.25, pa.int16()),
    (float("nan"), pa.int64()),
    (float("inf"), pa.int64()),
    (2**40, pa.int32()),  # out of the column's range
    (2.0**40, pa.int32()),
    (2**63, pa.int64()),
    (300, pa.int8()),
    ("12", pa.int64()),  # a string into a number
    ("1.5", pa.float64()),
    (True, pa.int64()),  # a bool is not a number here
    (True, pa.float64()),  # pyarrow wrote 1.0
    (decimal.Decimal("2.5"), pa.int64()),  # pyarrow wrote 2
    (decimal.Decimal("1.234"), pa.decimal128(9, 2)),  # more scale than the column
    (decimal.Decimal("12345678.9"), pa.decimal128(9, 2)),  # more precision
    (1.5, pa.decimal128(9, 2)),
    (1e300, pa.float32()),  # pyarrow wrote inf
    (2**24 + 1, pa.float32()),  # not exactly a float32
    (2**53 + 1, pa.float64()),
    (1_700_000_000, pa.timestamp("us", "UTC")),  # pyarrow took it for microseconds
    (1.7e9, pa.timestamp("us", "UTC")),
    (DAY, pa.timestamp("us", "UTC")),
    (AT, pa.date32()),  # pyarrow dropped the time
    (20_000, pa.date32()),  # pyarrow took it for days
    ([1, 2.5], pa.list_(pa.int64())),  # in a list, a map, a struct
    ({"a": 1.5}, pa.map_(pa.string(), pa.int64())),
    ({"a": 1.5}, pa.struct([("a", pa.int32())])),
    ([AT], pa.list_(pa.date32())),
]

#: A value that fits its column exactly, and what the column holds then.
FIT: list[tuple[Any, pa.DataType, Any]] = [
    (1611, pa.int64(), 1611),
    (1611.0, pa.int64(), 1611),  # whole-valued: nothing is lost
    (-3.0, pa.int8(), -3),
    (decimal.Decimal("7.00"), pa.int32(), 7),
    (2**63 - 1, pa.int64(), 2**63 - 1),
    (2, pa.float64(), 2.0),
    (2**53, pa.float64(), 2.0**53),
    (float("nan"), pa.float64(), "nan"),
    (float("inf"), pa.float32(), math.inf),  # inf was inf already
    (0.5, pa.float32(), 0.5),
    (decimal.Decimal("1.5"), pa.decimal128(9, 2), decimal.Decimal("1.50")),
    (AT, pa.timestamp("us", "UTC"), AT),
    (DAY, pa.date32(), DAY),
    ([1, 2.0], pa.list_(pa.int64()), [1, 2]),
    ({"a": 4.0}, pa.map_(pa.string(), pa.int64()), [("a", 4)]),
    ({"a": 4.0}, pa.struct([("a", pa.int32())]), {"a": 4}),
    ("text", pa.string(), "text"),
    (None, pa.int32(), None),
]


def one_column(type_: pa.DataType) -> TableBuilder:
    return TableBuilder(pa.schema([pa.field("v", type_)]))


@pytest.mark.parametrize(("value", "type_"), UNFIT, ids=[f"{v!r}-{t}" for v, t in UNFIT])
def test_a_value_that_does_not_fit_exactly_is_rejected(value: Any, type_: pa.DataType) -> None:
    good, bad = rec(1, {"v": None}), rec(2, {"v": value})
    table, accepted, rejected = one_column(type_).build_accepting([good, bad])
    assert [r.stream_seq for r, _ in rejected] == [2], table.to_pylist()
    ((_, why),) = rejected
    assert isinstance(why, SparkSchemaError) and why.column == "v"
    assert "ORDERS #2" in str(why)
    assert accepted == [good] and table.num_rows == 1


@pytest.mark.parametrize(("value", "type_", "stored"), FIT, ids=[f"{v!r}-{t}" for v, t, _ in FIT])
def test_a_value_that_fits_exactly_is_written_as_it_is(
    value: Any, type_: pa.DataType, stored: Any
) -> None:
    table = one_column(type_).build([rec(1, {"v": value})])
    assert table.schema.field("v").type == type_
    (got,) = table.column("v").to_pylist()
    if stored == "nan":
        assert math.isnan(got)
    else:
        assert got == stored and type(got) is type(stored)


def test_values_that_only_clash_together_are_each_written() -> None:
    # An int beyond a double's exact range beside a whole float: no common inferred type, but
    # each value fits the column, so the batch is written, a value at a time.
    big = 2**60 + 1
    records = [rec(1, {"v": big}), rec(2, {"v": 3.0}), rec(3, {"v": None})]
    table = one_column(pa.int64()).build(records)
    assert table.column("v").to_pylist() == [big, 3, None]


def test_a_pandas_timestamp_keeps_its_nanoseconds_or_is_rejected() -> None:
    pd = pytest.importorskip("pandas")
    micro = pd.Timestamp("2026-11-26 12:00:00.000001", tz="UTC")
    nano = pd.Timestamp("2026-11-26 12:00:00.000001001", tz="UTC")
    builder = one_column(pa.timestamp("us", "UTC"))
    table, _, rejected = builder.build_accepting([rec(1, {"v": micro}), rec(2, {"v": nano})])
    assert table.column("v").to_pylist() == [micro.to_pydatetime()]
    assert [r.stream_seq for r, _ in rejected] == [2]
    assert "nanoseconds" in str(rejected[0][1])


ORDER = pa.schema(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        pa.field("qty", pa.int32()),
        pa.field("amount", pa.float32()),
        pa.field("price", pa.decimal128(9, 2)),
        pa.field("placed_at", pa.timestamp("us", "UTC")),
        pa.field("day", pa.date32()),
        pa.field("tags", pa.list_(pa.int64())),
    ]
)


def order(seq: int, **changes: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "order_id": seq,
        "qty": seq,
        "amount": 0.5,
        "price": decimal.Decimal("9.99"),
        "placed_at": AT,
        "day": DAY,
        "tags": [seq],
    }
    value.update(changes)
    return value


#: Records of one batch that do not fit ORDER, each by one value (its column).
BAD = {
    3: ("qty", 1611.5),
    4: ("qty", 2**40),
    5: ("qty", float("nan")),
    6: ("order_id", "12"),
    7: ("price", decimal.Decimal("1.234")),
    8: ("placed_at", 1_700_000_000),
    9: ("day", AT),
    10: ("amount", 1e300),
    11: ("tags", [1, 2.5]),
}


@pytest.mark.spark
@pytest.mark.parametrize("writer", ["spark", "arrow"])
async def test_the_sink_rejects_what_does_not_fit_and_writes_the_rest_exactly(
    spark: Any, tmp_path: Path, writer: str
) -> None:
    records = [
        rec(1, order(1, qty=1611.0, tags=[7.0, 8])),  # whole floats: written as ints
        rec(2, order(2, qty=None, amount=float("inf"))),
        *(rec(seq, order(seq, **{column: value})) for seq, (column, value) in BAD.items()),
    ]
    out = tmp_path / "out"
    sink = SparkSink(out, spark=spark, schema=ORDER, writer=writer)
    await sink.open()
    with pytest.raises(RecordsRejected) as caught:
        await sink.write_batch(batch(*records))
    await sink.close()

    rejected = {r.stream_seq: why for r, why in caught.value.rejected}
    assert sorted(rejected) == sorted(BAD)
    for seq, (column, value) in BAD.items():
        why = rejected[seq]
        assert isinstance(why, SparkSchemaError) and why.column == column, (seq, why)
        assert repr(value) in str(why), (seq, why)
    assert sink.rows_written == 2 and sink.records_rejected == len(BAD)

    rows = sorted(read_rows(spark, out), key=lambda r: r["order_id"])
    assert [r["order_id"] for r in rows] == [1, 2]
    first, second = rows
    assert first["qty"] == 1611 and first["tags"] == [7, 8]
    assert first["price"] == decimal.Decimal("9.99") and first["amount"] == 0.5
    assert first["placed_at"] == AT.replace(tzinfo=None)  # Spark: UTC wall time, naive
    assert first["day"] == DAY
    assert second["qty"] is None and second["amount"] == math.inf
