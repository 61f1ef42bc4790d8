"""Writing a batch's table as parquet with Arrow's own writer, laid out as Spark lays it out.

``SparkSink(writer="arrow")`` takes this path instead of ``createDataFrame(table).write``: the
same table, the same staging directory, ledger and commit, but no Spark job. Why it exists: on
a small machine the JVM's side of a Spark write (Arrow batches turned into rows, then back into
parquet columns) costs about 0.65 CPU-seconds per 100k rows of the default columns (1.3 with
Spark's default Arrow threshold), about what the whole Python pipeline spends reading, parsing
and acking them; Arrow writes the same table in about 0.1 s and releases the GIL while it does.
``bench e2e`` reports both.

What Spark reads back is the same: the columns and their Spark types (``map<string,
array<string>>`` headers, UTC ``timestamp``), Hive-style ``col=value`` partition directories
without the partition columns in the files, ``__HIVE_DEFAULT_PARTITION__`` for nulls and empty
strings, one file per partition of a batch, no limit on a batch's partitions. The
differences: no ``transform`` (there is no DataFrame), parquet paths only (a table's catalog
needs Spark), timestamps stored as INT64 microseconds (Spark's writer uses INT96 by default;
Spark reads both as ``timestamp``), and partition values in directory names are URI-escaped by
Arrow where Spark escapes fewer characters; Spark unescapes both to the same value.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

#: Names as Spark gives its part files (``output._extension`` keeps ``.snappy.parquet``).
_FILE = "part-{i}-headrace-c000.snappy.parquet"


def write_parquet(table: pa.Table, staging: Path, partition_by: tuple[str, ...] = ()) -> None:
    """Write ``table`` under ``staging`` (which must not exist yet), one file per partition."""
    staging.mkdir(parents=True)
    if not partition_by:
        pq.write_table(table, staging / _FILE.format(i=0), compression="snappy")
        return
    # Only partitioned writes need the dataset module, which brings pandas in with it: about
    # 55 MB of every worker process that never partitions (measured with bench scale).
    import pyarrow.dataset as ds

    table = _empty_strings_as_null(table, partition_by)
    # Sorted by partition, as Spark's writer sorts: each partition's rows come together, so
    # one file is open at a time and each partition gets exactly one file.
    table = table.sort_by([(name, "ascending") for name in partition_by])
    partitioning = ds.partitioning(
        pa.schema([table.schema.field(name) for name in partition_by]), flavor="hive"
    )
    ds.write_dataset(
        table,
        staging,
        format="parquet",
        partitioning=partitioning,
        basename_template=_FILE,
        file_options=ds.ParquetFileFormat().make_write_options(compression="snappy"),
        existing_data_behavior="error",
        max_partitions=max(1024, table.num_rows),  # Arrow's default of 1024 fails a batch
        max_rows_per_group=1 << 20,
        use_threads=False,
    )


def _empty_strings_as_null(table: pa.Table, partition_by: tuple[str, ...]) -> pa.Table:
    """Spark writes an empty string partition value as ``__HIVE_DEFAULT_PARTITION__`` (and
    reads it back as null); a ``col=`` directory, which Arrow would write, makes Spark's
    partition discovery fail for the whole output."""
    for name in partition_by:
        column = table.column(name)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            empty = pc.equal(column, "")
            if pc.any(empty).as_py():
                blank = pc.if_else(empty, pa.scalar(None, column.type), column)
                table = table.set_column(table.schema.get_field_index(name), name, blank)
    return table
