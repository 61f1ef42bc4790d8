"""``SparkSink(writer="arrow")``: Arrow's parquet writer instead of a Spark job per batch. What
Spark reads back must be what the Spark writer gives it (columns, types, values, partition
directories); the commit protocol is the same (a redelivery is skipped, a failed write is
naked and written once later); what the arrow writer cannot do is refused when the sink is made.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from headrace.pipeline import BatchPolicy
from headrace.protocol.headers import Headers
from headrace_spark import CommitInfo, SparkSink, SparkSinkError, SparkWriteError

from tests.pipeline.pipe_support import (
    FAST,
    add_stream,
    connect,
    fast_pipeline,
    publish,
    source,
    wait_consumer,
    wait_stats,
)
from tests.sinks.sink_support import TS, batch, rec, seqs
from tests.spark.spark_support import all_acked, data_files, ledger_entries, read_rows, stream_seqs

pytestmark = pytest.mark.spark


def spark_types(spark: Any, out: Path) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in spark.read.parquet(str(out)).schema}


def by_key(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["stream"], r["stream_seq"]): r for r in rows}


async def write_with(writer: str, out: Path, spark: Any, *batches: Any, **options: Any) -> None:
    sink = SparkSink(out, spark=spark, writer=writer, **options)
    await sink.open()
    for b in batches:
        await sink.write_batch(b)
    await sink.close()


async def test_spark_reads_the_same_default_columns_from_both_writers(
    spark: Any, tmp_path: Path
) -> None:
    def records() -> Any:
        headers = Headers([("Trace", "a"), ("Trace", "b"), ("Nats-Msg-Id", "m-1")])
        return batch(
            rec(1, headers=headers, delivered=3),
            rec(2, subject="orders.old", ts=1_700_000_000_123_456_999),  # cut, not rounded
            rec(3, headers=headers),
            rec(7, stream="RETURNS", subject="returns.x", ts=TS + 5_000_000_000),
        )

    await write_with("spark", tmp_path / "spark", spark, records())
    await write_with("arrow", tmp_path / "arrow", spark, records())

    assert spark_types(spark, tmp_path / "arrow") == spark_types(spark, tmp_path / "spark")
    assert spark.read.parquet(str(tmp_path / "arrow")).columns[:3] == ["subject", "data", "headers"]
    arrow = by_key(read_rows(spark, tmp_path / "arrow"))
    assert arrow == by_key(read_rows(spark, tmp_path / "spark"))
    assert sorted(arrow) == [("ORDERS", 1), ("ORDERS", 2), ("ORDERS", 3), ("RETURNS", 7)]
    assert arrow["ORDERS", 1]["headers"] == {"Trace": ["a", "b"], "Nats-Msg-Id": ["m-1"]}
    assert arrow["ORDERS", 2]["headers"] == {}  # no headers: an empty map, not null
    assert arrow["ORDERS", 1]["num_delivered"] == 3
    micros = {
        r[0]: r[1]
        for r in spark.read.parquet(str(tmp_path / "arrow"))
        .selectExpr("stream_seq", "unix_micros(timestamp)")
        .collect()
    }
    assert micros[2] == 1_700_000_000_123_456
    assert micros[7] == TS // 1000 + 5_000_000


async def test_partition_directories_are_laid_out_as_spark_does(spark: Any, tmp_path: Path) -> None:
    schema = pa.schema([pa.field("region", pa.string()), pa.field("n", pa.int64())])
    regions = ["eu", "us", "eu", None, "a b/c:d%", "eu", ""]

    def records() -> Any:
        return batch(*(rec(i, {"region": r, "n": i}) for i, r in enumerate(regions, 1)))

    options = {"schema": schema, "keep_metadata": ["stream", "stream_seq"]}
    for writer in ("spark", "arrow"):
        await write_with(
            writer, tmp_path / writer, spark, records(), partition_by="region", **options
        )

    arrow_dirs = {f.rpartition("/")[0] for f in data_files(tmp_path / "arrow")}
    assert {"region=eu", "region=us", "region=__HIVE_DEFAULT_PARTITION__"} < arrow_dirs
    assert len(arrow_dirs) == 4
    assert len(data_files(tmp_path / "arrow")) == 4  # one file per partition of the batch

    def regions_read(out: Path) -> dict[int, Any]:
        df = spark.read.parquet(str(out))
        return {r["n"]: r["region"] for r in df.select("n", "region").collect()}

    assert regions_read(tmp_path / "arrow") == regions_read(tmp_path / "spark")
    # Spark keeps an empty partition value as its default partition: null when read back
    assert regions_read(tmp_path / "arrow") == {i: r or None for i, r in enumerate(regions, 1)}
    only_eu = spark.read.parquet(str(tmp_path / "arrow" / "region=eu"))
    assert "region" not in only_eu.columns  # the partition column is the directory
    assert sorted(r["n"] for r in only_eu.collect()) == [1, 3, 6]


async def test_a_redelivered_batch_is_skipped_and_reopening_keeps_the_commits(
    spark: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    commits: list[CommitInfo] = []
    sink = SparkSink(out, writer="arrow", on_commit=commits.append)
    await sink.open()
    assert sink.spark is None  # no session started: no Spark job per batch
    await sink.write_batch(seqs(1, 2, 3, 4, 5))
    await sink.write_batch(seqs(1, 2, 3, 4, 5, delivered=2))
    await sink.write_batch(seqs(4, 5, 6, 7, delivered=2))  # cut differently: 6-7 are new
    await sink.close()
    assert sink.duplicates_skipped == 7
    assert [c.rows for c in commits] == [5, 2]
    assert len(ledger_entries(out)) == 2

    reopened = SparkSink(out, writer="arrow")
    await reopened.open()
    await reopened.write_batch(seqs(6, 7, 8))
    await reopened.close()
    assert reopened.duplicates_skipped == 2
    assert stream_seqs(spark, out) == [1, 2, 3, 4, 5, 6, 7, 8]  # each once


async def test_compaction_starts_a_session_when_the_sink_has_none(
    spark: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    sink = SparkSink(out, writer="arrow")
    await sink.open()
    for first in range(1, 31, 3):
        await sink.write_batch(seqs(first, first + 1, first + 2))
    assert len(data_files(out)) == 10
    report = await sink.compact(min_files=4)
    assert sink.spark is not None  # started for the compaction (the test session's process)
    await sink.close()
    assert len(data_files(out)) == 1
    assert (report.files_before, report.files_after) == (10, 1)
    assert stream_seqs(spark, out) == list(range(1, 31))


def test_what_the_arrow_writer_cannot_do_is_refused_at_once(tmp_path: Path) -> None:
    with pytest.raises(SparkSinkError, match="table needs Spark's catalog"):
        SparkSink(table="orders", writer="arrow")
    with pytest.raises(SparkSinkError, match="cannot apply transform"):
        SparkSink(tmp_path, writer="arrow", transform=lambda df: df)
    with pytest.raises(SparkSinkError, match=r"writer must be one of \['spark', 'arrow'\]"):
        SparkSink(tmp_path, writer="pandas")
    with pytest.raises(SparkSinkError, match="one file per partition of a batch"):
        SparkSink(tmp_path, writer="arrow", files_per_batch=None)


async def test_an_unknown_partition_column_fails_at_open(tmp_path: Path) -> None:
    sink = SparkSink(tmp_path / "out", writer="arrow", partition_by="region")
    with pytest.raises(SparkSinkError, match=r"partition_by names \['region'\]"):
        await sink.open()


async def test_a_failed_write_is_written_again_and_its_messages_once(
    spark: Any, nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    """The staging directory made unusable once the sink is open (a file where it stages its
    batches): the write fails and is written again (held, not naked: a sink that fails is
    backpressure); once staging is usable again they are all written once and acked."""
    n = 30
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    out = tmp_path / "out"
    sink = SparkSink(out, writer="arrow")
    staging = out / "_headrace" / "staging"
    pipe = fast_pipeline("lake")
    pipe.source(source()).sink(sink, name="lake", batch=BatchPolicy(max_messages=10, max_age=0.2))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await wait_stats(lambda: sink.output is not None, what="the sink open")
        staging.rmdir()
        staging.write_text("in the way")
        await publish(natspy, n, headers=lambda i: {"X-Index": str(i)})
        await wait_stats(lambda: run.stats.batches_failed > 0, what="a failed batch")
        staging.unlink()
        # A retry may already have made it again (the sink creates what it stages into).
        staging.mkdir(exist_ok=True)
        info = await wait_consumer(natspy, all_acked(n), timeout=60)
        error = run.errors[0].error
        assert isinstance(error, SparkWriteError)
        assert str(error).startswith("Arrow could not write batch S-")
        assert isinstance(error.__cause__, OSError)
        assert run.stats.acks == n
        assert run.stats.naks == 0 and run.stats.sink_retries >= 1
    assert info.num_redelivered == 0
    rows = read_rows(spark, out)
    assert sorted(r["stream_seq"] for r in rows) == list(range(1, n + 1))  # none twice
    assert {json.dumps(r["headers"]) for r in rows if r["stream_seq"] == 7} == {
        json.dumps({"X-Index": ["6"]})
    }


async def test_a_batch_may_touch_more_partitions_than_arrow_allows_by_default(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    schema = pa.schema([pa.field("key", pa.string()), pa.field("n", pa.int64())])
    sink = SparkSink(out, writer="arrow", schema=schema, partition_by="key")
    await sink.open()
    n = 1100  # pyarrow's write_dataset refuses more than 1024 partitions unless told
    await sink.write_batch(batch(*(rec(i, {"key": f"k{i % n:04d}", "n": i}) for i in range(n))))
    await sink.close()
    files = data_files(out)
    assert len(files) == n  # one file per partition
    assert {f.split("/")[0] for f in files} == {f"key=k{i:04d}" for i in range(n)}
    assert sorted(pq.read_table(out, columns=["n"]).column("n").to_pylist()) == list(range(n))
