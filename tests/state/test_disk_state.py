"""State kept on disk (headrace.state.disk, disk_windows, disk_keyed) against the same
operators in memory: the same records in, the same results, late counts, watermarks and plain
snapshots out, with snapshots taken as the stage takes them (a copy of the file, reopened) at
random points, and operators moved from memory to disk and back. The memory operators are
themselves checked against a brute-force reference in test_windows.py."""

from __future__ import annotations

import os
import pickle
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from headrace.state.aggregates import collect, count
from headrace.state.disk import MAGIC, StateFile
from headrace.state.disk_keyed import DiskKeyedOperator
from headrace.state.disk_windows import DiskWindowOperator
from headrace.state.errors import StateLimitExceeded, StateStorageError
from headrace.state.keyed import KeyedOperator, fold_fn
from headrace.state.windows import TumblingWindow, WindowError, WindowOperator
from hypothesis import given
from hypothesis import strategies as st

from tests.state.test_windows import FLUSH, PROPERTY, Event, Fired, Spec, events, specs, us


def _rows(fired: list[Any], step: int) -> list[Fired]:
    return [(step, r.key, r.start_us, r.end_us, tuple(sorted(r.value)), r.count) for r in fired]


def run_memory(
    spec: Spec, evs: list[Event], lateness: int, limit: int | None = None
) -> tuple[list[Fired], list[Any]]:
    op = WindowOperator(spec.assigner(), collect(), lateness=us(lateness))
    rows: list[Fired] = []
    marks = []
    for i, (key, t) in enumerate(evs):
        op.add(key, t, i)
        rows.extend(_rows(op.fire(limit), i))
        marks.append((op.watermark, op.max_event_time, op.late, op.open_windows, op.keys))
    rows.extend(_rows(op.flush_all(), FLUSH))
    return rows, marks


def run_disk(
    spec: Spec,
    evs: list[Event],
    lateness: int,
    tmp: Path,
    copy_at: set[int],
    plain_at: set[int],
    limit: int | None = None,
) -> tuple[list[Fired], list[Any]]:
    """As :func:`run_memory` with a disk operator; before record ``i`` in ``copy_at`` the
    file is copied and reopened (a stage's snapshot and restore); in ``plain_at`` the operator
    goes through a plain snapshot into memory and back to a new file."""
    file = StateFile(directory=str(tmp))
    op = DiskWindowOperator(spec.assigner(), collect(), us(lateness), file=file)
    rows: list[Fired] = []
    marks = []
    files = [file]
    for i, (key, t) in enumerate(evs):
        if i in copy_at:
            op.checkpoint()
            path = str(tmp / f"copy-{i}.db")
            op.file.backup(path)
            op.add("ghost", 10**6, -1)  # after the copy: must not be in what reopens
            copy = StateFile(path)
            files.append(copy)
            op = DiskWindowOperator.reopen(spec.assigner(), collect(), us(lateness), copy)
        if i in plain_at:
            data = pickle.loads(pickle.dumps(op.snapshot()))
            middle = WindowOperator.restore(spec.assigner(), collect(), us(lateness), data)
            again = StateFile(directory=str(tmp))
            files.append(again)
            op = DiskWindowOperator.restore_into(
                spec.assigner(), collect(), us(lateness), middle.snapshot(), again
            )
        op.add(key, t, i)
        rows.extend(_rows(op.fire(limit), i))
        op.commit()
        marks.append((op.watermark, op.max_event_time, op.late, op.open_windows, op.keys))
    rows.extend(_rows(op.flush_all(), FLUSH))
    assert op.open_windows == 0 and op.keys == 0
    for f in files:
        f.close()
    return rows, marks


@pytest.mark.slow
@PROPERTY
@given(spec=specs, evs=events, lateness=st.integers(0, 40), data=st.data())
def test_windows_on_disk_match_windows_in_memory(
    spec: Spec, evs: list[Event], lateness: int, data: st.DataObject, tmp_path_factory: Any
):
    steps = st.sets(st.integers(0, max(0, len(evs) - 1)), max_size=3)
    copy_at = data.draw(steps, label="copy_at")
    plain_at = data.draw(steps, label="plain_at")
    limit = data.draw(st.one_of(st.none(), st.integers(1, 3)), label="limit")
    tmp = tmp_path_factory.mktemp("disk")
    expected, marks = run_memory(spec, evs, lateness, limit)
    got, disk_marks = run_disk(spec, evs, lateness, tmp, copy_at, plain_at, limit)
    assert got == expected
    assert disk_marks == marks


def test_a_disk_operator_moves_back_to_memory(tmp_path: Path):
    file = StateFile(directory=str(tmp_path))
    op = DiskWindowOperator(TumblingWindow(10), count(), file=file)
    for t in (1, 2, 11, 25):
        op.add("a", t * 1_000_000, None)
    assert not op.add("b", 3_000_000, None)  # behind the watermark (25 s)
    assert [(r.key, r.start_us, r.value) for r in op.fire()] == [
        ("a", 0, 2),
        ("a", 10_000_000, 1),
    ]
    back = WindowOperator.restore(TumblingWindow(10), count(), 0, op.snapshot())
    assert (back.open_windows, back.keys, back.late, back.watermark) == (1, 1, 1, 25_000_000)
    assert [(r.key, r.start_us, r.value) for r in back.flush_all()] == [("a", 20_000_000, 1)]
    file.close()


def test_reopen_refuses_another_operator(tmp_path: Path):
    file = StateFile(directory=str(tmp_path))
    op = DiskWindowOperator(TumblingWindow(10), count(), file=file)
    op.add("a", 1, None)
    op.checkpoint()
    with pytest.raises(WindowError, match="taken with"):
        DiskWindowOperator.reopen(TumblingWindow(20), count(), 0, file)
    empty = StateFile(directory=str(tmp_path))
    with pytest.raises(WindowError, match="holds no window operator"):
        DiskWindowOperator.reopen(TumblingWindow(10), count(), 0, empty)
    file.close()
    empty.close()


def test_a_state_file_is_an_sqlite_file_removed_on_close(tmp_path: Path):
    file = StateFile(directory=str(tmp_path))
    DiskWindowOperator(TumblingWindow(10), count(), file=file).checkpoint()
    copy = tmp_path / "copy.db"
    file.backup(str(copy))
    assert copy.read_bytes().startswith(MAGIC)
    assert os.path.exists(file.path)
    file.close()
    assert not os.path.exists(file.path)


def test_storage_errors_are_typed(tmp_path: Path):
    with pytest.raises(StateStorageError, match="opening the state file"):
        StateFile(directory=str(tmp_path / "missing" / "dir"))
    file = StateFile(directory=str(tmp_path))
    op = DiskWindowOperator(TumblingWindow(10), count(), file=file)
    file.conn.execute("DROP TABLE windows")  # the file changed under the operator
    with pytest.raises(StateStorageError, match="adding a record") as caught:
        op.add("a", 1, None)
    assert isinstance(caught.value.__cause__, sqlite3.Error)
    file.close()


def test_a_full_disk_is_a_storage_error(tmp_path: Path):
    """SQLite's own limit on the file's pages stands in for a full disk: the same error
    (SQLITE_FULL, "database or disk is full")."""
    file = StateFile(directory=str(tmp_path))
    op = DiskWindowOperator(TumblingWindow(10), collect(), file=file)
    file.conn.execute("PRAGMA max_page_count = 40")
    with pytest.raises(StateStorageError, match="full"):
        for i in range(100_000):
            op.add(f"key-{i}", i, "x" * 200)
            op.commit()
    file.close()


# -- keyed state ----------------------------------------------------------------------------

#: (key, value, seconds since the last op): a TTL of 5 s expires keys in the sequences.
ops = st.lists(
    st.one_of(
        st.tuples(st.just("apply"), st.sampled_from("abcd"), st.integers(-3, 3), st.integers(0, 4)),
        st.tuples(st.just("expire"), st.just(""), st.just(0), st.integers(0, 4)),
        st.tuples(st.just("copy"), st.just(""), st.just(0), st.just(0)),
    ),
    max_size=60,
)


def _step(state: Any, value: int) -> tuple[Any, Any]:
    """A running sum that forgets its key at 0 or below and emits every third total."""
    total = (state or 0) + value
    return (total if total > 0 else None), (total if total % 3 == 0 else None)


@pytest.mark.slow
@PROPERTY
@given(ops=ops, ttl=st.sampled_from([None, 5.0]))
def test_keyed_state_on_disk_matches_keyed_state_in_memory(
    ops: list[tuple[str, str, int, int]], ttl: float | None, tmp_path_factory: Any
):
    tmp = tmp_path_factory.mktemp("keyed")
    memory = KeyedOperator(_step, ttl=ttl)
    files = [StateFile(directory=str(tmp))]
    disk = DiskKeyedOperator(_step, ttl=ttl, file=files[0])
    now = 1_000_000.0
    for i, (what, key, value, later) in enumerate(ops):
        now += later
        if what == "apply":
            assert disk.apply(key, value, now) == memory.apply(key, value, now)
        elif what == "expire":
            assert disk.expire(now) == memory.expire(now)
        else:
            disk.checkpoint()
            path = str(tmp / f"copy-{i}.db")
            disk.file.backup(path)
            files.append(StateFile(path))
            disk = DiskKeyedOperator(_step, ttl=ttl, file=files[-1])
            disk.reopen()
        disk.commit()
        assert disk.keys == memory.keys
        assert disk.snapshot() == memory.snapshot()
        assert [disk.get(k) for k in "abcd"] == [memory.get(k) for k in "abcd"]
    for f in files:
        f.close()


def test_keyed_state_moves_between_memory_and_disk(tmp_path: Path):
    memory = KeyedOperator(fold_fn(int, lambda a, v: a + v), max_keys=3)
    for i, key in enumerate("abcab"):
        memory.apply(key, i, 100.0 + i)
    file = StateFile(directory=str(tmp_path))
    disk = DiskKeyedOperator(fold_fn(int, lambda a, v: a + v), max_keys=3, file=file)
    disk.restore(pickle.loads(pickle.dumps(memory.snapshot())))
    assert disk.snapshot() == memory.snapshot()
    assert disk.get("a") == 0 + 3
    disk.apply("c", 1, 200.0)
    with pytest.raises(StateLimitExceeded, match="max_keys"):
        disk.apply("d", 1, 201.0)
    back = KeyedOperator(fold_fn(int, lambda a, v: a + v))
    back.restore(disk.snapshot())
    assert [k for k, _, _ in back.snapshot()] == ["a", "b", "c"]  # touched order kept
    file.close()


#: Orders hypothesis rarely finds: sessions that end together, a bridge that ranks a session
#: by its earliest record, windows of several keys ending together.
CASES = [
    (Spec(kind="session", gap=10), [("a", 5), ("b", 0), ("b", 5)]),
    (Spec(kind="session", gap=10), [("a", 18), ("b", 0), ("a", 0), ("a", 9), ("b", 9), ("b", 18)]),
    (Spec(kind="session", gap=10), [("x", 100), ("a", 5), ("c", 5)]),
    (Spec(kind="tumbling", size=10), [("c", 1), ("a", 2), ("b", 3), ("a", 4), ("c", 12)]),
    (Spec(kind="sliding", size=10, slide=5), [("b", 7), ("a", 2), ("b", 3), ("a", 11)]),
]


@pytest.mark.parametrize(("spec", "evs"), CASES)
@pytest.mark.parametrize("copy_at", [set(), {1}, {2}])
def test_ties_fire_in_the_same_order_on_disk(
    spec: Spec, evs: list[Event], copy_at: set[int], tmp_path: Path
):
    expected, _ = run_memory(spec, evs, 100)
    got, _ = run_disk(spec, evs, 100, tmp_path, copy_at, set())
    assert got == expected
    plain, _ = run_disk(spec, evs, 100, tmp_path, set(), copy_at)
    assert plain == expected


def test_a_dead_process_s_state_files_are_swept(tmp_path: Path):
    """A SIGKILLed worker never closes its file: the next state file made in the directory
    removes it (and its snapshot copies), and leaves a live process's and other files."""
    import subprocess
    import sys

    script = "import os; print(os.getpid())"
    dead = int(subprocess.run([sys.executable, "-c", script], capture_output=True).stdout)
    stale = [
        f"headrace-state-{dead}-{'a' * 32}.db",
        f"headrace-state-{dead}-{'b' * 32}.db.snapshot-3",
    ]
    alive = f"headrace-state-{os.getppid()}-{'c' * 32}.db"
    other = "headrace-state-notes.txt"
    for name in [*stale, alive, other]:
        (tmp_path / name).write_bytes(b"x")
    file = StateFile(directory=str(tmp_path))
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([alive, other, os.path.basename(file.path)])
    file.close()
