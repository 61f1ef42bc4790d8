"""Sinks: where a pipeline's records end up.

The contract (``open``/``write_batch``/``close``) is in :mod:`headrace.pipeline.sink`; plugins are
found by name through the ``headrace.sinks`` entry point group (:mod:`.registry`). Built in:
:class:`JsonlSink` (``jsonl``), :class:`MemorySink` (``memory``), :class:`StdoutSink`
(``stdout``). For a file sink whose output any number of workers share: :class:`SharedWriter`
(the per-batch commit algorithm) over :class:`SharedOutput` (the files). See ``docs/sinks.md``.

What ``__all__`` lists is the public API; the modules under this package are internal and may
change (docs/architecture.md, "Public and internal").
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
from headrace.sinks.shared_output import SharedOutput, SweepReport
from headrace.sinks.shared_writer import (
    SharedWriter,
    Staged,
    batch_key,
    once_per_message,
    sequences,
)
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
    "SharedOutput",
    "SharedWriter",
    "SinkError",
    "SinkLoadError",
    "SinkNotOpen",
    "SinkUnavailable",
    "Staged",
    "StdoutSink",
    "SweepReport",
    "UnknownSink",
    "UnserialisableValue",
    "available_sinks",
    "batch_key",
    "decode_value",
    "load_sink",
    "once_per_message",
    "record_to_dict",
    "record_to_line",
    "sequences",
]
