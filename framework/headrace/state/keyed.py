"""Keyed state: one value per key, changed by a function of the state and each record.

:class:`KeyedOperator` is the sans-IO core of ``key_by(...).stateful_map(fn)`` (and of
``fold`` and ``reduce``, which are stateful maps): ``fn(state, value) -> (state, output)``,
with ``state`` None for a key not seen (or expired), a returned state of None forgetting the
key, and an output of None emitting nothing. It never reads a clock: the stage passes the
wall-clock time, which is what a key's time to live counts (a snapshot restored in another
process, hours later, must still know which keys are stale, which a monotonic clock cannot
tell).

Keys are kept in the order they were last touched, so expiring is a walk from the front that
stops at the first key still alive: no scan of every key.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from headrace.state.errors import StateLimitExceeded

#: ``fn(state, value) -> (state, output)``.
StatefulFn = Callable[[Any, Any], tuple[Any, Any]]


class KeyedOperator:
    """Per-key state under ``fn`` (see the module docs). ``ttl``: seconds a key's state is
    kept after its last record (None: for ever); ``max_keys``: more keys than this fails with
    :class:`StateLimitExceeded` (None: no limit)."""

    __slots__ = ("_states", "_touched", "expired", "fn", "max_keys", "name", "ttl")

    def __init__(
        self,
        fn: StatefulFn,
        *,
        ttl: float | None = None,
        max_keys: int | None = None,
        name: str = "stateful_map",
    ) -> None:
        if ttl is not None and not ttl > 0:
            raise ValueError(f"ttl must be a positive number of seconds, not {ttl!r}")
        if max_keys is not None and max_keys < 1:
            raise ValueError(f"max_keys must be at least 1, not {max_keys!r}")
        self.fn = fn
        self.ttl = ttl
        self.max_keys = max_keys
        self.name = name
        self._states: dict[Any, Any] = {}
        #: key -> when its state was last changed (wall clock), oldest first.
        self._touched: OrderedDict[Any, float] = OrderedDict()
        #: Keys forgotten for their age so far.
        self.expired = 0

    @property
    def keys(self) -> int:
        return len(self._states)

    def get(self, key: Any) -> Any:
        """The state of ``key`` (None if none)."""
        return self._states.get(key)

    def apply(self, key: Any, value: Any, now: float) -> Any:
        """Run ``fn`` for one record of ``key`` at wall-clock time ``now``; its output. If
        ``fn`` raises, nothing changed."""
        states = self._states
        old = states.get(key)
        if old is not None and self.ttl is not None and now - self._touched[key] >= self.ttl:
            old = None  # stale: the record starts the key afresh
        new, output = self.fn(old, value)
        if new is None:
            if key in states:
                del states[key]
                del self._touched[key]
            return output
        if key not in states and self.max_keys is not None and len(states) >= self.max_keys:
            raise StateLimitExceeded(
                f"{self.name!r} holds state for {len(states)} keys, its max_keys; a new key "
                f"{key!r} came"
            )
        states[key] = new
        touched = self._touched
        touched[key] = now
        touched.move_to_end(key)
        return output

    def expire(self, now: float) -> int:
        """Forget every key untouched for ``ttl`` seconds; how many went."""
        if self.ttl is None:
            return 0
        touched, states = self._touched, self._states
        gone = 0
        cutoff = now - self.ttl
        while touched:
            key, when = next(iter(touched.items()))
            if when > cutoff:
                break
            del touched[key]
            del states[key]
            gone += 1
        self.expired += gone
        return gone

    def snapshot(self) -> object:
        """Plain data for :meth:`restore` (keys oldest-touched first)."""
        return [(key, self._states[key], when) for key, when in self._touched.items()]

    def restore(self, data: object) -> None:
        """Take the state :meth:`snapshot` gave (replacing this one's)."""
        self._states.clear()
        self._touched.clear()
        for key, state, when in data:  # type: ignore[attr-defined]
            self._states[key] = state
            self._touched[key] = when


def fold_fn(init: Callable[[], Any], fn: Callable[[Any, Any], Any]) -> StatefulFn:
    """``fold``: the accumulator of each key is ``fn(acc, value)`` from ``init()``; each
    record emits ``(key-less) acc``; the stage pairs it with the key."""

    def step(state: Any, value: Any) -> tuple[Any, Any]:
        acc = fn(init() if state is None else state, value)
        return acc, acc

    return step


def reduce_fn(fn: Callable[[Any, Any], Any]) -> StatefulFn:
    """``reduce``: the first value of a key is its accumulator, each later one folds in."""

    def step(state: Any, value: Any) -> tuple[Any, Any]:
        acc = value if state is None else fn(state, value)
        return acc, acc

    return step
