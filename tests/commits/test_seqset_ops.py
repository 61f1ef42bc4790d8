"""SeqSet's set operations (the commit state's building blocks) against a plain ``set``."""

from __future__ import annotations

import itertools

from headrace.commits import SeqSet
from hypothesis import given
from hypothesis import strategies as st

#: Intervals over a small range so that unions, overlaps and touching ends are common.
spans = st.lists(
    st.tuples(st.integers(0, 60), st.integers(0, 10)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=10,
)
models = st.builds(
    lambda spans, singles: {n for a, b in spans for n in range(a, b + 1)} | set(singles),
    spans,
    st.lists(st.integers(0, 75), max_size=12),
)
ranges = st.tuples(st.integers(-5, 80), st.integers(-5, 80))
UNIVERSE = range(-10, 90)


def of(model: set[int]) -> SeqSet:
    """The SeqSet of ``model``, built one way or another (the canonical form does not care)."""
    return SeqSet.of(model)


def check(seqs: SeqSet, model: set[int]) -> None:
    """``seqs`` holds exactly ``model``, in the canonical form: intervals sorted, disjoint and
    not touching (so equal sets compare equal), every query agreeing."""
    intervals = seqs.intervals
    assert all(a <= b for a, b in intervals), intervals
    assert all(a[1] + 1 < b[0] for a, b in itertools.pairwise(intervals)), intervals
    assert {n for a, b in intervals for n in range(a, b + 1)} == model
    assert len(seqs) == len(model)
    assert [n for n in UNIVERSE if n in seqs] == sorted(n for n in model if n in UNIVERSE)
    assert bool(seqs) is bool(model)
    assert seqs.first == (min(model) if model else None)
    assert seqs.last == (max(model) if model else None)
    assert seqs == SeqSet.of(model)


@given(models)
def test_of_and_queries(model: set[int]) -> None:
    check(of(model), model)


@given(models, models)
def test_intersection(a: set[int], b: set[int]) -> None:
    left, right = of(a), of(b)
    check(left.intersection(right), a & b)
    check(right.intersection(left), a & b)
    check(left, a)  # the operands are left alone
    check(right, b)


@given(models, models)
def test_difference(a: set[int], b: set[int]) -> None:
    left, right = of(a), of(b)
    check(left.difference(right), a - b)
    check(right.difference(left), b - a)
    check(left, a)
    check(right, b)


@given(models, models)
def test_update(a: set[int], b: set[int]) -> None:
    left, right = of(a), of(b)
    left.update(right)
    check(left, a | b)
    check(right, b)


@given(models, ranges)
def test_discard_range(model: set[int], bounds: tuple[int, int]) -> None:
    first, last = bounds
    seqs = of(model)
    seqs.discard_range(first, last)  # an empty range (last < first) removes nothing
    check(seqs, {n for n in model if not first <= n <= last})


@given(models, st.integers(-5, 80))
def test_discard_through(model: set[int], floor: int) -> None:
    seqs = of(model)
    seqs.discard_through(floor)
    check(seqs, {n for n in model if n > floor})


@given(models, st.lists(st.tuples(st.sampled_from(["add", "discard"]), ranges), max_size=6))
def test_copy_is_independent(model: set[int], edits: list[tuple[str, tuple[int, int]]]) -> None:
    original = of(model)
    copy = original.copy()
    check(copy, model)
    expected = set(model)
    for op, (a, b) in edits:
        first, last = min(a, b), max(a, b)
        # Edit the copy and the original differently: neither may see the other's change.
        if op == "add":
            copy.add_range(first, last)
            expected.update(range(first, last + 1))
            original.discard_range(first, last)
            model = {n for n in model if not first <= n <= last}
        else:
            copy.discard_range(first, last)
            expected = {n for n in expected if not first <= n <= last}
            original.add_range(first, last)
            model = model | set(range(first, last + 1))
        check(copy, expected)
        check(original, model)


@given(models, models, models)
def test_algebra(a: set[int], b: set[int], c: set[int]) -> None:
    """A few identities the commit state relies on (overlap = part & committed, the rest =
    part - committed), through the SeqSet operations only."""
    x, y, z = of(a), of(b), of(c)
    union = x.copy()
    union.update(y)
    assert union.intersection(z) == SeqSet.of((a | b) & c)
    assert x.difference(y).intersection(y) == SeqSet()
    rebuilt = x.difference(y)
    rebuilt.update(x.intersection(y))
    assert rebuilt == x
    assert x.intersection(SeqSet()) == SeqSet() and x.difference(SeqSet()) == x


def test_empty_set() -> None:
    empty = SeqSet()
    assert not empty and len(empty) == 0
    assert empty.first is None and empty.last is None
    empty.discard_range(1, 10)
    empty.discard_through(10)
    assert empty.intervals == []
    # bool is about emptiness, not about a zero: {0} is a non-empty set.
    assert SeqSet([(0, 0)]) and SeqSet([(0, 0)]).first == 0
