"""JetStream as a Spark data source: the format ``jetstream``, read and written by Spark's own
engine (PySpark's Python Data Source API, ``pyspark.sql.datasource``), with headrace's client
inside the executors.

``headrace_spark.register(spark)`` registers it on a session; then::

    df = (spark.readStream.format("jetstream")
          .option("servers", "nats://host:4222").option("stream", "ORDERS")
          .option("startingOffsets", "earliest").load())

reads the stream as micro-batches of sequence ranges (``spark.read`` reads one range), and
``df.writeStream.format("jetstream")`` / ``df.write.format("jetstream")`` publish rows. Exactly
once, in both directions, without a consumer or acks: the source's offsets are stream sequences
that Spark checkpoints and replays; the sink's messages carry ids derived from the query, the
micro-batch, the partition and the row, which the stream deduplicates. docs/spark-streaming.md
is the guide; the modules:

- ``options``: the options, checked on the driver, secrets kept out of every ``repr``;
- ``offsets``: the offset (a stream sequence and the stream's identity) and the partitions;
- ``source``: the driver's side of reading (start, each trigger's end, admission control);
- ``reading``: one partition read in a task (batched Direct Get, ADR-31);
- ``writing``: the sink.

The parts a caller outside the package uses (the benchmarks measure a task's read with them)
are listed in ``__all__`` and load on first use, since ``reading`` imports pyarrow.
"""

from __future__ import annotations

import importlib
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from headrace_spark.errors import JetStreamOptionError

#: The source's rows (``timestamp``: when the stream stored the message, for watermarks).
SOURCE_SCHEMA = (
    "subject string, data binary, headers map<string,array<string>>, stream string, "
    "seq bigint, timestamp timestamp"
)


def source_schema() -> StructType:
    """:data:`SOURCE_SCHEMA` as a ``StructType``, built without a session (Spark's Python
    workers have none to parse DDL with)."""
    return StructType(
        [
            StructField("subject", StringType()),
            StructField("data", BinaryType()),
            StructField("headers", MapType(StringType(), ArrayType(StringType()))),
            StructField("stream", StringType()),
            StructField("seq", LongType()),
            StructField("timestamp", TimestampType()),
        ]
    )


class JetStreamDataSource(DataSource):
    """The ``jetstream`` format (see the package's docs)."""

    @classmethod
    def name(cls) -> str:
        return "jetstream"

    def schema(self) -> StructType:
        return source_schema()

    def _check_schema(self, schema: StructType) -> None:
        expected = source_schema()
        if [(f.name, f.dataType) for f in schema.fields] != [
            (f.name, f.dataType) for f in expected.fields
        ]:
            raise JetStreamOptionError(
                "schema",
                f"the jetstream source's schema is fixed ({SOURCE_SCHEMA}); "
                "do not give .schema(...), select and cast the columns instead",
            )

    def reader(self, schema: StructType) -> DataSourceReader:
        from headrace_spark.datasource.options import SourceSpec
        from headrace_spark.datasource.source import JetStreamBatchReader

        self._check_schema(schema)
        return JetStreamBatchReader(SourceSpec.from_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from headrace_spark.datasource.options import SourceSpec
        from headrace_spark.datasource.source import JetStreamStreamReader

        self._check_schema(schema)
        return JetStreamStreamReader(SourceSpec.from_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from headrace_spark.datasource.options import SinkSpec
        from headrace_spark.datasource.writing import JetStreamBatchWriter, check_schema

        if overwrite:
            raise JetStreamOptionError(
                "mode", "a stream is appended to: use mode('append'), not overwrite"
            )
        spec = SinkSpec.from_options(self.options)
        return JetStreamBatchWriter(spec, check_schema(schema, spec))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from headrace_spark.datasource.options import SinkSpec
        from headrace_spark.datasource.writing import JetStreamStreamWriter, check_schema

        spec = SinkSpec.from_options(self.options)
        return JetStreamStreamWriter(spec, check_schema(schema, spec))


def register(spark: Any) -> None:
    """Register the ``jetstream`` format on ``spark`` (a classic or a Spark Connect session)."""
    spark.dataSource.register(JetStreamDataSource)


#: The parts of the source loaded on first use, and the module of each.
_WHERE = {
    "ARROW_SCHEMA": "reading",
    "read_range": "reading",
    "user_headers": "reading",
    "SequenceRange": "offsets",
    "SourceSpec": "options",
    "JetStreamBatchReader": "source",
}

__all__ = [
    "ARROW_SCHEMA",
    "SOURCE_SCHEMA",
    "JetStreamBatchReader",
    "JetStreamDataSource",
    "SequenceRange",
    "SourceSpec",
    "read_range",
    "register",
    "source_schema",
    "user_headers",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'headrace_spark.datasource' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"headrace_spark.datasource.{module}"), name)
    globals()[name] = value
    return value
