"""Compaction: fewer files, the same rows, and a ledger that still knows every committed
sequence (a redelivery after compaction is still skipped)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from headrace_spark import CompactionReport, SparkSink, compact

from tests.sinks.sink_support import batch, rec, seqs
from tests.spark.spark_support import data_files, hidden_files, ledger_entries, stream_seqs

pytestmark = pytest.mark.spark


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "out"


async def test_compact_rewrites_small_files_into_one(spark: Any, out: Path) -> None:
    sink = SparkSink(out, spark=spark)
    await sink.open()
    for first in range(1, 21, 5):
        await sink.write_batch(seqs(*range(first, first + 5)))
    before = data_files(out)
    assert len(before) == 4

    report = await sink.compact(min_files=2)
    assert report == CompactionReport(directories=1, files_before=4, files_after=1)
    (after,) = data_files(out)
    assert after.startswith("part-compact.")
    assert hidden_files(out) == []
    assert stream_seqs(spark, out) == list(range(1, 21))
    # the ledger is folded into its snapshot
    assert ledger_entries(out) == ["snapshot.json"]

    # every sequence is still committed: a redelivery is skipped, new records written
    await sink.write_batch(seqs(3, 4, 5, 6, 7, delivered=2))
    assert sink.duplicates_skipped == 5
    assert data_files(out) == [after]
    await sink.write_batch(seqs(20, 21, 22))
    await sink.close()
    assert stream_seqs(spark, out) == list(range(1, 23))
    assert len(data_files(out)) == 2

    # reopening finds the ledger and the files in agreement: nothing removed, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        await sink.open()
    assert (sink.recovered_removed, sink.recovered_rolled) == (0, 0)
    await sink.write_batch(seqs(*range(1, 23), delivered=3))
    assert sink.duplicates_skipped == 22
    await sink.close()
    assert stream_seqs(spark, out) == list(range(1, 23))


async def test_compact_leaves_directories_below_min_files(spark: Any, out: Path) -> None:
    sink = SparkSink(out, spark=spark)
    await sink.open()
    await sink.write_batch(seqs(1, 2))
    await sink.write_batch(seqs(3))
    files = data_files(out)
    assert await sink.compact(min_files=3) == CompactionReport(0, 0, 0)
    assert data_files(out) == files
    with pytest.raises(ValueError, match="at least 2"):
        await sink.compact(min_files=1)
    await sink.close()


async def test_compact_works_per_partition(spark: Any, out: Path) -> None:
    schema = pa.schema([pa.field("region", pa.string()), pa.field("n", pa.int64())])
    sink = SparkSink(out, spark=spark, schema=schema, keep_metadata=True, partition_by="region")
    await sink.open()
    regions: dict[str, list[int]] = {"eu": [], "us": [], "apac": []}
    seq = 0
    for batch_no in range(3):
        records = []
        for region in ("eu", "us") if batch_no else ("eu", "us", "apac"):
            for _ in range(2):
                seq += 1
                regions[region].append(seq)
                records.append(rec(seq, {"region": region, "n": seq}))
        await sink.write_batch(batch(*records))
    assert [f.rpartition("/")[0] for f in data_files(out)].count("region=eu") == 3

    report = await sink.compact(min_files=2)
    assert report == CompactionReport(directories=2, files_before=6, files_after=2)
    assert [f.rpartition("/")[0] for f in data_files(out)] == [
        "region=apac",
        "region=eu",
        "region=us",
    ]
    # compacted files hold the same columns as the batches' (the region is the directory)
    eu = spark.read.parquet(str(out / "region=eu"))
    apac = spark.read.parquet(str(out / "region=apac"))
    assert eu.columns == apac.columns and "region" not in eu.columns
    rows = spark.read.parquet(str(out)).select("region", "n", "stream_seq").collect()
    got: dict[str, list[int]] = {}
    for row in rows:
        assert row["n"] == row["stream_seq"]
        got.setdefault(row["region"], []).append(row["n"])
    assert {k: sorted(v) for k, v in got.items()} == regions
    await sink.write_batch(batch(rec(1, {"region": "eu", "n": 1}, delivered=2)))
    assert sink.duplicates_skipped == 1
    await sink.close()


async def test_compact_a_closed_output_by_path(spark: Any, out: Path) -> None:
    sink = SparkSink(out, spark=spark)
    await sink.open()
    for n in range(1, 4):
        await sink.write_batch(seqs(n))
    await sink.close()

    report = compact(out, spark=spark, min_files=2)
    assert report == CompactionReport(1, 3, 1)
    assert len(data_files(out)) == 1
    assert stream_seqs(spark, out) == [1, 2, 3]

    reopened = SparkSink(out, spark=spark)
    await reopened.open()
    await reopened.write_batch(seqs(1, 2, 3, 4))
    assert reopened.duplicates_skipped == 3
    await reopened.close()
    assert stream_seqs(spark, out) == [1, 2, 3, 4]


async def test_compact_by_path_after_a_committed_file_was_deleted(spark: Any, out: Path) -> None:
    """The ledger forgets a committed file that is gone before compacting, as the sink's
    open does: compaction rewrites what is there instead of failing on the missing file."""
    sink = SparkSink(out, spark=spark)
    await sink.open()
    for n in range(1, 5):
        await sink.write_batch(seqs(n))
    await sink.close()
    (out / data_files(out)[0]).unlink()

    report = compact(out, spark=spark, min_files=2)
    assert report == CompactionReport(1, 3, 1)
    assert len(data_files(out)) == 1
    assert len(stream_seqs(spark, out)) == 3
