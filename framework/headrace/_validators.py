"""The attrs validators the configuration classes share (internal).

Options classes in several layers (``nats.options``, ``jetstream``, ``checkpoints``,
``pipeline``) check the same few properties of a number. They used to define the checks one
module at a time, with drifting rules (one accepted NaN, another did not) and drifting words.
They live here, beside ``errors.py`` at the bottom of the layers, so that every layer can use
them and the error text is the same wherever a value is refused.

Comparisons are written ``not value > 0`` rather than ``value <= 0`` so that NaN, for which
every comparison is false, is refused too: a NaN timeout or delay is never what was meant.
"""

from __future__ import annotations

from typing import Any

import attrs


def positive(_inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    """Refuse a value that is not greater than zero (NaN included)."""
    if not value > 0:
        raise ValueError(f"{attribute.name} must be positive, not {value!r}")


def positive_or_none(_inst: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    """Like :func:`positive`, with ``None`` (no limit, not set) allowed."""
    if value is not None and not value > 0:
        raise ValueError(f"{attribute.name} must be positive or None, not {value!r}")


def non_negative(_inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    """Refuse a value below zero (NaN included)."""
    if not value >= 0:
        raise ValueError(f"{attribute.name} must not be negative, not {value!r}")


def at_least_one_or_none(_inst: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    """A count that, when given, is at least 1 (``None``: not set)."""
    if value is not None and value < 1:
        raise ValueError(f"{attribute.name} must be at least 1, not {value!r}")


def at_least_one(_inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    """A count of at least 1, and an integer: ``True`` or ``1.5`` is a mistake, not a count."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be an integer of at least 1, not {value!r}")
