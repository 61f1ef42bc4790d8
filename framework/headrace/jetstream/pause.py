"""Consumer pause and resume (nats-server 2.11+).

A paused consumer delivers nothing until its ``pause_until`` time passes or it is resumed; it
keeps its place, its acks and its pending counts. Pausing is the server's doing, so it holds for
every client of the consumer at once (every copy of a pipeline sharing a durable) and survives
their restarts: a client needs no state of its own to pause.

Two ways to set it: ``pause_until`` in the consumer's configuration (a consumer created paused),
or ``$JS.API.CONSUMER.PAUSE.<stream>.<consumer>`` with ``{"pause_until": <RFC 3339>}`` on a
consumer that exists. The answer says ``paused``, until when, and how long is left. A resume is
that call without a time (an empty body). A time that has passed is no error: the server
answers ``paused: false`` and the consumer delivers (it creates a consumer with such a time as
well, unpaused). A pause ends by itself at its time, and the server announces each change on
``$JS.EVENT.ADVISORY.CONSUMER.PAUSE.<stream>.<consumer>``.

Times are aware ``datetime`` objects here, as everywhere in the JetStream models: a naive one
has no meaning on the server's clock, so it is refused before anything is sent
(:class:`InvalidPauseUntil`), as are a negative or non-finite number of seconds.

What a paused consumer does (nats-server 2.15, checked by the tests): pull requests are
accepted and wait, answered by nothing but their idle heartbeats, which keep coming, and end
with the usual 408 when they expire; a push consumer's idle heartbeats keep coming too. So a
consume buffer keeps pulling, raises no heartbeat alarm and needs no notion of a pause: it
cannot tell a paused consumer from an idle stream, which is right. On resume (or at the
pause's end) the waiting requests are served, within about a second.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import attrs

from headrace.jetstream.codec import DURATION, TIME, jfield
from headrace.jetstream.errors import InvalidPauseUntil

#: What ``until=None`` means where a pause may be open-ended (a pipeline's ``pause()``, the
#: CLI without ``--until``/``--for``): a time no run will see. It is the server's own way of
#: saying "until resumed": the consumer has no other form of an indefinite pause.
INDEFINITELY = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)

#: A pause given as a time, an interval from now (a ``timedelta``), or seconds from now.
PauseUntil = dt.datetime | dt.timedelta | float | int


def pause_api(stream: str, consumer: str) -> str:
    """The API subject that pauses or resumes a consumer, without the JetStream API prefix."""
    return f"CONSUMER.PAUSE.{stream}.{consumer}"


def check_pause_until(value: dt.datetime) -> dt.datetime:
    """``value`` if it is an aware datetime; :class:`InvalidPauseUntil` if not."""
    if not isinstance(value, dt.datetime):
        raise InvalidPauseUntil(
            f"pause_until must be a datetime, not {type(value).__name__}: {value!r}"
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidPauseUntil(
            f"pause_until {value.isoformat()} has no timezone: the server could not know "
            "which moment it means (use datetime.UTC, or an offset)"
        )
    return value


def pause_deadline(until: PauseUntil | None, *, now: dt.datetime | None = None) -> dt.datetime:
    """The aware time a pause ends: ``until`` itself if a datetime, else ``now`` (the current
    UTC time) plus the interval; :data:`INDEFINITELY` for ``None``. A datetime in the past is
    kept (the server resumes on it); a negative or non-finite interval is refused."""
    if until is None:
        return INDEFINITELY
    if isinstance(until, dt.datetime):
        return check_pause_until(until)
    if isinstance(until, bool) or not isinstance(until, dt.timedelta | float | int):
        raise InvalidPauseUntil(
            f"pause until a datetime, a timedelta or seconds, not {type(until).__name__}"
        )
    seconds = until.total_seconds() if isinstance(until, dt.timedelta) else float(until)
    if not (math.isfinite(seconds) and seconds >= 0):
        raise InvalidPauseUntil(f"a pause must last zero seconds or more, not {seconds}")
    start = now if now is not None else dt.datetime.now(dt.UTC)
    try:
        return check_pause_until(start) + dt.timedelta(seconds=seconds)
    except OverflowError:
        return INDEFINITELY


def check_config_pause(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    """The attrs validator of ``ConsumerConfig.pause_until``."""
    if value is not None:
        check_pause_until(value)  # type: ignore[arg-type]


@attrs.frozen(slots=True, kw_only=True)
class ConsumerPause:
    """The server's answer to a pause or a resume: whether the consumer is paused now, until
    when, and how long is left (seconds). A resume, or a pause until a time already past,
    answers ``paused=False``."""

    paused: bool = jfield(default=False, validator=attrs.validators.instance_of(bool))
    #: When the pause ends: the time asked for (one already past when ``paused`` is false),
    #: None after a resume (the server sends Go's zero time then).
    pause_until: dt.datetime | None = jfield(kind=TIME)
    #: Seconds left of the pause, as the server counted them when it answered.
    pause_remaining: float | None = jfield(kind=DURATION)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)

    def __attrs_post_init__(self) -> None:
        # Go's zero time (year 1) is how the server writes "no time": not a pause end.
        if self.pause_until is not None and self.pause_until.year <= 1:
            object.__setattr__(self, "pause_until", None)
