"""Checks of stream and consumer configuration values, run when a config is built.

A bad value would otherwise travel to the server and come back as a refusal with the server's
wording, or worse be read differently than meant: a negative ``max_age`` or a metadata value
that is a number do not fail the same way on every server version. Each check raises
:class:`InvalidConfigValue` naming the field. The checks accept every value a server sends
back (``-1`` for "unlimited", ``0`` for "not set", the ``_nats.*`` metadata keys), because the
same models decode the server's answers.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from headrace.errors import InvalidSubjectError
from headrace.jetstream.errors import InvalidConfigValue
from headrace.protocol.commands import check_subject

#: nats-server refuses more replicas than this (``num_replicas`` of streams and consumers).
MAX_REPLICAS = 5


def _int(attr: attrs.Attribute[Any], value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidConfigValue(attr.name, f"must be an int, not {type(value).__name__}")
    return value


def non_negative(_inst: object, attr: attrs.Attribute[Any], value: int | None) -> None:
    """A count or sequence that is ``0`` or more (``0``: the server's default)."""
    if value is not None and _int(attr, value) < 0:
        raise InvalidConfigValue(attr.name, f"must be 0 or more, not {value}")


def limit(_inst: object, attr: attrs.Attribute[Any], value: int | None) -> None:
    """A limit where ``-1`` means unlimited, as the server reports unset limits."""
    if value is not None and _int(attr, value) < -1:
        raise InvalidConfigValue(attr.name, f"must be -1 (unlimited) or more, not {value}")


def replicas(_inst: object, attr: attrs.Attribute[Any], value: int | None) -> None:
    """``0`` (the server's default: one, or the stream's for a consumer) to five."""
    if value is not None and not 0 <= _int(attr, value) <= MAX_REPLICAS:
        raise InvalidConfigValue(attr.name, f"must be 0 to {MAX_REPLICAS}, not {value}")


def duration(_inst: object, attr: attrs.Attribute[Any], value: float | None) -> None:
    """Seconds, finite and not negative (the wire carries whole nanoseconds)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidConfigValue(attr.name, f"must be seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise InvalidConfigValue(attr.name, f"must be finite seconds, 0 or more, not {value}")


def text_map(_inst: object, attr: attrs.Attribute[Any], value: dict[str, str] | None) -> None:
    """Metadata: text keys to text values (the server's ``map[string]string``)."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise InvalidConfigValue(attr.name, f"must be a dict, not {type(value).__name__}")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise InvalidConfigValue(attr.name, f"keys and values must be str: {key!r}: {item!r}")


def subject_filter(_inst: object, attr: attrs.Attribute[Any], value: str | None) -> None:
    """A subject that may have wildcards; empty means "every subject" where the server
    allows it (a transform's or republish's ``src``)."""
    if value is None or value == "":
        return
    try:
        check_subject(value, wildcards=True)
    except InvalidSubjectError as exc:
        raise InvalidConfigValue(attr.name, str(exc)) from None


def destination(_inst: object, attr: attrs.Attribute[Any], value: str) -> None:
    """A transform's or republish's ``dest``: required text. Its mapping functions
    (``{{wildcard(1)}}``, which may hold spaces) are the server's to judge."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidConfigValue(attr.name, f"must be a non-empty subject, not {value!r}")


def durations(_inst: object, attr: attrs.Attribute[Any], value: list[float] | None) -> None:
    """A list of durations (a consumer's ``backoff``), each as :func:`duration` checks it."""
    if value is None:
        return
    if not isinstance(value, list):
        raise InvalidConfigValue(attr.name, f"must be a list of seconds, not {value!r}")
    for item in value:
        duration(_inst, attr, item)


def sample_frequency(_inst: object, attr: attrs.Attribute[Any], value: str | None) -> None:
    """A sampling percentage, ``"0"`` to ``"100"`` with an optional ``%``, as the server
    parses it (ADR-15 ``sample_freq``)."""
    if value is None:
        return
    if not isinstance(value, str):
        raise InvalidConfigValue(attr.name, f"must be a str such as '50%', not {value!r}")
    digits = value.strip().removesuffix("%")
    if not digits.isdigit() or not 0 <= int(digits) <= 100:
        raise InvalidConfigValue(attr.name, f"must be a percentage 0 to 100, not {value!r}")
