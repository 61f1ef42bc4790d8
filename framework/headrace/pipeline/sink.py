"""The sink contract, whole: what a sink is, what it is given, and what it may raise.

A sink is any object with a ``write_batch(batch)`` method. :class:`Sink` declares every member
the pipeline looks for and says what it does with each; subclassing it is optional (it only
documents, and lets a type checker see the members), since the pipeline reads the members of
whatever object it is given, once, with :func:`sink_members`. Each member may be a coroutine
function (awaited on the event loop) or a plain one (run on the sink's own thread,
:mod:`headrace.pipeline.sink_runner`).

Beside it: :class:`SinkContext`, what ``bind`` is given; the errors a sink raises to say what
went wrong (:class:`SinkUnavailable`, :class:`RecordsRejected`, :class:`SinkNotOpen`, all
:class:`SinkError`); and :func:`failure_kind`, which reads the ``transient`` attribute by which
any exception says whether the sink is down or the records are bad. The errors of the sinks
built into headrace (finding plugins, a corrupt output) are in :mod:`headrace.sinks`, which sits
above this package: sinks use the pipeline's types, the pipeline never imports a sink.

A sink that raises :class:`~headrace.commits.errors.OutputConflict` (another pipeline's output,
a recreated stream) stops the pipeline: the batch is neither acked nor naked, since writing it
anywhere else or failing it would lose or duplicate records. docs/sinks.md is the guide.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from headrace.commits.coordinator import DEFAULT_BUCKET
from headrace.commits.identity import StreamIdentity, new_worker_id
from headrace.errors import HeadraceError
from headrace.jetstream.transient import retry_transient

if TYPE_CHECKING:
    from headrace.jetstream.context import JetStream
    from headrace.pipeline.batch import Batch
    from headrace.pipeline.record import Record

#: How long a stream identity looked up is trusted before a batch that overlaps committed
#: records looks it up again (seconds).
IDENTITY_TTL = 1.0


class Sink:
    """Every member of the sink contract, declared and documented.

    Only :meth:`write_batch` is required. The others are called when the sink has them and
    they are not this class's own defaults (which do nothing, so a subclass pays for no call it
    does not define). Any member may be ``async def``; a plain one runs on a thread of the
    sink's own, one call at a time and the same thread from ``bind``/``open`` to ``close``, so
    a blocking driver never stalls the event loop and one that ties its connection to the
    thread that opened it (sqlite3) works.
    """

    #: The sink's name in graphs, progress lines and metrics, unless ``Node.sink(name=...)``
    #: gives one; None: the class name, lower-cased.
    name: str | None = None

    def bind(self, context: SinkContext) -> object:
        """Called once, before :meth:`open`, with where the sink runs: the pipeline and sink
        names, this worker, the JetStream connection, and the identities and ack floors of the
        streams it is fed from. A sink whose output several workers share takes part in the
        commit protocol with them (headrace.commits, docs/scaling.md)."""

    def open(self) -> object:
        """Called once before the first batch (and again after a restart of the sink's stage);
        the sources take no message until every sink of the pipeline is open. Connect, create,
        read state. Raising fails the stage (its restart policy decides)."""

    def write_batch(self, batch: Batch) -> object:
        """Make ``batch`` durable, then return: the pipeline acks every message behind it as
        soon as this returns, and JetStream forgets them, so returning early loses records on a
        crash. Called one batch at a time.

        Raising keeps every message of the batch: it is written again after a pause. Say what
        the error means with its ``transient`` attribute (:func:`failure_kind`): ``True``, the
        sink is down (:class:`SinkUnavailable`; never split, waited out); ``False``, records of
        the batch are bad (split at once to find them); not set, the pipeline finds out by
        splitting once the retries fail. :class:`RecordsRejected` commits the rest of the batch
        and fails only the records it names."""
        raise NotImplementedError(f"{type(self).__name__} has no write_batch(batch)")

    def maintain(self) -> object:
        """Called when the sink has had nothing to write for a second, then every second while
        idle: upkeep that cannot wait for a batch (a shared output's sweep of what dead workers
        left). Return quickly when nothing is due."""

    def close(self) -> object:
        """Called after the last batch, and after a failure too (not after an ``open`` that
        raised): release what ``open`` took. Bounded by the pipeline (10 s)."""


#: The members of :class:`Sink` a sink may leave out.
OPTIONAL_MEMBERS = ("bind", "open", "maintain", "close")


@attrs.frozen(slots=True)
class SinkMembers:
    """The contract's members one sink has, read once: ``None`` for each optional member it
    does not define (or leaves at :class:`Sink`'s default)."""

    write_batch: Callable[..., Any]
    bind: Callable[..., Any] | None
    open: Callable[..., Any] | None
    maintain: Callable[..., Any] | None
    close: Callable[..., Any] | None


def sink_members(sink: object, name: str | None = None) -> SinkMembers:
    """The members of ``sink`` the pipeline calls; :class:`TypeError` naming the sink when it
    has no callable ``write_batch``, or has an optional member that is not callable."""
    label = f"sink {name!r} ({sink!r})" if name else f"sink {sink!r}"
    write = getattr(sink, "write_batch", None)
    if not callable(write) or getattr(type(sink), "write_batch", None) is Sink.write_batch:
        # (Sink's own raises: a subclass that forgot it would fail every batch, as bad data.)
        raise TypeError(f"{label} has no write_batch(batch) method")
    found: dict[str, Callable[..., Any] | None] = {}
    for member in OPTIONAL_MEMBERS:
        value = getattr(sink, member, None)
        if value is not None and not callable(value):
            raise TypeError(f"{label}: {member} is {value!r}, not a method")
        if getattr(type(sink), member, None) is getattr(Sink, member):
            value = None  # Sink's own default: nothing to call
        found[member] = value
    return SinkMembers(write_batch=write, **found)


def sink_name(sink: object) -> str:
    """The name a sink goes by when the pipeline gives it none: its ``name``, else its class's
    name, lower-cased."""
    return getattr(sink, "name", None) or type(sink).__name__.lower()


def failure_kind(error: BaseException | None) -> bool | None:
    """What an error says about a failed write, by its ``transient`` attribute: ``True``, the
    sink is down (wait, never split the batch); ``False``, records of the batch are bad (split
    to find them); ``None``, it does not say."""
    kind = getattr(error, "transient", None)
    return kind if isinstance(kind, bool) else None


# -- the errors a sink raises ------------------------------------------------------------------


class SinkError(HeadraceError):
    """Base class of the errors sinks raise and of the errors about sinks."""


class SinkUnavailable(SinkError):
    """Raise (or subclass) it from ``write_batch`` when the sink's destination is down (a
    connection refused, a full disk): the batch is written again after a pause, never split
    to look for bad records (headrace.pipeline.sink_retry)."""

    transient = True


class SinkNotOpen(SinkError):
    """A sink was written to before ``open()`` or after ``close()``."""


class RecordsRejected(SinkError):
    """Raised by ``write_batch`` after it committed the batch *except* some records that can
    never be written (a value that does not fit the sink's schema: a poison record).

    The pipeline acks the messages of the committed records and fails only the rejected ones
    (nak, then dead letter past ``max_deliveries``), so one bad record does not hold back, or
    dead-letter, the good records batched with it. ``rejected`` pairs each record with why it
    was rejected.
    """

    def __init__(self, rejected: Sequence[tuple[Record, BaseException]]) -> None:
        if not rejected:
            raise ValueError("RecordsRejected needs at least one rejected record")
        self.rejected = list(rejected)
        record, error = self.rejected[0]
        more = f" (and {len(self.rejected) - 1} more)" if len(self.rejected) > 1 else ""
        super().__init__(
            f"{len(self.rejected)} record(s) rejected, the rest of the batch committed; "
            f"{record.stream} #{record.stream_seq}: {error}{more}"
        )


# -- what bind is given ------------------------------------------------------------------------


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
