"""Keyed state kept on disk: :class:`DiskKeyedOperator`, the keyed operator of
``backend="disk"``.

:class:`~headrace.state.keyed.KeyedOperator`'s rules (``fn(state, value) -> (state, output)``,
a time to live on the wall clock, ``max_keys``), with each key's state a row of a
:class:`~headrace.state.disk.StateFile`: its pickled state, when it was last changed, and a
touch number that orders the keys as the memory operator's ``OrderedDict`` does, so that
expiring is the same walk from the oldest touch that stops at the first key still alive.
"""

from __future__ import annotations

from typing import Any, Final

from headrace.state.disk import StateFile, dumps, loads, storage_errors
from headrace.state.errors import StateLimitExceeded
from headrace.state.keyed import KeyedOperator, StatefulFn

#: The meta row a disk keyed operator's counters are kept under.
META: Final = "keyed"

_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS keyed(k BLOB PRIMARY KEY, state BLOB NOT NULL, "
    "touched REAL NOT NULL, tick INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE UNIQUE INDEX IF NOT EXISTS keyed_by_tick ON keyed(tick)",
)


class DiskKeyedOperator(KeyedOperator):
    """A :class:`KeyedOperator` whose states are rows of ``file`` (see the module docs)."""

    __slots__ = ("_count", "_file", "_tick")

    def __init__(
        self,
        fn: StatefulFn,
        *,
        file: StateFile,
        ttl: float | None = None,
        max_keys: int | None = None,
        name: str = "stateful_map",
    ) -> None:
        super().__init__(fn, ttl=ttl, max_keys=max_keys, name=name)
        self._file = file
        self._count = 0
        #: The next touch number (a key's row is renumbered each time it changes).
        self._tick = 0
        file.create(_SCHEMA, "the keyed table")

    @property
    def file(self) -> StateFile:
        return self._file

    @property
    def keys(self) -> int:
        return self._count

    def get(self, key: Any) -> Any:
        with storage_errors(self._file.where("reading a key")):
            row = self._file.conn.execute(
                "SELECT state FROM keyed WHERE k = ?", (dumps(key),)
            ).fetchone()
        return None if row is None else loads(row[0])

    def apply(self, key: Any, value: Any, now: float) -> Any:
        k = dumps(key)
        conn = self._file.conn
        with storage_errors(self._file.where("reading a key")):
            row = conn.execute("SELECT state, touched FROM keyed WHERE k = ?", (k,)).fetchone()
        old = None
        if row is not None:
            old = loads(row[0])
            if self.ttl is not None and now - row[1] >= self.ttl:
                old = None  # stale: the record starts the key afresh
        new, output = self.fn(old, value)
        with storage_errors(self._file.where("writing a key")):
            if new is None:
                if row is not None:
                    conn.execute("DELETE FROM keyed WHERE k = ?", (k,))
                    self._count -= 1
                return output
            if row is None:
                if self.max_keys is not None and self._count >= self.max_keys:
                    raise StateLimitExceeded(
                        f"{self.name!r} holds state for {self._count} keys, its max_keys; a "
                        f"new key {key!r} came"
                    )
                conn.execute(
                    "INSERT INTO keyed(k, state, touched, tick) VALUES (?, ?, ?, ?)",
                    (k, dumps(new), now, self._tick),
                )
                self._count += 1
            else:
                conn.execute(
                    "UPDATE keyed SET state = ?, touched = ?, tick = ? WHERE k = ?",
                    (dumps(new), now, self._tick, k),
                )
        self._tick += 1
        return output

    def expire(self, now: float) -> int:
        if self.ttl is None:
            return 0
        cutoff = now - self.ttl
        conn = self._file.conn
        with storage_errors(self._file.where("expiring keys")):
            stop = None
            walk = conn.execute("SELECT tick, touched FROM keyed ORDER BY tick")
            try:
                for tick, touched in walk:
                    if touched > cutoff:
                        stop = tick
                        break
            finally:
                walk.close()  # before the delete: no read open on the table it changes
            if stop is None:
                gone = conn.execute("DELETE FROM keyed").rowcount
            else:
                gone = conn.execute("DELETE FROM keyed WHERE tick < ?", (stop,)).rowcount
        self._count -= gone
        self.expired += gone
        return gone

    def commit(self) -> None:
        self._file.commit()

    def checkpoint(self) -> None:
        """Write the counters into the file and commit it (a copy is then the whole state)."""
        self._file.set_meta(META, {"count": self._count, "tick": self._tick})
        self._file.commit()

    def reopen(self) -> None:
        """Take the counters of the file's last :meth:`checkpoint` (the file a snapshot
        restored)."""
        meta = self._file.get_meta(META)
        if not isinstance(meta, dict):
            raise ValueError(f"{self._file.path} holds no keyed operator")
        self._count = meta["count"]
        self._tick = meta["tick"]

    def snapshot(self) -> object:
        """The memory operator's plain form (every key read into memory: for moving the
        operator to memory, ``headrace state show`` and tests)."""
        with storage_errors(self._file.where("reading every key")):
            rows = self._file.conn.execute(
                "SELECT k, state, touched FROM keyed ORDER BY tick"
            ).fetchall()
        return [(loads(k), loads(state), touched) for k, state, touched in rows]

    def restore(self, data: object) -> None:
        """Take a plain snapshot (of either kind of operator), replacing this one's state."""
        with storage_errors(self._file.where("writing a restored snapshot")):
            conn = self._file.conn
            conn.execute("DELETE FROM keyed")
            tick = 0
            for key, state, when in data:  # type: ignore[attr-defined]
                conn.execute(
                    "INSERT INTO keyed(k, state, touched, tick) VALUES (?, ?, ?, ?)",
                    (dumps(key), dumps(state), when, tick),
                )
                tick += 1
        self._count = tick
        self._tick = tick
        self.checkpoint()
