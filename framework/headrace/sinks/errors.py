"""Errors of the sinks package: finding and loading sink plugins, and the built-in sinks."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from headrace.errors import HeadraceError

if TYPE_CHECKING:
    from headrace.pipeline.record import Record


class SinkError(HeadraceError):
    """Base class of the errors raised by the sinks package."""


class UnknownSink(SinkError, LookupError):
    """No sink plugin is registered under ``name``; ``available`` lists the names there are."""

    def __init__(self, name: str, available: Iterable[str]) -> None:
        self.name = name
        self.available = sorted(available)
        names = ", ".join(self.available) if self.available else "none are installed"
        super().__init__(
            f"no sink named {name!r} (entry point group 'headrace.sinks'); available: {names}"
        )


class SinkLoadError(SinkError):
    """The plugin ``name`` is registered but could not be imported or created.

    ``target`` is the entry point's ``module:attr``; ``__cause__`` is the original error.
    """

    def __init__(self, name: str, target: str, reason: str) -> None:
        self.name = name
        self.target = target
        super().__init__(f"sink plugin {name!r} ({target}) {reason}")


class SinkNotOpen(SinkError):
    """A sink was written to before ``open()`` or after ``close()``."""


class OutputInUse(SinkError):
    """Another sink (in this process or another) holds the output directory."""


class CorruptOutput(SinkError):
    """An existing output file cannot be read back, so the sink cannot know what it holds.

    ``path`` is the file and ``line`` the 1-based line that failed.
    """

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        super().__init__(f"{path}, line {line}: {reason}")


class UnserialisableValue(SinkError, TypeError):
    """A record's value cannot be written as JSON (a set, a datetime, NaN...).

    Convert it in an operator before the sink (``map``), or write a sink for that type.
    """

    #: Bad records, not a sink that is down: the batch is split at once to isolate them
    #: (headrace.pipeline.sink_retry).
    transient = False


class SinkUnavailable(SinkError):
    """Raise (or subclass) it from ``write_batch`` when the sink's destination is down (a
    connection refused, a full disk): the batch is written again after a pause, never split
    to look for bad records (headrace.pipeline.sink_retry)."""

    transient = True


class RecordsRejected(SinkError):
    """Raised by ``write_batch`` after it committed the batch *except* some records that can
    never be written (a value that does not fit the sink's schema: a poison record).

    The pipeline acks the messages of the committed records and fails only the rejected ones
    (nak, then dead letter past ``max_deliveries``), so one bad record does not hold back, or
    dead-letter, the good records batched with it. ``rejected`` pairs each record with why it
    was rejected.
    """

    def __init__(self, rejected: Sequence[tuple[Record, BaseException]]) -> None:
        if not rejected:
            raise ValueError("RecordsRejected needs at least one rejected record")
        self.rejected = list(rejected)
        record, error = self.rejected[0]
        more = f" (and {len(self.rejected) - 1} more)" if len(self.rejected) > 1 else ""
        super().__init__(
            f"{len(self.rejected)} record(s) rejected, the rest of the batch committed; "
            f"{record.stream} #{record.stream_seq}: {error}{more}"
        )
