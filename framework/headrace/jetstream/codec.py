"""JSON mapping of the JetStream API models, declared once on each attrs field.

The wire uses nanosecond integers for durations, RFC 3339 strings for times, lower-case strings
for enums and omits unset fields. The models use seconds (float), aware ``datetime`` objects,
``StrEnum`` members and ``None`` for unset. Each field says which it is with :func:`jfield`;
:func:`to_json` and :func:`from_json` do the rest. Fields the server sends that a model does not
declare are kept in its ``extra`` mapping and sent back, so a config read from the server and
updated does not silently reset fields this version does not know.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from headrace.jetstream.errors import JetStreamError

T = TypeVar("T")

_KIND = "headrace.kind"
_JSON = "headrace.json"
_MANY = "headrace.many"

DURATION = "duration"
DURATIONS = "durations"
TIME = "time"


class DecodeError(JetStreamError):
    """An answer of the JetStream API (or a stored message's JetStream headers, an advisory)
    that is not what the server sends: not JSON, or not the shape of the model it should fill.

    A real server does not send one; a proxy, a mirror of the API or a broken server in front
    of it can. It is a :class:`~headrace.jetstream.JetStreamError` like any other failed
    request, so ``except JetStreamError`` handles it too."""


def jfield(
    json_name: str | None = None,
    *,
    kind: str | type | None = None,
    many: bool = False,
    default: Any = None,
    factory: Callable[[], Any] | None = None,
    **kwargs: Any,
) -> Any:
    """An attrs field with its JSON name and kind (DURATION, TIME, an enum or a model class);
    ``many`` marks a list of models, so a list and an object are never confused."""
    metadata = {_JSON: json_name, _KIND: kind, _MANY: many}
    if factory is not None:
        return attrs.field(factory=factory, metadata=metadata, **kwargs)
    return attrs.field(default=default, metadata=metadata, **kwargs)


def _json_name(field: attrs.Attribute[Any]) -> str:
    name = field.metadata.get(_JSON)
    return name if name else field.name


def seconds_to_ns(value: float) -> int:
    return round(value * 1_000_000_000)


def ns_to_seconds(value: int) -> float:
    return value / 1_000_000_000


_TIME_RE = re.compile(r"(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})")


def parse_time(text: str) -> dt.datetime:
    """RFC 3339 with up to nanoseconds (Go's format) to an aware datetime (microseconds)."""
    match = _TIME_RE.fullmatch(text)
    if not match:
        raise DecodeError(f"not an RFC 3339 time: {text!r}")
    day, clock, frac, zone = match.groups()
    micro = (frac or "").ljust(6, "0")[:6]
    zone = "+00:00" if zone == "Z" else zone
    try:
        return dt.datetime.fromisoformat(f"{day}T{clock}.{micro}{zone}")
    except ValueError as exc:
        raise DecodeError(f"not a valid time: {text!r}: {exc}") from exc


def format_time(value: dt.datetime) -> str:
    """RFC 3339 in UTC with microseconds; years are zero-padded (Go's zero time is year 1,
    which ``strftime`` would not pad)."""
    if value.tzinfo is None:
        raise ValueError("JetStream times must be timezone-aware (use datetime.UTC)")
    t = value.astimezone(dt.UTC) if value.year > 1 else value.replace(tzinfo=dt.UTC)
    return (
        f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"
        f".{t.microsecond:06d}Z"
    )


def _encode(value: Any, kind: Any) -> Any:
    if kind == DURATION:
        return seconds_to_ns(value)
    if kind == DURATIONS:
        return [seconds_to_ns(v) for v in value]
    if kind == TIME:
        return format_time(value)
    if isinstance(value, enum.Enum):
        return value.value
    if attrs.has(type(value)):
        return to_json(value)
    if isinstance(value, list | tuple):
        return [_encode(v, kind) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v, kind) for k, v in value.items()}
    return value


#: Metadata of a field that is the client's alone: never sent (``StreamSource.domain``).
LOCAL = "headrace.local"


def to_json(obj: Any) -> dict[str, Any]:
    """The wire form of a model: unset (``None``) fields omitted, ``extra`` merged back."""
    out: dict[str, Any] = dict(getattr(obj, "extra", None) or {})
    for field in attrs.fields(type(obj)):
        if field.name == "extra" or field.metadata.get(LOCAL):
            continue
        value = getattr(obj, field.name)
        if value is None:
            continue
        out[_json_name(field)] = _encode(value, field.metadata.get(_KIND))
    return out


def _decode(value: Any, kind: Any, where: str, many: bool = False) -> Any:
    try:
        if kind == DURATION:
            return ns_to_seconds(int(value))
        if kind == DURATIONS:
            return [ns_to_seconds(int(v)) for v in value]
        if kind == TIME:
            return parse_time(value)
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            return kind(value)
        if isinstance(kind, type) and attrs.has(kind):
            if many:
                if not isinstance(value, list):
                    raise DecodeError(f"{where}: expected a list, not {type(value).__name__}")
                return [from_json(kind, v) for v in value]
            return from_json(kind, value)
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"{where}: cannot decode {value!r}: {exc}") from exc
    return value


_FIELDS: dict[type, tuple[dict[str, attrs.Attribute[Any]], bool]] = {}


def _json_fields(cls: type) -> tuple[dict[str, attrs.Attribute[Any]], bool]:
    """``cls``'s fields by JSON name, and whether it keeps unknown keys in ``extra``: the
    same for every answer of a kind, so worked out once (every JetStream publish's PubAck is
    decoded here)."""
    found = _FIELDS.get(cls)
    if found is None:
        fields = attrs.fields(cls)
        by_json = {_json_name(f): f for f in fields if f.name != "extra"}
        found = _FIELDS[cls] = (by_json, any(f.name == "extra" for f in fields))
    return found


def from_json(cls: type[T], data: Any) -> T:
    """Build ``cls`` from a decoded JSON object; unknown keys go to ``extra`` if it has one."""
    if not isinstance(data, dict):
        raise DecodeError(f"{cls.__name__} must be a JSON object, not {type(data).__name__}")
    by_json, has_extra = _json_fields(cls)
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in data.items():
        field = by_json.get(key)
        if field is None:
            extra[key] = value
        elif value is not None:
            kwargs[field.alias or field.name] = _decode(
                value,
                field.metadata.get(_KIND),
                f"{cls.__name__}.{field.name}",
                bool(field.metadata.get(_MANY)),
            )
    if has_extra:
        kwargs["extra"] = extra
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"cannot build {cls.__name__} from the server's answer: {exc}") from exc
