"""The shared pieces of file sinks: SeqSet against a plain set, DirectoryLock across processes."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
from headrace.sinks import DirectoryLock, OutputInUse, SeqSet
from hypothesis import given
from hypothesis import strategies as st

ranges = st.lists(
    st.tuples(st.integers(0, 60), st.integers(0, 8)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=12,
)


@given(ranges, st.lists(st.integers(0, 80), max_size=20))
def test_seqset_matches_a_plain_set(spans: list[tuple[int, int]], singles: list[int]) -> None:
    model: set[int] = set()
    seqs = SeqSet()
    for first, last in spans:
        seqs.add_range(first, last)
        model.update(range(first, last + 1))
    for seq in singles:
        seqs.add(seq)
        model.add(seq)
    assert len(seqs) == len(model)
    assert all((n in seqs) == (n in model) for n in range(-1, 90))
    # disjoint, sorted, not touching: the canonical form, so equal sets compare equal
    intervals = seqs.intervals
    assert all(a[1] + 1 < b[0] for a, b in itertools.pairwise(intervals))
    assert seqs == SeqSet.of(model)
    assert seqs == SeqSet.of([*model, *model])  # repeats, unsorted
    assert SeqSet(intervals) == seqs
    for first, last in [(0, 0), (5, 9), (30, 31), (-5, -1), (85, 95), (0, 100)]:
        assert seqs.overlaps(first, last) == any(first <= n <= last for n in model)


def test_seqset_rejects_an_empty_range() -> None:
    with pytest.raises(ValueError, match=r"empty range 5\.\.4"):
        SeqSet().add_range(5, 4)


def test_directory_lock_excludes_another_process(tmp_path: Path) -> None:
    lock = DirectoryLock(tmp_path, ".lock", "TestSink")
    lock.acquire()
    probe = (
        "import sys; from pathlib import Path; from headrace.sinks import DirectoryLock\n"
        "try:\n    DirectoryLock(Path(sys.argv[1]), '.lock', 'TestSink').acquire()\n"
        "except Exception as e:\n    print(type(e).__name__, e); sys.exit(3)\n"
    )
    held = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True)
    assert held.returncode == 3, held
    assert b"OutputInUse" in held.stdout and b"another TestSink" in held.stdout
    lock.release()
    free = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True)
    assert free.returncode == 0, free


def test_directory_lock_in_one_process_is_exclusive_per_descriptor(tmp_path: Path) -> None:
    first = DirectoryLock(tmp_path, ".lock", "TestSink")
    first.acquire()
    with pytest.raises(OutputInUse):
        DirectoryLock(tmp_path, ".lock", "TestSink").acquire()
    first.release()
    DirectoryLock(tmp_path, ".lock", "TestSink").acquire()


@pytest.mark.parametrize(
    ("seqs", "intervals"),
    [
        ([3, 1, 2], [(1, 3)]),  # one run, unsorted: no loop needed
        ([1, 1, 3], [(1, 1), (3, 3)]),  # as long as its span, but with a repeat and a gap
        ([1, 2, 2, 3], [(1, 3)]),
        ([7], [(7, 7)]),
        ([], []),
    ],
)
def test_seqset_of_runs_with_and_without_gaps(
    seqs: list[int], intervals: list[tuple[int, int]]
) -> None:
    assert SeqSet.of(seqs).intervals == intervals
