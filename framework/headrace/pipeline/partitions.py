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
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from headrace.pipeline.errors import PipelineError
from headrace.pipeline.graph import Pipeline
from headrace.pipeline.partitioning import Partitioning
from headrace.state.errors import StateConflict
from headrace.state.leases import DEFAULT_TTL, PartitionLeases

if TYPE_CHECKING:
    from headrace.jetstream.context import JetStream
    from headrace.nats.connection import Connection
    from headrace.pipeline.nodes import Node

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


async def run_partitioned(
    pipe: Pipeline,
    nc: Connection,
    partitioning: Partitioning,
    *,
    worker: str | None = None,
    ttl: float = DEFAULT_TTL,
    js: JetStream | None = None,
    on_change: Callable[[frozenset[int], frozenset[int]], None] | None = None,
) -> None:
    """Run, until cancelled, the partitions of ``pipe`` this worker holds leases on (see the
    module docs). Cancelling drains every partition's copy, then releases the leases so that
    the other workers take them over at once."""
    from headrace.jetstream.context import JetStream

    pipe.validate()
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
                    async with graph.running(nc):
                        await stop.wait()
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
            for partition in sorted(gained):
                stops[partition], done[partition] = trio.Event(), trio.Event()
                nursery.start_soon(run_one, partition, stops[partition], done[partition])
            if on_change is not None:
                on_change(gained, lost)

        try:
            await leases.run(changed)
        finally:
            with trio.CancelScope(shield=True):
                for stop in stops.values():
                    stop.set()
                for finished in done.values():
                    await finished.wait()
                await leases.release_all()
