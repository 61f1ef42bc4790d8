"""Errors of the Spark plugin.

The sink's are :class:`~headrace.pipeline.SinkError`s: raised from ``write_batch`` they fail
the batch, so its messages are naked and come again; nothing is acked that Spark did not commit.
The ``jetstream`` data source's are :class:`JetStreamFormatError`s (end of the module)."""

from __future__ import annotations

from headrace.errors import HeadraceError
from headrace.pipeline import SinkError


class SparkSinkError(SinkError):
    """Base class of the Spark sink's errors."""


class SparkSessionError(SparkSinkError):
    """No Spark session could be made: no Java, a bad master URL, Spark Connect without its
    client libraries."""


class SparkSchemaError(SparkSinkError, TypeError):
    """Records do not fit the declared schema (a missing field, a value of the wrong type), or
    the schema itself cannot be used. ``column`` names the column when one is at fault."""

    #: Records that do not fit: split the batch at once to isolate them, never wait for them.
    transient = False

    def __init__(self, message: str, column: str | None = None) -> None:
        self.column = column
        super().__init__(message)


class SparkWriteError(SparkSinkError):
    """Spark failed to write a batch (an unwritable path, an executor lost, a failed job).
    ``__cause__`` holds Spark's own error.

    ``transient`` says whose fault it is (headrace.pipeline.sink_retry): True when the
    connection to Spark is lost (an outage: the batch is written again, never split), None
    when Spark does not say (written again, then split)."""

    transient: bool | None = None

    def __init__(self, message: str, *, transient: bool | None = None) -> None:
        super().__init__(message)
        if transient is not None:
            self.transient = transient


class SparkPythonError(SparkWriteError):
    """A Spark Python worker failed while Spark wrote a batch. ``python_error`` is the worker's
    own error, the last line of its traceback (``ValueError: bad thing``), which Spark's message
    buries under "An exception was thrown from the Python worker".

    Raised by a function the batch's rows went through (a UDF of ``transform``), it is the
    records' fault: ``transient`` is False, and the pipeline splits the batch to set the failing
    records aside. When the worker itself failed (it could not start, or import a module such as
    pyarrow), every batch would fail alike: ``transient`` stays None, and the batch is written
    again, never blamed on its records."""

    def __init__(self, message: str, python_error: str, *, in_function: bool) -> None:
        super().__init__(message, transient=False if in_function else None)
        self.python_error = python_error


class SparkJobCancelled(SparkWriteError):
    """The batch's Spark job was cancelled (the pipeline stopped while it ran)."""


class LedgerError(SparkSinkError):
    """The output's commit ledger cannot be read, so the sink cannot know what it holds."""


# -- the ``jetstream`` data source (headrace_spark.datasource) -------------------------------------


class JetStreamFormatError(HeadraceError):
    """Base class of the errors of the ``jetstream`` Spark data source (reading a stream into
    Spark, writing rows to one). Raised in Spark's Python workers, they reach the query as
    Spark's own error, with this message in it; they never carry a secret."""


class JetStreamOptionError(JetStreamFormatError, ValueError):
    """An option of the ``jetstream`` format is missing, unknown or malformed. ``option`` names
    it (as written in the docs' options table)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"jetstream option {option!r}: {message}")
        self.option = option


class DataLost(JetStreamFormatError):
    """Messages of the range a query must read were removed from the stream before they were
    read (retention limits, a purge): sequences ``first`` to ``last`` of ``stream``. Raised with
    ``failOnDataLoss=true`` (the default); with ``false`` the range is skipped with a warning."""

    def __init__(self, stream: str, first: int, last: int) -> None:
        count = last - first + 1
        super().__init__(
            f"stream {stream!r}: sequences {first}-{last} ({count} messages) were removed "
            "before the query read them (retention limits or a purge). Set failOnDataLoss=false "
            "to skip what is gone, or start a new query (a new checkpoint) from what is left"
        )
        self.stream = stream
        self.first = first
        self.last = last


class SourceStreamRecreated(JetStreamFormatError):
    """The stream the query reads was deleted and created again under its name: its sequences
    started again at 1, so the query's offsets no longer mean what they meant. Start a new
    query (a new checkpoint location) to read the new stream."""

    def __init__(self, stream: str, was: str, now: str) -> None:
        super().__init__(
            f"stream {stream!r} was deleted and created again (created {was}, now {now}): the "
            "query's offsets belong to the old stream; start the query again with a new "
            "checkpoint location to read the new one"
        )
        self.stream = stream
        self.was = was
        self.now = now


class PublishFailed(JetStreamFormatError):
    """Rows could not be written to the stream: the stream refused them (``__cause__`` says
    why) or never confirmed them in time. Spark retries the task; the retry's messages carry
    the same ``Nats-Msg-Id``s, so what was stored already is not stored twice."""
