"""A SparkSink writing a Hive table across a session restart.

The embedded Derby metastore belongs to one JVM at a time, so each phase is a process of its
own (table_child.py), started once the previous one and its JVM are gone:

1. a sink creates the partitioned table ``orders`` in a Hive warehouse and writes orders 1-20;
2. a new session: a sink on the same table writes orders 15-40 and 1-5 again (redeliveries of
   phase 1), the ones already committed left out, one partition new;
3. a new session reads the table through the catalog, and opens sinks whose columns or
   partitioning differ from the table's, or whose table cannot be created.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.spark.spark_procs import run_child

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TABLE = "orders"


def region(seq: int) -> str:  # as table_child.py
    return "latam" if seq > 30 else ("eu", "us", "apac")[seq % 3]


async def test_hive_table_across_session_restarts(tmp_path: Path) -> None:
    """One test for the three phases (each a JVM start): written once, partitions in the
    metastore, an existing table checked against the sink's columns."""
    warehouse = tmp_path / "wh"
    phases: dict[str, Any] = {"warehouse": warehouse}
    for name, args in (
        ("first", ("write", str(warehouse), TABLE, "1:10", "11:20")),
        ("second", ("write", str(warehouse), TABLE, "15:30", "1:5", "31:40")),
        ("read", ("read", str(warehouse), TABLE)),
    ):
        done = await run_child("table_child.py", *args, cwd=tmp_path, timeout=120)
        (phases[name],) = done.events("done")
        phases[name]["transcript"] = done.transcript()
    check_written_once(phases)
    check_partitions(phases)
    check_mismatches(phases)


def check_written_once(phases: dict[str, Any]) -> None:
    first, second, read = phases["first"], phases["second"], phases["read"]
    location = phases["warehouse"].resolve() / TABLE
    assert first["output"] == second["output"] == str(location)
    assert first["sink"] == {
        "batches_committed": 2,
        "rows_written": 20,
        "duplicates_skipped": 0,
        "recovered_removed": 0,
        "recovered_rolled": 0,
    }, first["transcript"]
    # 15-20 of the first batch and all of 1-5 were committed by phase 1; the second session
    # knows it from the table's ledger.
    assert second["sink"] == {
        "batches_committed": 2,
        "rows_written": 20,
        "duplicates_skipped": 6 + 5,
        "recovered_removed": 0,
        "recovered_rolled": 0,
    }, second["transcript"]

    rows = read["rows"]
    assert sorted(r["order_id"] for r in rows) == list(range(1, 41)), read["transcript"]
    assert sorted(r["stream_seq"] for r in rows) == list(range(1, 41))
    for row in rows:
        n = row["order_id"]
        assert row == {
            "order_id": n,
            "region": region(n),
            "amount": n * 1.5,
            "stream": "ORDERS",
            "stream_seq": n,
            "subject": "orders.new",
        }
    assert read["table_type"] == "MANAGED"
    # The partition column comes last in a partitioned table.
    assert read["columns"][:3] == ["order_id", "amount", "subject"]
    assert read["columns"][-1] == "region"


def check_partitions(phases: dict[str, Any]) -> None:
    read = phases["read"]
    assert sorted(read["partitions"]) == [
        "region=apac",
        "region=eu",
        "region=latam",
        "region=us",
    ], read["transcript"]
    location = phases["warehouse"] / TABLE
    for partition in read["partitions"]:
        assert list((location / partition).glob("part-*.parquet")), partition
    # The sink's control files live in the table's directory, hidden from readers.
    assert (location / "_headrace" / "ledger").is_dir()


def check_mismatches(phases: dict[str, Any]) -> None:
    errors = phases["read"]["errors"]
    transcript = phases["read"]["transcript"]
    # The same columns and partitioning: the sink opens on the table's directory.
    assert errors["same"] == {
        "type": "",
        "message": str(phases["warehouse"].resolve() / TABLE),
    }, transcript

    columns = errors["columns"]
    assert columns is not None and columns["type"] == "SparkSchemaError", transcript
    message = columns["message"]
    assert f"table {TABLE} has other columns than the batches" in message
    assert "not in the table: ['customer']" in message
    assert "only in the table: ['amount']" in message
    assert "order_id is bigint in the table, string here" in message

    partitioning = errors["partitioning"]
    assert partitioning is not None and partitioning["type"] == "SparkSchemaError", transcript
    assert f"table {TABLE} is partitioned by ['region'], the sink by []" in partitioning["message"]

    # A table that cannot be created: the sink's error, Spark's reason on one line.
    missing = errors["no_database"]
    assert missing is not None and missing["type"] == "SparkSinkError", transcript
    assert missing["message"].startswith(f"cannot create table nodb.{TABLE}: [SCHEMA_NOT_FOUND]")
    assert "\n" not in missing["message"]
