"""Event-time windows (headrace.state.windows, headrace.state.aggregates): the time
conversions, each assigner, the aggregates, and WindowOperator against a brute-force reference
written here from the rules alone (late iff below the running maximum minus the lateness;
fixed windows by their definition; sessions by sorting each key's times and cutting at gaps of
``gap`` or more), with snapshots taken at random points and restored through pickle."""

from __future__ import annotations

import itertools
import json
import math
import operator
import pickle
from collections import defaultdict
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import attrs
import pytest
from headrace.errors import HeadraceError
from headrace.state.aggregates import (
    Aggregate,
    collect,
    count,
    max_of,
    mean_of,
    min_of,
    sum_of,
)
from headrace.state.windows import (
    SessionWindow,
    SlidingWindow,
    TumblingWindow,
    WindowAssigner,
    WindowError,
    WindowOperator,
    WindowResult,
    duration_micros,
    from_micros,
    to_micros,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PROPERTY = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
US = timedelta(microseconds=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def us(n: int) -> timedelta:
    return n * US


# -- time -------------------------------------------------------------------------------------


def test_to_micros_of_datetimes_and_seconds():
    assert to_micros(EPOCH) == 0
    assert to_micros(datetime(2024, 1, 1, tzinfo=UTC)) == 1_704_067_200_000_000
    # Any offset: the instant counts, not the wall time.
    plus_two = timezone(timedelta(hours=2))
    assert to_micros(datetime(2024, 1, 1, 2, tzinfo=plus_two)) == 1_704_067_200_000_000
    assert to_micros(datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)) == -1
    assert to_micros(1_700_000_000) == 1_700_000_000_000_000
    assert to_micros(-1) == -1_000_000
    assert to_micros(1.5) == 1_500_000
    assert to_micros(1_700_000_000.123456) == 1_700_000_000_123_456
    assert to_micros(-0.000001) == -1


@pytest.mark.parametrize(
    "bad", [datetime(2024, 1, 1), True, "1", None, math.nan, math.inf, -math.inf]
)
def test_to_micros_refuses(bad: Any):
    with pytest.raises(WindowError):
        to_micros(bad)


def test_window_error_is_a_headrace_value_error():
    assert issubclass(WindowError, HeadraceError) and issubclass(WindowError, ValueError)


def test_from_micros():
    assert from_micros(0) == EPOCH
    assert from_micros(-1) == datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
    assert from_micros(1_704_067_200_000_001).tzinfo is UTC
    for n in (0, 1, -1, 1_704_067_200_123_456, -62_000_000_000_000_000):
        assert to_micros(from_micros(n)) == n
    with pytest.raises(WindowError):
        from_micros(10**20)


def test_duration_micros():
    assert duration_micros(timedelta(seconds=1)) == 1_000_000
    assert duration_micros(60) == 60_000_000
    assert duration_micros(0.25) == 250_000
    assert duration_micros(0, allow_zero=True) == 0
    assert duration_micros(timedelta(0), allow_zero=True) == 0
    for bad in (0, -1, timedelta(0), timedelta(seconds=-1), 1e-7, math.nan, math.inf, True, "1"):
        with pytest.raises(WindowError):
            duration_micros(bad)  # type: ignore[arg-type]
    with pytest.raises(WindowError):
        duration_micros(-0.5, allow_zero=True)


# -- assigners --------------------------------------------------------------------------------


def test_tumbling_alignment_and_negative_times():
    w = TumblingWindow(us(10))
    assert w.size == us(10) and w.align_to == EPOCH
    assert w.windows_of(0) == [(0, 10)]
    assert w.windows_of(9) == [(0, 10)]
    assert w.windows_of(10) == [(10, 20)]
    assert w.windows_of(-1) == [(-10, 0)]
    assert w.windows_of(-10) == [(-10, 0)]
    assert w.windows_of(-11) == [(-20, -10)]
    shifted = TumblingWindow(us(10), align_to=from_micros(3))
    assert shifted.windows_of(3) == [(3, 13)]
    assert shifted.windows_of(2) == [(-7, 3)]
    assert shifted.windows_of(-8) == [(-17, -7)]
    # The grid is the same whichever grid point is named.
    assert TumblingWindow(us(10), align_to=from_micros(-97)).windows_of(5) == [(3, 13)]


def test_tumbling_in_seconds_and_datetimes():
    hourly = TumblingWindow(3600, align_to=1800)
    assert hourly.size == timedelta(hours=1)
    assert hourly.align_to == datetime(1970, 1, 1, 0, 30, tzinfo=UTC)
    t = to_micros(datetime(2024, 5, 1, 12, 10, tzinfo=UTC))
    ((start, end),) = hourly.windows_of(t)
    assert from_micros(start) == datetime(2024, 5, 1, 11, 30, tzinfo=UTC)
    assert from_micros(end) == datetime(2024, 5, 1, 12, 30, tzinfo=UTC)
    again = TumblingWindow(timedelta(hours=1), align_to=datetime(2000, 1, 1, 0, 30, tzinfo=UTC))
    assert again == hourly.__class__(again.size, again.align_to)
    assert pickle.loads(pickle.dumps(hourly)) == hourly


@pytest.mark.parametrize(
    "kwargs",
    [
        {"size": 0},
        {"size": -1},
        {"size": 1, "align_to": datetime(2024, 1, 1)},
        {"size": math.nan},
    ],
)
def test_tumbling_refuses(kwargs: dict[str, Any]):
    with pytest.raises(WindowError):
        TumblingWindow(**kwargs)


def test_sliding_windows():
    w = SlidingWindow(us(10), us(5))
    assert w.windows_of(0) == [(-5, 5), (0, 10)]
    assert w.windows_of(4) == [(-5, 5), (0, 10)]
    assert w.windows_of(5) == [(0, 10), (5, 15)]
    assert w.windows_of(-1) == [(-10, 0), (-5, 5)]
    # A slide equal to the size: tumbling.
    assert SlidingWindow(us(10), us(10)).windows_of(-3) == TumblingWindow(us(10)).windows_of(-3)


def test_sliding_with_a_slide_that_does_not_divide_the_size():
    w = SlidingWindow(us(10), us(4))
    assert w.windows_of(9) == [(0, 10), (4, 14), (8, 18)]
    assert w.windows_of(10) == [(4, 14), (8, 18)]
    assert w.windows_of(-1) == [(-8, 2), (-4, 6)]
    aligned = SlidingWindow(us(10), us(4), align_to=from_micros(1))
    assert aligned.windows_of(9) == [(1, 11), (5, 15), (9, 19)]
    # Every instant: exactly the windows on the grid that contain it.
    for t in range(-30, 30):
        expected = [(s, s + 10) for s in range(-60, 60, 4) if s <= t < s + 10]
        assert w.windows_of(t) == expected


def test_sliding_refuses_a_slide_beyond_its_size():
    with pytest.raises(WindowError, match="slide"):
        SlidingWindow(us(10), us(11))


def test_session_window_needs_a_merge():
    assert SessionWindow(30).gap == timedelta(seconds=30)
    with pytest.raises(WindowError):
        SessionWindow(0)
    with pytest.raises(WindowError, match="merge"):
        WindowOperator(SessionWindow(us(10)), Aggregate(init=int, add=lambda a, v: a + 1))


def results(fired: list[WindowResult]) -> list[tuple[Any, int, int, Any, int]]:
    return [(r.key, r.start_us, r.end_us, r.value, r.count) for r in fired]


def test_sessions_merge_across_a_bridge():
    op = WindowOperator(SessionWindow(us(10)), collect(), lateness=us(20))
    assert op.add("a", 0, "x")
    assert op.add("a", 18, "z")
    assert op.open_windows == 2 and op.keys == 1
    assert op.add("a", 9, "y")  # within the gap of both: one session
    assert op.open_windows == 1
    assert op.add("b", 10, "q")
    assert results(op.flush_all()) == [("b", 10, 20, ["q"], 1), ("a", 0, 28, ["x", "y", "z"], 3)]
    assert op.open_windows == 0 and op.keys == 0


def test_sessions_split_at_exactly_the_gap():
    op = WindowOperator(SessionWindow(us(10)), count())
    for t in (0, 10, 19, 30):
        op.add("a", t, None)
    # 0 and 10 are a gap apart (two sessions); 10 and 19 are not; 30 - 19 >= 10 again.
    assert results(op.flush_all()) == [("a", 0, 10, 1, 1), ("a", 10, 29, 2, 2), ("a", 30, 40, 1, 1)]


def test_sessions_that_end_together_fire_by_start_then_first_record():
    op = WindowOperator(SessionWindow(us(10)), count(), lateness=us(100))
    op.add("a", 5, None)  # [5, 15), opened first
    op.add("b", 0, None)
    op.add("b", 5, None)  # [0, 15): starts earlier, fires first
    assert [(r.key, r.start_us, r.end_us) for r in op.flush_all()] == [
        ("b", 0, 15),
        ("a", 5, 15),
    ]


def test_a_merged_session_ranks_by_its_earliest_record():
    op = WindowOperator(SessionWindow(us(10)), count(), lateness=us(100))
    op.add("a", 18, None)  # the first record of what becomes a's only session
    op.add("b", 0, None)
    op.add("a", 0, None)  # a new session of a, opened after b's
    op.add("a", 9, None)  # the bridge: a's session is [0, 28), ranked by a@18
    op.add("b", 9, None)
    op.add("b", 18, None)  # b's session is [0, 28) too
    assert results(op.flush_all()) == [("a", 0, 28, 3, 3), ("b", 0, 28, 3, 3)]


def test_the_creation_order_survives_a_restore():
    op = WindowOperator(SessionWindow(us(10)), count(), lateness=us(100))
    op.add("x", 100, None)
    op.add("a", 5, None)
    data = pickle.loads(pickle.dumps(op.snapshot()))
    op = WindowOperator.restore(SessionWindow(us(10)), count(), us(100), data)
    op.add("c", 5, None)  # opened after a's: it fires after it
    assert [r.key for r in op.flush_all()] == ["a", "c", "x"]


def test_session_grows_backwards_within_lateness():
    op = WindowOperator(SessionWindow(us(10)), count(), lateness=us(100))
    op.add("a", 50, None)
    op.add("a", 45, None)  # before the session's first record: it starts earlier
    op.add("a", 36, None)
    assert results(op.flush_all()) == [("a", 36, 60, 3, 3)]


# -- aggregates -------------------------------------------------------------------------------


def fold(agg: Aggregate[Any, Any, Any], values: list[Any]) -> Any:
    acc = agg.init()
    for v in values:
        acc = agg.add(acc, v)
    return acc


def result(agg: Aggregate[Any, Any, Any], acc: Any) -> Any:
    return acc if agg.result is None else agg.result(acc)


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (count, 5),
        (sum_of, 17),
        (lambda: sum_of(lambda v: v * 10), 170),
        (collect, [3, 1, 4, 1, 8]),
        (min_of, 1),
        (lambda: min_of(lambda v: -v), -8),
        (max_of, 8),
        (lambda: max_of(lambda v: v % 4), 3),
        (mean_of, 3.4),
        (lambda: mean_of(lambda v: v * 2), 6.8),
    ],
)
def test_builtin_aggregates_fold_and_merge(make: Any, expected: Any):
    values = [3, 1, 4, 1, 8]
    agg = make()
    assert result(agg, fold(agg, values)) == pytest.approx(expected)
    # Any split, merged (earlier part first), gives the same.
    for cut in range(len(values) + 1):
        merged = agg.merge(fold(agg, values[:cut]), fold(agg, values[cut:]))
        assert result(agg, merged) == pytest.approx(expected)


def test_builtin_aggregates_pickle():
    for agg in (count(), sum_of(), collect(), min_of(), max_of(), mean_of(), sum_of(abs)):
        again = pickle.loads(pickle.dumps(agg))
        assert result(again, fold(again, [-2, 5])) == result(agg, fold(agg, [-2, 5]))


def test_aggregate_refuses_what_is_not_callable():
    with pytest.raises(TypeError):
        Aggregate(init=0, add=lambda a, v: a)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Aggregate(init=int, add=lambda a, v: a, merge=1)  # type: ignore[arg-type]


# -- WindowResult -----------------------------------------------------------------------------


def test_window_result_is_a_plain_record():
    r = WindowResult("k", from_micros(0), from_micros(60_000_000), {"n": 2}, 2)
    assert (r.start_us, r.end_us) == (0, 60_000_000)
    assert json.loads(json.dumps(r.to_dict())) == {
        "key": "k",
        "start": "1970-01-01T00:00:00+00:00",
        "end": "1970-01-01T00:01:00+00:00",
        "value": {"n": 2},
        "count": 2,
    }
    assert pickle.loads(pickle.dumps(r)) == r
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        r.count = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("start", "end", "n"),
    [
        (datetime(2024, 1, 1), datetime(2024, 1, 2, tzinfo=UTC), 1),
        (from_micros(5), from_micros(5), 1),
        (from_micros(0), from_micros(5), 0),
    ],
)
def test_window_result_refuses(start: datetime, end: datetime, n: int):
    with pytest.raises(WindowError):
        WindowResult("k", start, end, None, n)


# -- the operator, by example -----------------------------------------------------------------


def test_late_records_change_nothing_but_the_counter():
    op = WindowOperator(TumblingWindow(us(10)), count(), lateness=us(5))
    assert op.watermark is None and op.max_event_time is None
    assert op.add("a", 100, None)
    assert (op.watermark, op.max_event_time) == (95, 100)
    assert op.add("a", 95, None)  # at the watermark: on time
    assert not op.add("a", 94, None)  # below it: late, though its window is open
    assert op.late == 1 and op.open_windows == 2
    assert op.add("b", 120, None)
    assert op.watermark == 115
    assert results(op.fire()) == [("a", 90, 100, 1, 1), ("a", 100, 110, 1, 1)]
    assert op.fire() == []
    assert op.late == 1 and op.keys == 1


def test_a_record_is_judged_before_it_moves_the_watermark():
    op = WindowOperator(TumblingWindow(us(10)), count())
    assert op.add("a", 50, None)
    assert op.add("a", 60, None)  # raises the watermark to 60 only after it is taken
    assert not op.add("a", 59, None)


def test_advance_to_never_goes_back():
    op = WindowOperator(TumblingWindow(us(10)), count(), lateness=us(100))
    op.advance_to(30)
    assert op.watermark == 30
    op.advance_to(10)
    assert op.watermark == 30
    assert not op.add("a", 29, None)
    assert op.add("a", 35, None)
    assert op.watermark == 30  # 35 - 100 is behind
    assert op.fire() == []
    op.advance_to(40)
    assert results(op.fire()) == [("a", 30, 40, 1, 1)]


def test_fixed_windows_fire_by_end_then_first_record():
    op = WindowOperator(SlidingWindow(us(10), us(5)), collect(), lateness=us(100))
    op.add("b", 7, 1)
    op.add("a", 3, 2)
    op.add("b", 1, 3)
    op.advance_to(15)
    # (a, -5) was opened by the second record, (b, -5) by the third.
    assert results(op.fire()) == [
        ("a", -5, 5, [2], 1),
        ("b", -5, 5, [3], 1),
        ("b", 0, 10, [1, 3], 2),
        ("a", 0, 10, [2], 1),
        ("b", 5, 15, [1], 1),
    ]


def test_flush_all_closes_what_it_emitted():
    op = WindowOperator(TumblingWindow(us(10)), count(), lateness=us(100))
    op.add("a", 5, None)
    op.add("a", 25, None)
    assert results(op.flush_all()) == [("a", 0, 10, 1, 1), ("a", 20, 30, 1, 1)]
    assert op.watermark == 30
    assert not op.add("a", 29, None)  # its window was emitted
    assert op.add("a", 30, None)


def _picky_add(acc: int, value: Any) -> int:
    if value is None:
        raise TypeError("no value")
    return acc + value


@pytest.mark.parametrize(
    "assigner", [TumblingWindow(us(10)), SlidingWindow(us(10), us(3)), SessionWindow(us(10))]
)
def test_an_add_that_raises_changes_nothing(assigner: WindowAssigner):
    picky = Aggregate(init=int, add=_picky_add, merge=operator.add)
    op = WindowOperator(assigner, picky, lateness=us(100))
    for t in (0, 30):
        op.add("a", t, 1)
    before = op.snapshot()
    for key, t in (("a", 0), ("a", 15), ("b", 15)):  # into a window, a bridge, a new key
        with pytest.raises(TypeError):
            op.add(key, t, None)
        assert op.snapshot() == before
    fired = op.flush_all()
    assert sum(r.value for r in fired) == sum(r.count for r in fired)


def test_event_times_outside_datetimes_are_refused_before_any_change():
    op = WindowOperator(SlidingWindow(us(10), us(3)), count())
    with pytest.raises(WindowError):
        op.add("a", 10**19, None)
    with pytest.raises(WindowError):
        op.add("a", -(10**19), None)
    assert op.open_windows == 0 and op.max_event_time is None


def test_windows_in_datetimes():
    op = WindowOperator(TumblingWindow(timedelta(minutes=1)), sum_of(), lateness=5)
    t = to_micros(datetime(2024, 5, 1, 12, 0, 30, tzinfo=UTC))
    op.add("k", t, 2)
    op.add("k", t + 10_000_000, 3)
    op.add("k", to_micros(datetime(2024, 5, 1, 12, 1, 6, tzinfo=UTC)), 1)
    (r,) = op.fire()
    assert r == WindowResult(
        "k",
        datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
        datetime(2024, 5, 1, 12, 1, tzinfo=UTC),
        5,
        2,
    )


def test_restore_refuses_another_operator_s_snapshot():
    op = WindowOperator(TumblingWindow(us(10)), count(), lateness=us(3))
    op.add("a", 1, None)
    data = op.snapshot()
    with pytest.raises(WindowError):
        WindowOperator.restore(TumblingWindow(us(20)), count(), us(3), data)
    with pytest.raises(WindowError):
        WindowOperator.restore(TumblingWindow(us(10)), count(), us(4), data)
    with pytest.raises(WindowError):
        WindowOperator.restore(SessionWindow(us(10)), count(), us(3), data)
    with pytest.raises(WindowError):
        WindowOperator.restore(TumblingWindow(us(10)), count(), us(3), [1, 2])
    with pytest.raises(WindowError, match="newer"):
        WindowOperator.restore(TumblingWindow(us(10)), count(), us(3), {**data, "format": 99})


@pytest.mark.parametrize(
    "assigner", [TumblingWindow(us(10)), SlidingWindow(us(10), us(3)), SessionWindow(us(10))]
)
def test_a_snapshot_does_not_follow_the_operator(assigner: WindowAssigner):
    op = WindowOperator(assigner, collect(), lateness=us(50))
    op.add("a", 1, "x")
    data = op.snapshot()
    op.add("a", 2, "y")
    first = WindowOperator.restore(assigner, collect(), us(50), data)
    second = WindowOperator.restore(assigner, collect(), us(50), data)
    first.add("a", 3, "z")
    assert {tuple(r.value) for r in second.flush_all()} == {("x",)}
    assert all("y" not in r.value for r in first.flush_all())


# -- the operator against a brute-force reference --------------------------------------------

Event = tuple[str, int]


@attrs.frozen
class Spec:
    """An assigner's parameters in microseconds, to build it and to compute its windows."""

    kind: str
    size: int = 0
    slide: int = 0
    align: int = 0
    gap: int = 0

    def assigner(self) -> WindowAssigner:
        if self.kind == "tumbling":
            return TumblingWindow(us(self.size), align_to=from_micros(self.align))
        if self.kind == "sliding":
            return SlidingWindow(us(self.size), us(self.slide), align_to=from_micros(self.align))
        return SessionWindow(us(self.gap))


specs = st.one_of(
    st.builds(
        Spec,
        kind=st.just("tumbling"),
        size=st.integers(1, 40),
        align=st.integers(-50, 50),
    ),
    st.integers(1, 40).flatmap(
        lambda size: st.builds(
            Spec,
            kind=st.just("sliding"),
            size=st.just(size),
            slide=st.integers(1, size),
            align=st.integers(-50, 50),
        )
    ),
    st.builds(Spec, kind=st.just("session"), gap=st.integers(1, 40)),
)

KEYS = st.sampled_from(["a", "b", "c"])
#: Times in any order, or crowded into a few instants (windows of different keys that end and
#: start together: the creation order decides), or mostly rising with steps back (how real
#: streams come).
events = st.one_of(
    st.lists(st.tuples(KEYS, st.integers(-100, 200)), max_size=60),
    st.lists(st.tuples(KEYS, st.integers(0, 25)), max_size=40),
    st.tuples(
        st.integers(-100, 100), st.lists(st.tuples(KEYS, st.integers(-15, 20)), max_size=60)
    ).map(lambda base_steps: _walk(*base_steps)),
)


def _walk(base: int, steps: list[Event]) -> list[Event]:
    out, t = [], base
    for key, step in steps:
        t += step
        out.append((key, t))
    return out


#: The step of a record's fire() call (its index in the input) or FLUSH for flush_all.
FLUSH = 10**9
Fired = tuple[int, str, int, int, tuple[int, ...], int]


def reference(spec: Spec, evs: list[Event], lateness: int) -> tuple[list[Fired], int]:
    """The fired windows of the operator's rules, computed from the rules alone, as
    ``(step, key, start, end, sorted record indices, count)`` in the expected order; and how
    many records are late."""
    late: set[int] = set()
    watermarks: list[int] = []
    running_max: int | None = None
    for i, (_, t) in enumerate(evs):
        if running_max is not None and t < running_max - lateness:
            late.add(i)
        running_max = t if running_max is None else max(running_max, t)
        watermarks.append(running_max - lateness)
    taken = [(i, k, t) for i, (k, t) in enumerate(evs) if i not in late]

    members: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    if spec.kind == "session":
        by_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for i, k, t in taken:
            by_key[k].append((t, i))
        for k, points in by_key.items():
            points.sort()
            group = [points[0]]
            for prev, nxt in itertools.pairwise(points):
                if nxt[0] - prev[0] >= spec.gap:
                    members[(k, group[0][0], group[-1][0] + spec.gap)] = [i for _, i in group]
                    group = []
                group.append(nxt)
            members[(k, group[0][0], group[-1][0] + spec.gap)] = [i for _, i in group]
    else:
        slide = spec.size if spec.kind == "tumbling" else spec.slide
        for i, k, t in taken:
            # Every grid start near t, each checked against the definition.
            for n in range(
                (t - spec.size - spec.align) // slide - 1, (t - spec.align) // slide + 2
            ):
                start = spec.align + n * slide
                if start <= t < start + spec.size:
                    members[(k, start, start + spec.size)].append(i)

    fired: list[tuple[tuple[int, int, int, int], Fired]] = []
    for (k, start, end), indices in members.items():
        first = min(indices)
        # fire() runs after every add: a window fires at the first step whose watermark
        # reaches its end (no earlier than its first record), else at the flush.
        step = next(
            (j for j in range(first, len(evs)) if watermarks[j] >= end),
            FLUSH,
        )
        row = (step, k, start, end, tuple(sorted(indices)), len(indices))
        fired.append(((step, end, start, first), row))
    fired.sort(key=lambda pair: pair[0])
    return [row for _, row in fired], len(late)


def run(
    spec: Spec, evs: list[Event], lateness: int, snapshot_at: int | None = None
) -> tuple[list[WindowResult], list[Fired], WindowOperator]:
    """Run the operator as a stage would (fire after every add, flush at the end),
    snapshotting and restoring through pickle before record ``snapshot_at``."""
    op = WindowOperator(spec.assigner(), collect(), lateness=us(lateness))
    out: list[WindowResult] = []
    rows: list[Fired] = []
    for i, (key, t) in enumerate(evs):
        if i == snapshot_at:
            before = (op.watermark, op.max_event_time, op.late, op.open_windows, op.keys)
            data = pickle.loads(pickle.dumps(op.snapshot()))
            op = WindowOperator.restore(spec.assigner(), collect(), us(lateness), data)
            assert (op.watermark, op.max_event_time, op.late, op.open_windows, op.keys) == before
        was = op.watermark
        taken = op.add(key, t, i)
        assert taken == (was is None or t >= was)
        fired = op.fire()
        for r in fired:
            assert op.watermark is not None and r.end_us <= op.watermark
        out.extend(fired)
        rows.extend(
            (i, r.key, r.start_us, r.end_us, tuple(sorted(r.value)), r.count) for r in fired
        )
    fired = op.flush_all()
    out.extend(fired)
    rows.extend(
        (FLUSH, r.key, r.start_us, r.end_us, tuple(sorted(r.value)), r.count) for r in fired
    )
    assert op.open_windows == 0 and op.keys == 0
    return out, rows, op


@PROPERTY
@given(spec=specs, evs=events, lateness=st.integers(0, 40))
def test_operator_matches_the_reference(spec: Spec, evs: list[Event], lateness: int):
    out, rows, op = run(spec, evs, lateness)
    expected, late = reference(spec, evs, lateness)
    assert rows == expected
    assert op.late == late
    if spec.kind != "session":
        # Fixed windows collect in arrival order.
        assert all(list(r.value) == sorted(r.value) for r in out)


@PROPERTY
@given(spec=specs, evs=events, lateness=st.integers(0, 40), data=st.data())
def test_snapshot_and_restore_change_nothing(
    spec: Spec, evs: list[Event], lateness: int, data: st.DataObject
):
    at = data.draw(st.integers(0, len(evs)), label="snapshot_at")
    straight, _, _ = run(spec, evs, lateness)
    restored, _, _ = run(spec, evs, lateness, snapshot_at=at)
    assert restored == straight  # the same windows, values (in their order) and order


@PROPERTY
@given(spec=specs, evs=events, lateness=st.integers(0, 40))
def test_when_fire_is_called_does_not_change_the_results(
    spec: Spec, evs: list[Event], lateness: int
):
    """Firing after every record or only at the end: the same windows in the same order."""
    straight, _, _ = run(spec, evs, lateness)
    op = WindowOperator(spec.assigner(), collect(), lateness=us(lateness))
    for i, (key, t) in enumerate(evs):
        op.add(key, t, i)
    assert op.flush_all() == straight


@PROPERTY
@given(spec=specs, evs=events, lateness=st.integers(0, 40), slice_=st.integers(1, 4))
def test_firing_in_slices_gives_the_same_windows_in_the_same_order(
    spec: Spec, evs: list[Event], lateness: int, slice_: int
):
    """fire(limit) a slice at a time until nothing is due, after every record: the same
    windows, values and order as firing everything at once (records keep coming between
    slices, so a slice left due must stay closed to them: they are late)."""
    straight, _, _ = run(spec, evs, lateness)
    op = WindowOperator(spec.assigner(), collect(), lateness=us(lateness))
    out: list[WindowResult] = []
    for i, (key, t) in enumerate(evs):
        op.add(key, t, i)
        out.extend(op.fire(limit=slice_))  # one slice only: the rest stays due meanwhile
    while fired := op.fire(limit=slice_):
        out.extend(fired)
    out.extend(op.flush_all())
    assert out == straight
