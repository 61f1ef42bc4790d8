"""SparkSink at the sink level (records made without a server): each record once across
redeliveries, differently cut batches and reopening; one sink per output; recovery of
uncommitted attempts; ``on_commit`` and counters; configuration errors."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from headrace.pipeline import SinkNotOpen
from headrace.sinks import OutputInUse
from headrace_spark import (
    CommitInfo,
    SparkSchemaError,
    SparkSink,
    SparkSinkError,
    compact,
)

from tests.sinks.sink_support import batch, rec, seqs
from tests.spark.spark_support import data_files, hidden_files, ledger_entries, stream_seqs

pytestmark = pytest.mark.spark


def keys(spark: Any, out: Path) -> list[tuple[str, int]]:
    """(stream, stream_seq) of every row Spark reads, sorted, duplicates kept."""
    df = spark.read.parquet(str(out))
    return sorted((r[0], r[1]) for r in df.select("stream", "stream_seq").collect())


def orders(*numbers: int) -> list[tuple[str, int]]:
    return [("ORDERS", n) for n in numbers]


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "out"


# -- each record once ----------------------------------------------------------------------------


async def test_the_same_batch_twice_is_written_once(spark: Any, out: Path) -> None:
    commits: list[CommitInfo] = []
    sink = SparkSink(out, spark=spark, on_commit=commits.append)
    await sink.open()
    await sink.write_batch(seqs(1, 2, 3, 4, 5))
    await sink.write_batch(seqs(1, 2, 3, 4, 5, delivered=2))
    assert sink.duplicates_skipped == 5
    assert sink.batches_committed == 1
    assert sink.rows_written == 5
    assert len(commits) == 1  # nothing committed for the redelivery: no callback
    assert len(ledger_entries(out)) == 1
    await sink.close()
    assert keys(spark, out) == orders(1, 2, 3, 4, 5)
    assert len(data_files(out)) == 1


async def test_redeliveries_cut_differently_write_only_the_new_records(
    spark: Any, out: Path
) -> None:
    commits: list[CommitInfo] = []
    sink = SparkSink(out, spark=spark, on_commit=commits.append)
    await sink.open()
    await sink.write_batch(seqs(1, 2, 3, 4, 5))
    await sink.write_batch(seqs(3, 4, 5, 6, 7, 8, delivered=2))  # overlaps the end
    await sink.write_batch(batch(rec(2), rec(9), rec(4)))  # scattered, one new
    await sink.write_batch(seqs(10, 12))  # a gap: 11 is not committed by this batch
    await sink.write_batch(batch(rec(11), rec(12), rec(5), rec(1, stream="RETURNS")))
    await sink.close()

    assert [(c.batch, c.rows, c.skipped) for c in commits] == [
        ("ORDERS-1-5", 5, 0),
        ("ORDERS-6-8", 3, 3),
        ("ORDERS-9-9", 1, 2),
        ("ORDERS-10-12", 2, 0),
        ("ORDERS-11-11+RETURNS-1-1", 2, 2),
    ]
    assert sink.duplicates_skipped == 7
    assert sink.rows_written == 13
    assert sink.batches_committed == 5
    assert keys(spark, out) == [*orders(*range(1, 13)), ("RETURNS", 1)]
    # the records written from a redelivery are the redelivered ones
    delivered = {
        r["stream_seq"]: r["num_delivered"]
        for r in spark.read.parquet(str(out)).where("stream = 'ORDERS'").collect()
    }
    assert [delivered[n] for n in (5, 6, 8)] == [1, 2, 2]


async def test_reopening_keeps_what_was_committed(spark: Any, out: Path) -> None:
    first = SparkSink(out, spark=spark)
    await first.open()
    await first.write_batch(seqs(1, 2, 3, 4))
    await first.close()

    commits: list[CommitInfo] = []
    second = SparkSink(out, spark=spark, on_commit=commits.append)
    await second.open()
    assert (second.recovered_removed, second.recovered_rolled) == (0, 0)
    await second.write_batch(seqs(1, 2, 3, 4, delivered=2))
    await second.write_batch(seqs(3, 4, 5, 6, delivered=2))
    assert second.duplicates_skipped == 6
    assert [(c.batch, c.rows, c.skipped) for c in commits] == [("ORDERS-5-6", 2, 2)]
    await second.close()
    assert keys(spark, out) == orders(1, 2, 3, 4, 5, 6)

    # and once more, the same sink object opened again: counters restart, the ledger does not
    await second.open()
    assert (second.batches_committed, second.duplicates_skipped) == (0, 0)
    await second.write_batch(seqs(6, 7))
    assert (second.batches_committed, second.rows_written, second.duplicates_skipped) == (1, 1, 1)
    await second.close()
    assert keys(spark, out) == orders(1, 2, 3, 4, 5, 6, 7)


async def test_a_second_sink_on_the_same_output_is_refused(spark: Any, out: Path) -> None:
    first = SparkSink(out, spark=spark)
    second = SparkSink(str(out) + "/", spark=spark)  # the same directory, spelt differently
    await first.open()
    try:
        with pytest.raises(OutputInUse, match="in use by another SparkSink"):
            await second.open()
        with pytest.raises(OutputInUse):
            compact(out, spark=spark, min_files=2)  # compaction takes the same lock
        with pytest.raises(SinkNotOpen):
            await second.write_batch(seqs(1))
    finally:
        await first.close()
    await second.open()  # free once the first is closed
    await second.write_batch(seqs(1))
    await second.close()
    assert keys(spark, out) == orders(1)


async def test_uncommitted_attempts_are_never_read_and_are_removed_at_open(
    spark: Any, out: Path, tmp_path: Path
) -> None:
    sink = SparkSink(out, spark=spark)
    await sink.open()
    await sink.write_batch(seqs(1, 2, 3))
    await sink.close()
    # The files of an attempt at 4-6 that crashed before its ledger entry: Spark's output in
    # staging, one file placed hidden next to its final place, and (a crash while publishing
    # can never leave this, but a copy by hand can) a visible file of ours no entry names.
    other = tmp_path / "other"
    writer = SparkSink(other, spark=spark)
    await writer.open()
    await writer.write_batch(seqs(4, 5, 6))
    await writer.close()
    (attempt,) = data_files(other)
    staging = out / "_headrace" / "staging" / "ORDERS-4-6.0badc0de"
    staging.mkdir(parents=True)
    shutil.copy(other / attempt, staging / "part-00000-0000-c000.snappy.parquet")
    shutil.copy(other / attempt, out / ".part-ORDERS-4-6.0badc0de-00000.snappy.parquet.pending")
    shutil.copy(other / attempt, out / "part-ORDERS-4-6.1badc0de-00000.snappy.parquet")
    committed = data_files(out)[0]
    assert len(data_files(out)) == 2

    # readers never see the hidden attempt (only the stray visible copy, which open removes)
    assert keys(spark, out) == orders(1, 2, 3, 4, 5, 6)
    entries = ledger_entries(out)

    reopened = SparkSink(out, spark=spark)
    await reopened.open()
    assert reopened.recovered_removed == 2  # the hidden file and the stray one
    assert reopened.recovered_rolled == 0
    assert data_files(out) == [committed]
    assert hidden_files(out) == []
    assert list(staging.parent.iterdir()) == []
    assert ledger_entries(out) == entries
    assert keys(spark, out) == orders(1, 2, 3)
    # 4-6 were never committed: their redelivery is written, not skipped
    await reopened.write_batch(seqs(4, 5, 6, delivered=2))
    assert reopened.duplicates_skipped == 0
    await reopened.close()
    assert keys(spark, out) == orders(1, 2, 3, 4, 5, 6)


async def test_a_committed_file_deleted_by_hand_warns_and_stays_committed(
    spark: Any, out: Path
) -> None:
    sink = SparkSink(out, spark=spark)
    await sink.open()
    await sink.write_batch(seqs(1, 2))
    await sink.write_batch(seqs(3, 4))
    await sink.close()
    gone = next(f for f in data_files(out) if "ORDERS-1-2" in f)
    (out / gone).unlink()
    with pytest.warns(RuntimeWarning, match="deleted outside the sink"):
        await sink.open()
    await sink.write_batch(seqs(1, 2, 5))
    assert sink.duplicates_skipped == 2  # their sequences stay committed
    await sink.close()
    assert keys(spark, out) == orders(3, 4, 5)
    # the ledger no longer names the file: the next open does not warn again
    await sink.open()
    await sink.close()


# -- what a commit reports ---------------------------------------------------------------------


async def test_on_commit_gets_each_committed_batch(spark: Any, out: Path) -> None:
    commits: list[CommitInfo] = []
    sink = SparkSink(out, spark=spark, on_commit=commits.append)
    await sink.open()
    await sink.write_batch(seqs(1, 2, 3))
    await sink.write_batch(seqs(2, 3, 4))
    await sink.write_batch(batch())  # empty: nothing to commit
    await sink.close()
    assert len(commits) == 2
    first, second = commits
    assert (first.batch, first.rows, first.skipped) == ("ORDERS-1-3", 3, 0)
    assert (second.batch, second.rows, second.skipped) == ("ORDERS-4-4", 1, 2)
    assert first.seconds > 0
    # one file per batch by default, named after its sequences, relative to the output
    assert len(first.files) == 1 and len(second.files) == 1
    assert first.files[0].startswith("part-ORDERS-1-3.")
    assert second.files[0].startswith("part-ORDERS-4-4.")
    assert sorted([*first.files, *second.files]) == data_files(out)
    assert (sink.batches_committed, sink.rows_written, sink.duplicates_skipped) == (2, 4, 2)
    # each file holds exactly the rows of its commit
    assert stream_seqs(spark, out / first.files[0]) == [1, 2, 3]


async def test_files_per_batch(spark: Any, out: Path) -> None:
    commits: list[CommitInfo] = []
    sink = SparkSink(
        out,
        spark=spark,
        files_per_batch=3,
        on_commit=commits.append,
        # spread the rows over more partitions than files_per_batch allows
        transform=lambda df: df.repartition(6, "stream_seq"),
    )
    await sink.open()
    await sink.write_batch(seqs(*range(1, 31)))
    await sink.close()
    (info,) = commits
    assert 1 < len(info.files) <= 3
    assert keys(spark, out) == orders(*range(1, 31))


# -- configuration -------------------------------------------------------------------------------


def test_exactly_one_of_path_and_table(tmp_path: Path) -> None:
    with pytest.raises(SparkSinkError, match=r"exactly one of path= \(parquet\) or table="):
        SparkSink()
    with pytest.raises(SparkSinkError, match="exactly one"):
        SparkSink(tmp_path, table="events")


def test_files_per_batch_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(SparkSinkError, match="files_per_batch must be at least 1, not 0"):
        SparkSink(tmp_path, files_per_batch=0)
    assert SparkSink(tmp_path, files_per_batch=None).files_per_batch is None


def test_decode_needs_a_schema(tmp_path: Path) -> None:
    with pytest.raises(SparkSchemaError, match="decode needs a schema"):
        SparkSink(tmp_path, decode=lambda r: r.data)


@pytest.mark.parametrize(
    "url", ["s3://bucket/x", "s3a://bucket/events", "hdfs://namenode:8020/x", "gs://b/x"]
)
def test_object_store_paths_are_refused(url: str) -> None:
    with pytest.raises(SparkSinkError, match="atomic") as caught:
        SparkSink(url)
    assert url in str(caught.value)
    assert "local" in str(caught.value)


def test_file_urls_are_local_paths(tmp_path: Path) -> None:
    where = tmp_path / "with space"
    sink = SparkSink(where.as_uri())
    assert sink.target.path == where
    assert repr(sink) == f"SparkSink(parquet {where})"


@pytest.mark.parametrize("name", ["", "a;b", "x`y", "t'"])
def test_table_names_must_be_plain(name: str) -> None:
    with pytest.raises(SparkSinkError, match="plain"):
        SparkSink(table=name)


async def test_writing_before_open_or_after_close(spark: Any, out: Path) -> None:
    sink = SparkSink(out, spark=spark)
    with pytest.raises(SinkNotOpen, match="not open"):
        await sink.write_batch(seqs(1))
    with pytest.raises(SinkNotOpen):
        await sink.compact(min_files=2)
    assert sink.output is None
    await sink.close()  # closing what was never opened is harmless
    await sink.open()
    assert sink.output == out
    await sink.close()
    with pytest.raises(SinkNotOpen):
        await sink.write_batch(seqs(1))
    assert not data_files(out)
    assert ledger_entries(out) == []


async def test_a_transform_that_breaks_fails_the_open(spark: Any, out: Path) -> None:
    """The transform runs on an empty frame at open, so a broken one is found before data."""

    def transform(df: Any) -> Any:
        return df.select("no_such_column")

    sink = SparkSink(out, spark=spark, transform=transform)
    with pytest.raises(Exception, match="no_such_column"):
        await sink.open()
    assert sink.output is None
    # nothing is held: a working sink opens on the same directory
    good = SparkSink(out, spark=spark)
    await good.open()
    await good.close()
