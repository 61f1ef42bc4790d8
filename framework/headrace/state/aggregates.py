"""What a window computes from its records: an :class:`Aggregate` and the built-in ones.

An aggregate is four plain functions rather than an object with methods, so that the window
operator's per-record path is one call (``acc = add(acc, value)``) with no lookup through an
instance, and so that an accumulator is plain data (an int, a list) that a snapshot pickles as
it is. The accumulator belongs to the operator from ``init()`` until the window fires, so
``add`` may change it in place and return it (``collect`` does: appending beats copying).

``merge`` joins the accumulators of two windows that became one. Fixed windows (tumbling,
sliding) never need it; session windows do, because one record can bridge two sessions of a
key. Every built-in has one. ``merge(earlier, later)`` gets the session that starts first as
``earlier``.

The built-ins are made of module-level functions (and :func:`functools.partial` of them for
the ``fn`` variants), so an aggregate pickles whenever its ``fn`` does: an operator's
configuration can cross to a worker process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import attrs

__all__ = ["Aggregate", "collect", "count", "max_of", "mean_of", "min_of", "sum_of"]

A = TypeVar("A")
V = TypeVar("V")
R = TypeVar("R")


@attrs.frozen(slots=True)
class Aggregate(Generic[A, V, R]):
    """How a window folds its values: ``init()`` makes an empty accumulator, ``add(acc,
    value)`` returns the accumulator with one more value (it may be ``acc`` changed in place),
    ``merge(a, b)`` the accumulator of both (None: the aggregate cannot serve session windows)
    and ``result(acc)`` the window's value when it fires (None: the accumulator itself).

    An accumulator should be plain picklable data: it is what an operator's snapshot holds.
    """

    init: Callable[[], A] = attrs.field(validator=attrs.validators.is_callable())
    add: Callable[[A, V], A] = attrs.field(validator=attrs.validators.is_callable())
    merge: Callable[[A, A], A] | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.is_callable())
    )
    result: Callable[[A], R] | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.is_callable())
    )


# -- helpers (module level: picklable) ---------------------------------------------------------


def _zero() -> int:
    return 0


def _none() -> None:
    return None


def _plus(a: Any, b: Any) -> Any:
    return a + b


def _count_add(acc: int, _value: object) -> int:
    return acc + 1


def _sum_add(acc: Any, value: Any) -> Any:
    return acc + value


def _sum_add_fn(fn: Callable[[Any], Any], acc: Any, value: Any) -> Any:
    return acc + fn(value)


def _new_list() -> list[Any]:
    return []


def _append(acc: list[Any], value: Any) -> list[Any]:
    acc.append(value)
    return acc


def _extend(a: list[Any], b: list[Any]) -> list[Any]:
    a.extend(b)
    return a


def _min(a: Any, b: Any) -> Any:
    """The smaller of two accumulators, None being "no value yet" (never the case once a
    window exists, but merge stays total). The earlier one wins a tie, as ``min`` does."""
    if a is None:
        return b
    if b is None or not b < a:
        return a
    return b


def _max(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None or not b > a:
        return a
    return b


def _min_add_fn(fn: Callable[[Any], Any], acc: Any, value: Any) -> Any:
    return _min(acc, fn(value))


def _max_add_fn(fn: Callable[[Any], Any], acc: Any, value: Any) -> Any:
    return _max(acc, fn(value))


def _mean_init() -> list[Any]:
    return [0, 0]


def _mean_add(acc: list[Any], value: Any) -> list[Any]:
    # In place: a mean over a busy window must not allocate a pair per record.
    acc[0] += value
    acc[1] += 1
    return acc


def _mean_add_fn(fn: Callable[[Any], Any], acc: list[Any], value: Any) -> list[Any]:
    acc[0] += fn(value)
    acc[1] += 1
    return acc


def _mean_merge(a: list[Any], b: list[Any]) -> list[Any]:
    a[0] += b[0]
    a[1] += b[1]
    return a


def _mean_result(acc: list[Any]) -> float:
    return float(acc[0] / acc[1])


# -- the built-ins ------------------------------------------------------------------------------


def count() -> Aggregate[int, Any, int]:
    """How many records the window holds (the same as a result's ``count``; handy as a value)."""
    return Aggregate(init=_zero, add=_count_add, merge=_plus)


def sum_of(fn: Callable[[Any], Any] | None = None) -> Aggregate[Any, Any, Any]:
    """The sum of the values, or of ``fn(value)``; it starts from the int 0, so the values may
    be ints, floats, Decimals or anything that adds to an int."""
    add = _sum_add if fn is None else functools.partial(_sum_add_fn, fn)
    return Aggregate(init=_zero, add=add, merge=_plus)


def collect() -> Aggregate[list[Any], Any, list[Any]]:
    """Every value, in a list: in arrival order within a window. When a record bridges two
    sessions, the merged list is the earlier session's values, the bridge's, then the later
    session's."""
    return Aggregate(init=_new_list, add=_append, merge=_extend)


def min_of(fn: Callable[[Any], Any] | None = None) -> Aggregate[Any, Any, Any]:
    """The least value, or the least ``fn(value)`` (not the value it came from: use
    ``Aggregate`` with a pair for an arg-min). The values must be comparable with ``<``."""
    add = _min if fn is None else functools.partial(_min_add_fn, fn)
    return Aggregate(init=_none, add=add, merge=_min)


def max_of(fn: Callable[[Any], Any] | None = None) -> Aggregate[Any, Any, Any]:
    """The greatest value, or the greatest ``fn(value)``; see :func:`min_of`."""
    add = _max if fn is None else functools.partial(_max_add_fn, fn)
    return Aggregate(init=_none, add=add, merge=_max)


def mean_of(fn: Callable[[Any], Any] | None = None) -> Aggregate[list[Any], Any, float]:
    """The arithmetic mean of the values, or of ``fn(value)``, as a float. The accumulator is
    ``[total, count]`` (a list, changed in place)."""
    add = _mean_add if fn is None else functools.partial(_mean_add_fn, fn)
    return Aggregate(init=_mean_init, add=add, merge=_mean_merge, result=_mean_result)
