"""A running pipeline: its actors, their supervision, and drain-on-cancel.

The stages run in a nursery inside a shielded cancel scope, so that cancelling the caller does
not cut them off: it starts a drain instead. Sources stop pulling and pass on what the server
already sent, each stage finishes what it holds and passes an END on, batchers cut their last
batches, sinks commit them, the tracker acks them, and the acks are flushed to the server. The
drain has ``drain_timeout`` seconds; past that the shielded scope cancels itself (a hard stop)
and whatever was not committed is redelivered by the server after its ack wait.

Each stage runs under its node's restart policy. A stage that fails for good stops the pipeline
and the caller's block with its original error (with a note naming the actor).

This module wires the run: it imports the stages, the ack tracker and the publish guard, and
gives each what it asks for (``SourceHost``, ``SinkHost``, ``GuardedRun``, a ``keep_alive``
callable); none of them imports it. It sees the graph as a
:class:`~headrace.pipeline.nodes.PipelineGraph`: ``Pipeline.running`` (graph.py) starts a run,
so graph.py is above this module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import trio

from headrace._run_registry import track_run
from headrace._trio import BodyError, either
from headrace.actors.actor import Actor
from headrace.actors.supervision import ActorFailed, Escalate, RestartPolicy, supervise
from headrace.commits.identity import StreamIdentity
from headrace.jetstream.consumer_config import ConsumerInfo
from headrace.jetstream.context import JetStream
from headrace.jetstream.pause import ConsumerPause, PauseUntil, pause_deadline
from headrace.jetstream.transient import retry_transient
from headrace.pipeline.ack_tracker import DEFAULT_ACK_WAIT, AckTracker
from headrace.pipeline.caught_up import (
    RECHECK_MAX,
    RECHECK_MIN,
    CatchUpMark,
    NotCaughtUp,
    SourceMark,
    catch_up_mark,
    reached,
)
from headrace.pipeline.describe import mermaid
from headrace.pipeline.errors import PipelineEnded
from headrace.pipeline.lookup_stage import LookupStage
from headrace.pipeline.publish_guard import PublishGuard
from headrace.pipeline.sink import SinkContext
from headrace.pipeline.sink_retry import SinkOutage
from headrace.pipeline.stages import (
    BatcherStage,
    OperatorStage,
    SinkStage,
    SourceStage,
    Stage,
)
from headrace.pipeline.stateful import StatefulStage, StateStats
from headrace.pipeline.stats import PipelineStats

if TYPE_CHECKING:
    from headrace.nats.connection import Connection
    from headrace.pipeline.nodes import Node, PipelineGraph
    from headrace.pipeline.record import Record


@attrs.frozen(slots=True)
class StageError:
    """A failure a stage reported and survived (a sink write that failed: its messages are
    naked and come back)."""

    stage: str
    error: BaseException
    at: float


class PipelineRun:
    """The running form of a :class:`~headrace.pipeline.graph.Pipeline`: actors, stats,
    states, drain."""

    def __init__(
        self, pipeline: PipelineGraph, nc: Connection, *, js: JetStream | None = None
    ) -> None:
        self.pipeline = pipeline
        self.nc = nc
        self.js = js or JetStream(nc)
        self.stats = PipelineStats()
        self.tracker = AckTracker(pipeline, self.js, self.stats)
        self.tracker.report = self.report_error
        #: Stops the run when the server refuses its acks or dead letters (publish_guard.py).
        #: Not among ``actors``: it does nothing to draw in the graph until it fails the run.
        self.guard = PublishGuard(self)
        self.stages: dict[str, Stage] = {}
        self.sources: list[SourceStage] = []
        self.draining = False
        self.stopping = False
        self.errors: list[StageError] = []
        self._scope: trio.CancelScope | None = None
        self._finished = trio.Event()
        self._stop_requested = False
        #: Set once finished: the drain did not end within ``drain_timeout`` and the stages
        #: were stopped (messages taken and not committed are redelivered after ack_wait).
        self.drain_timed_out = False
        #: Set once finished: :meth:`stop` ended the run before it had drained.
        self.stopped_hard = False
        self._sinks_left = 0
        #: Sink stages whose sink has not opened yet; sources take nothing before (stages.py).
        self._sinks_to_open = 0
        self._sinks_open = trio.Event()
        #: The identities of the stateful operators' results (``<pipeline>.<operator>``),
        #: which the sinks look up as they do a stream's (pipeline/stateful.py).
        self.result_identities: dict[str, StreamIdentity] = {}
        #: Told of each batch a sink committed, with the sink's name: the server-less test
        #: harness (headrace.testing) records them through it. None in production: one check
        #: per committed batch, nothing per message.
        self.on_commit: Callable[[str, list[Record]], None] | None = None
        self._build()
        # Inside run_until_signal, a second signal stops this run hard (shutdown.py).
        track_run(self)

    # -- wiring -----------------------------------------------------------------------------

    def _build(self) -> None:
        for node in self.pipeline.nodes:
            stage: Stage
            if node.kind == "source":
                stage = SourceStage(node, self)
                self.sources.append(stage)
            elif node.kind == "sink":
                batcher = BatcherStage(node, self.tracker)
                writer = SinkStage(node, self.tracker, self)
                batcher.downstream.append(writer)
                self.stages[batcher.name] = batcher
                self.stages[writer.name] = writer
                self._sinks_left += 1
                self._sinks_to_open += 1
                continue
            elif node.kind == "stateful":
                stage = StatefulStage(node, self.tracker, self)
            elif node.kind == "lookup":
                stage = LookupStage(node, self.tracker, self.js)
            else:
                stage = OperatorStage(node, self.tracker)
            self.stages[stage.name] = stage
        by_node = {id(s.node): s for s in self.stages.values() if not isinstance(s, SinkStage)}
        for stage in list(self.stages.values()):
            if isinstance(stage, SinkStage | BatcherStage):
                continue
            stage.downstream = [by_node[id(n)] for n in stage.node.downstream]

    def bound(self, source: SourceStage, info: ConsumerInfo) -> None:
        """A source bound its consumer: check batches against max_ack_pending, learn the ack
        wait for the tracker's +WPI."""
        node = source.node
        source.consumer_name = info.name
        source.bound.set()
        messages = source.messages
        self.tracker.learn_ack_wait(
            node.name,
            info.config.ack_wait or DEFAULT_ACK_WAIT,
            None if messages is None else messages.keep_alive,
        )
        self.check_consumer(node, info)

    def check_consumer(self, source: Node, info: ConsumerInfo) -> None:
        """The consumer ``source`` bound fits the pipeline: its ``max_deliver`` does not give
        up before ``max_deliveries``, its ``max_ack_pending`` holds the sinks' batches. The
        source asks before its first pull (nothing taken yet when it is refused)."""
        self.pipeline.check_max_deliver(source, info.config.max_deliver)
        limit = info.config.max_ack_pending
        if limit:
            for sink in self.pipeline.sinks:
                if source in self.pipeline.sources_of(sink):
                    self.pipeline.check_batch_fits(sink, source, limit)

    def sink_opened(self) -> None:
        """A sink stage's sink is open (the first time)."""
        self._sinks_to_open -= 1
        if self._sinks_to_open <= 0:
            self._sinks_open.set()

    async def sinks_opened(self) -> None:
        """Until every sink of the run is open."""
        await self._sinks_open.wait()

    def replays_in_order(self, source: Node) -> bool:
        """Whether ``source`` feeds a stateful operator, whose watermark needs what a dead
        worker held back before anything newer (``SourceStage._wait_for_redeliveries``)."""
        return any(
            n.kind == "stateful" and source in self.pipeline.sources_of(n)
            for n in self.pipeline.nodes
        )

    def sink_context(self, sink: Node) -> SinkContext:
        """What sink ``sink`` is told of where it runs (its ``bind``): the pipeline, the
        connection, and the consumers of the sources that feed it."""
        feeding = [s for s in self.sources if s.node in self.pipeline.sources_of(sink)]

        def consumers() -> list[tuple[str, str | None]]:
            return [(s.node.source.stream, s.consumer_name) for s in feeding if s.node.source]

        return SinkContext(
            self.js,
            pipeline=self.pipeline.name,
            sink=sink.name,
            consumers=consumers,
            commit_bucket=self.pipeline.commit_bucket,
            results=self.result_identities,
        )

    # -- what stateful stages need (StatefulHost) --------------------------------------------

    @property
    def pipeline_name(self) -> str:
        return self.pipeline.name

    @property
    def state_bucket(self) -> str:
        return self.pipeline.state_bucket

    def held_limit(self, node: Node) -> int:
        """The fewest messages a source feeding ``node`` may have in flight."""
        feeding = self.pipeline.sources_of(node)
        return min((self.max_in_flight(s) for s in feeding), default=1000)

    async def stream_identities(self, node: Node) -> dict[str, str]:
        """The creation time (ISO 8601) of each stream of a source feeding ``node``."""
        found: dict[str, str] = {}
        for source in self.pipeline.sources_of(node):
            spec = source.source
            if spec is not None and spec.stream not in found:
                info = await self.js.stream_info(spec.stream)
                found[spec.stream] = StreamIdentity.of(spec.stream, info.created).created
        return found

    def stream_consumers(self, node: Node) -> dict[str, list[str]]:
        """Per stream, the durable consumers of the sources feeding ``node`` (sorted)."""
        found: dict[str, set[str]] = {}
        for source in self.pipeline.sources_of(node):
            spec = source.source
            if spec is not None and spec.durable is not None:
                found.setdefault(spec.stream, set()).add(spec.durable)
        return {stream: sorted(names) for stream, names in found.items()}

    async def ack_floors(self) -> dict[str, int]:
        """Per stream, the lowest ack floor of the consumers of this run's sources on it."""
        floors: dict[str, int] = {}
        for source in self.sources:
            spec, name = source.node.source, source.consumer_name
            if spec is None or name is None:
                continue
            info = await retry_transient(partial(self.js.consumer_info, spec.stream, name))
            floor = info.ack_floor.stream_seq
            floors[spec.stream] = min(floors.get(spec.stream, floor), floor)
        return floors

    def max_in_flight(self, source: Node) -> int:
        """How many of a source's messages may be in the pipeline at once (taken and not yet
        settled): the source's own ``max_in_flight`` if set, else twice the larger of its
        consume buffer and the largest batch it feeds, so a batch can always fill while the
        next one is being taken."""
        spec = source.source
        assert spec is not None
        if self.pipeline.max_in_flight is not None:
            return self.pipeline.max_in_flight
        batches = [
            s.batch.max_messages
            for s in self.pipeline.sinks
            if source in self.pipeline.sources_of(s)
        ]
        return 2 * max([spec.consume.buffer_messages, *batches])

    def report_error(self, stage: str, error: BaseException) -> None:
        self.errors.append(StageError(stage, error, trio.current_time()))
        del self.errors[:-100]

    # -- looking at it ----------------------------------------------------------------------

    @property
    def actors(self) -> list[Actor[Any]]:
        """Every actor of the run: the stages, the ack tracker, and each source's JetStream
        actors (consume buffer, consumer lifecycle, heartbeat monitor, ...)."""
        found: list[Actor[Any]] = [*self.stages.values(), self.tracker]
        for source in self.sources:
            found.extend(source.internal_actors)
        return found

    def state_stats(self, operator: str) -> StateStats:
        """The figures of the stateful operator named ``operator`` (a window, a
        ``stateful_map``, a fold): keys, open windows, snapshots, late records. The same object
        all run long: read it during the run or after. KeyError naming the operators there are
        for a name that is none."""
        stage = self.stages.get(f"stateful:{operator}")
        if not isinstance(stage, StatefulStage):
            there = sorted(
                s.node.name for s in self.stages.values() if isinstance(s, StatefulStage)
            )
            raise KeyError(
                f"pipeline {self.pipeline.name!r} has no stateful operator {operator!r}; "
                f"it has: {', '.join(there) or 'none'}"
            )
        return stage.stats

    def states(self) -> dict[str, str]:
        """Actor name to state, the connection supervisor included."""
        states = {a.name: a.state.value for a in self.actors}
        states[self.nc.actor_name] = self.nc.actor_state
        return states

    def describe(self) -> str:
        internal = {s.node.name: sorted(a.name for a in s.internal_actors) for s in self.sources}
        return mermaid(self.pipeline, self.states(), internal)

    # -- lifetime ---------------------------------------------------------------------------

    def _policy(self, stage: Stage) -> RestartPolicy:
        node = stage.node
        if isinstance(stage, OperatorStage | SinkStage):
            return node.restart
        return Escalate()

    @trio.lowlevel.enable_ki_protection  # a Ctrl-C goes to the caller, whose exit drains
    async def _main(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with trio.CancelScope(shield=True) as scope:
                self._scope = scope
                async with trio.open_nursery() as nursery:
                    await nursery.start(supervise, self.tracker, Escalate())
                    await nursery.start(supervise, self.guard, Escalate())
                    for stage in reversed(list(self.stages.values())):  # consumers first
                        await nursery.start(supervise, stage, self._policy(stage))
                    task_status.started()
                    await self._wait_sinks()
                    with trio.move_on_after(5):
                        await self.nc.flush()  # the last acks reach the server
                    nursery.cancel_scope.cancel()
            if scope.cancelled_caught:
                if self._stop_requested:
                    self.stopped_hard = True
                else:
                    self.drain_timed_out = True
        finally:
            # However it ended (drained, stopped hard, failed), nobody may wait for it longer.
            self._finished.set()

    async def _wait_sinks(self) -> None:
        for writer in [s for s in self.stages.values() if isinstance(s, SinkStage)]:
            await writer.wait_stopped()

    def drain(self) -> None:
        """Start draining (idempotent); the hard stop follows after ``drain_timeout``."""
        if self.draining:
            return
        self.draining = True
        if self._scope is not None:
            self._scope.deadline = trio.current_time() + self.pipeline.drain_timeout
        for source in self.sources:
            source.request_drain()

    async def wait_bound(self) -> None:
        """Wait until every source has bound its consumer (created it, if it creates one) and
        started its JetStream actors: from then on, what is published reaches the pipeline
        even with a deliver-new ephemeral consumer."""
        for source in self.sources:
            await source.bound.wait()

    def stop(self) -> None:
        """Stop now, without waiting for the drain: every stage is cancelled (a sink's worker
        thread is abandoned). What was taken and not committed is neither acked nor naked, so
        the server redelivers it after its ack_wait; nothing is lost."""
        self.draining = True
        self._stop_requested = True
        if self._scope is not None:
            self._scope.cancel()
        else:
            for source in self.sources:
                source.request_drain()

    async def wait_finished(self) -> None:
        """Wait until the pipeline has drained and stopped (it runs until asked to)."""
        await self._finished.wait()

    # -- pause and resume (nats-server 2.11+, jetstream/pause.py) ----------------------------

    async def pause(self, until: PauseUntil | None = None) -> dict[str, ConsumerPause]:
        """Pause the consumer of every source until ``until`` (an aware datetime, a timedelta
        or seconds from now; ``None``: until :meth:`resume`). The server stops delivering;
        the run keeps running, its sources wait with their pulls open and heartbeats keep
        coming, so nothing is declared dead and nothing is lost: what was taken before is
        still committed and acked. The pause is the consumer's, not this run's: every copy
        of the pipeline on a shared durable pauses with it, and it outlasts this run.

        Waits until every source is bound; returns the server's answer per source name.
        """
        deadline = pause_deadline(until)  # one time for all, refused before anything is sent
        return await self._each_consumer(
            lambda stream, name: self.js.pause_consumer(stream, name, deadline)
        )

    async def resume(self) -> dict[str, ConsumerPause]:
        """Resume the consumer of every source (harmless on one not paused): the pulls that
        waited are served. Returns the server's answer per source name."""
        return await self._each_consumer(self.js.resume_consumer)

    async def _each_consumer(
        self, call: Callable[[str, str], Awaitable[ConsumerPause]]
    ) -> dict[str, ConsumerPause]:
        answers: dict[str, ConsumerPause] = {}
        for source in self.sources:
            await either(source.bound, self._finished)
            spec = source.node.source
            if self._finished.is_set() or spec is None or source.consumer_name is None:
                raise PipelineEnded(
                    f"pipeline {self.pipeline.name!r} ended before its sources were bound"
                )
            answers[source.node.name] = await call(spec.stream, source.consumer_name)
        return answers

    # -- caught up (caught_up.py) -----------------------------------------------------------

    async def catch_up_mark(self) -> CatchUpMark:
        """Where each source's consumer is now: the stream sequence of the last message its
        filter selects (caught_up.py). Waits until every source is bound; raises
        :class:`NotCaughtUp` if the run finishes first."""
        marks: list[SourceMark] = []
        for source in self.sources:
            await either(source.bound, self._finished)
            spec = source.node.source
            if self._finished.is_set() or spec is None or source.consumer_name is None:
                raise NotCaughtUp(f"pipeline {self.pipeline.name!r} ended before it was bound")
            mark, _info = await catch_up_mark(
                self.js, source.node.name, spec.stream, source.consumer_name
            )
            marks.append(mark)
        return CatchUpMark(tuple(marks))

    async def wait_caught_up(self, mark: CatchUpMark | None = None) -> PipelineStats:
        """Wait until every message each source's stream held for its consumer when called
        (or at ``mark``) is acked, terminated or dead-lettered; a copy of the stats then.

        Messages naked and waiting for their redelivery (or whose ack wait ran out) are not
        caught up; messages stored after the call are not waited for. Raises
        :class:`NotCaughtUp` if the run ends first (drained or stopped), the server's error
        if a consumer is gone (``ConsumerNotFound``); a run that fails for good cancels the
        wait and its block raises the failure. The server decides, asked after each ack the
        tracker sends (caught_up.py says why that is exact).
        """
        if mark is None:
            mark = await self.catch_up_mark()
        left = list(mark.sources)
        pause = RECHECK_MIN
        while True:
            changed = self.tracker.changed()  # taken first: no change is missed while asking
            await self.nc.flush()  # the acks sent so far reached the server
            still = []
            for source in left:
                # (A failover or reconnect answers late or not at all: asked again, for a
                # while, rather than failing the wait; a deleted consumer is not transient.)
                info = await retry_transient(partial(self._consumer_info, source))
                if not reached(source, info):
                    still.append(source)
            left = still
            if not left:
                return attrs.evolve(self.stats, failures=dict(self.stats.failures))
            if self._finished.is_set():
                raise NotCaughtUp(
                    f"pipeline {self.pipeline.name!r} ended before it caught up: "
                    + ", ".join(f"{s.stream}/{s.consumer} to #{s.seq}" for s in left)
                )
            with trio.move_on_after(pause):
                await either(changed, self._finished)
                pause = RECHECK_MIN
                continue
            pause = min(2 * pause, RECHECK_MAX)

    async def _consumer_info(self, source: SourceMark) -> ConsumerInfo:
        return await self.js.consumer_info(source.stream, source.consumer)

    async def _abandon(self) -> None:
        """The pipeline gives up (a sink down past its deadline): nak everything it holds, so
        that it is delivered again (to another worker, or the next run) at once rather than
        after its ack wait; never terminated. After the stages stopped: the sources have let
        go of their consumers, so the naked messages are not handed straight back here."""
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            self.tracker.abandon_all()
            await self.nc.flush()

    @asynccontextmanager
    async def lifetime(self) -> AsyncIterator[None]:
        body = BodyError()  # the body's own error comes out as raised, after the drain
        try:
            async with trio.open_nursery() as outer:
                await outer.start(self._main)
                with body:
                    yield
                with trio.CancelScope(shield=True):
                    self.drain()
                    await self._finished.wait()
                self.stopping = True
        except BaseExceptionGroup as group:
            failed = _find_failure(group)
            if failed is not None:
                error = _lone(failed.error)
                if isinstance(error, SinkOutage):
                    await self._abandon()
                error.add_note(
                    f"headrace: actor {failed.actor!r} of pipeline "
                    f"{self.pipeline.name!r} failed for good"
                )
                raise error from error.__cause__  # its own cause kept, not the group around
            raise
        body.reraise()


def _find_failure(group: BaseExceptionGroup[Any]) -> ActorFailed | None:
    for exc in group.exceptions:
        if isinstance(exc, ActorFailed):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _find_failure(exc)
            if found is not None:
                return found
    return None


def _lone(error: BaseException) -> BaseException:
    """An actor's error as itself: an actor whose run keeps a nursery of its own (a sink's
    background tasks) fails with a group around its one error; the caller wants the error
    (``except SinkOutage``), with its cause. Cancellations beside it are left out."""
    while isinstance(error, BaseExceptionGroup):
        inner = [e for e in error.exceptions if not isinstance(e, trio.Cancelled)]
        if len(inner) != 1:
            return error
        error = inner[0]
    return error
