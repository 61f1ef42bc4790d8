"""The sink contract, and how the pipeline calls a sink whether it is async or not.

A sink has three methods, each either a coroutine function or a plain one:

- ``open()`` before the first batch;
- ``write_batch(batch)``, which returns only once the batch is durable: the records are acked
  after it returns, never before;
- ``close()`` after the last batch (also after a failure).

and may have two more:

- ``bind(context)``, called before ``open()`` with a :class:`SinkContext`: where the sink runs
  (pipeline, sink name, this worker), the JetStream connection, and the identities and ack
  floors of the streams it is fed from. A sink whose output is shared by several workers uses
  them to take part in the commit protocol (headrace.commits, docs/scaling.md);
- ``maintain()``, called when the sink has had nothing to write for a second (and then every
  second while idle): upkeep that must go on without batches, such as a shared output's sweep
  of what dead workers left. It must return quickly when there is nothing due.

Async sinks run on the event loop. A sync sink's methods run on one thread of its own, from
``bind``/``open`` to ``close`` (:class:`~headrace.pipeline.sink_thread.SinkThread`), one call at
a time, so a blocking write never stalls the loop and a driver that ties its connection to the
thread that opened it (sqlite3) works. ``name`` (optional) names the sink in graphs, progress
and metrics.

A sink that raises :class:`~headrace.commits.errors.OutputConflict` (another pipeline's output,
a recreated stream) stops the pipeline: the batch is neither acked nor naked, since writing it
anywhere else or failing it would lose or duplicate records.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import trio

from headrace.commits.coordinator import DEFAULT_BUCKET
from headrace.commits.identity import StreamIdentity, new_worker_id
from headrace.jetstream.transient import retry_transient
from headrace.pipeline.batch import Batch
from headrace.pipeline.sink_thread import SinkThread

if TYPE_CHECKING:
    from headrace.jetstream.context import JetStream

#: How long a stream identity looked up is trusted before a batch that overlaps committed
#: records looks it up again (seconds).
IDENTITY_TTL = 1.0


class SinkContext:
    """Where a sink runs, given to its ``bind(context)`` before ``open()``.

    ``owner`` (``"<pipeline>/<sink>"``) is what an output shared by workers records as its
    writer: every worker of one pipeline has the same, another pipeline does not. ``worker``
    is this process's id in the commit protocol (random per run). ``consumers`` gives the
    (stream, consumer name) of every source feeding the sink, with None for a name while that
    source has not bound its consumer yet. ``commit_bucket`` and ``replicas`` (None: as many as
    the largest source stream's, at most 3) say where a shared commit state is made.

    Outside a pipeline, make one with the connection's JetStream context and an owner name of
    your own: ``SinkContext(js, pipeline="backfill", sink="lake")``.
    """

    def __init__(
        self,
        js: JetStream,
        *,
        pipeline: str,
        sink: str,
        worker: str | None = None,
        consumers: Callable[[], list[tuple[str, str | None]]] | None = None,
        commit_bucket: str = DEFAULT_BUCKET,
        replicas: int | None = None,
        results: Mapping[str, StreamIdentity] | None = None,
    ) -> None:
        self.js = js
        self.pipeline = pipeline
        self.sink = sink
        self.worker = worker or new_worker_id()
        self.commit_bucket = commit_bucket
        self._consumers = consumers or (lambda: [])
        self._replicas = replicas
        #: A nursery that lives as long as the sink is open, for its background tasks (the
        #: watch of a shared output's commit state); set by the pipeline, None outside one.
        self.nursery: trio.Nursery | None = None
        self._identities: dict[str, tuple[StreamIdentity, float]] = {}
        #: The identities of the stateful operators' results that may reach the sink, by
        #: their stream name (``<pipeline>.<operator>``; no stream of the server): filled by
        #: the operators as they load their state (pipeline/stateful.py).
        self.results: Mapping[str, StreamIdentity] = results if results is not None else {}

    def __repr__(self) -> str:
        return f"<SinkContext {self.owner} worker {self.worker}>"

    @property
    def owner(self) -> str:
        return f"{self.pipeline}/{self.sink}"

    async def stream_identity(self, name: str, *, fresh: bool = False) -> StreamIdentity:
        """The identity (name and creation time) of stream ``name``; looked up again when
        ``fresh`` and the last look is older than a second."""
        result = self.results.get(name)
        if result is not None:
            return result
        now = trio.current_time()
        known = self._identities.get(name)
        if known is not None and not (fresh and now - known[1] > IDENTITY_TTL):
            return known[0]
        info = await retry_transient(lambda: self.js.stream_info(name))
        identity = StreamIdentity.of(name, info.created)
        self._identities[name] = (identity, now)
        return identity

    async def ack_floors(self) -> dict[StreamIdentity, int]:
        """Per stream feeding the sink, the lowest ack floor of its consumers: every sequence up
        to it is settled (committed by every sink, or dropped on the way). A stream with a
        source not bound yet is left out: its floor is not known."""
        by_stream: dict[str, list[str | None]] = {}
        for stream, consumer in self._consumers():
            by_stream.setdefault(stream, []).append(consumer)
        floors: dict[StreamIdentity, int] = {}
        for stream, consumers in by_stream.items():
            if any(c is None for c in consumers):
                continue
            infos = [
                await retry_transient(functools.partial(self.js.consumer_info, stream, c))
                for c in consumers
                if c
            ]
            lowest = min(info.ack_floor.stream_seq for info in infos)
            floors[await self.stream_identity(stream)] = lowest
        return floors

    async def replicas(self) -> int:
        """Replicas for a commit bucket made now."""
        if self._replicas is not None:
            return self._replicas
        found = 1
        for stream in {s for s, _ in self._consumers()}:
            info = await retry_transient(functools.partial(self.js.stream_info, stream))
            found = max(found, info.config.num_replicas or 1)
        return min(found, 3)


@runtime_checkable
class Sink(Protocol):
    """What a sink is: any object with ``write_batch`` (a coroutine function or a plain one).

    ``write_batch(batch)`` returns only once the batch is durable: the pipeline then acks
    every message behind it and JetStream forgets them. Raising keeps them: the batch is
    written again after a pause (an error with ``transient = True`` is an outage, never split;
    ``False`` is bad data, split at once to find the records at fault; ``RecordsRejected``
    names them). ``bind(context)``, ``open()``, ``close()`` and ``maintain()`` are optional.
    A plain method runs on the sink's own thread, one call at a time, so a blocking driver
    never stalls the event loop. docs/sinks.md is the whole contract.
    """

    def write_batch(self, batch: Batch) -> Any:
        """Make ``batch`` durable, then return; raise to have it written again."""


class SinkRunner:
    """Calls a sink's methods: coroutine functions on the loop, plain ones on the sink's thread.

    A sink's life runs from ``bind``/``open`` to ``close``; its sync calls all run on one
    :class:`SinkThread`, started at the first and let go after ``close`` (or after a ``bind``
    or ``open`` that failed: the stage does not close what did not open). A new life (a
    restart opens the sink again) gets a new thread, once the last one is free: a call
    abandoned by a hard stop never overlaps the next one.
    """

    def __init__(self, sink: Any, name: str) -> None:
        if not callable(getattr(sink, "write_batch", None)):
            raise TypeError(f"sink {name!r} ({sink!r}) has no write_batch(batch) method")
        self.sink = sink
        self.name = name
        #: The thread of the sink's current (or last) life; None before its first sync call.
        self.thread: SinkThread | None = None

    async def _call(self, method: str, *args: Any) -> None:
        fn = getattr(self.sink, method, None)
        if fn is None:
            return
        if inspect.iscoroutinefunction(fn):
            await fn(*args)
            return
        thread = self.thread
        if thread is None or thread.stopping:
            if thread is not None:
                # The last life's thread may still be in a call abandoned by a hard stop.
                await thread.ended.wait()
            thread = self.thread = SinkThread(self.name)
        await thread.call(fn, *args)

    async def _start(self, method: str, *args: Any) -> None:
        try:
            await self._call(method, *args)
        except BaseException:
            self._stop_thread()
            raise

    def _stop_thread(self) -> None:
        if self.thread is not None:
            self.thread.stop()

    async def bind(self, context: SinkContext) -> None:
        await self._start("bind", context)

    async def open(self) -> None:
        await self._start("open")

    async def maintain(self) -> None:
        await self._call("maintain")

    async def write_batch(self, batch: Batch) -> None:
        await self._call("write_batch", batch)

    async def close(self) -> None:
        """Close the sink and let its thread go. When the thread is free (no call abandoned by a
        hard stop still runs in it), this waits for it to stop serving the sink, which is then
        immediate: a sink closed has no thread left."""
        try:
            await self._call("close")
        finally:
            self._stop_thread()
        thread = self.thread
        if thread is not None and not thread.pending:
            await thread.ended.wait()
