"""Stateful pipelines over partitioned keys, with partitions leased to workers.

Keyed state must not be split between workers: every record of a key has to reach the one
operator that holds the key's state. The server does the splitting: the stream maps each
subject to one of ``n`` partitions by a token of it (a subject transform such as
``clicks.* -> clicks.{{partition(4,1)}}.{{wildcard(1)}}``), so every record of one user lands
in one partition, ``clicks.<p>.<user>``. :class:`Partitioning` names that layout.

Each partition is then a pipeline of its own: the graph copied with its sources filtered on
the partition's subjects, their durable consumers and its stateful operators named after the
partition (``per-minute-p3``: a state, a snapshot and a results' lineage per partition), its
sinks copied (each copy opened apart; shared outputs are made for many writers).
:func:`run_partitioned` runs, in one worker process, the copies of the partitions this worker
holds a lease on (``headrace.state.leases``), starting one when a lease is gained and draining
it when one is lost, so that its last snapshot is saved before the lease is handed over.

A partition whose state another worker saved meanwhile (this one's lease expired while it was
stalled, and the other took it) stops with :class:`~headrace.state.errors.StateFenced`; if the
lease is still this worker's, its copy starts again from the saved state.

What the copies do is seen as one run through :class:`PartitionRuns` (``headrace run`` shows
it as it shows a single run: progress, events, metrics).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
import trio

from headrace.pipeline.errors import PipelineError
from headrace.pipeline.graph import Pipeline
from headrace.pipeline.partitioning import Partitioning
from headrace.pipeline.stats import (
    LEVELS,
    STATE_COUNTS,
    Failure,
    PipelineStats,
    add_counts,
    merge_states,
    state_figures,
)
from headrace.state.errors import StateConflict
from headrace.state.leases import DEFAULT_TTL, PartitionLeases

if TYPE_CHECKING:
    from headrace.jetstream.context import JetStream
    from headrace.nats.connection import Connection
    from headrace.pipeline.nodes import Node
    from headrace.pipeline.runtime import PipelineRun

log = logging.getLogger("headrace.pipeline")

#: How long a partition whose copy failed waits before it starts again (seconds).
RESTART_PAUSE = 0.5


def partition_graph(pipe: Pipeline, partitioning: Partitioning, partition: int) -> Pipeline:
    """The copy of ``pipe`` that runs ``partition`` (see the module docs)."""
    if not 0 <= partition < partitioning.count:
        raise PipelineError(f"partition {partition} is not one of 0..{partitioning.count - 1}")
    copied = Pipeline(
        pipe.name,
        partitioning=None,  # a copy runs one partition
        dead_letter=pipe.dead_letter,
        max_deliveries=pipe.max_deliveries,
        nak_delay=pipe.nak_delay,
        nak_delay_max=pipe.nak_delay_max,
        drain_timeout=pipe.drain_timeout,
        max_in_flight=pipe.max_in_flight,
        commit_bucket=pipe.commit_bucket,
        state_bucket=pipe.state_bucket,
        sink_retry=pipe.sink_retry,
        allow_termination=pipe.allow_termination,
    )
    suffix = f"-p{partition}"
    made: dict[int, Node] = {}
    for node in pipe.nodes:
        changes: dict[str, Any] = {"pipeline": copied, "upstream": [], "downstream": []}
        if node.kind == "source":
            spec = node.source
            assert spec is not None
            if spec.durable is None:
                raise PipelineError(
                    f"source {node.name!r}: a partitioned pipeline needs durable consumers "
                    "(one per partition)"
                )
            changes["source"] = attrs.evolve(
                spec,
                durable=spec.durable + suffix,
                filter_subjects=(partitioning.subject_of(partition),),
            )
        elif node.kind == "stateful":
            changes["name"] = node.name + suffix
        elif node.kind == "sink":
            changes["sink_obj"] = copy.copy(node.sink_obj)
        new = attrs.evolve(node, **changes)
        copied.nodes.append(new)
        made[id(node)] = new
    for node in pipe.nodes:
        new = made[id(node)]
        new.upstream = [made[id(n)] for n in node.upstream]
        new.downstream = [made[id(n)] for n in node.downstream]
    return copied


@attrs.define(eq=False)
class PartitionRuns:
    """The copies :func:`run_partitioned` runs in this process, seen as one run: the figures a
    single run's stats, state and actors give, for progress views and metrics.

    A copy's stats start at 0 and end with it, and a copy stops whenever its partition is
    given up (for balance) or fenced: added up as they stand, the totals would go down. So the
    counts of every copy that stopped are kept (:meth:`stopped`) and added to those of the
    copies running. Levels (``lag``, ``ack_pending``, ``retrying``; :data:`LEVELS`) are summed
    over the partitions this process holds, each copy's own consumer and messages (so ``lag``
    adds up, unlike workers sharing one consumer); ``commit_seconds_last`` is the largest, the
    slowest of their last commits. A partition whose copy stopped keeps its last levels and
    actors' states until it is lost to another worker: the final figures then show the last
    lag, unsettled messages and stopped actors, as a single run's do, and a partition whose
    copy starts again after a fence shows how the last one ended.

    The stateful operators' figures are per copy, under the copy's name (``per-minute-p3``):
    the name its state has in KV and in ``headrace state show``; a figure such as the
    watermark means nothing summed over partitions, and with several workers each copy's
    figures come from the one worker that holds it, whatever moves. Those counted since the
    stage started (:data:`~headrace.pipeline.stats.STATE_COUNTS`: snapshots, their time) are
    kept over the copies of one partition in this process, as the stats are.
    """

    #: The partitions this process holds a lease on.
    held: frozenset[int] = frozenset()
    #: The copies running now, by partition.
    runs: dict[int, PipelineRun] = attrs.field(factory=dict)
    #: Told of each failure a copy survives (``PipelineStats.on_failure``); set before the run.
    on_failure: Callable[[Failure], None] | None = None
    #: True once the whole run drains (not when one partition is given up).
    draining: bool = False
    _carried: dict[str, Any] = attrs.field(factory=dict)
    _state_carried: dict[str, dict[str, float]] = attrs.field(factory=dict)
    _levels: dict[int, dict[str, Any]] = attrs.field(factory=dict)
    _states: dict[int, dict[str, str]] = attrs.field(factory=dict)

    def gained(self, partitions: frozenset[int]) -> None:
        self.held |= partitions

    def lost(self, partitions: frozenset[int]) -> None:
        """``partitions`` are another worker's now (their copies drained): their levels and
        states too."""
        self.held -= partitions
        for partition in partitions:
            self._levels.pop(partition, None)
            self._states.pop(partition, None)

    def released(self) -> None:
        """The run is over and its leases given back; its last levels and states stay for the
        final figures."""
        self.held = frozenset()

    def started(self, partition: int, run: PipelineRun) -> None:
        run.stats.on_failure = self.on_failure
        self.runs[partition] = run

    def stopped(self, partition: int, run: PipelineRun) -> None:
        """``run``, the copy of ``partition``, has stopped (drained or failed): keep what it
        counted, its last levels and its actors' states."""
        if self.runs.get(partition) is run:
            del self.runs[partition]
        counts = run.stats.snapshot()
        add_counts(self._carried, counts)
        self._levels[partition] = {key: counts[key] for key in LEVELS}
        self._states[partition] = run.states()
        for name, figures in state_figures(run.stages, 0.0).items():
            kept = self._state_carried.setdefault(name, {})
            for key in STATE_COUNTS:
                kept[key] = kept.get(key, 0) + figures.get(key, 0)

    def _levels_now(self) -> Iterator[dict[str, Any]]:
        """The levels of each partition: its running copy's, else its last copy's."""
        for run in self.runs.values():
            yield run.stats.snapshot()
        for partition, levels in self._levels.items():
            if partition not in self.runs:
                yield levels

    def _states_now(self) -> Iterator[dict[str, str]]:
        """The actors' states of each partition: its running copy's, else its last copy's."""
        for run in self.runs.values():
            yield run.states()
        for partition, states in self._states.items():
            if partition not in self.runs:
                yield states

    def snapshot(self) -> dict[str, Any]:
        """The copies' stats as one :meth:`PipelineStats.snapshot` (see the class docs)."""
        total = PipelineStats().snapshot()
        add_counts(total, self._carried)
        for run in self.runs.values():
            add_counts(total, run.stats.snapshot())
        levels = list(self._levels_now())
        for key in LEVELS - {"commit_last_sink"}:
            values = [figures[key] for figures in levels]
            if values:
                total[key] = max(values) if key == "commit_seconds_last" else sum(values)
        if levels:
            # The sink of the slowest last commit: the one commit_seconds_last shows.
            slowest = max(levels, key=lambda figures: figures["commit_seconds_last"])
            total["commit_last_sink"] = slowest["commit_last_sink"]
        return total

    def state_figures(self, now: float) -> dict[str, dict[str, Any]]:
        """The stateful operators' figures of the running copies, by copy (``per-minute-p3``),
        with the counts of the partition's earlier copies added (see the class docs)."""
        found: dict[str, dict[str, Any]] = {}
        for run in self.runs.values():
            for name, figures in state_figures(run.stages, now).items():
                for key, value in self._state_carried.get(name, {}).items():
                    figures[key] = figures.get(key, 0) + value
                found[name] = figures
        return dict(sorted(found.items()))

    def stop(self) -> None:
        """Stop every copy now, without waiting for its drain (``PipelineRun.stop``): a hard
        stop of the whole run, whose caller is cancelling ``run_partitioned``."""
        self.draining = True
        for run in self.runs.values():
            run.stop()

    def states(self) -> dict[str, str]:
        """Actor -> state over the copies (running, else the last), which name their actors
        alike but for the stateful ones and the consumers': the most telling state of each."""
        return merge_states(self._states_now())


async def _run_copy(
    pipe: Pipeline, nc: Connection, partition: int, runs: PartitionRuns, stop: trio.Event
) -> None:
    """Run ``pipe``, the copy of ``partition``, until ``stop``; ``runs`` sees it while it runs
    and keeps its counts once it has stopped (after its drain: its last acks count)."""
    run: PipelineRun | None = None
    try:
        async with pipe.running(nc) as run:
            runs.started(partition, run)
            await stop.wait()
    finally:
        if run is not None:
            runs.stopped(partition, run)


async def run_partitioned(
    pipe: Pipeline,
    nc: Connection,
    partitioning: Partitioning,
    *,
    worker: str | None = None,
    ttl: float = DEFAULT_TTL,
    js: JetStream | None = None,
    on_change: Callable[[frozenset[int], frozenset[int]], None] | None = None,
    runs: PartitionRuns | None = None,
) -> None:
    """Run, until cancelled, the partitions of ``pipe`` this worker holds leases on (see the
    module docs). Cancelling drains every partition's copy, then releases the leases so that
    the other workers take them over at once. ``runs``, if given, is kept up to date with the
    partitions held and their copies: what the caller looks at to see the run (progress,
    metrics)."""
    from headrace.jetstream.context import JetStream

    pipe.validate()
    seen = runs if runs is not None else PartitionRuns()
    context = js or JetStream(nc)
    leases = await PartitionLeases.open(
        context, pipe.name, partitioning.count, worker=worker, ttl=ttl
    )
    stops: dict[int, trio.Event] = {}
    done: dict[int, trio.Event] = {}

    async def run_one(partition: int, stop: trio.Event, finished: trio.Event) -> None:
        try:
            while not stop.is_set():
                graph = partition_graph(pipe, partitioning, partition)
                try:
                    await _run_copy(graph, nc, partition, seen, stop)
                except StateConflict as exc:  # fenced: another worker saved this state
                    log.warning("partition %d of %s: %s", partition, pipe.name, exc)
                    with trio.move_on_after(RESTART_PAUSE):
                        await stop.wait()
        finally:
            finished.set()

    async with trio.open_nursery() as nursery:

        async def changed(gained: frozenset[int], lost: frozenset[int]) -> None:
            for partition in sorted(lost):
                stop = stops.pop(partition, None)
                if stop is not None:
                    stop.set()
                    await done.pop(partition).wait()  # drained: its last snapshot is saved
            seen.lost(lost)
            seen.gained(gained)
            for partition in sorted(gained):
                stops[partition], done[partition] = trio.Event(), trio.Event()
                nursery.start_soon(run_one, partition, stops[partition], done[partition])
            if on_change is not None:
                on_change(gained, lost)

        try:
            await leases.run(changed)
        finally:
            seen.draining = True
            with trio.CancelScope(shield=True):
                for stop in stops.values():
                    stop.set()
                for finished in done.values():
                    await finished.wait()
                seen.released()
                await leases.release_all()
