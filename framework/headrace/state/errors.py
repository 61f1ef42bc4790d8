"""Errors of stateful operators (keyed state, windows, their snapshots).

Two kinds, as for the commit protocol (``headrace.commits.errors``):

- :class:`StateConflict` and its subclasses say the state cannot be kept *safely*: another
  worker wrote the operator's snapshot (two owners of one state would each count what the
  other counted), or the stored snapshot cannot be read. Retrying would fail the same, and
  failing the records would lose them, so the pipeline stops and its held messages are
  redelivered after their ack wait.
- :class:`LateRecord` is not raised at anyone: it is the reason a record that came after the
  watermark passed its event time is dead-lettered with (``Headrace-Reason``), and counted.
"""

from __future__ import annotations

from headrace.errors import HeadraceError


class StateError(HeadraceError):
    """Base class of the errors of stateful operators."""


class StateConflict(StateError):
    """The operator's state cannot be kept without losing or repeating records; the pipeline
    stops, whatever the operator's restart policy."""

    #: Never restarted by a supervisor (headrace.actors.supervision): it would fail the same.
    restartable = False


class StateFenced(StateConflict):
    """Another worker saved a snapshot of this operator's state since this one loaded it: two
    processes run the same stateful operator. The one that finds out stops; its messages go to
    the other."""


class SnapshotCorrupt(StateConflict):
    """The stored snapshot is incomplete or does not decode (a chunk missing, a checksum that
    does not match, a format from a newer headrace). ``headrace state reset`` starts over."""


class StateStreamRecreated(StateConflict):
    """A stream feeding the operator was deleted and created again since its state was saved:
    the sequences the state took in name messages of the old stream, and new messages under
    the same numbers would be skipped as taken. Reset the operator's state to start over."""


class StateConsumerChanged(StateConflict):
    """The operator's state was built from what one durable consumer delivered, and the
    pipeline now reads the stream through another: the new consumer would deliver again what
    the state already counted (or skip what it has not). Go back to the consumer, or reset
    the operator's state."""


class StateLimitExceeded(StateConflict):
    """The state grew past a limit the operator was given (``max_keys``): stopping is better
    than growing until the process is killed for its memory. Raise the limit, shorten the
    windows or the key TTL, or partition the keys over more workers."""


class StateStorageError(StateConflict):
    """The local file of an operator kept on disk (``backend="disk"``) cannot be written or
    read: the disk is full, the directory is not writable, the file was removed under it. The
    pipeline stops; its held messages come again after their ack wait, and the operator
    starts from its last snapshot once the disk is fixed."""


class LeaseError(StateConflict):
    """The leases on a pipeline's partitions cannot be trusted: a lease or member record in
    the bucket does not decode, or a worker holds a partition under another number of
    partitions (workers that split the keys differently would each own a key). Stopping is
    better than owning a key twice."""


class LateRecord(StateError, ValueError):
    """A record whose event time was below the operator's watermark when it came: every window
    it belongs to may already have been emitted. It is dead-lettered with this as its reason,
    never silently dropped."""

    def __init__(self, operator: str, event_time: str, watermark: str) -> None:
        super().__init__(
            f"late record for {operator!r}: event time {event_time} is behind the watermark "
            f"{watermark} (raise the operator's lateness to admit such records)"
        )
        self.operator = operator
        self.event_time = event_time
        self.watermark = watermark
