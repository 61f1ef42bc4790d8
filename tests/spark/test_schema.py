"""What the Spark sink writes: the default metadata columns, declared schemas (attrs classes,
pyarrow schemas, ``decode``, ``keep_metadata``), records that do not fit them, and
``partition_by``. Everything is read back with Spark's own parquet reader."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import attrs
import pyarrow as pa
import pytest
from headrace.jetstream.message import JsMsg
from headrace.pipeline import RecordsRejected, SinkNotOpen
from headrace.pipeline.record import Delivery, Record
from headrace.protocol.events import Msg
from headrace.protocol.headers import Headers
from headrace_spark import CommitInfo, SparkSchemaError, SparkSink

from tests.sinks.sink_support import TS, batch, rec
from tests.spark.spark_support import data_files, ledger_entries, read_rows, stream_seqs

pytestmark = pytest.mark.spark


def raw_rec(
    seq: int,
    data: bytes,
    *,
    stream: str = "ORDERS",
    subject: str = "orders.new",
    headers: Headers | None = None,
    delivered: int = 1,
    consumer_seq: int | None = None,
    ts: int = TS,
) -> Record:
    """A record of a message with exactly ``data`` (its value: the data)."""
    cseq = seq if consumer_seq is None else consumer_seq
    reply = f"$JS.ACK.{stream}.c.{delivered}.{seq}.{cseq}.{ts}.0"
    raw = headers.encode() if headers is not None else None
    msg = JsMsg(Msg(subject, 1, reply, data, raw), conn=None)  # type: ignore[arg-type]
    return Record(data, Delivery(msg, 0.0, "src"))


def spark_types(spark: Any, out: Path) -> dict[str, str]:
    df = spark.read.parquet(str(out))
    return {f.name: f.dataType.simpleString() for f in df.schema.fields}


# -- the default columns ---------------------------------------------------------------------


async def test_default_columns_round_trip(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    headers = Headers([("Trace", "a"), ("Trace", "b"), ("Nats-Msg-Id", "m-1")])
    binary = bytes(range(256))  # not UTF-8, NUL bytes included
    records = [
        raw_rec(1, binary, headers=headers, delivered=3, consumer_seq=17),
        # a nanosecond part of 999: a cut gives ...456, rounding would give ...457
        raw_rec(2, b"", subject="orders.old", ts=1_700_000_000_123_456_999),
        raw_rec(7, b"{}", stream="RETURNS", subject="returns.x", ts=TS + 5_000_000_000),
    ]
    sink = SparkSink(out, spark=spark)
    await sink.open()
    await sink.write_batch(batch(*records))
    await sink.close()

    df = spark.read.parquet(str(out))
    assert df.columns == [
        "subject",
        "data",
        "headers",
        "stream",
        "stream_seq",
        "consumer_seq",
        "num_delivered",
        "timestamp",
    ]
    assert spark_types(spark, out) == {
        "subject": "string",
        "data": "binary",
        "headers": "map<string,array<string>>",
        "stream": "string",
        "stream_seq": "bigint",
        "consumer_seq": "bigint",
        "num_delivered": "int",
        "timestamp": "timestamp",  # with a time zone (UTC), not timestamp_ntz
    }
    rows = {(r["stream"], r["stream_seq"]): r for r in read_rows(spark, out)}
    assert sorted(rows) == [("ORDERS", 1), ("ORDERS", 2), ("RETURNS", 7)]
    first = rows["ORDERS", 1]
    assert first["subject"] == "orders.new"
    assert bytes(first["data"]) == binary
    assert first["headers"] == {"Trace": ["a", "b"], "Nats-Msg-Id": ["m-1"]}
    assert first["consumer_seq"] == 17
    assert first["num_delivered"] == 3
    second = rows["ORDERS", 2]
    assert second["subject"] == "orders.old"
    assert bytes(second["data"]) == b""
    assert second["headers"] == {}  # no headers: an empty map, not null
    assert second["consumer_seq"] == 2
    assert rows["RETURNS", 7]["subject"] == "returns.x"

    # Timestamps: the exact microseconds, in UTC, whatever the Python process's time zone.
    stamps = {
        r["stream_seq"]: (r["micros"], r["text"])
        for r in df.selectExpr(
            "stream_seq",
            "unix_micros(timestamp) AS micros",
            "date_format(timestamp, 'yyyy-MM-dd HH:mm:ss.SSSSSS') AS text",
        ).collect()
    }
    assert stamps == {
        1: (TS // 1000, "2023-11-14 22:13:20.123456"),
        2: (1_700_000_000_123_456, "2023-11-14 22:13:20.123456"),
        7: (TS // 1000 + 5_000_000, "2023-11-14 22:13:25.123456"),
    }


async def test_metadata_prefix_without_a_schema_renames_the_default_columns(
    spark: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    sink = SparkSink(out, spark=spark, metadata_prefix="nats_")
    await sink.open()
    await sink.write_batch(batch(rec(1), rec(2)))
    await sink.close()
    df = spark.read.parquet(str(out))
    assert df.columns[:2] == ["nats_subject", "nats_data"]
    assert sorted(r["nats_stream_seq"] for r in df.collect()) == [1, 2]


def dictionary_encoded(out: Path) -> dict[str, bool]:
    """Per top-level column of the written files, whether any chunk has a dictionary page."""
    import pyarrow.parquet as pq

    found: dict[str, bool] = {}
    for name in data_files(out):
        meta = pq.ParquetFile(out / name).metadata
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                chunk = meta.row_group(g).column(c)
                top = chunk.path_in_schema.split(".")[0]
                found[top] = found.get(top, False) or chunk.has_dictionary_page
    return found


@pytest.mark.parametrize("prefix", ["", "nats_"])
async def test_the_sequences_and_timestamp_are_written_without_a_dictionary(
    spark: Any, tmp_path: Path, prefix: str
) -> None:
    """Their values never repeat: a dictionary only costs the writer and grows the file. The
    columns whose values do repeat keep Spark's default."""
    out = tmp_path / "out"
    sink = SparkSink(out, spark=spark, metadata_prefix=prefix)
    await sink.open()
    await sink.write_batch(batch(*(rec(seq, ts=TS + seq * 1000) for seq in range(1, 201))))
    await sink.close()
    encoded = dictionary_encoded(out)
    assert len(encoded) == 8
    for name in ("stream_seq", "consumer_seq", "timestamp"):
        assert encoded[prefix + name] is False, name
    for name in ("subject", "stream", "num_delivered"):
        assert encoded[prefix + name] is True, name
    assert sorted(r[prefix + "stream_seq"] for r in read_rows(spark, out)) == list(range(1, 201))


async def test_a_transform_that_drops_a_sequence_column_still_writes(
    spark: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    sink = SparkSink(out, spark=spark, transform=lambda df: df.drop("consumer_seq", "timestamp"))
    await sink.open()
    await sink.write_batch(batch(rec(1), rec(2)))
    await sink.close()
    assert "consumer_seq" not in dictionary_encoded(out)
    assert sorted(r["stream_seq"] for r in read_rows(spark, out)) == [1, 2]


# -- declared schemas --------------------------------------------------------------------------


@attrs.frozen
class Order:
    id: int
    customer: str
    total: float
    paid: bool
    tags: list[str]
    extra: dict[str, int]
    note: str | None = None
    at: dt.datetime | None = None
    raw: bytes | None = None


ORDER_TYPES = {
    "id": "bigint",
    "customer": "string",
    "total": "double",
    "paid": "boolean",
    "tags": "array<string>",
    "extra": "map<string,bigint>",
    "note": "string",
    "at": "timestamp",
    "raw": "binary",
}


async def test_an_attrs_schema_takes_attrs_instances_and_dicts(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = SparkSink(out, spark=spark, schema=Order)
    await sink.open()
    at = dt.datetime(2026, 11, 25, 12, 0, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    first = Order(1, "ann", 9.5, True, ["a", "b"], {"x": 1}, "rush", at, b"\x00\xff")
    second = {"id": 2, "customer": "bob", "total": 0.25, "paid": False, "tags": [], "extra": {}}
    await sink.write_batch(batch(rec(1, first), rec(2, second)))
    await sink.close()
    assert spark_types(spark, out) == ORDER_TYPES
    df = spark.read.parquet(str(out))
    rows = sorted(
        (r.asDict(recursive=True) for r in df.drop("at", "raw").collect()), key=lambda r: r["id"]
    )
    assert rows == [
        {"id": 1, "customer": "ann", "total": 9.5, "paid": True, "tags": ["a", "b"],
         "extra": {"x": 1}, "note": "rush"},
        {"id": 2, "customer": "bob", "total": 0.25, "paid": False, "tags": [], "extra": {},
         "note": None},
    ]  # fmt: skip
    # an aware datetime is stored as its instant (10:00 UTC); a missing one as null
    extra = df.selectExpr(
        "id", "unix_micros(at) AS micros", "date_format(at, 'HH:mm:ss.SSSSSS') AS text", "raw"
    ).collect()
    assert sorted((r[0], r[1], r[2], r[3] and bytes(r[3])) for r in extra) == [
        (1, int(at.timestamp()) * 1_000_000 + 123456, "10:00:00.123456", b"\x00\xff"),
        (2, None, None, None),
    ]


async def test_a_pyarrow_schema_with_decode_and_prefixed_metadata(
    spark: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    schema = pa.schema(
        [
            pa.field("sku", pa.string(), nullable=False),
            pa.field("qty", pa.int32()),
            pa.field("day", pa.date32()),
        ]
    )
    decoded: list[int] = []

    def decode(record: Record) -> dict[str, Any]:
        decoded.append(record.stream_seq)
        value = json.loads(record.data)
        value["day"] = value["day"] and dt.date.fromisoformat(value["day"])
        return value

    sink = SparkSink(
        out, spark=spark, schema=schema, decode=decode, keep_metadata=True, metadata_prefix="_n_"
    )
    payloads = [
        {"sku": "a-1", "qty": 3, "day": "2026-11-25"},
        {"sku": "b-2", "qty": None, "day": None},
    ]
    # decode reads the payload; the records' values (the raw bytes) would not fit the schema
    records = [
        raw_rec(i, json.dumps(p).encode(), subject=f"orders.{i}") for i, p in enumerate(payloads, 1)
    ]
    await sink.open()
    await sink.write_batch(batch(*records))
    await sink.close()
    assert decoded == [1, 2]
    df = spark.read.parquet(str(out))
    assert df.columns == [
        "sku",
        "qty",
        "day",
        "_n_subject",
        "_n_data",
        "_n_headers",
        "_n_stream",
        "_n_stream_seq",
        "_n_consumer_seq",
        "_n_num_delivered",
        "_n_timestamp",
    ]
    types = spark_types(spark, out)
    assert (types["qty"], types["day"], types["_n_stream_seq"]) == ("int", "date", "bigint")
    rows = sorted(read_rows(spark, out), key=lambda r: r["_n_stream_seq"])
    assert [(r["sku"], r["qty"], r["day"]) for r in rows] == [
        ("a-1", 3, dt.date(2026, 11, 25)),
        ("b-2", None, None),
    ]
    assert [r["_n_subject"] for r in rows] == ["orders.1", "orders.2"]
    assert [json.loads(bytes(r["_n_data"])) for r in rows] == payloads


# -- records that do not fit -------------------------------------------------------------------


@attrs.frozen
class Line:
    sku: str
    qty: int
    note: str | None = None


def committed_state(out: Path) -> tuple[list[str], list[str]]:
    """The ledger's entries and the visible data files: what a failed batch must not change."""
    return ledger_entries(out), data_files(out)


async def _failing_batch(sink: SparkSink, out: Path, *records: Record) -> SparkSchemaError:
    """Write a batch of one record that does not fit: it is rejected, nothing committed."""
    before = committed_state(out)
    with pytest.raises(RecordsRejected) as caught:
        await sink.write_batch(batch(*records))
    assert committed_state(out) == before
    assert list((out / "_headrace" / "staging").iterdir()) == []
    ((record, error),) = caught.value.rejected
    assert record is records[0]
    assert isinstance(error, SparkSchemaError)
    return error


GOOD = {"sku": "s", "qty": 1}


async def test_a_record_that_does_not_fit_is_rejected_and_named(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = SparkSink(out, spark=spark, schema=Line)
    await sink.open()

    wrong = await _failing_batch(sink, out, rec(2, {"sku": "s", "qty": "seven"}))
    assert wrong.column == "qty"
    assert "'qty'" in str(wrong) and "ORDERS #2" in str(wrong) and "'seven'" in str(wrong)

    missing = await _failing_batch(sink, out, rec(3, {"sku": "s"}))
    assert missing.column == "qty"
    assert "not nullable" in str(missing) and "ORDERS #3" in str(missing)

    not_a_record = await _failing_batch(sink, out, rec(2, b"raw bytes"))
    assert "ORDERS #2" in str(not_a_record) and "bytes" in str(not_a_record)

    overflow = await _failing_batch(sink, out, rec(4, {"sku": "s", "qty": 2**70}))
    assert overflow.column == "qty" and "ORDERS #4" in str(overflow)

    assert (sink.batches_committed, sink.records_rejected) == (0, 4)
    assert ledger_entries(out) == []
    # the same sequences, now well-formed: nothing of the failures blocks them
    await sink.write_batch(batch(rec(2, {"sku": "t", "qty": 2}), rec(3, GOOD), rec(4, GOOD)))
    await sink.close()
    assert sorted((r["sku"], r["qty"], r["note"]) for r in read_rows(spark, out)) == [
        ("s", 1, None),
        ("s", 1, None),
        ("t", 2, None),
    ]
    assert sink.batches_committed == 1
    assert len(ledger_entries(out)) == 1


async def test_records_that_do_not_fit_are_rejected_and_the_rest_committed(
    spark: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    commits: list[CommitInfo] = []
    sink = SparkSink(out, spark=spark, schema=Line, keep_metadata=True, on_commit=commits.append)
    await sink.open()
    bad_type, bad_missing = rec(2, {"sku": "s", "qty": "seven"}), rec(4, {"sku": "s"})
    with pytest.raises(RecordsRejected) as caught:
        await sink.write_batch(batch(rec(1, GOOD), bad_type, rec(3, GOOD), bad_missing))
    rejected = caught.value.rejected
    assert [r for r, _ in rejected] == [bad_type, bad_missing]
    (_, wrong), (_, missing) = rejected
    assert isinstance(wrong, SparkSchemaError) and isinstance(missing, SparkSchemaError)
    assert wrong.column == "qty" and "ORDERS #2" in str(wrong) and "'seven'" in str(wrong)
    assert missing.column == "qty" and "ORDERS #4" in str(missing)
    assert "ORDERS #2" in str(caught.value)  # the error the pipeline reports names one

    # the good records are committed, and said to be
    (info,) = commits
    assert (info.batch, info.rows, info.skipped, info.rejected) == ("ORDERS-1-3", 2, 0, 2)
    assert (sink.batches_committed, sink.rows_written, sink.records_rejected) == (1, 2, 2)
    assert stream_seqs(spark, out) == [1, 3]

    # Redelivered (fixed upstream, say): the rejected ones are written, the others skipped.
    await sink.write_batch(batch(*(rec(n, GOOD, delivered=2) for n in (1, 2, 3, 4))))
    assert sink.duplicates_skipped == 2
    assert commits[-1].batch == "ORDERS-2-4"
    await sink.close()
    assert stream_seqs(spark, out) == [1, 2, 3, 4]


async def test_a_batch_of_only_bad_records_commits_nothing(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = SparkSink(out, spark=spark, schema=Line)
    await sink.open()
    with pytest.raises(RecordsRejected) as caught:
        await sink.write_batch(batch(rec(1, {"qty": 1}), rec(2, "text")))
    assert [r.stream_seq for r, _ in caught.value.rejected] == [1, 2]
    assert ledger_entries(out) == [] and data_files(out) == []
    assert sink.batches_committed == 0
    await sink.close()


async def test_the_records_of_one_message_stand_or_fall_together(
    spark: Any, tmp_path: Path
) -> None:
    """A message whose one record (of several, a flat_map's) does not fit is rejected whole:
    it comes again, and its records written now would then be skipped with the bad one."""
    out = tmp_path / "out"
    sink = SparkSink(out, spark=spark, schema=Line, keep_metadata=True)
    await sink.open()
    first = rec(5, {"sku": "a", "qty": 1})
    sibling = first.derive({"sku": "b", "qty": "x"})
    with pytest.raises(RecordsRejected) as caught:
        await sink.write_batch(batch(rec(4, GOOD), first, sibling, rec(6, GOOD)))
    assert {id(r) for r, _ in caught.value.rejected} == {id(first), id(sibling)}
    assert any("another record of its message" in str(e) for _, e in caught.value.rejected)
    await sink.close()
    assert stream_seqs(spark, out) == [4, 6]


async def test_decode_failures_are_the_records_fault(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"

    def decode(record: Record) -> Any:
        value = json.loads(record.data)
        if value["n"] == 7:
            raise ValueError("seven is not an order")
        return {"sku": f"s{value['n']}", "qty": value["n"]} if value["n"] != 5 else value

    sink = SparkSink(out, spark=spark, schema=Line, decode=decode, keep_metadata=True)
    await sink.open()
    # the payload of rec(5) decodes to {"n": 5}: no sku, no qty
    error = await _failing_batch(sink, out, rec(5))
    assert error.column == "sku"
    assert "ORDERS #5" in str(error)
    raised = await _failing_batch(sink, out, rec(7))
    assert "decode failed for the record at ORDERS #7" in str(raised)
    assert "ValueError: seven is not an order" in str(raised)
    assert isinstance(raised.__cause__, ValueError)
    # in a batch, only the records whose decode fails are set aside
    with pytest.raises(RecordsRejected) as caught:
        await sink.write_batch(batch(rec(6), rec(7), rec(8)))
    ((record, why),) = caught.value.rejected
    assert record.stream_seq == 7 and "decode failed" in str(why)
    await sink.close()
    rows = sorted((r["sku"], r["qty"]) for r in read_rows(spark, out))
    assert rows == [("s6", 6), ("s8", 8)]


def test_metadata_columns_clashing_with_the_schema_need_a_prefix(tmp_path: Path) -> None:
    @attrs.frozen
    class Event:
        subject: str
        stream_seq: int

    with pytest.raises(SparkSchemaError, match="metadata_prefix") as caught:
        SparkSink(tmp_path, schema=Event, keep_metadata=True)
    assert caught.value.column == "stream_seq"
    assert "'stream_seq'" in str(caught.value) and "'subject'" in str(caught.value)
    # with a prefix they do not clash
    sink = SparkSink(tmp_path, schema=Event, keep_metadata=True, metadata_prefix="nats_")
    assert sink.builder.arrow_schema.names[:3] == ["subject", "stream_seq", "nats_subject"]


async def test_keep_metadata_may_name_the_columns_to_keep(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = SparkSink(
        out,
        spark=spark,
        schema=Line,
        keep_metadata=["timestamp", "stream_seq"],
        metadata_prefix="m_",
    )
    await sink.open()
    await sink.write_batch(batch(rec(7, GOOD)))
    await sink.close()
    # in METADATA_SCHEMA's order, whatever the order asked
    assert spark.read.parquet(str(out)).columns == [
        "sku",
        "qty",
        "note",
        "m_stream_seq",
        "m_timestamp",
    ]
    (row,) = read_rows(spark, out)
    assert row["m_stream_seq"] == 7
    # without a schema, the named columns are the table
    bare = SparkSink(tmp_path / "bare", spark=spark, keep_metadata=["subject", "stream_seq"])
    assert bare.builder.arrow_schema.names == ["subject", "stream_seq"]


@pytest.mark.parametrize(
    ("keep", "message"),
    [(["stream_sequence"], "not metadata columns"), ([], "empty list")],
)
def test_keep_metadata_names_are_checked(tmp_path: Path, keep: list[str], message: str) -> None:
    with pytest.raises(SparkSchemaError, match=message):
        SparkSink(tmp_path, schema=Line, keep_metadata=keep)


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        (set, "no column type"),
        (list, re.escape("list[X]")),
        (dict[int, str], re.escape("only dict[str, X]")),
        (int | str, "a union"),
    ],
)
def test_attrs_fields_without_a_column_type_are_refused(
    tmp_path: Path, annotation: Any, message: str
) -> None:
    Bad = attrs.make_class("Bad", {"ok": attrs.field(type=int), "f": attrs.field(type=annotation)})
    with pytest.raises(SparkSchemaError, match=message) as caught:
        SparkSink(tmp_path, schema=Bad)
    assert "Bad.f" in str(caught.value)


def test_a_schema_must_be_pyarrow_or_attrs(tmp_path: Path) -> None:
    with pytest.raises(SparkSchemaError, match=r"pyarrow\.Schema or an attrs class"):
        SparkSink(tmp_path, schema={"id": int})  # type: ignore[arg-type]


# -- partition_by ------------------------------------------------------------------------------


async def test_partition_by_lays_out_col_value_directories(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    schema = pa.schema([pa.field("region", pa.string()), pa.field("n", pa.int64())])
    sink = SparkSink(out, spark=spark, schema=schema, keep_metadata=True, partition_by="region")
    await sink.open()
    regions = ["eu", "us", "eu", "apac", "eu", "us"]
    await sink.write_batch(
        batch(*(rec(i, {"region": r, "n": i}) for i, r in enumerate(regions, 1)))
    )
    await sink.write_batch(batch(rec(7, {"region": "us", "n": 7})))
    await sink.close()

    files = data_files(out)
    assert {f.rpartition("/")[0] for f in files} == {"region=apac", "region=eu", "region=us"}
    # one file per partition a batch touches (files_per_batch=1)
    assert len(files) == 4
    assert all(f.split("/")[1].startswith(("part-ORDERS-1-6.", "part-ORDERS-7-7.")) for f in files)

    df = spark.read.parquet(str(out))
    by_region: dict[str, list[int]] = {}
    for row in df.select("region", "n", "stream_seq").collect():
        assert row["n"] == row["stream_seq"]
        by_region.setdefault(row["region"], []).append(row["n"])
    assert {k: sorted(v) for k, v in by_region.items()} == {
        "eu": [1, 3, 5],
        "us": [2, 6, 7],
        "apac": [4],
    }
    # the partition files themselves hold no region column: it is the directory
    only_eu = spark.read.parquet(str(out / "region=eu"))
    assert "region" not in only_eu.columns
    assert sorted(r["n"] for r in only_eu.collect()) == [1, 3, 5]


async def test_partition_by_a_column_the_transform_adds(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    out = tmp_path / "out"
    sink = SparkSink(
        out,
        spark=spark,
        partition_by=["day"],
        transform=lambda df: df.withColumn("day", F.to_date("timestamp")),
    )
    await sink.open()
    await sink.write_batch(batch(rec(1), rec(2, ts=TS + 86_400 * 10**9)))
    await sink.close()
    assert [f.rpartition("/")[0] for f in data_files(out)] == ["day=2023-11-14", "day=2023-11-15"]


async def test_an_unknown_partition_column_fails_at_open(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = SparkSink(out, spark=spark, partition_by=["region"])
    with pytest.raises(SparkSchemaError, match="region") as caught:
        await sink.open()
    assert caught.value.column == "region"
    assert "stream_seq" in str(caught.value)  # says which columns there are
    with pytest.raises(SinkNotOpen):
        await sink.write_batch(batch(rec(1)))
    assert not (out / "_headrace").exists()  # refused before touching the output

    only_region = pa.schema([pa.field("region", pa.string())])
    everything = SparkSink(out, spark=spark, schema=only_region, partition_by="region")
    with pytest.raises(SparkSchemaError, match="takes every column"):
        await everything.open()


def test_a_partition_column_named_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SparkSchemaError, match="twice"):
        SparkSink(tmp_path, partition_by=["subject", "subject"])
