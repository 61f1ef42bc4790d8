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
    ``__cause__`` holds Spark's own error."""


class SparkJobCancelled(SparkWriteError):
    """The batch's Spark job was cancelled (the pipeline stopped while it ran)."""


class LedgerError(SparkSinkError):
    """The output's commit ledger cannot be read, so the sink cannot know what it holds."""
