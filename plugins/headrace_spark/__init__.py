"""headrace's Spark plugin: pipeline batches into parquet or tables through PySpark, and
JetStream as a Spark data source (the format ``jetstream``: :func:`register`).

A distribution of its own, ``headrace-spark`` (this directory's pyproject.toml), written as any
plugin would be: it registers the sink ``spark`` (entry-point group ``headrace.sinks``) and the
command ``headrace demo`` (group ``headrace.commands``: :mod:`headrace_spark.cli`), and headrace
never imports it by name. ``pip install 'headrace[spark]'`` installs it. See docs/spark.md.

The names below load on first use: loading the ``demo`` command (which ``headrace --help``
does, to list it) imports this package, and the sink's modules import pyarrow, about 0.2 s.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Light modules (no pyarrow), imported at once. ``compact`` must be: the function shares its
# name with its module, and importing the module ``headrace_spark.compact`` later would bind the
# module to the package's name ``compact`` over a function loaded on first use.
from headrace_spark._version import __version__
from headrace_spark.compact import CompactionReport, compact
from headrace_spark.errors import (
    DataLost,
    JetStreamFormatError,
    JetStreamOptionError,
    LedgerError,
    PublishFailed,
    SourceStreamRecreated,
    SparkJobCancelled,
    SparkPythonError,
    SparkSchemaError,
    SparkSessionError,
    SparkSinkError,
    SparkWriteError,
)
from headrace_spark.targets import ParquetTarget, TableTarget

if TYPE_CHECKING:
    from headrace_spark.datasource import JetStreamDataSource, register
    from headrace_spark.schema import HEADERS_TYPE, METADATA_SCHEMA, TableBuilder, schema_of
    from headrace_spark.session import embedded_conf, start_session
    from headrace_spark.sink import CommitInfo, SparkSink
    from headrace_spark.staged_input import staged_frame

#: Each public name loaded on first use, and the module that defines it.
_WHERE = {
    "HEADERS_TYPE": "schema",
    "METADATA_SCHEMA": "schema",
    "TableBuilder": "schema",
    "JetStreamDataSource": "datasource",
    "register": "datasource",
    "schema_of": "schema",
    "embedded_conf": "session",
    "start_session": "session",
    "CommitInfo": "sink",
    "SparkSink": "sink",
    "staged_frame": "staged_input",
}

__all__ = [
    "HEADERS_TYPE",
    "METADATA_SCHEMA",
    "CommitInfo",
    "CompactionReport",
    "DataLost",
    "JetStreamDataSource",
    "JetStreamFormatError",
    "JetStreamOptionError",
    "LedgerError",
    "ParquetTarget",
    "PublishFailed",
    "SourceStreamRecreated",
    "SparkJobCancelled",
    "SparkPythonError",
    "SparkSchemaError",
    "SparkSessionError",
    "SparkSink",
    "SparkSinkError",
    "SparkWriteError",
    "TableBuilder",
    "TableTarget",
    "__version__",
    "compact",
    "embedded_conf",
    "register",
    "schema_of",
    "staged_frame",
    "start_session",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'headrace_spark' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"headrace_spark.{module}"), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
