"""What sinks that write files share: sets of committed sequence numbers, an exclusive lock on
an output directory, and fsync of a directory.

A duplicate-free sink has to know which (stream, stream_seq) it already committed, across
redeliveries cut into different batches and across restarts; :class:`SeqSet` keeps such a set
as intervals, so a contiguous run of a million sequences costs as much as one. A sink that owns
a directory must be the only writer there, in any process: :class:`DirectoryLock` is an
``flock`` that goes away with its descriptor, so with the process that held it, even after
``SIGKILL``.
"""

from __future__ import annotations

import bisect
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from headrace.sinks.errors import OutputInUse

if sys.platform != "win32":
    import fcntl


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


class DirectoryLock:
    """An exclusive ``flock`` on ``directory / name``, held until :meth:`release` (or the end of
    the process). ``owner`` names the kind of sink in the :class:`OutputInUse` message."""

    def __init__(self, directory: Path, name: str, owner: str) -> None:
        self.path = directory / name
        self.owner = owner
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        if sys.platform == "win32":  # pragma: no cover - no flock there
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputInUse(
                f"{self.path.parent} is in use by another {self.owner} (lock {self.path.name})"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the flock


def fsync_directory(directory: Path) -> None:
    """Make the renames and creations in ``directory`` durable."""
    if sys.platform == "win32":  # pragma: no cover - directories cannot be opened there
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
