"""The pipeline graph itself: its nodes, its settings and its checks; everything but running it.

:class:`~headrace.pipeline.graph.Pipeline` (graph.py) is this graph plus ``run`` and
``running``, which start a :class:`~headrace.pipeline.runtime.PipelineRun`. The graph lives
here, below the runtime, so that the runtime, the stages, the ack tracker and the diagram can
name its types without importing the module that runs them: ``graph -> runtime -> stages ->
ack_tracker -> nodes`` is one way, with no cycle (docs/architecture.md section 2).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal

import attrs

from headrace.actors.supervision import Escalate, RestartPolicy
from headrace.commits.coordinator import DEFAULT_BUCKET
from headrace.jetstream.kv import check_bucket_name
from headrace.pipeline.batch import BatchPolicy
from headrace.pipeline.errors import PipelineError
from headrace.pipeline.keyed import KeyedStream, StateSpec
from headrace.pipeline.lookup import LookupSpec, Missing
from headrace.pipeline.partitioning import Partitioning
from headrace.pipeline.sink import sink_members, sink_name
from headrace.pipeline.sink_retry import SinkRetry
from headrace.pipeline.source import JetStreamSource
from headrace.state.snapshots import DEFAULT_STATE_BUCKET

Kind = Literal["source", "map", "filter", "flat_map", "merge", "stateful", "lookup", "sink"]
Ordering = Literal["all", "subject", "none"]
OPERATORS = ("map", "filter", "flat_map")


@attrs.define(eq=False, kw_only=True)
class Node:
    """A node of the graph: a source, an operator, a merge, or a sink."""

    pipeline: PipelineGraph
    kind: Kind
    name: str
    upstream: list[Node] = attrs.field(factory=list)
    downstream: list[Node] = attrs.field(factory=list)
    #: source
    source: JetStreamSource | None = None
    #: operators
    fn: Callable[..., Any] | None = None
    concurrency: int = 1
    ordered: Ordering = "all"
    record: bool = False
    on_error: Literal["nak", "crash"] = "nak"
    #: stateful operators (``key_by(...).window(...)`` and the like: pipeline/keyed.py)
    state: StateSpec | None = None
    #: lookups (``lookup(bucket, ...)``: pipeline/lookup.py)
    lookup_spec: LookupSpec | None = None
    #: sinks
    sink_obj: Any = None
    batch: BatchPolicy = attrs.field(factory=BatchPolicy)
    #: How the sink's failed writes are retried (None: the pipeline's ``sink_retry``).
    retry: SinkRetry | None = None
    restart: RestartPolicy = attrs.field(factory=Escalate)

    def __repr__(self) -> str:
        return f"<{self.kind} {self.name!r}>"

    def _then(self, kind: Kind, fn: Callable[..., Any] | None, name: str | None, **kw: Any) -> Node:
        if self.kind == "sink":
            raise PipelineError(f"sink {self.name!r} has no output to continue from")
        node = self.pipeline._add(kind, name or _fn_name(fn, kind), fn=fn, **kw)
        node.upstream.append(self)
        self.downstream.append(node)
        return node

    def map(
        self,
        fn: Callable[[Any], Any],
        *,
        name: str | None = None,
        concurrency: int = 1,
        ordered: Ordering = "all",
        record: bool = False,
        on_error: Literal["nak", "crash"] = "nak",
        restart: RestartPolicy | None = None,
    ) -> Node:
        """Each record's value becomes ``fn(value)``."""
        return self._then(
            "map",
            fn,
            name,
            concurrency=concurrency,
            ordered=ordered,
            record=record,
            on_error=on_error,
            restart=restart or Escalate(),
        )

    def filter(
        self,
        fn: Callable[[Any], Any],
        *,
        name: str | None = None,
        concurrency: int = 1,
        ordered: Ordering = "all",
        record: bool = False,
        on_error: Literal["nak", "crash"] = "nak",
        restart: RestartPolicy | None = None,
    ) -> Node:
        """Keep the records for which ``fn`` is true; the others' messages are acked when
        dropped."""
        return self._then(
            "filter",
            fn,
            name,
            concurrency=concurrency,
            ordered=ordered,
            record=record,
            on_error=on_error,
            restart=restart or Escalate(),
        )

    def flat_map(
        self,
        fn: Callable[[Any], Any],
        *,
        name: str | None = None,
        concurrency: int = 1,
        ordered: Ordering = "all",
        record: bool = False,
        on_error: Literal["nak", "crash"] = "nak",
        restart: RestartPolicy | None = None,
    ) -> Node:
        """Each record becomes the records of the values ``fn(value)`` yields (none drops it)."""
        return self._then(
            "flat_map",
            fn,
            name,
            concurrency=concurrency,
            ordered=ordered,
            record=record,
            on_error=on_error,
            restart=restart or Escalate(),
        )

    def lookup(
        self,
        bucket: str,
        *,
        key: Callable[[Any], str],
        into: Callable[[Any, Any], Any],
        decode: Callable[[bytes], Any] | None = None,
        missing: Missing = "keep",
        name: str | None = None,
    ) -> Node:
        """Join each record with the current value of ``key(value)`` in KV bucket ``bucket``:
        the record's value becomes ``into(value, found)``, ``found`` being the entry's bytes
        (decoded by ``decode`` if given), or None for a key without a value (``missing="keep"``;
        ``"drop"`` ends such a record, ``"fail"`` fails it). A whole batch's keys are read in
        one batched Direct Get."""
        spec = LookupSpec(bucket=bucket, key=key, into=into, decode=decode, missing=missing)
        return self._then("lookup", None, name or f"lookup-{bucket}", lookup_spec=spec)

    def key_by(self, key: Callable[[Any], Any]) -> KeyedStream:
        """Key the records by ``key(value)`` for the stateful operators that follow
        (``stateful_map``, ``fold``, ``reduce``, ``window``; docs/state.md). Each key's state
        lives in one operator, snapshotted to KV with the messages it covers."""
        if self.kind == "sink":
            raise PipelineError(f"sink {self.name!r} has no output to key")
        return KeyedStream(self, key)

    def sink(
        self,
        sink: Any,
        *,
        name: str | None = None,
        batch: BatchPolicy | None = None,
        retry: SinkRetry | None = None,
        restart: RestartPolicy | None = None,
    ) -> Node:
        """Write records to ``sink`` in batches cut by ``batch``; records are acked after the
        sink committed them. ``retry``: how failed writes are retried (default: the
        pipeline's ``sink_retry``; docs/failures.md)."""
        return self._then(
            "sink",
            None,
            name or sink_name(sink),
            sink_obj=sink,
            batch=batch or BatchPolicy(),
            retry=retry,
            restart=restart or Escalate(),
        )


def _fn_name(fn: Callable[..., Any] | None, kind: str) -> str:
    name = getattr(fn, "__name__", "") if fn is not None else ""
    return kind if not name or name == "<lambda>" else name


class PipelineGraph:
    """A named graph of sources, operators and sinks, with the settings its run follows; the
    base of :class:`~headrace.pipeline.graph.Pipeline`, whose docs describe the settings. The
    runtime sees a pipeline as this (it has no use for ``run``)."""

    def __init__(
        self,
        name: str,
        *,
        dead_letter: str | None = None,
        max_deliveries: int = 5,
        nak_delay: float = 1.0,
        nak_delay_max: float = 60.0,
        drain_timeout: float = 30.0,
        max_in_flight: int | None = None,
        commit_bucket: str = DEFAULT_BUCKET,
        state_bucket: str = DEFAULT_STATE_BUCKET,
        sink_retry: SinkRetry | None = None,
        allow_termination: bool = False,
        partitioning: Partitioning | None = None,
    ) -> None:
        if not name:
            raise PipelineError("a pipeline needs a name")
        if max_deliveries < 1:
            raise PipelineError("max_deliveries must be at least 1")
        self.name = name
        self.dead_letter = dead_letter
        self.max_deliveries = max_deliveries
        self.nak_delay = nak_delay
        self.nak_delay_max = nak_delay_max
        self.drain_timeout = drain_timeout
        if max_in_flight is not None and max_in_flight < 1:
            raise PipelineError("max_in_flight must be at least 1")
        self.max_in_flight = max_in_flight
        self.commit_bucket = check_bucket_name(commit_bucket)
        self.state_bucket = check_bucket_name(state_bucket)
        self.sink_retry = sink_retry or SinkRetry()
        self.allow_termination = allow_termination
        #: The stream's keys split into partitions, leased to workers (``headrace run``
        #: then runs ``run_partitioned``; pipeline/partitions.py). None: one run.
        if partitioning is not None and not isinstance(partitioning, Partitioning):
            raise PipelineError(f"partitioning must be a Partitioning, not {partitioning!r}")
        self.partitioning = partitioning
        self.nodes: list[Node] = []

    def __repr__(self) -> str:
        return f"<Pipeline {self.name!r} {len(self.nodes)} nodes>"

    def _add(self, kind: Kind, name: str, **kw: Any) -> Node:
        taken = {n.name for n in self.nodes}
        unique, i = name, 2
        while unique in taken:
            unique, i = f"{name}-{i}", i + 1
        node = Node(pipeline=self, kind=kind, name=unique, **kw)
        self.nodes.append(node)
        return node

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def source(self, spec: JetStreamSource, *, name: str | None = None) -> Node:
        """A JetStream source (see :class:`JetStreamSource`)."""
        if not isinstance(spec, JetStreamSource):
            raise PipelineError(f"a source must be a JetStreamSource, not {spec!r}")
        return self._add("source", name or spec.durable or spec.stream.lower(), source=spec)

    def merge(self, *nodes: Node, name: str | None = None) -> Node:
        """One flow from several: records of every input, interleaved as they come."""
        if len(nodes) < 2:
            raise PipelineError("merge needs at least two inputs")
        node = self._add("merge", name or "merge")
        for upstream in nodes:
            if upstream.pipeline is not self:
                raise PipelineError(f"{upstream!r} belongs to another pipeline")
            if upstream.kind == "sink":
                raise PipelineError(f"sink {upstream.name!r} has no output to merge")
            node.upstream.append(upstream)
            upstream.downstream.append(node)
        return node

    @property
    def sources(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "source"]

    @property
    def sinks(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "sink"]

    # -- checking ---------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise :class:`PipelineError`, naming the node, for a graph that cannot run."""
        if not self.sources:
            raise PipelineError(f"pipeline {self.name!r} has no source")
        if not self.sinks:
            raise PipelineError(f"pipeline {self.name!r} has no sink: nothing would be committed")
        for node in self.nodes:
            if node.kind != "sink" and not node.downstream:
                raise PipelineError(
                    f"{node.kind} {node.name!r} is not connected to anything downstream: its "
                    "records would never be committed or acked; add a sink after it"
                )
            if node.kind in OPERATORS:
                if node.concurrency < 1:
                    raise PipelineError(f"{node.kind} {node.name!r}: concurrency must be >= 1")
                if node.ordered not in ("all", "subject", "none"):
                    raise PipelineError(
                        f"{node.kind} {node.name!r}: ordered must be 'all', 'subject' or 'none'"
                    )
                if not callable(node.fn):
                    raise PipelineError(f"{node.kind} {node.name!r}: its function is not callable")
                if node.concurrency > 1 and not inspect.iscoroutinefunction(node.fn):
                    pass  # sync functions run in worker threads then
            if node.kind == "stateful" and not isinstance(node.restart, Escalate):
                raise PipelineError(
                    f"stateful {node.name!r}: a stateful operator cannot be restarted in place "
                    "(the messages its state holds would be neither acked nor redelivered "
                    "until their ack wait); leave restart at Escalate"
                )
            if node.kind == "sink":
                try:
                    sink_members(node.sink_obj, node.name)
                except TypeError as exc:
                    raise PipelineError(str(exc)) from None
        self._check_acyclic()
        for sink in self.sinks:
            for src in self.sources_of(sink):
                assert src.source is not None
                limit = src.source.config.max_ack_pending
                if limit is not None:
                    self.check_batch_fits(sink, src, limit)
        for node in self.nodes:
            if node.kind == "stateful" and node.state is not None:
                self._check_results_fit(node, node.state.max_pending_results)
                self._check_durable_sources(node)

    def _check_durable_sources(self, node: Node) -> None:
        """A stateful operator's snapshot remembers what it took by stream sequence, trimmed
        to its consumers' ack floors: an ephemeral consumer starts over on every run and
        would deliver again what the state counted."""
        for source in self.sources_of(node):
            spec = source.source
            if spec is not None and spec.durable is None:
                raise PipelineError(
                    f"stateful {node.name!r} is fed by source {source.name!r}, an ephemeral "
                    "consumer: its state outlives the run, and a new consumer would deliver "
                    "again what the state holds. Give the source a durable "
                    "(JetStreamSource(..., durable=...))"
                )

    def _check_results_fit(self, node: Node, limit: int) -> None:
        """A stateful operator stops at ``max_pending_results`` uncommitted results: a sink
        after it that batches more could only cut its batches by age, so every round of
        results would wait out the batch's ``max_age``."""
        seen: set[int] = set()
        todo = list(node.downstream)
        while todo:
            after = todo.pop()
            if id(after) in seen:
                continue
            seen.add(id(after))
            if after.kind == "sink" and after.batch.max_messages > limit:
                raise PipelineError(
                    f"sink {after.name!r} batches {after.batch.max_messages} messages, more "
                    f"than the max_pending_results ({limit}) of stateful {node.name!r}, which "
                    "waits for its results to be committed before taking more records: the "
                    "batches could only ever be cut by age. Lower the batch or raise "
                    "max_pending_results"
                )
            todo.extend(after.downstream)

    def check_batch_fits(self, sink: Node, source: Node, max_ack_pending: int) -> None:
        """A batch larger than the consumer's max_ack_pending can never fill: the server stops
        delivering once that many messages wait for their ack."""
        if max_ack_pending > 0 and sink.batch.max_messages > max_ack_pending:
            spec = source.source
            fix = "ConsumerConfig(max_ack_pending=...) on the source"
            if spec is not None and spec.durable is not None:
                fix = (
                    f"`headrace consumer update {spec.stream} {spec.durable} --max-ack-pending "
                    f"{2 * sink.batch.max_messages}` for the consumer that exists, or "
                    "ConsumerConfig(max_ack_pending=...) on the source"
                )
            raise PipelineError(
                f"sink {sink.name!r} batches {sink.batch.max_messages} messages, more than the "
                f"max_ack_pending ({max_ack_pending}) of source {source.name!r}: its batches "
                f"could only ever be cut by age. Lower the batch, or raise max_ack_pending: "
                f"{fix}"
            )

    def check_max_deliver(self, source: Node, max_deliver: int | None) -> None:
        """A consumer that stops delivering before the pipeline's ``max_deliveries`` would
        strand a failing message: the server gives up on it (it stays in the stream, never
        delivered again, no advisory the pipeline sees) before the pipeline makes it poison,
        so it is neither written nor dead-lettered, and the run ends as if nothing happened."""
        if max_deliver is not None and 0 < max_deliver < self.max_deliveries:
            raise PipelineError(
                f"source {source.name!r}: its consumer delivers a message at most "
                f"{max_deliver} times (max_deliver), but the pipeline makes a message poison "
                f"only when its delivery {self.max_deliveries} fails (max_deliveries): a "
                "failing message would be given up by the server, neither written nor "
                "dead-lettered. Raise the consumer's max_deliver to max_deliveries or more "
                "(or leave it unlimited), or lower max_deliveries"
            )

    def _check_acyclic(self) -> None:
        state: dict[int, int] = {}

        def visit(node: Node, path: list[str]) -> None:
            mark = state.get(id(node), 0)
            if mark == 1:
                raise PipelineError(f"cycle through {' -> '.join([*path, node.name])}")
            if mark == 2:
                return
            state[id(node)] = 1
            for nxt in node.downstream:
                visit(nxt, [*path, node.name])
            state[id(node)] = 2

        for node in self.nodes:
            visit(node, [])

    def sources_of(self, node: Node) -> list[Node]:
        """The sources whose records can reach ``node``."""
        found: list[Node] = []
        stack, seen = [node], set()
        while stack:
            current = stack.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            if current.kind == "source":
                found.append(current)
            stack.extend(current.upstream)
        return found
