"""A set of stream sequence numbers kept as intervals.

A duplicate-free sink has to know which (stream, stream_seq) it already committed, across
redeliveries cut into different batches and across restarts; :class:`SeqSet` keeps such a set as
sorted, disjoint, closed intervals, so a contiguous run of a million sequences costs as much as
one. The commit state of an output (state.py) is made of these, so they live in the lowest layer
that needs them; ``headrace.sinks`` re-exports the class.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable


class SeqSet:
    """A set of sequence numbers kept as sorted, disjoint, closed intervals."""

    __slots__ = ("_ends", "_starts")

    def __init__(self, intervals: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for first, last in intervals:
            self.add_range(first, last)

    def __contains__(self, seq: object) -> bool:
        if not isinstance(seq, int):
            return False
        i = bisect.bisect_right(self._starts, seq) - 1
        return i >= 0 and seq <= self._ends[i]

    def add(self, seq: int) -> None:
        starts, ends = self._starts, self._ends
        i = bisect.bisect_right(starts, seq) - 1
        if i >= 0 and seq <= ends[i]:
            return
        joins_left = i >= 0 and ends[i] == seq - 1
        joins_right = i + 1 < len(starts) and starts[i + 1] == seq + 1
        if joins_left and joins_right:
            ends[i] = ends[i + 1]
            del starts[i + 1], ends[i + 1]
        elif joins_left:
            ends[i] = seq
        elif joins_right:
            starts[i + 1] = seq
        else:
            starts.insert(i + 1, seq)
            ends.insert(i + 1, seq)

    def add_range(self, first: int, last: int) -> None:
        """Add every sequence from ``first`` to ``last`` (inclusive)."""
        if last < first:
            raise ValueError(f"empty range {first}..{last}")
        starts, ends = self._starts, self._ends
        # Intervals that overlap or touch [first, last] are merged into it.
        lo = bisect.bisect_left(ends, first - 1)
        hi = bisect.bisect_right(starts, last + 1)
        if lo < hi:
            first = min(first, starts[lo])
            last = max(last, ends[hi - 1])
        starts[lo:hi] = [first]
        ends[lo:hi] = [last]

    def __len__(self) -> int:
        return sum(e - s + 1 for s, e in zip(self._starts, self._ends, strict=True))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SeqSet):
            return NotImplemented
        return self._starts == other._starts and self._ends == other._ends

    def __repr__(self) -> str:
        return f"SeqSet({self.intervals!r})"

    @property
    def intervals(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends, strict=True))

    def overlaps(self, first: int, last: int) -> bool:
        """Whether any sequence from ``first`` to ``last`` (inclusive) is in the set."""
        i = bisect.bisect_left(self._ends, first)
        return i < len(self._starts) and self._starts[i] <= last

    @classmethod
    def of(cls, seqs: Iterable[int]) -> SeqSet:
        """The set of ``seqs``: sorted, then runs become intervals in one pass (a batch's
        sequences are mostly one run, and this is on a sink's per-batch path)."""
        ordered = sorted(seqs)
        result = cls()
        if ordered and ordered[-1] - ordered[0] == len(ordered) - 1 == len(set(ordered)) - 1:
            # One run without gaps or repeats, a batch's usual shape: no loop needed.
            result._starts, result._ends = [ordered[0]], [ordered[-1]]
            return result
        starts: list[int] = []
        ends: list[int] = []
        for seq in ordered:
            if ends and seq <= ends[-1] + 1:
                if seq > ends[-1]:
                    ends[-1] = seq
            else:
                starts.append(seq)
                ends.append(seq)
        result._starts, result._ends = starts, ends
        return result

    def copy(self) -> SeqSet:
        """An independent copy (the commit state's sets are treated as values)."""
        result = SeqSet()
        result._starts, result._ends = list(self._starts), list(self._ends)
        return result

    def __bool__(self) -> bool:
        return bool(self._starts)

    @property
    def first(self) -> int | None:
        return self._starts[0] if self._starts else None

    @property
    def last(self) -> int | None:
        return self._ends[-1] if self._ends else None

    def update(self, other: SeqSet) -> None:
        """Add every sequence of ``other``."""
        for first, last in zip(other._starts, other._ends, strict=True):
            self.add_range(first, last)

    def intersection(self, other: SeqSet) -> SeqSet:
        """The sequences in both sets, as a new set (a merge of the two interval lists)."""
        result = SeqSet()
        starts, ends = result._starts, result._ends
        i = j = 0
        a_s, a_e, b_s, b_e = self._starts, self._ends, other._starts, other._ends
        while i < len(a_s) and j < len(b_s):
            lo = max(a_s[i], b_s[j])
            hi = min(a_e[i], b_e[j])
            if lo <= hi:
                starts.append(lo)
                ends.append(hi)
            if a_e[i] < b_e[j]:
                i += 1
            else:
                j += 1
        return result

    def difference(self, other: SeqSet) -> SeqSet:
        """The sequences of this set that ``other`` lacks, as a new set."""
        result = self.copy()
        for first, last in zip(other._starts, other._ends, strict=True):
            result.discard_range(first, last)
        return result

    def discard_range(self, first: int, last: int) -> None:
        """Remove every sequence from ``first`` to ``last`` (inclusive)."""
        if last < first:
            return
        starts, ends = self._starts, self._ends
        lo = bisect.bisect_left(ends, first)
        hi = bisect.bisect_right(starts, last)
        if lo >= hi:
            return
        keep_s: list[int] = []
        keep_e: list[int] = []
        if starts[lo] < first:
            keep_s.append(starts[lo])
            keep_e.append(first - 1)
        if ends[hi - 1] > last:
            keep_s.append(last + 1)
            keep_e.append(ends[hi - 1])
        starts[lo:hi] = keep_s
        ends[lo:hi] = keep_e

    def discard_through(self, floor: int) -> None:
        """Remove every sequence up to ``floor`` (inclusive)."""
        if self._starts and self._starts[0] <= floor:
            self.discard_range(self._starts[0], floor)
