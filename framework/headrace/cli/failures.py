"""Failures as events, in words and rate-limited: what ``headrace run`` says when an operator or a
sink fails and the pipeline carries on (and when the server reports an error).

A filter with a bug fails on every record: 900 events a second would bury everything else, and
``errors=900`` alone says nothing. :class:`EventLimiter` emits the first event of each key (an
actor) at once; further ones within ``per`` seconds are held back and counted. The last one held
back is emitted once ``per`` has passed since the previous event of its key
(:meth:`EventLimiter.flush`, which the caller runs every ``per`` seconds and at the end), with
``suppressed``: how many of that key's events were not shown before it. So each failure is either
shown or counted: over a run, an actor's ``error`` events plus their ``suppressed`` add up to its
failures.

:class:`FailureEvents` feeds it the pipeline's failures (the ``stats.on_failure`` hook): an
``error`` event with the error's text, the actor and node, and the stream and sequence of the
message concerned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from headrace.pipeline.sink_retry import SinkStuck
from headrace.pipeline.stats import Failure

#: At most one event per key (actor) per this many seconds.
PER_KEY_INTERVAL = 1.0


@attrs.define(slots=True)
class _Key:
    #: When (the clock's time) its last event was emitted.
    last: float
    #: Events held back since then, and the latest of them (event name, fields).
    held: int = 0
    latest: tuple[str, dict[str, Any]] | None = None


class EventLimiter:
    """At most one event per key per ``per`` seconds; the others counted (module docs)."""

    def __init__(
        self, emit: Callable[..., None], clock: Callable[[], float], *, per: float
    ) -> None:
        self._emit = emit
        self._clock = clock
        self.per = per
        self._keys: dict[str, _Key] = {}

    def offer(self, key: str, event: str, fields: dict[str, Any]) -> None:
        now = self._clock()
        state = self._keys.get(key)
        if state is not None and now - state.last < self.per:
            state.held += 1
            state.latest = (event, fields)
            return
        held = state.held if state is not None else 0
        self._keys[key] = _Key(last=now)
        self._emit(event, **fields, suppressed=held)

    def flush(self, *, final: bool = False) -> None:
        """Emit what was held back for ``per`` seconds or more (everything, when ``final``)."""
        now = self._clock()
        for state in self._keys.values():
            if state.latest is None or (not final and now - state.last < self.per):
                continue
            (event, fields), suppressed = state.latest, state.held - 1
            state.last, state.held, state.latest = now, 0, None
            self._emit(event, **fields, suppressed=suppressed)

    @property
    def held(self) -> int:
        """Events counted and not shown yet."""
        return sum(state.held for state in self._keys.values())


class FailureEvents(EventLimiter):
    """The pipeline's failures as ``error`` events, at most one per actor per ``per`` seconds."""

    def __init__(
        self,
        emit: Callable[..., None],
        clock: Callable[[], float],
        *,
        per: float = PER_KEY_INTERVAL,
    ) -> None:
        super().__init__(emit, clock, per=per)

    def __call__(self, failure: Failure) -> None:
        """A failure just happened (the pipeline's ``stats.on_failure`` hook). A sink taken
        for down after every part of a batch failed is a ``sink_stuck`` event of its own (the
        error events of its writes would not say it)."""
        if isinstance(failure.error, SinkStuck):
            self.offer(f"{failure.actor}:stuck", "sink_stuck", failure.fields())
            return
        self.offer(failure.actor, "error", {**failure.fields(), "fatal": False})
