"""Sinks: where a pipeline's records end up.

The contract (:class:`~headrace.pipeline.Sink`, what ``bind`` is given, and the errors a sink
raises) is in :mod:`headrace.pipeline`, below this package. Plugins are found by name through
the ``headrace.sinks`` entry point group (:mod:`.registry`). Built in:
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
    SinkLoadError,
    UnknownSink,
    UnserialisableValue,
)
from headrace.sinks.jsonl import JsonlSink
from headrace.sinks.lines import decode_value, record_to_dict, record_to_line
from headrace.sinks.memory import MemorySink
from headrace.sinks.output import DirectoryLock, SeqSet, fsync_directory, fsync_file, fsync_tree
from headrace.sinks.registry import GROUP, available_sinks, load_sink
from headrace.sinks.shared_output import (
    CONTROL,
    MANIFEST,
    STALE_AFTER,
    SWEEP_INTERVAL,
    SharedOutput,
    SweepReport,
)
from headrace.sinks.shared_writer import (
    SharedWriter,
    Staged,
    batch_key,
    once_per_message,
    sequences,
)
from headrace.sinks.stdout import StdoutSink

__all__ = [
    "CONTROL",
    "GROUP",
    "MANIFEST",
    "STALE_AFTER",
    "SWEEP_INTERVAL",
    "CorruptOutput",
    "DirectoryLock",
    "JsonlSink",
    "MemorySink",
    "OutputInUse",
    "SeqSet",
    "SharedOutput",
    "SharedWriter",
    "SinkLoadError",
    "Staged",
    "StdoutSink",
    "SweepReport",
    "UnknownSink",
    "UnserialisableValue",
    "available_sinks",
    "batch_key",
    "decode_value",
    "fsync_directory",
    "fsync_file",
    "fsync_tree",
    "load_sink",
    "once_per_message",
    "record_to_dict",
    "record_to_line",
    "sequences",
]
