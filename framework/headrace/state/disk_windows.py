"""Windows kept on disk: :class:`DiskWindowOperator`, the window operator of ``backend="disk"``.

The same operator as :class:`~headrace.state.windows.WindowOperator` (the watermark, lateness,
the rules for firing, the order of results, the snapshot's plain form are inherited and must
not differ: tests/state/test_disk_state.py runs both on the same records and compares), with
its open windows in a :class:`~headrace.state.disk.StateFile` instead of dicts:

- fixed windows (tumbling, sliding): one row per ``(key, start)`` with its end, creation
  number, accumulator and count; an index on ``(end, creation)`` is the firing order;
- sessions: one row per ``(key, first)`` with its last time; an index on ``(last, first,
  creation)`` is theirs (a session ends at ``last + gap``);
- ``window_keys``: how many windows each key has open, for :attr:`keys`.

A record is a read and a write of its window's row (an accumulator is unpickled, added to and
pickled again), so it costs more than in memory (bench/README.md "bench windows"); in return
the operator's memory is SQLite's page cache, whatever the number of keys and windows. The
scalars (watermark, newest event time, counters) live in memory and go into the file's
``meta`` table at each :meth:`checkpoint`, so that a copy of the file is the whole state.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Final

from headrace.state.aggregates import Aggregate
from headrace.state.disk import StateFile, dumps, loads, storage_errors
from headrace.state.windows import (
    _SESSION,
    Duration,
    WindowAssigner,
    WindowError,
    WindowOperator,
    WindowResult,
    from_micros,
)

#: The meta row a disk window operator's scalars are kept under.
META: Final = "windows"

_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS windows(k BLOB NOT NULL, start INTEGER NOT NULL, "
    "end INTEGER NOT NULL, seq INTEGER NOT NULL, acc BLOB NOT NULL, n INTEGER NOT NULL, "
    "PRIMARY KEY (k, start)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS windows_by_end ON windows(end, seq)",
    "CREATE TABLE IF NOT EXISTS sessions(k BLOB NOT NULL, first INTEGER NOT NULL, "
    "last INTEGER NOT NULL, seq INTEGER NOT NULL, acc BLOB NOT NULL, n INTEGER NOT NULL, "
    "PRIMARY KEY (k, first)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS sessions_by_last ON sessions(last, first, seq)",
    "CREATE TABLE IF NOT EXISTS window_keys(k BLOB PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID",
)


class DiskWindowOperator(WindowOperator):
    """A :class:`WindowOperator` whose open windows are rows of ``file`` (see the module
    docs). Built empty by the constructor, from a plain snapshot by :meth:`restore_into`, or
    from a file a snapshot restored by :meth:`reopen`."""

    __slots__ = ("_file", "_keys_open", "_min_end", "_windows_open")

    def __init__(
        self,
        assigner: WindowAssigner,
        aggregate: Aggregate[Any, Any, Any],
        lateness: Duration = 0,
        *,
        file: StateFile,
    ) -> None:
        super().__init__(assigner, aggregate, lateness)
        self._file = file
        #: Windows and keys open (kept here: counting rows is a scan).
        self._windows_open = 0
        self._keys_open = 0
        #: No window ends before this (None: none open). Exact for fixed windows; for
        #: sessions a lower bound, since a session's end grows with its records.
        self._min_end: int | None = None
        file.create(_SCHEMA, "the window tables")

    @property
    def file(self) -> StateFile:
        return self._file

    @property
    def open_windows(self) -> int:
        return self._windows_open

    @property
    def keys(self) -> int:
        return self._keys_open

    # -- records ----------------------------------------------------------------------------

    def add(self, key: Any, t_us: int, value: Any) -> bool:
        if not self._admit(t_us):
            return False
        k = dumps(key)
        with storage_errors(self._file.where("adding a record")):
            if self._kind == _SESSION:
                self._add_to_disk_session(k, t_us, value)
            else:
                start = t_us - (t_us - self._align) % self._slide
                low = t_us - self._size
                while start > low:  # one window (tumbling) or size / slide of them
                    self._add_to_disk_window(k, start, value)
                    start -= self._slide
        self._taken(t_us)
        return True

    def _add_to_disk_window(self, k: bytes, start: int, value: Any) -> None:
        conn = self._file.conn
        row = conn.execute(
            "SELECT acc, n FROM windows WHERE k = ? AND start = ?", (k, start)
        ).fetchone()
        if row is None:
            acc = self._add(self._init(), value)
            end = start + self._size
            conn.execute(
                "INSERT INTO windows(k, start, end, seq, acc, n) VALUES (?, ?, ?, ?, ?, 1)",
                (k, start, end, self._seq, dumps(acc)),
            )
            self._seq += 1
            self._opened(k, end)
        else:
            acc = self._add(loads(row[0]), value)
            conn.execute(
                "UPDATE windows SET acc = ?, n = ? WHERE k = ? AND start = ?",
                (dumps(acc), row[1] + 1, k, start),
            )

    def _opened(self, k: bytes, end: int) -> None:
        """A window of ``k`` ending at ``end`` was opened: the counts and the earliest end."""
        self._windows_open += 1
        conn = self._file.conn
        if conn.execute("UPDATE window_keys SET n = n + 1 WHERE k = ?", (k,)).rowcount == 0:
            conn.execute("INSERT INTO window_keys(k, n) VALUES (?, 1)", (k,))
            self._keys_open += 1
        if self._min_end is None or end < self._min_end:
            self._min_end = end

    def _closed(self, per_key: Counter[bytes]) -> None:
        """Windows were fired: ``per_key`` says how many of each key."""
        conn = self._file.conn
        for k, gone in per_key.items():
            self._windows_open -= gone
            conn.execute("UPDATE window_keys SET n = n - ? WHERE k = ?", (gone, k))
            if conn.execute("DELETE FROM window_keys WHERE k = ? AND n <= 0", (k,)).rowcount:
                self._keys_open -= 1

    def _add_to_disk_session(self, k: bytes, t: int, value: Any) -> None:
        # The memory operator's rule (WindowOperator._add_to_session), with the key's
        # sessions on either side of t found by the primary key's order.
        gap = self._gap
        conn = self._file.conn
        left = conn.execute(
            "SELECT first, last, seq, acc, n FROM sessions WHERE k = ? AND first <= ? "
            "ORDER BY first DESC LIMIT 1",
            (k, t),
        ).fetchone()
        if left is not None and not t < left[1] + gap:
            left = None
        right = conn.execute(
            "SELECT first, last, seq, acc, n FROM sessions WHERE k = ? AND first > ? "
            "ORDER BY first LIMIT 1",
            (k, t),
        ).fetchone()
        if right is not None and not right[0] - gap < t:
            right = None
        if left is not None:
            first, last, seq, _, n = left
            acc = self._add(loads(left[3]), value)
            if right is not None:  # a bridge: the later session merges into the earlier
                assert self._merge is not None  # checked in __init__
                acc = self._merge(acc, loads(right[3]))
                n += right[4]
                last = right[1]
                seq = min(seq, right[2])
                conn.execute("DELETE FROM sessions WHERE k = ? AND first = ?", (k, right[0]))
                self._closed(Counter({k: 1}))
            elif t > last:
                last = t
            conn.execute(
                "UPDATE sessions SET last = ?, seq = ?, acc = ?, n = ? WHERE k = ? AND first = ?",
                (last, seq, dumps(acc), n + 1, k, first),
            )
        elif right is not None:
            acc = self._add(loads(right[3]), value)
            conn.execute(
                "UPDATE sessions SET first = ?, acc = ?, n = n + 1 WHERE k = ? AND first = ?",
                (t, dumps(acc), k, right[0]),
            )
        else:
            acc = self._add(self._init(), value)
            conn.execute(
                "INSERT INTO sessions(k, first, last, seq, acc, n) VALUES (?, ?, ?, ?, ?, 1)",
                (k, t, t, self._seq, dumps(acc)),
            )
            self._seq += 1
            self._opened(k, t + gap)

    # -- firing -----------------------------------------------------------------------------

    def fire(self, limit: int | None = None) -> list[WindowResult]:
        wm = self._watermark
        if wm is None or self._min_end is None or self._min_end > wm:
            return []
        if limit is not None and limit < 1:
            return []
        with storage_errors(self._file.where("firing windows")):
            if self._kind == _SESSION:
                return self._fire_disk_sessions(wm, limit)
            return self._fire_disk_windows(wm, limit)

    def _take_due(
        self, table: str, order: str, due: str, bound: tuple[int, ...], limit: int | None
    ) -> list[Any]:
        """The due rows of ``table`` (``due``: the condition, on ``bound``) in firing
        ``order``, at most ``limit``, deleted with the key counts they held. The counts are
        changed by two statements over every key at once: a statement per key took 1.1 of
        the 3.0 s that firing 259,000 windows took."""
        conn = self._file.conn
        columns = (
            "k, first, last, acc, n, seq" if table == "sessions" else "k, start, end, acc, n, seq"
        )
        sql = f"SELECT {columns} FROM {table} WHERE {due} ORDER BY {order}"
        rows = conn.execute(
            sql + (" LIMIT ?" if limit is not None else ""),
            (*bound, limit) if limit is not None else bound,
        ).fetchall()
        if not rows:
            return rows
        if limit is not None and len(rows) == limit:
            # Exactly the rows read: those up to the last one's place in the order.
            last = rows[-1]
            if table == "sessions":
                due, bound = "(last, first, seq) <= (?, ?, ?)", (last[2], last[1], last[5])
            else:
                due, bound = "(end, seq) <= (?, ?)", (last[2], last[5])
        conn.execute(
            f"UPDATE window_keys SET n = n - (SELECT COUNT(*) FROM {table} "
            f"WHERE {table}.k = window_keys.k AND {due}) "
            f"WHERE k IN (SELECT k FROM {table} WHERE {due})",
            bound + bound,
        )
        self._keys_open -= conn.execute("DELETE FROM window_keys WHERE n <= 0").rowcount
        conn.execute(f"DELETE FROM {table} WHERE {due}", bound)
        self._windows_open -= len(rows)
        return rows

    def _fire_disk_windows(self, wm: int, limit: int | None) -> list[WindowResult]:
        rows = self._take_due("windows", "end, seq", "end <= ?", (wm,), limit)
        self._min_end = self._file.conn.execute("SELECT MIN(end) FROM windows").fetchone()[0]
        result = self._result
        size = self._size
        fired = []
        bounds: tuple[int, Any, Any] | None = None
        for k, _start, end, acc_bytes, n, _seq in rows:
            if bounds is None or bounds[0] != end:  # rows come by end: one pair per end
                bounds = (end, from_micros(end - size), from_micros(end))
            acc = loads(acc_bytes)
            value = acc if result is None else result(acc)
            fired.append(WindowResult(loads(k), bounds[1], bounds[2], value, n))
        return fired

    def _fire_disk_sessions(self, wm: int, limit: int | None) -> list[WindowResult]:
        gap = self._gap
        rows = self._take_due("sessions", "last, first, seq", "last <= ?", (wm - gap,), limit)
        low = self._file.conn.execute("SELECT MIN(last) FROM sessions").fetchone()[0]
        self._min_end = None if low is None else low + gap
        result = self._result
        fired = []
        for k, first, last, acc_bytes, n, _seq in rows:
            acc = loads(acc_bytes)
            value = acc if result is None else result(acc)
            fired.append(
                WindowResult(loads(k), from_micros(first), from_micros(last + gap), value, n)
            )
        return fired

    def flush_all(self) -> list[WindowResult]:
        with storage_errors(self._file.where("finding the last window")):
            if self._kind == _SESSION:
                last = self._file.conn.execute("SELECT MAX(last) FROM sessions").fetchone()[0]
                end = None if last is None else last + self._gap
            else:
                end = self._file.conn.execute("SELECT MAX(end) FROM windows").fetchone()[0]
        if end is not None:
            self.advance_to(end)
        return self.fire()

    # -- the file and snapshots -------------------------------------------------------------

    def checkpoint(self) -> None:
        """Write the scalars into the file and commit it: a copy of the file is now the
        whole state (:meth:`reopen` reads it back)."""
        self._file.set_meta(
            META,
            {
                **self._scalars(),
                "windows_open": self._windows_open,
                "keys_open": self._keys_open,
                "min_end": self._min_end,
            },
        )
        self._file.commit()

    def commit(self) -> None:
        """End the file's transaction (the stage does after every batch, so a long one does
        not pile up in SQLite's cache)."""
        self._file.commit()

    @classmethod
    def reopen(
        cls,
        assigner: WindowAssigner,
        aggregate: Aggregate[Any, Any, Any],
        lateness: Duration,
        file: StateFile,
    ) -> DiskWindowOperator:
        """The operator whose :meth:`checkpoint` ``file`` holds (:meth:`load_checkpoint`)."""
        op = cls(assigner, aggregate, lateness, file=file)
        op.load_checkpoint()
        return op

    def load_checkpoint(self) -> None:
        """Take the scalars of the file's last :meth:`checkpoint` (a file a snapshot
        restored); :class:`WindowError` if it was made with another assigner or lateness, or
        holds no window operator."""
        meta = self._file.get_meta(META)
        if not isinstance(meta, dict):
            raise WindowError(f"{self._file.path} holds no window operator")
        self._take_scalars(meta)
        self._windows_open = meta["windows_open"]
        self._keys_open = meta["keys_open"]
        self._min_end = meta["min_end"]

    @classmethod
    def restore_into(
        cls,
        assigner: WindowAssigner,
        aggregate: Aggregate[Any, Any, Any],
        lateness: Duration,
        data: object,
        file: StateFile,
    ) -> DiskWindowOperator:
        """The operator in the state a plain snapshot (:meth:`WindowOperator.snapshot`, of
        either kind of operator) gives, its windows written into ``file``: how an operator
        moves from memory to disk."""
        plain = WindowOperator.restore(assigner, aggregate, lateness, data)
        op = cls(assigner, aggregate, lateness, file=file)
        op._take_scalars(plain._scalars())
        # The creation numbers are kept as they are: unique within one snapshot, and what
        # orders windows (sessions, whose ends move) that come to end together later.
        windows = data["windows"]  # type: ignore[index]
        with storage_errors(file.where("writing a restored snapshot")):
            conn = file.conn
            for key, start, end, acc, n, seq in windows:
                k = dumps(key)
                if op._kind == _SESSION:
                    conn.execute(
                        "INSERT INTO sessions(k, first, last, seq, acc, n) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        (k, start, end - op._gap, seq, dumps(acc), n),
                    )
                else:
                    conn.execute(
                        "INSERT INTO windows(k, start, end, seq, acc, n) VALUES (?, ?, ?, ?, ?, ?)",
                        (k, start, end, seq, dumps(acc), n),
                    )
                op._opened(k, end)
            op._seq = max([plain._seq, *(w[5] + 1 for w in windows)])
            op.checkpoint()
        return op

    def snapshot(self) -> dict[str, Any]:
        """The whole state in :meth:`WindowOperator.snapshot`'s plain form (every window read
        into memory: for moving an operator back to memory, ``headrace state show`` and
        tests, not for the stage's snapshots, which copy the file)."""
        with storage_errors(self._file.where("reading every window")):
            conn = self._file.conn
            if self._kind == _SESSION:
                gap = self._gap
                rows = conn.execute(
                    "SELECT k, first, last, acc, n, seq FROM sessions ORDER BY last, first, seq"
                ).fetchall()
                windows = [
                    (loads(k), f, last + gap, loads(a), n, s) for k, f, last, a, n, s in rows
                ]
            else:
                rows = conn.execute(
                    "SELECT k, start, end, acc, n, seq FROM windows ORDER BY end, seq"
                ).fetchall()
                windows = [(loads(k), st, e, loads(a), n, s) for k, st, e, a, n, s in rows]
        return {**self._scalars(), "windows": windows}
