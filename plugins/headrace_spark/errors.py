"""Errors of the Spark sink. All are :class:`~headrace.sinks.errors.SinkError`s: raised from
``write_batch`` they fail the batch, so its messages are naked and come again; nothing is acked
that Spark did not commit."""

from __future__ import annotations

from headrace.sinks.errors import SinkError


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
