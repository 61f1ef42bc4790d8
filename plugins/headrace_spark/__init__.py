"""headrace's Spark sink plugin: pipeline batches into parquet or tables through PySpark.

Registered as sink ``spark`` (entry point group ``headrace.sinks``); installed with the ``spark``
extra. See docs/spark.md.
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
