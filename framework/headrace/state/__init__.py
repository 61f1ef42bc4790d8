"""Stateful operators: keyed state, windows over event time, and their snapshots.

The pure parts, with no I/O: window assigners (:class:`TumblingWindow`, :class:`SlidingWindow`,
:class:`SessionWindow`), the watermark and the open windows of every key
(:class:`WindowOperator`), aggregates (:func:`count`, :func:`sum_of`, ...), per-key state with a
time to live (:class:`KeyedOperator`). And :class:`SnapshotStore`, which keeps an operator's
snapshots in a KV bucket by compare-and-set. A pipeline uses them through ``key_by``
(``Node.key_by(...).window(...)``, ``.stateful_map(...)``, ``.fold(...)``, ``.reduce(...)``);
docs/state.md is the guide.
"""

from headrace.state.aggregates import (
    Aggregate,
    collect,
    count,
    max_of,
    mean_of,
    min_of,
    sum_of,
)
from headrace.state.disk import StateFile
from headrace.state.disk_windows import DiskWindowOperator
from headrace.state.errors import (
    LateRecord,
    LeaseError,
    SnapshotCorrupt,
    StateConflict,
    StateConsumerChanged,
    StateError,
    StateFenced,
    StateLimitExceeded,
    StateStorageError,
    StateStreamRecreated,
)
from headrace.state.joins import Joined
from headrace.state.keyed import KeyedOperator
from headrace.state.leases import LeaseChanges, LeaseTable, PartitionLeases
from headrace.state.snapshots import DEFAULT_STATE_BUCKET, SnapshotHead, SnapshotStore
from headrace.state.windows import (
    Duration,
    Instant,
    SessionWindow,
    SlidingWindow,
    TumblingWindow,
    WindowAssigner,
    WindowError,
    WindowOperator,
    WindowResult,
    duration_micros,
    from_micros,
    to_micros,
)

__all__ = [
    "DEFAULT_STATE_BUCKET",
    "Aggregate",
    "DiskWindowOperator",
    "Duration",
    "Instant",
    "Joined",
    "KeyedOperator",
    "LateRecord",
    "LeaseChanges",
    "LeaseError",
    "LeaseTable",
    "PartitionLeases",
    "SessionWindow",
    "SlidingWindow",
    "SnapshotCorrupt",
    "SnapshotHead",
    "SnapshotStore",
    "StateConflict",
    "StateConsumerChanged",
    "StateError",
    "StateFenced",
    "StateFile",
    "StateLimitExceeded",
    "StateStorageError",
    "StateStreamRecreated",
    "TumblingWindow",
    "WindowAssigner",
    "WindowError",
    "WindowOperator",
    "WindowResult",
    "collect",
    "count",
    "duration_micros",
    "from_micros",
    "max_of",
    "mean_of",
    "min_of",
    "sum_of",
    "to_micros",
]
