"""A batch's table handed to Spark as a parquet file Arrow wrote, instead of Arrow batches.

Why: ``spark.createDataFrame(table)`` ships Arrow record batches to the JVM, which turns them
into rows through Arrow column vectors before the parquet writer encodes them. Reading the
same table from a parquet file Arrow wrote is cheaper for the JVM (its vectorized parquet
reader), and Arrow's own write of it costs the Python process little (GIL released). Measured
on 100k order rows (issue 14): JVM CPU 0.56-0.70 s against 0.81-1.06 s through
``createDataFrame``; the Spark writer's limit is the JVM's CPU on this machine.

Opt-in (``SparkSink(staged_input=True)``), because it is not a win for every table: measured
on 2 cores, the metadata columns of ``bench e2e`` (no partitioning, batches of 100k) went from
79-90k to 84-108k msg/s, but ``headrace demo`` (decoded orders partitioned by day, batches of
50k) went from 59k to 46-50k msg/s, warm-up through this path included. Why is not measured
yet (per-batch file listing and planning, the partition sort over a parquet scan, the decimal
and date columns are candidates).

When: a classic (JVM-backed) session, and a table whose every column type reads back from
parquet as exactly the Spark type ``createDataFrame`` would give it (:func:`stageable`). A
naive timestamp, for one, is not: Spark would read it back as a local-time ``TIMESTAMP_NTZ``
column, where ``createDataFrame`` localises it. Anything else keeps ``createDataFrame``.

Where: ``<output>/_headrace/input/<attempt>.parquet``, next to the staging directory, so that
a cluster's executors (which must see the output anyway) can read it. The file is removed when
Spark's write returns, whatever happened; one left by a killed process is removed by the next
sink to open the output once it is older than the stale-attempt age.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

#: The directory under the output's control directory (``_headrace``).
INPUT = "input"


def _stageable_type(t: pa.DataType) -> bool:
    if pa.types.is_timestamp(t):
        return t.tz is not None  # an instant: read back as Spark's TIMESTAMP, as created
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _stageable_type(t.value_type)
    if pa.types.is_map(t):
        return _stageable_type(t.key_type) and _stageable_type(t.item_type)
    if pa.types.is_struct(t):
        return all(_stageable_type(t.field(i).type) for i in range(t.num_fields))
    return bool(
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_boolean(t)
        or pa.types.is_int8(t)
        or pa.types.is_int16(t)
        or pa.types.is_int32(t)
        or pa.types.is_int64(t)
        or pa.types.is_float32(t)
        or pa.types.is_float64(t)
        or pa.types.is_date32(t)
        or pa.types.is_decimal128(t)
    )


def stageable(schema: pa.Schema) -> bool:
    """Whether a table of ``schema`` reads back from parquet as ``createDataFrame`` makes it."""
    return len(schema) > 0 and all(_stageable_type(field.type) for field in schema)


@contextlib.contextmanager
def staged_frame(spark: Any, table: pa.Table, control: Path, name: str) -> Iterator[Any]:
    """A DataFrame of ``table`` read from a parquet file staged under ``control``; the file
    is removed on leaving (the DataFrame is lazy: write it inside the ``with``)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    directory = control / INPUT
    directory.mkdir(exist_ok=True)
    path = directory / f"{name}.parquet"
    try:
        # Uncompressed: read once, at once, from the local disk; compressing it would only
        # spend the CPU this path is here to save.
        pq.write_table(table, path, compression="none")
        schema = from_arrow_schema(table.schema, prefer_timestamp_ntz=False)
        yield spark.read.schema(schema).parquet(str(path))
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_stale_inputs(control: Path, older_than: float) -> int:
    """Remove staged inputs older than ``older_than`` seconds (left by a killed process);
    the number removed. A younger one may be another worker's, being read right now."""
    directory = control / INPUT
    removed = 0
    if not directory.is_dir():
        return 0
    limit = time.time() - older_than
    for entry in os.scandir(directory):
        with contextlib.suppress(FileNotFoundError):
            if entry.is_file() and entry.stat().st_mtime < limit:
                os.unlink(entry.path)
                removed += 1
    return removed
