"""Sinks: where a pipeline's records end up.

The contract (``open``/``write_batch``/``close``) is in :mod:`headrace.pipeline.sink`; plugins are
found by name through the ``headrace.sinks`` entry point group (:mod:`.registry`). Built in:
:class:`JsonlSink` (``jsonl``), :class:`MemorySink` (``memory``), :class:`StdoutSink`
(``stdout``). See ``docs/sinks.md``.
"""

from __future__ import annotations

from headrace.sinks.errors import (
    CorruptOutput,
    OutputInUse,
    RecordsRejected,
    SinkError,
    SinkLoadError,
    SinkNotOpen,
    SinkUnavailable,
    UnknownSink,
    UnserialisableValue,
)
from headrace.sinks.jsonl import JsonlSink
from headrace.sinks.lines import decode_value, record_to_dict, record_to_line
from headrace.sinks.memory import MemorySink
from headrace.sinks.output import DirectoryLock, SeqSet
from headrace.sinks.registry import GROUP, available_sinks, load_sink
from headrace.sinks.stdout import StdoutSink

__all__ = [
    "GROUP",
    "CorruptOutput",
    "DirectoryLock",
    "JsonlSink",
    "MemorySink",
    "OutputInUse",
    "RecordsRejected",
    "SeqSet",
    "SinkError",
    "SinkLoadError",
    "SinkNotOpen",
    "SinkUnavailable",
    "StdoutSink",
    "UnknownSink",
    "UnserialisableValue",
    "available_sinks",
    "decode_value",
    "load_sink",
    "record_to_dict",
    "record_to_line",
]
