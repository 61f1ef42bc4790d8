"""Per-message TTL (ADR-43): how long the stream keeps one message, in its ``Nats-TTL`` header.

A stream with ``allow_msg_ttl`` removes a message whose ``Nats-TTL`` has run out, counting from
the message's stream timestamp; ``never`` exempts it from the stream's ``max_age`` as well. The
server reads the header as whole seconds (``"90"``) or a Go duration (``"1h30m"``, ``"1.5s"``)
and refuses, with err_code 10165, anything else: fractional bare numbers, ``0``, negative
values and anything under one second. A stream without ``allow_msg_ttl`` refuses every
``Nats-TTL`` with 10166 (:class:`~headrace.jetstream.errors.MessageTTLDisabled`).

The client checks a TTL before sending it, so a bad one is an
:class:`~headrace.jetstream.errors.InvalidMessageTTL` raised at the call, not a round trip
later, and it sends numbers in the form the server reads exactly: whole seconds as an integer,
anything finer as milliseconds.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Final

from headrace.jetstream.errors import InvalidMessageTTL

#: The header that carries a message's TTL.
NATS_TTL: Final = "Nats-TTL"
#: The TTL of a message that is never removed for its age (neither by TTL nor by ``max_age``).
NEVER: Final = "never"
#: ADR-43's floor: a TTL under one second is refused.
MIN_TTL: Final = 1.0

#: What a TTL may be given as: seconds, a timedelta, ``"never"``, or a duration string.
MessageTTL = float | int | dt.timedelta | str

_ERR_CODE = 10165
_UNITS: Final = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def _refuse(ttl: object, why: str) -> InvalidMessageTTL:
    return InvalidMessageTTL(
        400,
        _ERR_CODE,
        f"invalid per-message TTL {ttl!r}: {why}; give seconds (at least 1), a timedelta, "
        f"a duration such as '90s' or '1h30m', or {NEVER!r}",
    )


def duration_seconds(text: str) -> float:
    """The seconds of a Go duration string (``"1h30m"``, ``"1.5s"``, ``"500ms"``) or of a
    bare count of seconds (``"90"``); :class:`InvalidMessageTTL` for anything else."""
    if text.isdigit():
        return float(int(text))
    pos, total = 0, 0.0
    for part in _PART.finditer(text):
        if part.start() != pos:
            break
        total += float(part.group(1)) * _UNITS[part.group(2)]
        pos = part.end()
    if not text or pos != len(text):
        raise _refuse(text, "not whole seconds nor a duration string")
    return total


def ttl_header(ttl: MessageTTL) -> str:
    """The ``Nats-TTL`` value for ``ttl``: seconds (int or float), a :class:`datetime.timedelta`,
    ``"never"``, or a duration string passed on as given. :class:`InvalidMessageTTL` if it is
    under one second or not a TTL at all."""
    if isinstance(ttl, str):
        if ttl == NEVER:
            return ttl
        seconds = duration_seconds(ttl)
        if seconds < MIN_TTL:
            raise _refuse(ttl, "under one second")
        return ttl
    if isinstance(ttl, dt.timedelta):
        seconds = ttl.total_seconds()
    elif isinstance(ttl, (int, float)) and not isinstance(ttl, bool):
        seconds = float(ttl)
    else:
        raise _refuse(ttl, f"a TTL is not a {type(ttl).__name__}")
    if math.isnan(seconds):
        raise _refuse(ttl, "not a number")
    if math.isinf(seconds):
        raise _refuse(ttl, f"infinite (a message kept for ever has the TTL {NEVER!r})")
    if seconds < MIN_TTL:
        raise _refuse(ttl, "under one second")
    if seconds == int(seconds):
        return str(int(seconds))
    return f"{round(seconds * 1000)}ms"
