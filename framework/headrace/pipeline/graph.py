"""The pipeline DSL: a graph of sources, operators and sinks.

::

    pipe = Pipeline("orders-to-lake", dead_letter="orders.dead")
    orders = pipe.source(JetStreamSource(stream="ORDERS", durable="lake"))
    decoded = orders.map(json.loads, name="decode")
    decoded.filter(lambda o: o["qty"] > 1).sink(JsonlSink("big"), batch=BatchPolicy(1000))
    decoded.sink(MemorySink(), name="all")          # a second sink: fan-out
    pipe.merge(a, b)                                 # several sources into one flow

Operators take the record's value (``record=True`` passes the :class:`Record`); sync or async
functions; ``concurrency`` > 1 runs several at once, with output order kept for the whole batch
(``ordered="all"``), per subject (``"subject"``: one subject's records run one after another),
or not at all (``"none"``). A function that raises fails that record's message (nak, then
poison, see the ack tracker) unless ``on_error="crash"``, which fails the operator and lets its
restart policy decide.

The graph is validated before it runs (:meth:`Pipeline.validate`), with errors that name the
node, and can be described as a Mermaid diagram, internal actors included.

The graph itself (:class:`Node`, the settings and the checks) is in nodes.py, below the runtime;
this module adds what draws and runs it, so that it alone imports the runtime and nothing
imports it back.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio

from headrace.pipeline.caught_up import CatchUpTimeout, NotCaughtUp
from headrace.pipeline.describe import mermaid
from headrace.pipeline.nodes import PipelineGraph
from headrace.pipeline.runtime import PipelineRun

if TYPE_CHECKING:
    from headrace.nats.connection import Connection
    from headrace.pipeline.stats import PipelineStats


class Pipeline(PipelineGraph):
    """A named graph of sources, operators and sinks, and how its deliveries are acked.

    ``max_deliveries``: a message whose processing failed this many deliveries is a poison
    message: published to ``dead_letter`` if set (a subject a stream must store: checked when
    the pipeline starts), then terminated (+TERM). Without a dead letter it is terminated and
    reported, and ``headrace run`` exits 4 at the end unless ``allow_termination``.
    ``max_in_flight`` bounds the messages a source has in the pipeline at once (taken, not yet
    acked), which bounds memory; by default twice the larger of its consume buffer and its
    largest batch. ``nak_delay`` and ``nak_delay_max`` bound the backoff of naks before that.
    ``drain_timeout``: how long a cancelled pipeline may take to commit and ack what it holds
    before it is stopped hard. ``commit_bucket``: the KV bucket where sinks shared by several
    workers keep their commit state (docs/scaling.md). ``sink_retry``: how the sinks' failed
    writes are retried, an outage told from bad records (a sink's own ``retry`` overrides it;
    docs/failures.md).
    """

    # -- describing -------------------------------------------------------------------------

    def describe(
        self,
        states: dict[str, str] | None = None,
        internal_actors: dict[str, list[str]] | None = None,
    ) -> str:
        """A Mermaid flowchart of the graph with its internal actors; ``states`` (actor name to
        state) adds each actor's state and ``internal_actors`` (source name to the names of its
        JetStream actors) their real names, as a running pipeline does."""
        return mermaid(self, states or {}, internal_actors)

    # -- running ----------------------------------------------------------------------------

    async def run(self, nc: Connection) -> None:
        """Run until cancelled; cancelling drains (see :meth:`running`)."""
        async with self.running(nc) as run:
            await run.wait_finished()

    @asynccontextmanager
    async def running(self, nc: Connection) -> AsyncIterator[PipelineRun]:
        """Run the pipeline next to the caller's code: ``async with pipe.running(nc) as run:``.

        Leaving the block, or cancelling the task in it, drains: sources stop pulling, open
        batches are cut and committed, their messages acked, within ``drain_timeout``; past it
        the pipeline is stopped hard and what was not committed is redelivered later. An
        actor that fails for good stops the pipeline and the block with its original error.
        """
        self.validate()
        run = PipelineRun(self, nc)
        async with run.lifetime():
            yield run


async def run_until_caught_up(
    pipe: Pipeline, nc: Connection, *, timeout: float | None = None
) -> PipelineStats:
    """Run ``pipe`` until it has caught up with what its sources' streams held when it
    started (:meth:`PipelineRun.wait_caught_up`), drain it, and return its final stats: a
    backfill, a cron job, a test.

    Raises :class:`CatchUpTimeout` after ``timeout`` seconds (the pipeline drained first:
    nothing taken is lost), :class:`NotCaughtUp` if the drain then timed out (messages taken
    and not acked are redelivered after their ack wait), and a failed run's own error.
    """
    async with pipe.running(nc) as run:
        with trio.move_on_after(math.inf if timeout is None else timeout) as scope:
            await run.wait_caught_up()
    if scope.cancelled_caught:
        raise CatchUpTimeout(
            f"pipeline {pipe.name!r} did not catch up within {timeout}s "
            f"({run.stats.acks} messages acked); it was drained"
        )
    if run.drain_timed_out:
        raise NotCaughtUp(
            f"pipeline {pipe.name!r} caught up, but its drain did not finish within "
            f"{pipe.drain_timeout}s: {run.stats.ack_pending} messages taken were not acked"
        )
    return run.stats
