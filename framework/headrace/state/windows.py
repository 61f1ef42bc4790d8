"""Event-time windows, sans-IO: the assigners, the watermark and :class:`WindowOperator`.

Nothing here does I/O, starts a task or reads a clock: the stage that drives an operator
passes each record's event time and, when it wants, the time it believes input has reached
(:meth:`WindowOperator.advance_to`). That keeps the window rules testable against a
brute-force reference, and makes a snapshot plain data.

**Time.** Inside this module an instant is an int of *microseconds* since the Unix epoch (UTC)
and a duration an int of microseconds: ints keep the window arithmetic exact (a float of
seconds cannot hold today's times to the microsecond) and hash fast as dict keys. The edges
convert: :func:`to_micros` (an aware datetime, or seconds since the epoch as an int or float),
:func:`from_micros` (to an aware UTC datetime) and :func:`duration_micros`. Windows are
half-open, ``[start, end)``.

**Watermark.** The watermark is the largest event time seen so far minus the operator's
``lateness``, raised further by :meth:`~WindowOperator.advance_to`, and never lowered; before
the first record there is none. A record is *late* when its event time is below the watermark
at the moment it comes. A late record is counted (:attr:`~WindowOperator.late`) and changes
nothing else; the caller decides what becomes of it (dead-letter it, log it). A window *fires*
(is emitted and leaves the state) once the watermark reaches its end.

Why that rule is enough: a record that is not late never needs a window that has fired.
Let ``W`` be the watermark when a record at ``t`` comes, so ``t >= W``; any window fired before
fired at a watermark ``W' <= W`` (it never goes down), so its end is ``<= W <= t``.

- A tumbling or sliding window of the record contains ``t``, so its end is ``> t``: it cannot
  have fired.
- A session takes the record only if ``t < last + gap``, its end: a fired session's end is
  ``<= t``, so the record joins open sessions only (or starts its own), and a bridge merges
  open sessions only.

So every window fires exactly once, with every record that was not late and belongs to it,
and none are lost or counted twice. The rule is conservative: a late record of a tumbling
window may find its window still open, and is refused all the same, so whether a record
counts depends on the watermark alone, not on which windows happen to be open.
:meth:`~WindowOperator.flush_all` keeps the argument intact by raising the watermark to the
end of every window it emits.

**Processing-time windows** need nothing special: pass each record's arrival time (the wall
clock, :func:`to_micros` of ``time.time()``) as its event time, with a ``lateness`` of 0, and
call :meth:`~WindowOperator.advance_to` with the clock (then :meth:`~WindowOperator.fire`)
when no record comes, so that windows close on an idle stream too. A wall clock that steps
back makes the records of that step late (counted, not lost silently).
"""

from __future__ import annotations

import copy
import heapq
import math
from bisect import bisect_left, bisect_right
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import attrs

from headrace.errors import HeadraceError
from headrace.state.aggregates import Aggregate

__all__ = [
    "Duration",
    "Instant",
    "SessionWindow",
    "SlidingWindow",
    "TumblingWindow",
    "WindowAssigner",
    "WindowError",
    "WindowOperator",
    "WindowResult",
    "duration_micros",
    "from_micros",
    "to_micros",
]


class WindowError(HeadraceError, ValueError):
    """A time, duration, window or snapshot that the window operator cannot use: a naive
    datetime (whose instant is unknown), a window size that is not positive, a time outside
    what a datetime can hold, a session window without an aggregate that can merge."""


#: An instant as the public functions take it: an aware datetime, or seconds since the epoch.
Instant = datetime | int | float
#: A duration: a timedelta, or seconds.
Duration = timedelta | int | float

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US: Final = timedelta(microseconds=1)
#: The instants a datetime can hold, in microseconds: windows must start and end within.
_MIN_US: Final = (datetime.min.replace(tzinfo=UTC) - _EPOCH) // _ONE_US
_MAX_US: Final = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // _ONE_US


# -- time -----------------------------------------------------------------------------------


def to_micros(t: Instant) -> int:
    """Microseconds since the epoch of an aware datetime, or of seconds since the epoch (an
    int, or a float rounded to the microsecond, half to even). A naive datetime is refused:
    which instant it means depends on a time zone nobody named."""
    if isinstance(t, datetime):
        if t.utcoffset() is None:
            raise WindowError(
                f"a naive datetime ({t.isoformat()}) has no instant; give it a tzinfo "
                "(datetime.UTC for UTC)"
            )
        return (t - _EPOCH) // _ONE_US
    if isinstance(t, bool) or not isinstance(t, int | float):
        raise WindowError(f"an instant is an aware datetime or seconds since the epoch, not {t!r}")
    if isinstance(t, int):
        return t * 1_000_000
    return _seconds(t, "an instant") // _ONE_US


def from_micros(us: int) -> datetime:
    """The aware UTC datetime of ``us`` microseconds since the epoch."""
    try:
        return _EPOCH + timedelta(microseconds=us)
    except OverflowError:
        raise WindowError(
            f"{us} microseconds since the epoch is outside the years a datetime can hold"
        ) from None


def duration_micros(d: Duration, *, allow_zero: bool = False) -> int:
    """Microseconds of a timedelta or of seconds (an int or float, rounded to the
    microsecond); it must be positive, or with ``allow_zero`` not negative."""
    return _duration(d, allow_zero=allow_zero) // _ONE_US


def _seconds(s: float, what: str) -> timedelta:
    """``s`` seconds as a timedelta: exact rounding to the microsecond (``s * 1e6`` would
    round twice)."""
    if not math.isfinite(s):
        raise WindowError(f"{what} must be a finite number of seconds, not {s!r}")
    try:
        return timedelta(seconds=s)
    except OverflowError:
        raise WindowError(f"{what} of {s!r} seconds is out of range") from None


def _duration(d: Duration, *, allow_zero: bool = False) -> timedelta:
    if isinstance(d, timedelta):
        td = d
    elif isinstance(d, bool) or not isinstance(d, int | float):
        raise WindowError(f"a duration is a timedelta or seconds, not {d!r}")
    else:
        td = _seconds(d, "a duration")
    if td < timedelta(0) or (td == timedelta(0) and not allow_zero):
        rule = "must not be negative" if allow_zero else "must be positive"
        raise WindowError(f"a duration {rule}, not {d!r} ({td // _ONE_US} microseconds)")
    return td


def _positive_duration(d: Duration) -> timedelta:
    """attrs converter: any :data:`Duration` to a positive timedelta (a timedelta has the
    module's resolution, a microsecond, so nothing is lost, and its repr reads back)."""
    return _duration(d)


def _instant(t: Instant) -> datetime:
    """attrs converter: any :data:`Instant` to an aware UTC datetime."""
    return from_micros(to_micros(t))


# -- assigners ------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class TumblingWindow:
    """Back-to-back windows of one ``size``: ``[start, start + size)`` for every start
    ``align_to + k * size`` (``k`` any integer, so times before ``align_to`` or the epoch are
    covered too). Each instant is in exactly one window. ``align_to`` shifts the grid: hourly
    windows from the half hour are ``TumblingWindow(3600, align_to=1800)``."""

    size: timedelta = attrs.field(converter=_positive_duration)
    align_to: datetime = attrs.field(default=_EPOCH, converter=_instant)

    @property
    def size_us(self) -> int:
        return self.size // _ONE_US

    @property
    def align_us(self) -> int:
        return to_micros(self.align_to)

    def windows_of(self, t: int) -> list[tuple[int, int]]:
        """The window of the instant ``t`` (microseconds), as ``[(start, end)]``."""
        size = self.size_us
        start = t - (t - self.align_us) % size  # % of a positive size is never negative
        return [(start, start + size)]


@attrs.frozen(slots=True)
class SlidingWindow:
    """Overlapping windows of one ``size``, one starting every ``slide``: ``[start, start +
    size)`` for every start ``align_to + k * slide``. An instant is in every window whose
    start is at most it and whose end is after it: ``size / slide`` of them when ``slide``
    divides ``size``, otherwise the floor or the ceiling of that. ``slide`` may not exceed
    ``size`` (there would be instants in no window; use a filter for sampling)."""

    size: timedelta = attrs.field(converter=_positive_duration)
    slide: timedelta = attrs.field(converter=_positive_duration)
    align_to: datetime = attrs.field(default=_EPOCH, converter=_instant)

    @slide.validator
    def _slide_fits(self, _attribute: attrs.Attribute[timedelta], value: timedelta) -> None:
        if value > self.size:
            raise WindowError(
                f"a sliding window's slide ({value}) may not exceed its size ({self.size})"
            )

    @property
    def size_us(self) -> int:
        return self.size // _ONE_US

    @property
    def slide_us(self) -> int:
        return self.slide // _ONE_US

    @property
    def align_us(self) -> int:
        return to_micros(self.align_to)

    def windows_of(self, t: int) -> list[tuple[int, int]]:
        """The windows of the instant ``t`` (microseconds), earliest start first."""
        size, slide = self.size_us, self.slide_us
        start = t - (t - self.align_us) % slide  # the latest start at or before t
        found = []
        while start > t - size:
            found.append((start, start + size))
            start -= slide
        found.reverse()
        return found


@attrs.frozen(slots=True)
class SessionWindow:
    """Per key, a burst of records with no silence of ``gap`` or more inside: a record at
    ``t`` joins a session ``[first, last + gap)`` when ``first - gap < t < last + gap`` (its
    own ``[t, t + gap)`` overlaps the session), starts one otherwise, and a record that joins
    two sessions merges them. So the sessions of a key are its records sorted by time and cut
    wherever two neighbours are ``gap`` or more apart, whatever order they came in. Needs an
    aggregate with ``merge``."""

    gap: timedelta = attrs.field(converter=_positive_duration)

    @property
    def gap_us(self) -> int:
        return self.gap // _ONE_US


#: Any of the window kinds :class:`WindowOperator` runs.
WindowAssigner = TumblingWindow | SlidingWindow | SessionWindow


# -- results --------------------------------------------------------------------------------


def _aware(_inst: object, attribute: attrs.Attribute[datetime], value: datetime) -> None:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise WindowError(f"{attribute.name} must be an aware datetime, not {value!r}")


def _positive_count(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WindowError(f"{attribute.name} must be an integer of at least 1, not {value!r}")


@attrs.frozen(slots=True)
class WindowResult:
    """One fired window of one key: ``[start, end)`` (aware UTC datetimes), the aggregate's
    ``value`` and how many records went into it (``count``, never 0: a window exists because
    a record came). ``start_us`` and ``end_us`` are the same instants in microseconds."""

    key: Any
    start: datetime = attrs.field(validator=_aware)
    end: datetime = attrs.field(validator=_aware)
    value: Any
    count: int = attrs.field(validator=_positive_count)

    @end.validator
    def _after_start(self, _attribute: attrs.Attribute[datetime], value: datetime) -> None:
        if not value > self.start:
            raise WindowError(f"a window ends after it starts, not {self.start} to {value}")

    @property
    def start_us(self) -> int:
        return to_micros(self.start)

    @property
    def end_us(self) -> int:
        return to_micros(self.end)

    def to_dict(self) -> dict[str, Any]:
        """A dict for JSON: the times as ISO 8601 strings (UTC offset included); ``key`` and
        ``value`` as they are, so they must be JSON-friendly themselves."""
        return {
            "key": self.key,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "value": self.value,
            "count": self.count,
        }


# -- the operator ---------------------------------------------------------------------------

_TUMBLING: Final = 0
_SLIDING: Final = 1
_SESSION: Final = 2

#: The snapshot format :meth:`WindowOperator.snapshot` writes; a newer one is refused.
_FORMAT: Final = 1

#: Accumulators that need no copy in a snapshot (immutable, and deepcopy's own shortcut).
_ATOMIC: Final = frozenset({int, float, str, bytes, bool, type(None), complex})


class _Session:
    """One open session of one key (mutable: it grows, and a bridge merges another in).
    ``seq`` orders sessions that end and start together: the earliest-created part wins."""

    __slots__ = ("acc", "alive", "count", "first", "key", "last", "seq")

    def __init__(self, key: Any, first: int, last: int, acc: Any, count: int, seq: int) -> None:
        self.key = key
        self.first = first
        self.last = last
        self.acc = acc
        self.count = count
        self.seq = seq
        self.alive = True


def _first(session: _Session) -> int:
    return session.first


def _copy(acc: Any) -> Any:
    return acc if type(acc) in _ATOMIC else copy.deepcopy(acc)


class WindowOperator:
    """Per-key windows of one assigner under one aggregate, closed by the watermark (see the
    module docs for the rules).

    :meth:`add` each record with its event time in microseconds, then :meth:`fire` when
    convenient (after every record, or after every batch) for the windows the watermark has
    passed. Keys must be hashable; they are never compared with each other, so they need not
    be orderable. The aggregate's functions are called as records come, and what they raise
    propagates. A record whose ``add`` raises changes nothing, as long as ``add`` raises before
    it changes the accumulator in place (the built-ins do), with one exception: under a sliding
    window, the record's windows before the one that failed keep it (``add`` fails on the same
    value in the first one, unless it depends on the accumulator).

    Fired windows come ordered by end, then start, then the order in which their first
    record came (for a session made of several: the earliest of them). That order does not
    depend on when :meth:`fire` is called, and survives :meth:`snapshot` and :meth:`restore`.

    Cost: for tumbling windows a record is a few dict operations (one lookup of ``(key,
    start)``, a call of ``add``); a sliding window repeats that for each window of the
    record; a session record adds a bisect over the key's open sessions. A :meth:`fire` with
    nothing due is one comparison with the earliest open end.
    """

    __slots__ = (
        "_add",
        "_aggregate",
        "_align",
        "_assigner",
        "_buckets",
        "_ends",
        "_gap",
        "_heap",
        "_hi",
        "_init",
        "_kind",
        "_late",
        "_lateness",
        "_lo",
        "_max_event",
        "_merge",
        "_open",
        "_open_sessions",
        "_per_key",
        "_pushes",
        "_result",
        "_seq",
        "_sessions",
        "_size",
        "_slide",
        "_watermark",
        "follow_events",
    )

    def __init__(
        self,
        assigner: WindowAssigner,
        aggregate: Aggregate[Any, Any, Any],
        lateness: Duration = 0,
    ) -> None:
        if not isinstance(aggregate, Aggregate):
            raise WindowError(f"aggregate must be an Aggregate, not {aggregate!r}")
        self._assigner = assigner
        self._aggregate = aggregate
        self._lateness = duration_micros(lateness, allow_zero=True)
        self._init = aggregate.init
        self._add = aggregate.add
        self._merge = aggregate.merge
        self._result = aggregate.result
        self._size = self._slide = self._align = self._gap = 0
        if isinstance(assigner, TumblingWindow):
            self._kind = _TUMBLING
            self._size = self._slide = assigner.size_us
            self._align = assigner.align_us
        elif isinstance(assigner, SlidingWindow):
            self._kind = _SLIDING
            self._size, self._slide = assigner.size_us, assigner.slide_us
            self._align = assigner.align_us
        elif isinstance(assigner, SessionWindow):
            if aggregate.merge is None:
                raise WindowError(
                    "session windows merge when a record bridges two sessions: the "
                    "aggregate needs a merge function"
                )
            self._kind = _SESSION
            self._gap = assigner.gap_us
        else:
            raise WindowError(
                f"assigner must be a TumblingWindow, SlidingWindow or SessionWindow, "
                f"not {assigner!r}"
            )
        # The event times whose windows a datetime can hold (checked before anything
        # changes). A fixed window of t lies within (t - size, t + size]; a session within
        # [t, t + gap].
        if self._kind == _SESSION:
            self._lo, self._hi = _MIN_US, _MAX_US - self._gap
        else:
            self._lo, self._hi = _MIN_US + self._size - 1, _MAX_US - self._size
        #: Whether the newest event time moves the watermark (less the lateness). Off for an
        #: operator of several inputs whose caller sets the watermark with
        #: :meth:`advance_to` (a join: the least of its inputs' newest times).
        self.follow_events = True
        self._watermark: int | None = None
        self._max_event: int | None = None
        self._late = 0
        #: The creation order of windows: the next number to give (sessions use it).
        self._seq = 0
        # Fixed windows: (key, start) -> [accumulator, count]; end -> the (key, start) of the
        # windows ending there, in creation order; a heap of those ends; key -> open windows.
        self._open: dict[tuple[Any, int], list[Any]] = {}
        self._buckets: dict[int, list[tuple[Any, int]]] = {}
        self._ends: list[int] = []
        self._per_key: dict[Any, int] = {}
        # Sessions: key -> its open sessions by first record; a heap of (an end no later
        # than the session's, a push number, the session), one entry per live session and
        # stale ones of merged-away sessions, both sorted out lazily when due.
        self._sessions: dict[Any, list[_Session]] = {}
        self._heap: list[tuple[int, int, _Session]] = []
        self._pushes = 0
        self._open_sessions = 0

    def __repr__(self) -> str:
        return (
            f"<WindowOperator {self._assigner!r} watermark={self._watermark} "
            f"open={self.open_windows} keys={self.keys} late={self._late}>"
        )

    # -- what it holds ----------------------------------------------------------------------

    @property
    def assigner(self) -> WindowAssigner:
        return self._assigner

    @property
    def aggregate(self) -> Aggregate[Any, Any, Any]:
        return self._aggregate

    @property
    def lateness_us(self) -> int:
        return self._lateness

    @property
    def watermark(self) -> int | None:
        """The watermark in microseconds; None before the first record or
        :meth:`advance_to` (every record is on time then)."""
        return self._watermark

    @property
    def max_event_time(self) -> int | None:
        """The largest event time of a record taken (not late), None before the first."""
        return self._max_event

    @property
    def open_windows(self) -> int:
        """Windows (of all keys) not fired yet."""
        if self._kind == _SESSION:
            return self._open_sessions
        return len(self._open)

    @property
    def keys(self) -> int:
        """Keys with at least one open window."""
        if self._kind == _SESSION:
            return len(self._sessions)
        return len(self._per_key)

    @property
    def late(self) -> int:
        """Records refused as late so far."""
        return self._late

    # -- records and time -------------------------------------------------------------------

    def add(self, key: Any, t_us: int, value: Any) -> bool:
        """Take one record of ``key`` at event time ``t_us`` (microseconds); False if it is
        late (it is only counted, see :attr:`late`), True once it is in every window it
        belongs to. :class:`WindowError` if its windows would reach outside the years a
        datetime holds (nothing changes then)."""
        if not self._admit(t_us):
            return False
        kind = self._kind
        if kind == _TUMBLING:
            start = t_us - (t_us - self._align) % self._size
            entry = self._open.get((key, start))
            if entry is None:
                self._new_window(key, start, [self._add(self._init(), value), 1])
            else:
                entry[0] = self._add(entry[0], value)
                entry[1] += 1
        elif kind == _SLIDING:
            size = self._size
            slide = self._slide
            windows = self._open
            add = self._add
            start = t_us - (t_us - self._align) % slide
            low = t_us - size
            while start > low:
                entry = windows.get((key, start))
                if entry is None:
                    self._new_window(key, start, [add(self._init(), value), 1])
                else:
                    entry[0] = add(entry[0], value)
                    entry[1] += 1
                start -= slide
        else:
            self._add_to_session(key, t_us, value)
        self._taken(t_us)
        return True

    def _admit(self, t_us: int) -> bool:
        """Whether a record at ``t_us`` is on time (a late one is counted);
        :class:`WindowError` for a time whose windows a datetime cannot hold."""
        wm = self._watermark
        if wm is not None and t_us < wm:
            self._late += 1
            return False
        if not self._lo <= t_us <= self._hi:
            raise WindowError(
                f"event time {t_us} (microseconds) puts its windows outside the years a "
                "datetime can hold"
            )
        return True

    def _taken(self, t_us: int) -> None:
        """A record at ``t_us`` is in its windows: only now may it move the newest event time
        and the watermark (it was judged against the watermark before it)."""
        mx = self._max_event
        if mx is None or t_us > mx:
            self._max_event = t_us
            if self.follow_events:
                moved = t_us - self._lateness
                wm = self._watermark
                if wm is None or moved > wm:
                    self._watermark = moved

    def _new_window(self, key: Any, start: int, entry: list[Any]) -> None:
        """Open the fixed window of ``key`` at ``start`` with ``entry``, ``[accumulator,
        count]``: once per window, off the per-record path."""
        end = start + self._size
        window = (key, start)
        self._open[window] = entry
        bucket = self._buckets.get(end)
        if bucket is None:
            self._buckets[end] = [window]
            heapq.heappush(self._ends, end)
        else:
            bucket.append(window)
        per_key = self._per_key
        per_key[key] = per_key.get(key, 0) + 1

    def _add_to_session(self, key: Any, t: int, value: Any) -> None:
        gap = self._gap
        sessions = self._sessions.get(key)
        left = right = None
        i = 0
        if sessions is not None:
            # Sessions of a key are disjoint and at least ``gap`` apart, so only the last one
            # starting at or before t and the first one after it can take the record.
            i = bisect_right(sessions, t, key=_first)
            if i and t < sessions[i - 1].last + gap:
                left = sessions[i - 1]
            if i < len(sessions) and sessions[i].first - gap < t:
                right = sessions[i]
        # The value goes in before anything else changes: if ``add`` raises, the sessions are
        # as they were (a bridge merged without its record would join two sessions wrongly).
        if left is not None:
            acc = self._add(left.acc, value)
            if right is not None:  # a bridge: the later session merges into the earlier
                assert self._merge is not None  # checked in __init__
                acc = self._merge(acc, right.acc)
                left.count += right.count
                left.last = right.last
                if right.seq < left.seq:
                    left.seq = right.seq
                right.alive = False  # its heap entry is dropped when it comes up
                assert sessions is not None
                del sessions[i]
                self._open_sessions -= 1
            elif t > left.last:
                left.last = t
            left.acc = acc
            left.count += 1
        elif right is not None:
            right.acc = self._add(right.acc, value)
            right.first = t  # bisect_right: right.first > t
            right.count += 1
        else:
            session = _Session(key, t, t, self._add(self._init(), value), 1, self._seq)
            self._seq += 1
            self._open_sessions += 1
            if sessions is None:
                self._sessions[key] = [session]
            else:
                sessions.insert(i, session)
            self._push(t + gap, session)

    def _push(self, end: int, session: _Session) -> None:
        # The push number keeps heap entries unique, so sessions are never compared.
        heapq.heappush(self._heap, (end, self._pushes, session))
        self._pushes += 1

    def advance_to(self, t_us: int) -> None:
        """Raise the watermark to at least ``t_us`` (microseconds): time passed without
        records (an idle stream, a processing-time clock). It never goes back."""
        wm = self._watermark
        if wm is None or t_us > wm:
            self._watermark = t_us

    # -- firing -----------------------------------------------------------------------------

    def fire(self, limit: int | None = None) -> list[WindowResult]:
        """The windows whose end the watermark has reached, removed from the state, ordered
        by (end, start, creation); an empty list, cheaply, when none is due. ``limit``: at
        most that many, the first in that order (the rest stay due for the next call): a
        watermark that closes a million windows at once is fired a slice at a time, so that
        the caller can let other tasks run between. If the aggregate's ``result`` raises, the
        error propagates and the windows of this call are gone: a bug to fix, after which
        the stage restarts from its last snapshot."""
        wm = self._watermark
        if wm is None or (limit is not None and limit < 1):
            return []
        if self._kind == _SESSION:
            heap = self._heap
            if not heap or heap[0][0] > wm:
                return []
            return self._fire_sessions(wm, limit)
        ends = self._ends
        if not ends or ends[0] > wm:
            return []
        result = self._result
        open_windows = self._open
        buckets = self._buckets
        per_key = self._per_key
        fired: list[WindowResult] = []
        while ends and ends[0] <= wm:
            end = ends[0]
            bucket = buckets[end]
            room = len(bucket) if limit is None else limit - len(fired)
            if room <= 0:
                break
            if room >= len(bucket):
                heapq.heappop(ends)
                del buckets[end]
            else:  # a part of this end's windows: the first ones, in creation order
                buckets[end] = bucket[room:]
                bucket = bucket[:room]
            # Every window of one end has the same start (one size): one pair of datetimes.
            end_at = from_micros(end)
            start_at = from_micros(end - self._size)
            for window in bucket:
                acc, n = open_windows.pop(window)
                key = window[0]
                left = per_key[key] - 1
                if left:
                    per_key[key] = left
                else:
                    del per_key[key]
                value = acc if result is None else result(acc)
                fired.append(WindowResult(key, start_at, end_at, value, n))
        return fired

    def _fire_sessions(self, wm: int, limit: int | None) -> list[WindowResult]:
        gap = self._gap
        heap = self._heap
        due: list[_Session] = []
        while heap and heap[0][0] <= wm:
            _, _, session = heapq.heappop(heap)
            if not session.alive:
                continue  # merged into another session
            end = session.last + gap
            if end <= wm:
                due.append(session)
            else:  # it grew since this entry was pushed: due later
                self._push(end, session)
        due.sort(key=lambda s: (s.last, s.first, s.seq))  # last + gap: the same order as end
        if limit is not None and len(due) > limit:
            # The rest wait for the next call; no record can join them meanwhile (it would
            # be behind the watermark), so their order stays.
            for session in due[limit:]:
                self._push(session.last + gap, session)
            due = due[:limit]
        result = self._result
        fired: list[WindowResult] = []
        for session in due:
            session.alive = False
            sessions = self._sessions[session.key]
            del sessions[bisect_left(sessions, session.first, key=_first)]
            if not sessions:
                del self._sessions[session.key]
            self._open_sessions -= 1
            value = session.acc if result is None else result(session.acc)
            fired.append(
                WindowResult(
                    session.key,
                    from_micros(session.first),
                    from_micros(session.last + gap),
                    value,
                    session.count,
                )
            )
        return fired

    def flush_all(self) -> list[WindowResult]:
        """Fire every open window, in :meth:`fire`'s order: the end of the input (a batch
        run, a test). The watermark moves to the last end fired, so a record that comes after
        and would belong to a fired window is late, as the module docs require."""
        if self._kind == _SESSION:
            ends = [s.last + self._gap for ss in self._sessions.values() for s in ss]
        else:
            ends = self._ends
        if ends:
            self.advance_to(max(ends))
        return self.fire()

    # -- snapshots --------------------------------------------------------------------------

    def _assigner_spec(self) -> tuple[str, int, int, int] | tuple[str, int]:
        if self._kind == _TUMBLING:
            return ("tumbling", self._size, self._size, self._align)
        if self._kind == _SLIDING:
            return ("sliding", self._size, self._slide, self._align)
        return ("session", self._gap)

    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain data (a dict of ints, tuples, lists, the keys and the
        accumulators) for :meth:`restore`: picklable whenever the keys and accumulators are.
        Mutable accumulators are copied, so the snapshot does not change as records keep
        coming. ``windows`` lists ``(key, start, end, accumulator, count, seq)`` tuples, where
        ``seq`` orders windows of equal start and end."""
        windows: list[tuple[Any, int, int, Any, int, int]] = []
        if self._kind == _SESSION:
            gap = self._gap
            windows.extend(
                (s.key, s.first, s.last + gap, _copy(s.acc), s.count, s.seq)
                for sessions in self._sessions.values()
                for s in sessions
            )
        else:
            seq = 0
            for end in sorted(self._buckets):
                for window in self._buckets[end]:
                    acc, n = self._open[window]
                    windows.append((window[0], window[1], end, _copy(acc), n, seq))
                    seq += 1
        return {**self._scalars(), "windows": windows}

    def _scalars(self) -> dict[str, Any]:
        """What a snapshot holds besides the windows: the format, the assigner and lateness
        it was taken with, the watermark, the newest event time, the late count and the next
        creation number."""
        return {
            "format": _FORMAT,
            "assigner": self._assigner_spec(),
            "lateness": self._lateness,
            "watermark": self._watermark,
            "max_event_time": self._max_event,
            "late": self._late,
            "next_seq": self._seq,
        }

    def _take_scalars(self, data: dict[str, Any]) -> None:
        """Take :meth:`_scalars` of a snapshot, refused (:class:`WindowError`) when it was
        taken with another assigner or lateness: windows of another size would be wrong,
        silently."""
        if tuple(data["assigner"]) != self._assigner_spec() or data["lateness"] != self._lateness:
            raise WindowError(
                f"the snapshot was taken with {tuple(data['assigner'])} and a lateness of "
                f"{data['lateness']} us; this operator has {self._assigner_spec()} and "
                f"{self._lateness} us"
            )
        self._watermark = data["watermark"]
        self._max_event = data["max_event_time"]
        self._late = data["late"]
        self._seq = data["next_seq"]

    @classmethod
    def restore(
        cls,
        assigner: WindowAssigner,
        aggregate: Aggregate[Any, Any, Any],
        lateness: Duration,
        data: object,
    ) -> WindowOperator:
        """An operator in the state :meth:`snapshot` gave, which then behaves exactly as the
        one snapshotted would have. The assigner and lateness must be the snapshot's (windows
        of another size would be wrong, silently): :class:`WindowError` otherwise, and for
        data that is not a snapshot. Mutable accumulators are copied, so one snapshot can
        start several operators."""
        op = cls(assigner, aggregate, lateness)
        if not isinstance(data, dict) or not isinstance(data.get("format"), int):
            raise WindowError("not a WindowOperator snapshot")
        if data["format"] > _FORMAT:
            raise WindowError(
                f"the snapshot is in format {data['format']}, newer than this headrace reads "
                f"({_FORMAT})"
            )
        op._take_scalars(data)
        windows = sorted(data["windows"], key=lambda w: (w[2], w[1], w[5]))
        if op._kind == _SESSION:
            gap = op._gap
            for key, first, end, acc, n, seq in windows:
                session = _Session(key, first, end - gap, _copy(acc), n, seq)
                op._sessions.setdefault(key, []).append(session)
                op._push(end, session)
                op._open_sessions += 1
            for sessions in op._sessions.values():
                sessions.sort(key=_first)
        else:
            for key, start, _end, acc, n, _seq in windows:
                op._new_window(key, start, [_copy(acc), n])
        return op
