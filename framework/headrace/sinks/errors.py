"""Errors of the sinks package: finding and loading sink plugins, and the built-in sinks.

The errors of the contract itself (:class:`SinkError`, the base of these;
:class:`SinkUnavailable`, :class:`RecordsRejected`, :class:`SinkNotOpen`) are beside it, in
:mod:`headrace.pipeline.sink`.
"""

from __future__ import annotations

from collections.abc import Iterable

from headrace.pipeline.sink import SinkError


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
