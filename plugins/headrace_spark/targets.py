"""Where a Spark sink writes: a parquet directory, or a table whose files live in a directory.

Either way the sink commits into a local directory (the table's location for a table), since a
commit is a rename (output.py); object stores have no atomic rename, so ``s3a://`` and friends
are refused with a clear error rather than written without the guarantee.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from headrace_spark.errors import SparkSchemaError, SparkSinkError
from headrace_spark.session import first_line


def local_path(location: str, what: str) -> Path:
    """A local directory from a path or a ``file:`` URI."""
    parsed = urllib.parse.urlparse(location)
    if parsed.scheme in ("", "file"):
        raw = urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else location
        return Path(raw).expanduser().resolve()
    if len(parsed.scheme) == 1:  # a Windows drive letter
        return Path(location).resolve()
    raise SparkSinkError(
        f"{what} {location!r}: the Spark sink writes only to local (or locally mounted) "
        "directories, since it commits a batch by renaming files; object stores have no atomic "
        "rename (see docs/spark.md)"
    )


def _to_path(value: str | os.PathLike[str]) -> Path:
    return local_path(os.fspath(value), "path")


def _columns(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)  # partition_by="day": one column, not three letters
    return tuple(value)


def _check_partitions(partition_by: tuple[str, ...]) -> None:
    if len(set(partition_by)) != len(partition_by):
        raise SparkSchemaError(f"partition_by {list(partition_by)} names a column twice")


@attrs.frozen(slots=True)
class ParquetTarget:
    """Parquet files under ``path``, in Hive-style partition directories by ``partition_by``."""

    path: Path = attrs.field(converter=_to_path)
    partition_by: tuple[str, ...] = attrs.field(default=(), converter=_columns)

    def __attrs_post_init__(self) -> None:
        _check_partitions(self.partition_by)

    def describe(self) -> str:
        parts = f" partitioned by {', '.join(self.partition_by)}" if self.partition_by else ""
        return f"parquet {self.path}{parts}"

    def location(self, spark: Any, template: Any) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        return self.path

    def after_commit(self, spark: Any, files: list[str]) -> None:
        """Nothing to tell anyone: readers list the directory."""


@attrs.frozen(slots=True)
class TableTarget:
    """A parquet table ``name`` in the session's catalog (Hive with ``hive=True``), created on
    first use with the batches' columns and ``partition_by``."""

    name: str
    partition_by: tuple[str, ...] = attrs.field(default=(), converter=_columns)

    def __attrs_post_init__(self) -> None:
        if not self.name or any(c in self.name for c in "`;'\"\n"):
            raise SparkSinkError(f"table name {self.name!r} is not a plain (db.)table name")
        _check_partitions(self.partition_by)

    def describe(self) -> str:
        parts = f" partitioned by {', '.join(self.partition_by)}" if self.partition_by else ""
        return f"table {self.name}{parts}"

    def location(self, spark: Any, template: Any) -> Path:
        """The table's directory, creating the table from ``template`` (an empty DataFrame of
        the batches' columns) when it does not exist; an existing table must have the same
        columns and partitioning."""
        if not spark.catalog.tableExists(self.name):
            writer = template.limit(0).write.format("parquet")
            if self.partition_by:
                writer = writer.partitionBy(*self.partition_by)
            try:
                writer.saveAsTable(self.name)
            except Exception as exc:  # no such database, no permission, a bad column name...
                raise SparkSinkError(f"cannot create table {self.name}: {first_line(exc)}") from exc
        else:
            self._check(spark, template)
        rows = spark.sql(f"DESCRIBE TABLE EXTENDED {self.name}").collect()
        location = next((r[1] for r in rows if r[0] == "Location"), None)
        if not location:
            raise SparkSinkError(f"table {self.name} has no location in the catalog")
        return local_path(str(location), f"table {self.name}'s location")

    def _check(self, spark: Any, template: Any) -> None:
        table = spark.table(self.name)
        have = {f.name: f.dataType.simpleString() for f in table.schema.fields}
        want = {f.name: f.dataType.simpleString() for f in template.schema.fields}
        if have != want:
            missing = sorted(set(want) - set(have))
            extra = sorted(set(have) - set(want))
            changed = sorted(n for n in set(have) & set(want) if have[n] != want[n])
            details = "; ".join(
                part
                for part in (
                    f"not in the table: {missing}" if missing else "",
                    f"only in the table: {extra}" if extra else "",
                    ", ".join(f"{n} is {have[n]} in the table, {want[n]} here" for n in changed),
                )
                if part
            )
            raise SparkSchemaError(
                f"table {self.name} has other columns than the batches: {details}"
            )
        partitions = [
            c.name for c in spark.catalog.listColumns(self.name) if getattr(c, "isPartition", False)
        ]
        if list(self.partition_by) != partitions:
            raise SparkSchemaError(
                f"table {self.name} is partitioned by {partitions}, the sink by "
                f"{list(self.partition_by)}"
            )

    def after_commit(self, spark: Any, files: list[str]) -> None:
        """Register new partitions in the catalog and drop cached file listings."""
        if self.partition_by:
            seen: set[str] = set()
            for relative in files:
                directory = relative.rpartition("/")[0]
                if directory and directory not in seen:
                    seen.add(directory)
                    spec = _partition_spec(directory)
                    spark.sql(f"ALTER TABLE {self.name} ADD IF NOT EXISTS PARTITION ({spec})")
        spark.sql(f"REFRESH TABLE {self.name}")


def _partition_spec(directory: str) -> str:
    """``day=2026-11-25/region=eu`` as ``day = '2026-11-25', region = 'eu'``."""
    parts = []
    for segment in directory.split("/"):
        column, _, value = segment.partition("=")
        value = urllib.parse.unquote(value)
        literal = (
            "NULL"
            if value == "__HIVE_DEFAULT_PARTITION__"
            else "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
        )
        parts.append(f"`{column}` = {literal}")
    return ", ".join(parts)
