"""Python values into an Arrow column of a declared type: exactly, or not at all.

``pa.array(values, type)`` changes some values instead of refusing them: a float into an
integer column is truncated (1611.5 is written as 1611), a float beyond a ``float32`` becomes
inf, a bool into a float column becomes 1.0, an int or a float into a timestamp or date column
is taken for a count of microseconds or days, a datetime into a date column loses its time, a
pandas ``Timestamp`` loses its nanoseconds. The sink would then commit a value the record never
had, and nothing would say so. :func:`exact_array` converts a column so that every value is
written as it is, or raises (``ValueError``, ``TypeError``) for the values the column cannot
hold; the sink sets such a record aside (``RecordsRejected``), and writes the rest.

What counts as exact:

- integer columns take ints within the column's range, and **whole-valued** floats and
  Decimals (``1611.0`` is written as ``1611``: nothing is lost, and JSON encoders and pandas
  turn integers into floats often). A fraction, NaN, inf, or a value out of range is refused,
  and so are bools and strings;
- float columns take ints that the float type holds exactly (pyarrow checks them) and floats;
  a ``float32`` rounds as floats do, but a finite float that would become inf is refused;
- timestamp columns take datetimes only; date columns take dates, not datetimes;
- Decimal, string, binary and bool columns were already strict (pyarrow refuses what does not
  fit; text and bytes convert both ways only when the bytes are UTF-8);
- lists, maps and structs: their items are checked by the same rules.

Cost: the usual batch holds one kind of value per column, so no Python runs per value. The
distinct Python types of a column are collected in C (``set(map(type, values))``, about 11 ns
a value); a column of the expected kind then takes pyarrow's typed conversion, as before. Floats
bound for an integer column are converted as they are (double, or decimal) and cast with
``cast(safe=True)``, which refuses a fraction, NaN, inf or overflow in C. Only nested columns
with such items, and a batch that fails, cost Python per value.
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

_NONE = type(None)


def exact_array(values: Sequence[Any], type_: pa.DataType) -> pa.Array:
    """``values`` as an array of ``type_``, each value exactly; ``ValueError`` or
    ``TypeError`` (pyarrow's errors are subclasses of both) when one does not fit."""
    if pa.types.is_integer(type_):
        return _integers(values, type_)
    if pa.types.is_floating(type_):
        return _floats(values, type_)
    if pa.types.is_timestamp(type_):
        kinds = _kinds(values)
        _only(kinds, type_, lambda k: issubclass(k, dt.datetime), "a datetime")
        _no_lost_nanoseconds(values, kinds)
    elif pa.types.is_date(type_):
        _only(
            _kinds(values),
            type_,
            lambda k: issubclass(k, dt.date) and not issubclass(k, dt.datetime),
            "a date (a datetime's .date(), if the time may go)",
        )
    elif pa.types.is_time(type_):
        _only(_kinds(values), type_, lambda k: issubclass(k, dt.time), "a time")
    elif pa.types.is_duration(type_):
        _only(_kinds(values), type_, lambda k: issubclass(k, dt.timedelta), "a timedelta")
    elif _nested(type_) and _needs_check(type_):
        _check_items(values, type_)
    return pa.array(values, type_)


def _kinds(values: Iterable[Any]) -> set[type]:
    """The distinct types of ``values`` but None: one C loop over them."""
    kinds = set(map(type, values))
    kinds.discard(_NONE)
    return kinds


def _is_int(kind: type) -> bool:
    return issubclass(kind, numbers.Integral) and not issubclass(kind, bool)


def _is_number(kind: type) -> bool:
    """An int, a float (numpy's too) or a Decimal: what an integer column may take, if whole."""
    return _is_int(kind) or (
        not issubclass(kind, bool) and issubclass(kind, (numbers.Real, decimal.Decimal))
    )


def _only(kinds: set[type], type_: pa.DataType, ok: Callable[[type], bool], wanted: str) -> None:
    wrong = sorted(k.__name__ for k in kinds if not ok(k))
    if wrong:
        raise TypeError(f"a {wrong[0]} value for a column of type {type_}, which takes {wanted}")


def _integers(values: Sequence[Any], type_: pa.DataType) -> pa.Array:
    kinds = _kinds(values)
    if all(map(_is_int, kinds)):
        return pa.array(values, type_)  # exact for ints; out of range raises
    _only(kinds, type_, _is_number, "an int, or a float or Decimal with no fraction")
    # Inferred: double for ints and floats, decimal for Decimals; then a safe cast, which
    # refuses a fraction, NaN, inf or a value out of the column's range.
    try:
        return pa.array(values).cast(type_, safe=True)
    except pa.ArrowInvalid as exc:
        raise ValueError(f"does not fit a column of type {type_} exactly: {exc}") from exc


def _floats(values: Sequence[Any], type_: pa.DataType) -> pa.Array:
    kinds = _kinds(values)
    _only(
        kinds,
        type_,
        lambda k: _is_number(k) and not issubclass(k, decimal.Decimal),
        "an int or a float",
    )
    array = pa.array(values, type_)  # ints are checked to be exact, floats are rounded
    if type_.bit_width < 64 and not all(map(_is_int, kinds)) and pc.any(pc.is_inf(array)).as_py():
        # A finite float beyond the type's range became inf (rare: only here per value).
        for i in pc.indices_nonzero(pc.is_inf(array)).to_pylist():
            if math.isfinite(values[i]):
                raise ValueError(f"{values[i]!r} is beyond the range of type {type_}")
    return array


def _no_lost_nanoseconds(values: Sequence[Any], kinds: set[type]) -> None:
    """pandas' Timestamp has nanoseconds, which a microsecond column would cut."""
    if kinds <= {dt.datetime}:
        return
    for value in values:
        if getattr(value, "nanosecond", 0):
            raise ValueError(f"{value!r} has nanoseconds; the column keeps microseconds")


def _nested(type_: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(type_)
        or pa.types.is_large_list(type_)
        or pa.types.is_fixed_size_list(type_)
        or pa.types.is_map(type_)
        or pa.types.is_struct(type_)
    )


def _children(type_: pa.DataType) -> list[pa.DataType]:
    if pa.types.is_map(type_):
        return [type_.key_type, type_.item_type]
    if pa.types.is_struct(type_):
        return [type_.field(i).type for i in range(type_.num_fields)]
    return [type_.value_type]


def _needs_check(type_: pa.DataType) -> bool:
    """Whether pyarrow's typed conversion may change a value somewhere in ``type_``."""
    if _nested(type_):
        return any(map(_needs_check, _children(type_)))
    # Floats of any width: a bool in a float column would become 1.0.
    types = pa.types
    return bool(types.is_integer(type_) or types.is_floating(type_) or types.is_temporal(type_))


def _check_items(values: Sequence[Any], type_: pa.DataType) -> None:
    """Check the items of a nested column by the rules of their own type (Python per row)."""
    present = [v for v in values if v is not None]
    if pa.types.is_map(type_):
        pairs = [p for v in present for p in (v.items() if isinstance(v, dict) else v)]
        keys, items = ([k for k, _ in pairs], [i for _, i in pairs])
        exact_array(keys, type_.key_type)
        exact_array(items, type_.item_type)
    elif pa.types.is_struct(type_):
        for i in range(type_.num_fields):
            field = type_.field(i)
            exact_array([_member(v, field.name, i) for v in present], field.type)
    else:
        if any(isinstance(v, (str, bytes, dict)) for v in present):
            return  # not a list: the typed conversion refuses it
        exact_array(list(itertools.chain.from_iterable(present)), type_.value_type)


def _member(value: Any, name: str, index: int) -> Any:
    if isinstance(value, dict):
        return value.get(name)
    if isinstance(value, (tuple, list)):
        return value[index] if index < len(value) else None
    return None  # the typed conversion refuses it
