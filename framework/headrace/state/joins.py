"""A windowed join of two keyed streams: the records of both sides that share a key and a
window, paired when the window closes.

The join is a window like any other (``headrace.state.windows``): both sides' records, tagged
with their side, go into one operator keyed by each side's own key function, whose aggregate
(:func:`join_sides`) keeps each side's values apart; when the window closes, :func:`pairs`
turns its result into one :class:`Joined` per pair. So a join has the windows' guarantees
as they are: event time, watermark, late records dead-lettered, exactly once through the
snapshots.

``how`` is the SQL word: ``"inner"`` pairs every left value with every right value of the
window and key (none when a side is empty); ``"left"`` keeps left values without a match
(paired with None), ``"right"`` the other way, ``"outer"`` both.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import attrs

from headrace.state.aggregates import Aggregate
from headrace.state.windows import WindowResult

How = Literal["inner", "left", "right", "outer"]
HOWS = ("inner", "left", "right", "outer")

#: The side a record came from, as tagged before the join's window.
LEFT, RIGHT = 0, 1


@attrs.frozen(slots=True)
class Joined:
    """One pair of a windowed join: the key, the window, and a value of each side (None for
    the missing side of a left, right or outer join's unmatched value)."""

    key: Any
    start: datetime
    end: datetime
    left: Any
    right: Any

    def to_dict(self) -> dict[str, Any]:
        """A dict for JSON (times as ISO 8601); ``key`` and the values as they are."""
        return {
            "key": self.key,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "left": self.left,
            "right": self.right,
        }


def _init() -> tuple[list[Any], list[Any]]:
    return ([], [])


def _add(acc: tuple[list[Any], list[Any]], tagged: tuple[int, Any]) -> tuple[list[Any], list[Any]]:
    acc[tagged[0]].append(tagged[1])
    return acc


def _merge(
    a: tuple[list[Any], list[Any]], b: tuple[list[Any], list[Any]]
) -> tuple[list[Any], list[Any]]:
    return (a[0] + b[0], a[1] + b[1])


def join_sides() -> Aggregate[tuple[list[Any], list[Any]], tuple[int, Any], Any]:
    """The join's aggregate: each side's values of a window, in arrival order."""
    return Aggregate(init=_init, add=_add, merge=_merge)


def pairs(result: WindowResult, how: How) -> list[Joined]:
    """The pairs of one closed window of the join (see the module docs for ``how``)."""
    lefts, rights = result.value
    key, start, end = result.key, result.start, result.end
    out = [Joined(key, start, end, a, b) for a in lefts for b in rights]
    if not rights and how in ("left", "outer"):
        out.extend(Joined(key, start, end, a, None) for a in lefts)
    if not lefts and how in ("right", "outer"):
        out.extend(Joined(key, start, end, None, b) for b in rights)
    return out
