"""headrace's Spark sink plugin: pipeline batches into parquet or tables through PySpark.

A distribution of its own, ``headrace-spark`` (this directory's pyproject.toml), written as any
plugin would be: it registers the sink ``spark`` (entry-point group ``headrace.sinks``) and the
command ``headrace demo`` (group ``headrace.commands``: :mod:`headrace_spark.cli`), and headrace
never imports it by name. ``pip install 'headrace[spark]'`` installs it. See docs/spark.md.
"""

from __future__ import annotations

from headrace_spark.compact import CompactionReport, compact
from headrace_spark.errors import (
    LedgerError,
    SparkJobCancelled,
    SparkPythonError,
    SparkSchemaError,
    SparkSessionError,
    SparkSinkError,
    SparkWriteError,
)
from headrace_spark.schema import METADATA_SCHEMA, TableBuilder, schema_of
from headrace_spark.session import embedded_conf, start_session
from headrace_spark.sink import CommitInfo, SparkSink
from headrace_spark.targets import ParquetTarget, TableTarget

__all__ = [
    "METADATA_SCHEMA",
    "CommitInfo",
    "CompactionReport",
    "LedgerError",
    "ParquetTarget",
    "SparkJobCancelled",
    "SparkPythonError",
    "SparkSchemaError",
    "SparkSessionError",
    "SparkSink",
    "SparkSinkError",
    "SparkWriteError",
    "TableBuilder",
    "TableTarget",
    "compact",
    "embedded_conf",
    "schema_of",
    "start_session",
]
