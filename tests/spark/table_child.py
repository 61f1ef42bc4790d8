"""Child of test_table.py: one phase of a SparkSink writing a Hive table, in a process (so
a Spark session, and an embedded Derby metastore) of its own.

    table_child.py write WAREHOUSE TABLE FIRST:LAST [FIRST:LAST ...]
        a SparkSink(table=TABLE, hive=True, warehouse=WAREHOUSE) writes one batch per range of
        sequences (records built without a server), then closes and stops its session
    table_child.py read WAREHOUSE TABLE
        a new Hive session reads the table, its partitions, and opens sinks whose columns or
        partitioning differ from the table's, and one on a table in a database that does not
        exist

stdout: one JSON object (``{"event": "done", ...}``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pyarrow as pa
import trio
from headrace_spark import SparkSink, SparkSinkError
from headrace_spark.session import start_session

from tests.sinks.sink_support import batch, rec

#: The orders' own columns; the message metadata follows them (keep_metadata).
ORDERS = pa.schema(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        pa.field("region", pa.string(), nullable=False),
        pa.field("amount", pa.float64()),
    ]
)
PARTITION_BY = ["region"]


def region(seq: int) -> str:
    """Three regions for the first 30 orders, a fourth after (a partition new in phase 2)."""
    return "latam" if seq > 30 else ("eu", "us", "apac")[seq % 3]


def order(seq: int) -> dict[str, Any]:
    return {"order_id": seq, "region": region(seq), "amount": seq * 1.5}


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def write(warehouse: str, table: str, ranges: list[str]) -> None:
    sink = SparkSink(
        table=table,
        partition_by=PARTITION_BY,
        schema=ORDERS,
        keep_metadata=True,
        master="local[2]",
        hive=True,
        warehouse=warehouse,
        app_name="headrace-table-child",
        stop_session=True,
    )
    await sink.open()
    output = str(sink.output)
    for spec in ranges:
        first, _, last = spec.partition(":")
        seqs = range(int(first), int(last) + 1)
        await sink.write_batch(batch(*(rec(n, order(n), subject="orders.new") for n in seqs)))
    counters = {
        "batches_committed": sink.batches_committed,
        "rows_written": sink.rows_written,
        "duplicates_skipped": sink.duplicates_skipped,
        "recovered_removed": sink.recovered_removed,
        "recovered_rolled": sink.recovered_rolled,
    }
    await sink.close()
    say("done", sink=counters, output=output)


async def read(warehouse: str, table: str) -> None:
    spark = await trio.to_thread.run_sync(
        lambda: start_session("local[2]", hive=True, warehouse=warehouse, app_name="reader")
    )

    def query() -> dict[str, Any]:
        rows = spark.sql(
            f"SELECT order_id, region, amount, stream, stream_seq, subject FROM {table}"
        ).collect()
        partitions = [r[0] for r in spark.sql(f"SHOW PARTITIONS {table}").collect()]
        (info,) = [t for t in spark.catalog.listTables() if t.name == table]
        return {
            "rows": [r.asDict() for r in rows],
            "partitions": partitions,
            "table_type": info.tableType,
            "columns": [c.name for c in spark.catalog.listColumns(table)],
        }

    found = await trio.to_thread.run_sync(query)

    async def open_error(name: str = table, **kwargs: Any) -> dict[str, str] | None:
        sink = SparkSink(table=name, spark=spark, keep_metadata=True, **kwargs)
        try:
            await sink.open()
        except SparkSinkError as exc:
            return {"type": type(exc).__name__, "message": str(exc)}
        output = str(sink.output)
        await sink.close()
        return {"type": "", "message": output}

    other = pa.schema(
        [
            pa.field("order_id", pa.string()),  # int64 in the table
            pa.field("region", pa.string()),
            pa.field("customer", pa.string()),  # not in the table
        ]
    )  # and no amount
    errors = {
        "same": await open_error(schema=ORDERS, partition_by=PARTITION_BY),
        "columns": await open_error(schema=other, partition_by=PARTITION_BY),
        "partitioning": await open_error(schema=ORDERS, partition_by=[]),
        "no_database": await open_error(f"nodb.{table}", schema=ORDERS),
    }
    spark.stop()
    say("done", errors=errors, **found)


if __name__ == "__main__":
    command, warehouse_dir, table_name, *rest = sys.argv[1:]
    if command == "write":
        trio.run(write, warehouse_dir, table_name, rest)
    else:
        trio.run(read, warehouse_dir, table_name)
