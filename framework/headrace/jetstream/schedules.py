"""Message schedules (ADR-51, nats-server 2.12+; time zones 2.14+): the stream publishes for you.

A schedule is one message, stored on a subject of its own in a stream with
``allow_msg_schedules``, whose headers say when to publish (``Nats-Schedule``) and where
(``Nats-Schedule-Target``, a literal subject of the same stream). At each firing the server
stores a new message on the target with the schedule's body and headers, less the
``Nats-Schedule*`` ones, the ``Nats-Expected-*`` ones, ``Nats-Msg-Id``, ``Nats-TTL`` and
``Nats-Rollup`` (those belong to the schedule message, not to what it produces), plus
``Nats-Scheduler`` (the schedule's subject) and ``Nats-Schedule-Next`` (the next firing, or
``purge`` for a one-off). Three kinds:

* ``@at <RFC 3339>``: once, then the schedule message is removed. A time in the past fires at
  once, also after a server was down: give the schedule message a ``Nats-TTL`` where a late
  firing is worse than none.
* ``@every <Go duration>``: repeatedly, at least a second apart.
* a cron expression of six fields (seconds first) or a predefined one (``@hourly`` ...), in
  UTC unless ``Nats-Schedule-Time-Zone`` names a zone (cron only: the server refuses a zone on
  the other two).

Optional: ``Nats-Schedule-TTL`` (a ``Nats-TTL`` on each produced message; the stream needs
``allow_msg_ttl`` as well), ``Nats-Schedule-Source`` (publish the last message of that subject
instead of the schedule's own body, which remains the fallback while the subject is empty) and
``Nats-Schedule-Rollup: sub`` (each produced message replaces the target's earlier ones).

There is one schedule per subject: publishing another on the same subject replaces it (the
server adds ``Nats-Rollup: sub`` to every schedule message). A schedule stops when its message
goes, by any means: delete it, purge its subject, let its own ``Nats-TTL`` run out, or publish
elsewhere with :func:`stop_headers`, which stores that message and removes the schedule as one
write.

:class:`MessageSchedule` checks all this before anything is sent and raises what the server
would answer, as the same class with the same ``err_code``; the server's own refusals are the
classes below too, once :func:`~headrace.jetstream.errors.api_error` knows their codes
(:data:`SCHEDULE_ERRORS`).
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
import zoneinfo
from typing import Any, Final, Literal

import attrs

from headrace.errors import InvalidSubjectError
from headrace.jetstream.errors import (
    InvalidMessageSchedule,
    InvalidMessageTTL,
    InvalidSchedulePattern,
    InvalidScheduler,
    InvalidScheduleRollup,
    InvalidScheduleSource,
    InvalidScheduleTarget,
    InvalidScheduleTimeZone,
    InvalidScheduleTTL,
)
from headrace.jetstream.msg_ttl import MessageTTL, duration_seconds, ttl_header
from headrace.protocol.commands import check_subject

# -- headers --------------------------------------------------------------------------------------

#: On the schedule message: when, where, and how the produced messages look.
NATS_SCHEDULE: Final = "Nats-Schedule"
NATS_SCHEDULE_TARGET: Final = "Nats-Schedule-Target"
NATS_SCHEDULE_SOURCE: Final = "Nats-Schedule-Source"
NATS_SCHEDULE_TTL: Final = "Nats-Schedule-TTL"
NATS_SCHEDULE_TIME_ZONE: Final = "Nats-Schedule-Time-Zone"
NATS_SCHEDULE_ROLLUP: Final = "Nats-Schedule-Rollup"
#: On every produced message: the schedule's subject, and its next firing (or ``purge``).
NATS_SCHEDULER: Final = "Nats-Scheduler"
NATS_SCHEDULE_NEXT: Final = "Nats-Schedule-Next"
#: ``Nats-Schedule-Next`` of a one-off's message: the schedule is removed as it is stored.
PURGE: Final = "purge"
#: Every header name the server reads as a schedule's (``Nats-Scheduler`` included): a publish
#: that sends a :class:`MessageSchedule` should not take any of them from elsewhere.
SCHEDULE_HEADER_PREFIX: Final = "Nats-Schedule"

#: The predefined cron schedules the server knows, spelled as it reads them (lower case).
PREDEFINED: Final = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
#: The shortest ``@every`` interval the server accepts, in seconds.
MIN_INTERVAL: Final = 1.0


def _refuse(cls: type[InvalidMessageSchedule], message: str) -> InvalidMessageSchedule:
    """The error the server would answer, raised before sending (code 400, its err_code)."""
    return cls(400, cls.err_codes[0], message)


# -- checks ---------------------------------------------------------------------------------------

# RFC 3339 as Go's time.Parse reads it: a date, "T", a time, optional fraction, a zone offset.
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")


def _check_at(text: str) -> None:
    if not _RFC3339.fullmatch(text):
        raise _refuse(
            InvalidSchedulePattern,
            f"@at needs an RFC 3339 time with an offset, such as 2030-01-01T09:00:00Z, "
            f"not {text!r}",
        )
    try:
        dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise _refuse(InvalidSchedulePattern, f"@at {text!r}: {exc}") from None


def _check_every(text: str) -> None:
    # A bare number of seconds is a TTL, but no Go duration: the server wants a unit here.
    # Go reads ASCII digits only (non-ASCII "µs" is a unit, no other digit is), and one "+".
    unsigned = text.removeprefix("+")
    foreign = any(c.isdigit() and not c.isascii() for c in unsigned)
    try:
        seconds = math.nan if unsigned.isdigit() or foreign else duration_seconds(unsigned)
    except InvalidMessageTTL:
        seconds = math.nan
    if math.isnan(seconds):
        raise _refuse(
            InvalidSchedulePattern,
            f"@every needs a Go duration such as '90s' or '1h30m', not {text!r}",
        )
    if seconds < MIN_INTERVAL:
        raise _refuse(InvalidSchedulePattern, f"@every {text}: the interval is under 1 second")


# name, lowest, highest, names: the six fields the server's cron reads, seconds first.
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_FIELDS: Final[tuple[tuple[str, int, int, dict[str, int]], ...]] = (
    ("second", 0, 59, {}),
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, {name: i for i, name in enumerate(_MONTHS, 1)}),
    ("day of week", 0, 6, {name: i for i, name in enumerate(_DAYS)}),
)


# A number as the server's strconv.Atoi reads it (a "+" allowed), within Go's int.
_NUMBER = re.compile(r"\+?[0-9]{1,18}")


def _cron_value(text: str, names: dict[str, int], field: str) -> int:
    if text.lower() in names:
        return names[text.lower()]
    if not _NUMBER.fullmatch(text):
        raise _refuse(InvalidSchedulePattern, f"cron {field}: {text!r} is not a number")
    return int(text)


def _check_cron_field(text: str, field: str, low: int, high: int, names: dict[str, int]) -> None:
    """One field as the server reads it: a comma list of ``*`` (or ``?``), ``N`` or ``N-M``,
    each with an optional ``/step``; ``N/step`` runs from N to the field's end, and whatever
    follows ``*-`` is ignored."""
    parts = [part for part in text.split(",") if part]
    if not parts:
        raise _refuse(InvalidSchedulePattern, f"cron {field}: {text!r} has no values")
    for part in parts:
        span, slash, step = part.partition("/")
        if slash and (not _NUMBER.fullmatch(step) or int(step) == 0):
            raise _refuse(InvalidSchedulePattern, f"cron {field}: bad step in {part!r}")
        first, dash, last = span.partition("-")
        if first in ("*", "?"):
            continue
        start = _cron_value(first, names, field)
        end = _cron_value(last, names, field) if dash else high if slash else start
        if start < low or end > high or start > end:
            raise _refuse(
                InvalidSchedulePattern,
                f"cron {field}: {part!r} is outside {low}-{high} or runs backwards",
            )


def _check_cron(text: str) -> None:
    if text in PREDEFINED:
        return
    fields = text.split()
    if len(fields) != len(_FIELDS):
        raise _refuse(
            InvalidSchedulePattern,
            f"a cron schedule has 6 fields (second minute hour day-of-month month "
            f"day-of-week), not {len(fields)}: {text!r}; or use one of {sorted(PREDEFINED)}",
        )
    for value, (field, low, high, names) in zip(fields, _FIELDS, strict=True):
        _check_cron_field(value, field, low, high, names)


def _kind(pattern: str) -> Literal["at", "every", "cron"]:
    if pattern.startswith("@at "):
        return "at"
    if pattern.startswith("@every "):
        return "every"
    return "cron"


def _check_pattern(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise _refuse(InvalidSchedulePattern, f"a schedule is a non-empty str, not {value!r}")
    kind = _kind(value)
    if kind == "at":
        _check_at(value[len("@at ") :])
    elif kind == "every":
        _check_every(value[len("@every ") :])
    else:
        _check_cron(value)


def _literal(cls: type[InvalidMessageSchedule], what: str, value: object) -> None:
    """A subject the server publishes to: non-empty, no wildcard tokens, no whitespace."""
    if not isinstance(value, str):
        raise _refuse(cls, f"{what} must be a str, not {type(value).__name__}")
    try:
        check_subject(value, what=what)
    except InvalidSubjectError as exc:
        raise _refuse(cls, str(exc)) from None


def _check_target(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    _literal(InvalidScheduleTarget, "schedule target", value)


def _check_source(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _literal(InvalidScheduleSource, "schedule source", value)


def _check_rollup(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    # The server has one rollup for produced messages ("sub"): a flag, not a value.
    if not isinstance(value, bool):
        raise _refuse(InvalidScheduleRollup, f"rollup is True or False, not {value!r}")


@functools.cache
def _zones_known() -> bool:
    """Whether this machine has a time zone database to check names against (the system's
    or the ``tzdata`` package). Without one, a name is left to the server to judge."""
    return bool(zoneinfo.available_timezones())


def _check_time_zone(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    """What Go's ``time.LoadLocation`` takes: ``UTC``, ``Local`` or a database name. The
    server resolves the name against its own database, which is assumed to know what this
    machine's knows."""
    if value is None or value in ("UTC", "Local"):
        return
    if not isinstance(value, str) or not value:
        raise _refuse(
            InvalidScheduleTimeZone,
            f"a time zone is a non-empty name such as 'Europe/Amsterdam', not {value!r} "
            "(for UTC, give none)",
        )
    if not _zones_known():
        return
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise _refuse(
            InvalidScheduleTimeZone,
            f"no time zone {value!r}: give an IANA name such as 'America/New_York' "
            "(a fixed offset such as '+02:00' is no zone)",
        ) from None


def _schedule_ttl(ttl: MessageTTL | None) -> str | None:
    """ADR-43's rules, as for a publish's ``ttl``, refused with the schedule's err_code."""
    if ttl is None:
        return None
    try:
        return ttl_header(ttl)
    except InvalidMessageTTL as exc:
        raise _refuse(InvalidScheduleTTL, f"schedule ttl: {exc.description}") from exc


def _every_text(interval: float | dt.timedelta | str) -> str:
    """A Go duration for ``interval``: strings as given (bare digits as seconds), numbers
    and timedeltas in the largest unit that keeps them whole (down to microseconds)."""
    if isinstance(interval, str):
        return f"{interval}s" if interval.isdigit() else interval
    if isinstance(interval, dt.timedelta):
        micros = interval // dt.timedelta(microseconds=1)
    elif isinstance(interval, (int, float)) and not isinstance(interval, bool):
        if not math.isfinite(interval):
            raise _refuse(InvalidSchedulePattern, f"@every {interval}: not a finite interval")
        micros = round(interval * 1_000_000)
    else:
        raise _refuse(
            InvalidSchedulePattern,
            f"an interval is seconds, a timedelta or a duration string, not {interval!r}",
        )
    if micros <= 0:
        raise _refuse(InvalidSchedulePattern, f"@every {interval!r}: the interval is not positive")
    for unit, size in (("h", 3_600_000_000), ("m", 60_000_000), ("s", 1_000_000), ("ms", 1000)):
        if micros % size == 0:
            return f"{micros // size}{unit}"
    return f"{micros}us"


def _at_text(when: dt.datetime) -> str:
    """RFC 3339 in UTC, as the server keeps it; a naive time is no moment on its clock."""
    if not isinstance(when, dt.datetime):
        raise _refuse(InvalidSchedulePattern, f"@at needs a datetime, not {when!r}")
    if when.tzinfo is None or when.utcoffset() is None:
        raise _refuse(
            InvalidSchedulePattern,
            f"@at needs an aware datetime (with tzinfo), not the naive {when!r}",
        )
    utc = when.astimezone(dt.UTC)
    spec = "microseconds" if utc.microsecond else "seconds"
    return utc.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


# -- the schedule ---------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class MessageSchedule:
    """A schedule to publish as a message's headers (:meth:`headers`).

    Build one with :meth:`at`, :meth:`every` or :meth:`cron`; the constructor takes the
    ``Nats-Schedule`` text itself (``pattern``) and checks it the same way. Every field is
    checked when the schedule is made, so a bad one raises (an
    :class:`InvalidMessageSchedule`, a ``ValueError``) where it was written.

    ``target`` is the subject each firing publishes to: a literal subject of the same stream,
    not the schedule's own. ``ttl`` is the ``Nats-TTL`` of each produced message (ADR-43 forms:
    seconds, a timedelta, ``"1h30m"``, ``"never"``), not of the schedule. ``time_zone`` (cron
    only) is an IANA name, ``UTC`` or ``Local`` (the server's). ``source`` publishes the last
    message of that subject instead of the schedule's body (which stays the fallback).
    ``rollup`` makes each produced message replace the target's earlier ones.
    """

    pattern: str = attrs.field(validator=_check_pattern)
    target: str = attrs.field(kw_only=True, validator=_check_target)
    ttl: str | None = attrs.field(kw_only=True, default=None, converter=_schedule_ttl)
    time_zone: str | None = attrs.field(kw_only=True, default=None, validator=_check_time_zone)
    source: str | None = attrs.field(kw_only=True, default=None, validator=_check_source)
    rollup: bool = attrs.field(kw_only=True, default=False, validator=_check_rollup)

    def __attrs_post_init__(self) -> None:
        if self.time_zone is not None and self.kind != "cron":
            raise _refuse(
                InvalidSchedulePattern,
                f"a time zone applies to cron schedules only, not to @{self.kind}",
            )
        if self.source is not None and self.source == self.target:
            raise _refuse(InvalidScheduleSource, "the schedule's source is its target")

    @classmethod
    def at(
        cls,
        when: dt.datetime,
        *,
        target: str,
        ttl: MessageTTL | None = None,
        source: str | None = None,
        rollup: bool = False,
    ) -> MessageSchedule:
        """Publish once, at ``when`` (an aware datetime; one in the past fires at once)."""
        return cls(f"@at {_at_text(when)}", target=target, ttl=ttl, source=source, rollup=rollup)

    @classmethod
    def every(
        cls,
        interval: float | dt.timedelta | str,
        *,
        target: str,
        ttl: MessageTTL | None = None,
        source: str | None = None,
        rollup: bool = False,
    ) -> MessageSchedule:
        """Publish every ``interval`` (seconds, a timedelta, or a Go duration such as
        ``"1m30s"``; at least a second), the first an interval after the schedule is stored."""
        return cls(
            f"@every {_every_text(interval)}", target=target, ttl=ttl, source=source, rollup=rollup
        )

    @classmethod
    def cron(
        cls,
        expression: str,
        *,
        target: str,
        time_zone: str | None = None,
        ttl: MessageTTL | None = None,
        source: str | None = None,
        rollup: bool = False,
    ) -> MessageSchedule:
        """Publish on a cron schedule: six fields, ``second minute hour day-of-month month
        day-of-week`` (``*``, ``?``, lists, ranges, steps, ``jan``/``mon`` names; Sunday is 0),
        or one of :data:`PREDEFINED` (``@hourly``, ``@daily``, ...), in ``time_zone`` (UTC
        when none)."""
        if not isinstance(expression, str) or _kind(expression) != "cron":
            raise _refuse(
                InvalidSchedulePattern,
                f"{expression!r} is no cron expression: use MessageSchedule.at or .every",
            )
        return cls(
            expression,
            target=target,
            time_zone=time_zone,
            ttl=ttl,
            source=source,
            rollup=rollup,
        )

    @property
    def kind(self) -> Literal["at", "every", "cron"]:
        """``"at"`` (fires once, then is removed), ``"every"`` or ``"cron"`` (repeat)."""
        return _kind(self.pattern)

    def headers(self, subject: str | None = None) -> dict[str, str]:
        """The headers that make a message published on ``subject`` this schedule.

        Given the schedule's subject, it is checked against the target and source (the
        server refuses a schedule that publishes to, or samples, its own subject).
        """
        if subject is not None:
            if subject == self.target:
                raise _refuse(
                    InvalidScheduleTarget,
                    f"the schedule on {subject!r} targets its own subject; give it a subject "
                    "of its own, such as 'schedules.<name>'",
                )
            if subject == self.source:
                raise _refuse(InvalidScheduleSource, f"the schedule on {subject!r} samples itself")
        optional = (
            (NATS_SCHEDULE_SOURCE, self.source),
            (NATS_SCHEDULE_TTL, self.ttl),
            (NATS_SCHEDULE_TIME_ZONE, self.time_zone),
            (NATS_SCHEDULE_ROLLUP, "sub" if self.rollup else None),
        )
        return {
            NATS_SCHEDULE: self.pattern,
            NATS_SCHEDULE_TARGET: self.target,
            **{name: value for name, value in optional if value is not None},
        }


def stop_headers(schedule_subject: str, subject: str | None = None) -> dict[str, str]:
    """Headers that stop the schedule on ``schedule_subject`` when the message carrying them
    is stored: that message and the schedule's removal are one write, so a "cancelled" record
    cannot exist beside a schedule that still fires (ADR-51). Publish it on any subject of the
    stream but the schedule's own (``subject``, if given, is checked for that): on the target
    it is the firing, early. With ``expected_last_subject_seq`` and
    ``Nats-Expected-Last-Subject-Sequence-Subject: <schedule_subject>`` it stops only the
    version of the schedule you read. The server refuses (:class:`InvalidScheduler`) a stop
    naming a subject whose last message is no schedule; one naming an empty subject is stored.
    """
    _literal(InvalidScheduler, "schedule subject", schedule_subject)
    if subject == schedule_subject:
        raise _refuse(
            InvalidScheduler,
            f"a stop of the schedule on {schedule_subject!r} is published on another subject",
        )
    return {NATS_SCHEDULE_NEXT: PURGE, NATS_SCHEDULER: schedule_subject}
