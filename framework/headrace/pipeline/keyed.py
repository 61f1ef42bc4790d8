"""``key_by``: the graph's stateful operators, as a user writes them.

::

    clicks = pipe.source(JetStreamSource(stream="CLICKS", durable="counts")).map(json.loads)
    per_user = clicks.key_by(lambda c: c["user"])
    per_user.window(TumblingWindow(timedelta(minutes=1)), count(),
                    event_time=lambda c: c["ts"], lateness=timedelta(seconds=30)).sink(...)
    per_user.fold(lambda: 0, lambda total, c: total + c["amount"]).sink(...)

:meth:`Node.key_by <headrace.pipeline.nodes.Node.key_by>` returns a :class:`KeyedStream`, which
is not a node: it only says how records are keyed. Each of its operators makes one node of kind
``stateful`` whose :class:`StateSpec` says what it keeps. The stage that runs it
(``pipeline/stateful.py``) owns the state, snapshots it to KV and emits its outputs exactly once
(docs/state.md).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable
from typing import Any, Literal, Protocol

import attrs

from headrace.pipeline.errors import PipelineError
from headrace.state.aggregates import Aggregate
from headrace.state.disk import DEFAULT_CACHE_BYTES
from headrace.state.joins import HOWS, LEFT, RIGHT, How, join_sides, pairs
from headrace.state.keyed import StatefulFn, fold_fn, reduce_fn
from headrace.state.windows import SessionWindow, SlidingWindow, TumblingWindow


class Chain(Protocol):
    """What a keyed stream needs of the node it keys: to add a node after it (the graph's
    ``Node``, named this way so that this module need not import the graph, which imports
    it)."""

    @property
    def pipeline(self) -> Any: ...

    def _then(self, kind: Any, fn: Any, name: str | None, **kw: Any) -> Any: ...

    def map(self, fn: Callable[[Any], Any], *, name: str | None = None) -> Any: ...


Assigner = TumblingWindow | SlidingWindow | SessionWindow
#: Where a record's event time comes from: a function of its value (a datetime, or seconds
#: since the epoch), ``"stored"`` (when the stream stored its message) or ``"processing"``
#: (the wall clock when the operator sees it: processing-time windows).
EventTime = Callable[[Any], Any] | Literal["stored", "processing"]

#: A snapshot at least this often (seconds) by default: the delay before a window's result
#: or a stateful map's output goes on, and before the messages behind it are acked.
SNAPSHOT_INTERVAL = 1.0
#: Results waiting for the sinks at which an operator stops taking records (the default of
#: ``max_pending_results``).
MAX_PENDING_RESULTS = 10_000
#: Where an operator's state lives while it runs (``StateSpec.backend``).
Backend = Literal["memory", "disk"]


def _storage(
    backend: Backend, state_dir: str | None, cache_bytes: int, max_pending_results: int
) -> dict[str, Any]:
    """The storage options every stateful operator takes, checked."""
    if backend not in ("memory", "disk"):
        raise PipelineError(f"backend must be 'memory' or 'disk', not {backend!r}")
    if state_dir is not None:
        if backend != "disk":
            raise PipelineError("state_dir is where backend='disk' keeps its file; set both")
        if not os.path.isdir(state_dir):
            raise PipelineError(f"state_dir {state_dir!r} is not a directory")
    if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 2**20:
        raise PipelineError(f"cache_bytes must be an int of at least 1 MiB, not {cache_bytes!r}")
    if (
        isinstance(max_pending_results, bool)
        or not isinstance(max_pending_results, int)
        or max_pending_results < 1
    ):
        raise PipelineError(
            f"max_pending_results must be a positive int, not {max_pending_results!r}"
        )
    return {
        "backend": backend,
        "state_dir": state_dir,
        "cache_bytes": cache_bytes,
        "max_pending_results": max_pending_results,
    }


def _seconds(value: float | dt.timedelta | None, what: str, *, zero: bool = False) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    if not (seconds >= 0 if zero else seconds > 0) or seconds != seconds:
        raise PipelineError(f"{what} must be {'>= 0' if zero else '> 0'}, not {value!r}")
    return seconds


@attrs.frozen(slots=True, kw_only=True)
class StateSpec:
    """What a stateful node keeps and does. ``kind`` ``"map"``: ``fn(state, value) ->
    (state, output)`` per key (``pair``: outputs are ``(key, output)``, as ``fold`` and
    ``reduce`` give them); ``"window"``: ``aggregate`` over ``assigner``'s windows of event
    time. ``ttl`` (map): seconds a key's state outlives its last record; ``lateness``
    (window): how far behind the newest event time a record may come and still count;
    ``idle`` (window): after this many seconds without records the watermark moves on with
    the wall clock, so the last windows close; ``max_keys``: a bound that stops the pipeline
    rather than growing until it is killed; ``snapshot_interval`` / ``snapshot_every``: a
    snapshot after this many seconds or held messages, whichever comes first."""

    kind: Literal["map", "window"]
    key: Callable[[Any], Any]
    fn: StatefulFn | None = None
    pair: bool = False
    assigner: Assigner | None = None
    aggregate: Aggregate[Any, Any, Any] | None = None
    event_time: EventTime = "stored"
    lateness: float = 0.0
    idle: float | None = None
    ttl: float | None = None
    max_keys: int | None = None
    snapshot_interval: float = SNAPSHOT_INTERVAL
    snapshot_every: int | None = None
    #: Inputs of a window whose watermark is the least of theirs (2 for a join: records are
    #: ``(side, value)``); 1: the newest event time of all records.
    sides: int = 1
    #: Where the state lives while the operator runs: ``"memory"`` (dicts: fastest, grows
    #: with the keys and open windows) or ``"disk"`` (a local SQLite file in ``state_dir``,
    #: the system's temporary directory by default, of which at most ``cache_bytes`` are
    #: kept in memory). Snapshots go to KV either way, and either restores the other's.
    backend: Backend = "memory"
    state_dir: str | None = None
    cache_bytes: int = DEFAULT_CACHE_BYTES
    #: Results not yet committed by the sinks (held in the state and in every snapshot) at
    #: which the operator stops taking records until the sinks catch up: backpressure, so
    #: that a sink down for an hour does not fill memory with results.
    max_pending_results: int = MAX_PENDING_RESULTS

    def describe(self) -> str:
        """One line for ``headrace graph``: what it keeps, by which rule."""
        where = ", on disk" if self.backend == "disk" else ""
        if self.kind == "window":
            assigner = type(self.assigner).__name__.removesuffix("Window").lower()
            return f"{assigner} windows, lateness {self.lateness:g}s{where}"
        ttl = f", ttl {self.ttl:g}s" if self.ttl is not None else ""
        return f"keyed state{ttl}{where}"


class KeyedStream:
    """Records of ``node`` keyed by ``key(value)``; its methods add stateful operators. Each
    also takes ``backend`` (``"memory"`` or ``"disk"``), ``state_dir``, ``cache_bytes`` and
    ``max_pending_results``: where its state lives and when it waits for its sinks
    (:class:`StateSpec`, docs/state.md)."""

    def __init__(self, node: Chain, key: Callable[[Any], Any]) -> None:
        if not callable(key):
            raise PipelineError(f"key_by needs a function of the record's value, not {key!r}")
        self.node = node
        self.key = key

    def __repr__(self) -> str:
        return f"<KeyedStream of {self.node!r}>"

    def _add(self, name: str | None, default: str, spec: StateSpec, **kw: Any) -> Any:
        return self.node._then("stateful", None, name or default, state=spec, **kw)

    def stateful_map(
        self,
        fn: StatefulFn,
        *,
        name: str | None = None,
        ttl: float | dt.timedelta | None = None,
        max_keys: int | None = None,
        snapshot_interval: float = SNAPSHOT_INTERVAL,
        snapshot_every: int | None = None,
        on_error: Literal["nak", "crash"] = "nak",
        backend: Backend = "memory",
        state_dir: str | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_pending_results: int = MAX_PENDING_RESULTS,
    ) -> Any:
        """Per key, ``fn(state, value) -> (state, output)``: ``state`` is None for a new key
        (or one whose ``ttl`` ran out); returning a state of None forgets the key; an output
        of None emits nothing."""
        if not callable(fn):
            raise PipelineError(f"stateful_map needs a function, not {fn!r}")
        spec = StateSpec(
            kind="map",
            key=self.key,
            fn=fn,
            ttl=_seconds(ttl, "ttl"),
            max_keys=max_keys,
            snapshot_interval=_seconds(snapshot_interval, "snapshot_interval") or 1.0,
            snapshot_every=snapshot_every,
            **_storage(backend, state_dir, cache_bytes, max_pending_results),
        )
        return self._add(name, getattr(fn, "__name__", "stateful_map"), spec, on_error=on_error)

    def fold(
        self,
        init: Callable[[], Any],
        fn: Callable[[Any, Any], Any],
        *,
        name: str | None = None,
        ttl: float | dt.timedelta | None = None,
        max_keys: int | None = None,
        snapshot_interval: float = SNAPSHOT_INTERVAL,
        backend: Backend = "memory",
        state_dir: str | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_pending_results: int = MAX_PENDING_RESULTS,
    ) -> Any:
        """Per key, ``acc = fn(acc, value)`` from ``init()``; each record emits
        ``(key, acc)``: the running value."""
        storage = _storage(backend, state_dir, cache_bytes, max_pending_results)
        spec = self._running(fold_fn(init, fn), ttl, max_keys, snapshot_interval, storage)
        return self._add(name, "fold", spec)

    def reduce(
        self,
        fn: Callable[[Any, Any], Any],
        *,
        name: str | None = None,
        ttl: float | dt.timedelta | None = None,
        max_keys: int | None = None,
        snapshot_interval: float = SNAPSHOT_INTERVAL,
        backend: Backend = "memory",
        state_dir: str | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_pending_results: int = MAX_PENDING_RESULTS,
    ) -> Any:
        """Per key, the first value, then ``fn(acc, value)``; each record emits
        ``(key, acc)``."""
        storage = _storage(backend, state_dir, cache_bytes, max_pending_results)
        spec = self._running(reduce_fn(fn), ttl, max_keys, snapshot_interval, storage)
        return self._add(name, "reduce", spec)

    def _running(
        self,
        fn: StatefulFn,
        ttl: float | dt.timedelta | None,
        max_keys: int | None,
        snapshot_interval: float,
        storage: dict[str, Any],
    ) -> StateSpec:
        """The spec of ``fold`` and ``reduce``: a stateful map emitting ``(key, acc)``."""
        return StateSpec(
            kind="map",
            key=self.key,
            fn=fn,
            pair=True,
            ttl=_seconds(ttl, "ttl"),
            max_keys=max_keys,
            snapshot_interval=_seconds(snapshot_interval, "snapshot_interval") or 1.0,
            **storage,
        )

    def window(
        self,
        assigner: Assigner,
        aggregate: Aggregate[Any, Any, Any],
        *,
        event_time: EventTime = "stored",
        lateness: float | dt.timedelta = 0.0,
        idle: float | dt.timedelta | None = None,
        name: str | None = None,
        max_keys: int | None = None,
        snapshot_interval: float = SNAPSHOT_INTERVAL,
        snapshot_every: int | None = None,
        backend: Backend = "memory",
        state_dir: str | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_pending_results: int = MAX_PENDING_RESULTS,
    ) -> Any:
        """Aggregate each key's records over ``assigner``'s windows of event time; a window
        emits one :class:`~headrace.state.WindowResult` (key, bounds, value, count) once the
        watermark (the newest event time less ``lateness``) passes its end. A record behind
        the watermark is late: dead-lettered with the reason, counted, never dropped
        silently."""
        if not isinstance(assigner, TumblingWindow | SlidingWindow | SessionWindow):
            raise PipelineError(
                f"window needs a TumblingWindow, SlidingWindow or SessionWindow, not {assigner!r}"
            )
        if not isinstance(aggregate, Aggregate):
            raise PipelineError(f"window needs an Aggregate (count(), ...), not {aggregate!r}")
        if isinstance(assigner, SessionWindow) and aggregate.merge is None:
            raise PipelineError("session windows merge: the aggregate needs a merge function")
        if not (callable(event_time) or event_time in ("stored", "processing")):
            raise PipelineError(
                "event_time must be a function of the value, 'stored' or 'processing', "
                f"not {event_time!r}"
            )
        spec = StateSpec(
            kind="window",
            key=self.key,
            assigner=assigner,
            aggregate=aggregate,
            event_time=event_time,
            lateness=_seconds(lateness, "lateness", zero=True) or 0.0,
            idle=_seconds(idle, "idle"),
            max_keys=max_keys,
            snapshot_interval=_seconds(snapshot_interval, "snapshot_interval") or 1.0,
            snapshot_every=snapshot_every,
            **_storage(backend, state_dir, cache_bytes, max_pending_results),
        )
        return self._add(name, "window", spec)

    def join(
        self,
        other: KeyedStream,
        assigner: Assigner,
        *,
        how: How = "inner",
        event_time: EventTime | tuple[EventTime, EventTime] = "stored",
        lateness: float | dt.timedelta = 0.0,
        idle: float | dt.timedelta | None = None,
        name: str | None = None,
        max_keys: int | None = None,
        snapshot_interval: float = SNAPSHOT_INTERVAL,
        backend: Backend = "memory",
        state_dir: str | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_pending_results: int = MAX_PENDING_RESULTS,
    ) -> Any:
        """A windowed join with ``other``: for each key and each of ``assigner``'s windows,
        every pair of a value of this side with a value of the other, as
        :class:`~headrace.state.Joined` records, once the window closes (``how``: ``"inner"``,
        ``"left"``, ``"right"``, ``"outer"``; headrace/state/joins.py). ``event_time`` is one
        rule for both sides or a pair (this side's, the other's). Built as a merge of both
        sides tagged with their side, one window operator keyed by each side's key, and a
        flat_map of the closed windows into pairs: exactly once, late records dead-lettered,
        as for any window."""
        if not isinstance(other, KeyedStream):
            raise PipelineError(f"join needs another key_by(...) stream, not {other!r}")
        if how not in HOWS:
            raise PipelineError(f"how must be one of {', '.join(HOWS)}, not {how!r}")
        label = name or "join"
        times = event_time if isinstance(event_time, tuple) else (event_time, event_time)
        for rule in times:
            if not (callable(rule) or rule in ("stored", "processing")):
                raise PipelineError(
                    f"join {label!r}: event_time must be a function of the value, 'stored' or "
                    f"'processing', not {rule!r}"
                )
        if callable(times[0]) != callable(times[1]) or (
            not callable(times[0]) and times[0] != times[1]
        ):
            raise PipelineError(
                f"join {label!r}: both sides need the same kind of event time (two functions, "
                "or the same 'stored' or 'processing')"
            )
        keys = (self.key, other.key)
        left = self.node.map(_Tag(LEFT), name=f"{label}-left")
        right = other.node.map(_Tag(RIGHT), name=f"{label}-right")
        merged = self.node.pipeline.merge(left, right, name=f"{label}-sides")
        windowed = KeyedStream(merged, _SideKey(keys)).window(
            assigner,
            join_sides(),
            event_time=_SideTime(times) if callable(times[0]) else times[0],
            lateness=lateness,
            idle=idle,
            name=label,
            max_keys=max_keys,
            snapshot_interval=snapshot_interval,
            backend=backend,
            state_dir=state_dir,
            cache_bytes=cache_bytes,
            max_pending_results=max_pending_results,
        )
        # The join's watermark is the least of the two sides' (pipeline/stateful.py): a side
        # read ahead of the other does not make the other's records late.
        windowed.state = attrs.evolve(windowed.state, sides=2)
        return windowed.flat_map(_Pairs(how), name=f"{label}-pairs")


class _Tag:
    """Tags a value with its side of a join (a class, not a lambda: it reads in a graph)."""

    def __init__(self, side: int) -> None:
        self.side = side
        self.__name__ = "left" if side == LEFT else "right"

    def __call__(self, value: Any) -> tuple[int, Any]:
        return (self.side, value)


class _SideKey:
    """The key of a tagged value: its own side's key function."""

    def __init__(self, keys: tuple[Callable[[Any], Any], Callable[[Any], Any]]) -> None:
        self.keys = keys

    def __call__(self, tagged: tuple[int, Any]) -> Any:
        return self.keys[tagged[0]](tagged[1])


class _SideTime:
    """The event time of a tagged value: its own side's rule."""

    def __init__(self, rules: tuple[Any, Any]) -> None:
        self.rules = rules

    def __call__(self, tagged: tuple[int, Any]) -> Any:
        return self.rules[tagged[0]](tagged[1])


class _Pairs:
    """A closed window of the join into its pairs."""

    def __init__(self, how: How) -> None:
        self.how = how
        self.__name__ = "pairs"

    def __call__(self, result: Any) -> list[Any]:
        return pairs(result, self.how)
