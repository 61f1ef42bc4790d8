"""Counters of a running pipeline, for progress views, health and metrics.

Plain attributes updated in place by the pipeline's actors (one thread, no locks); read them
at any time. ``snapshot()`` gives a dict for logs and metrics.

Several runs seen as one (the partitions' copies of one process, the worker processes of
``headrace run --workers``) add their snapshots up: :func:`add_counts` sums the counters and
leaves out the :data:`LEVELS`, which say what is so now, not what has happened, and so are not
kept once a run has stopped; :func:`merge_states` shows each actor's most telling state.

A count alone does not say what is wrong (``errors=900``): every operator and sink failure the
pipeline survives is reported through :meth:`PipelineStats.failure`, which counts it (in total,
and per actor and error type in ``failures``), keeps it as ``last_failure`` (the error, the actor,
the stream and sequence of the message concerned) and hands it to ``on_failure``, the hook
through which ``headrace run`` turns failures into events.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from headrace.jetstream.message import JsMsg
    from headrace.pipeline.record import Record

#: Error types counted apart per actor in ``failures``; more are counted as ``other``, so that
#: a metric labelled by them stays small whatever the code raises.
MAX_ERROR_TYPES = 10


@attrs.frozen(slots=True, kw_only=True)
class Failure:
    """One failure the pipeline survived: what failed, where, and on which message."""

    #: The actor that failed: ``filter:valid``, ``sink:lake``, ``ack-tracker``.
    actor: str
    #: Its node's name in the graph (``valid``, ``lake``); the actor's name for the tracker.
    node: str
    error: BaseException
    #: The stream and stream sequence of the (first) message concerned, if one is.
    stream: str | None = None
    seq: int | None = None
    #: How many times that message has been delivered.
    delivered: int | None = None
    #: Records concerned: 1 for an operator's record, the batch's size for a sink write.
    records: int = 1
    #: When (Unix time).
    at: float = 0.0

    @property
    def text(self) -> str:
        """The error in one line: ``NameError: name 'x' is not defined``."""
        message = " ".join(str(self.error).split())
        name = type(self.error).__name__
        return f"{name}: {message}" if message else name

    def fields(self) -> dict[str, Any]:
        """For an event or a log line: ``stage`` (the node), ``actor``, ``error`` (the text),
        ``stream``, ``seq``, ``delivered``, ``records``."""
        return {
            "stage": self.node,
            "actor": self.actor,
            "error": self.text,
            "stream": self.stream,
            "seq": self.seq,
            "delivered": self.delivered,
            "records": self.records,
        }


def _not_snapshot(attribute: attrs.Attribute[Any], _value: Any) -> bool:
    return attribute.name not in ("last_failure", "on_failure")


@attrs.define(slots=True)
class PipelineStats:
    """What a run has done, counted as it goes (``run.stats``; ``headrace run`` reports it as
    progress and Prometheus metrics): counters from 0 at the run's start, and a few levels
    (``retrying``, ``lag``, ``ack_pending``) that go up and down. :meth:`snapshot` copies the
    figures."""

    #: JetStream messages taken from the sources.
    messages_in: int = 0
    #: Of those, messages delivered more than once (a redelivery after a crash, a nak, an ack
    #: wait that ran out).
    redeliveries: int = 0
    #: Records sinks committed (written, or taken by a sink that does not skip).
    records_out: int = 0
    #: Records sinks left out as already committed (``Batch.skipped``: redeliveries of
    #: messages they had written, after a crash, a stall past ``ack_wait``, a nak); their
    #: messages are acked, and they are not in ``records_out``.
    records_skipped: int = 0
    #: Records a filter dropped (their messages acked when nothing else holds them).
    dropped: int = 0
    #: Sink writes that committed.
    batches_committed: int = 0
    #: Sink writes that failed (each is retried, or its bad records isolated).
    batches_failed: int = 0
    #: Pauses before writing a failed batch again.
    sink_retries: int = 0
    #: Sinks in a run of failures right now (no write has succeeded since the first).
    retrying: int = 0
    #: Messages acked (everything they became was committed, or dropped).
    acks: int = 0
    #: Messages naked (a failure; delivered again after a backoff).
    naks: int = 0
    #: Messages terminated (poison: dead-lettered first when a ``dead_letter`` is set).
    terms: int = 0
    #: Poison messages whose copy went to the dead-letter subject.
    dead_lettered: int = 0
    #: Poison messages terminated with no dead-letter copy (no ``dead_letter`` set).
    terminated_unkept: int = 0
    #: ``+WPI`` sent: messages kept from redelivery while a commit takes long.
    in_progress: int = 0
    #: Redeliveries of messages the pipeline still held (their ``+WPI`` came too late: a
    #: starved host, a stalled loop): not taken again (not in ``messages_in``); the held
    #: message answers for the newest delivery.
    redelivered_held: int = 0
    #: Operator and sink failures (each also in ``failures``).
    errors: int = 0
    #: Seconds spent in sink writes that committed, in all and the last one.
    commit_seconds_total: float = 0.0
    commit_seconds_last: float = 0.0
    #: The sink of that last commit.
    commit_last_sink: str = ""
    #: Messages the consumer still has for us (num_pending from the last message's metadata).
    lag: int = 0
    #: Deliveries taken and not yet acked, naked or terminated.
    ack_pending: int = 0
    #: ``errors`` by actor and error type: ``{"filter:valid": {"NameError": 900}}``.
    failures: dict[str, dict[str, int]] = attrs.field(factory=dict)
    #: The latest failure (not in the snapshot: it holds the exception).
    last_failure: Failure | None = None
    #: Told of each failure as it is counted; must neither block nor raise.
    on_failure: Callable[[Failure], None] | None = None

    def failure(
        self,
        actor: str,
        node: str,
        error: BaseException,
        records: Sequence[Record] = (),
        msg: JsMsg | None = None,
    ) -> Failure:
        """Count a failure of ``actor`` (node ``node``) on ``records`` (or on message ``msg``),
        keep it as the last one, and tell ``on_failure``."""
        self.errors += 1
        by_type = self.failures.setdefault(actor, {})
        kind = type(error).__name__
        if kind not in by_type and len(by_type) >= MAX_ERROR_TYPES:
            kind = "other"
        by_type[kind] = by_type.get(kind, 0) + 1
        if msg is None and records:
            msg = records[0].delivery.msg
        stream = seq = delivered = None
        if msg is not None:
            try:
                meta = msg.metadata
                stream, seq, delivered = meta.stream, meta.stream_seq, meta.num_delivered
            except Exception:  # a message without JetStream metadata: said without
                pass
        failure = Failure(
            actor=actor,
            node=node,
            error=error,
            stream=stream,
            seq=seq,
            delivered=delivered,
            records=max(len(records), 1),
            at=time.time(),
        )
        self.last_failure = failure
        if self.on_failure is not None:
            self.on_failure(failure)
        return failure

    def snapshot(self) -> dict[str, Any]:
        return attrs.asdict(self, filter=_not_snapshot)


#: Fields of the snapshot that are levels (what is so now), not counts (what has happened): a
#: run that stopped has none any more, so they are not carried over from it.
LEVELS = frozenset({"ack_pending", "retrying", "lag", "commit_seconds_last", "commit_last_sink"})
#: The field that counts failures per actor and error type: added up key by key.
FAILURES = "failures"


def is_number(value: Any) -> bool:
    """An int or a float that is not a bool (a figure that adds up)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def add_failures(into: dict[str, Any], counts: Any) -> None:
    """Add ``counts`` (a snapshot's ``failures``: actor -> error type -> count) to
    ``into[FAILURES]``; anything else in ``counts`` (a report read from another process) is
    left out."""
    if not isinstance(counts, dict):
        return
    total: dict[str, dict[str, int]] = into.setdefault(FAILURES, {})
    for actor, by_type in counts.items():
        if not isinstance(by_type, dict):
            continue
        mine = total.setdefault(actor, {})
        for kind, n in by_type.items():
            if is_number(n):
                mine[kind] = mine.get(kind, 0) + n


def add_counts(
    into: dict[str, Any], snapshot: Mapping[str, Any], levels: frozenset[str] = LEVELS
) -> None:
    """Add the counts of ``snapshot`` (a :meth:`PipelineStats.snapshot`) to ``into``: every
    number but the ``levels``, and the failures key by key. What a run that stopped did is
    kept this way, so that totals never go down (Prometheus counters)."""
    for key, value in snapshot.items():
        if key not in levels and is_number(value):
            into[key] = into.get(key, 0) + value
        elif key == FAILURES:
            add_failures(into, value)


#: Actor states, most telling first: the merged view of an actor shows the first one that any
#: run reports (one failed sink shows, though the other runs' sinks run).
STATE_ORDER = ("failed", "restarting", "starting", "draining", "running", "stopped")


def merge_states(runs: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """Actor -> state over several runs of one pipeline (its partitions' copies, its worker
    processes), which name their actors alike: the most telling state any of them reports."""

    def rank(state: str) -> int:
        # A state this module does not know is shown rather than hidden.
        return STATE_ORDER.index(state) if state in STATE_ORDER else -1

    merged: dict[str, str] = {}
    for states in runs:
        for actor, state in states.items():
            if actor not in merged or rank(state) < rank(merged[actor]):
                merged[actor] = state
    return merged


#: The prefix of a stateful operator's stage name (``stateful:<node>``).
STATEFUL_PREFIX = "stateful:"
#: The key of :func:`state_figures` in the stats ``headrace run`` reports (progress, metrics),
#: present when the pipeline has stateful operators.
STATEFUL = "stateful"


#: The state figures a stateful stage counts from 0 when it starts (``late`` is not one: it is
#: kept in the state and restored with it).
STATE_COUNTS = (
    "snapshots",
    "snapshot_seconds",
    "results_emitted",
    "skipped_redeliveries",
    "backpressure_waits",
)


def state_figures(stages: Mapping[str, Any], now: float) -> dict[str, dict[str, Any]]:
    """The figures of the stateful operators among ``stages`` (a run's ``stages``), by
    operator name: their :class:`~headrace.pipeline.stateful.StateStats`, and two lags of the
    watermark (seconds; None before it exists): ``watermark_lag``, the newest event time less
    the watermark (about the lateness, more while records come out of order), and
    ``event_time_lag``, ``now`` (Unix time) less the watermark (how far event time is behind
    the clock: large while old data is replayed)."""
    found: dict[str, dict[str, Any]] = {}
    for name, stage in stages.items():
        stats = getattr(stage, "stats", None)
        if not name.startswith(STATEFUL_PREFIX) or stats is None:
            continue
        figures: dict[str, Any] = attrs.asdict(stats)
        spec = getattr(stage, "spec", None)
        figures["kind"] = getattr(spec, "kind", None)
        mark, newest = figures.get("watermark"), figures.get("max_event_time")
        figures["watermark_lag"] = None if mark is None or newest is None else newest - mark
        figures["event_time_lag"] = None if mark is None else now - mark
        found[name.removeprefix(STATEFUL_PREFIX)] = figures
    return found
