"""The commit ledger of an output directory: which data files are committed, and which (stream,
stream_seq) they hold.

The ledger is the commit point of a batch: a batch is committed when its entry is in place,
whatever data files exist. It lives in ``<output>/_headrace/ledger/``, a directory Spark does not
read (names starting with ``_`` are hidden from it). Each change is one small JSON file, written
to a temporary name, fsynced and renamed, so it is there whole or not at all:

- ``commit``: the data files a batch added (their final names, relative to the output) and the
  sequences they hold, per stream, as intervals;
- ``compact``: data files that replace others (the same rows in fewer files).

Entries are numbered; applied in order they give the state. Folding writes that state to
``snapshot.json`` (also atomically) and removes the entries it covers, so opening stays cheap
however many batches were written. A crash between the two leaves entries the snapshot already
holds; they are recognised by their number and removed on the next load.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from headrace.sinks import SeqSet, fsync_directory

from headrace_spark.errors import LedgerError

SNAPSHOT = "snapshot.json"
_TEMP_PREFIX = ".tmp-"
#: Fold when this many entries have accumulated.
FOLD_AFTER = 500


class CommitLedger:
    """The state of one output directory's commits (see the module docs)."""

    def __init__(self, directory: Path, *, fsync: bool = True) -> None:
        self.directory = directory
        self.fsync = fsync
        #: Committed sequences per stream.
        self.committed: dict[str, SeqSet] = {}
        #: Committed data files, relative to the output directory (POSIX separators).
        self.files: set[str] = set()
        self._next = 1
        self._through = 0  # entries up to this number are in the snapshot
        self._entries: list[Path] = []

    # -- reading ----------------------------------------------------------------------------

    def load(self) -> None:
        """Read the snapshot and the entries after it; remove leftovers of a crash."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.committed = {}
        self.files = set()
        self._through = 0
        snapshot = self.directory / SNAPSHOT
        if snapshot.exists():
            state = self._read(snapshot)
            self._through = _int(state, "through", snapshot)
            for name in _list(state, "files", snapshot):
                self.files.add(str(name))
            self._add_seqs(state.get("seqs", {}), snapshot)
        numbered: list[tuple[int, Path]] = []
        for entry in self.directory.iterdir():
            if entry.name.startswith(_TEMP_PREFIX):
                entry.unlink()  # never renamed into place: not a change
            elif entry.name != SNAPSHOT and entry.suffix == ".json":
                try:
                    numbered.append((int(entry.stem), entry))
                except ValueError:
                    raise LedgerError(f"{entry}: not a ledger entry") from None
        numbered.sort()
        self._entries = []
        for number, entry in numbered:
            if number <= self._through:
                entry.unlink()  # folded into the snapshot before a crash
                continue
            self._apply(self._read(entry), entry)
            self._entries.append(entry)
        last = numbered[-1][0] if numbered else 0
        self._next = max(last, self._through) + 1

    def is_committed(self, stream: str, seq: int) -> bool:
        seqs = self.committed.get(stream)
        return seqs is not None and seq in seqs

    @property
    def entries(self) -> int:
        """Entries not folded into the snapshot yet."""
        return len(self._entries)

    # -- changes ----------------------------------------------------------------------------

    def record_commit(
        self, batch: str, files: Iterable[str], seqs: Mapping[str, SeqSet], rows: int
    ) -> None:
        """Commit a batch: from here on its files and sequences are committed."""
        entry = {
            "op": "commit",
            "batch": batch,
            "files": sorted(files),
            "seqs": {stream: s.intervals for stream, s in sorted(seqs.items())},
            "rows": rows,
            "at": _now(),
        }
        self._append(entry)

    def record_compaction(self, added: Iterable[str], removed: Iterable[str]) -> None:
        """Replace the ``removed`` files by the ``added`` ones (the same rows)."""
        entry = {"op": "compact", "add": sorted(added), "remove": sorted(removed), "at": _now()}
        self._append(entry)

    def fold(self) -> None:
        """Write the state to the snapshot and remove the entries it covers."""
        if not self._entries:
            return
        through = self._next - 1
        state = {
            "version": 1,
            "through": through,
            "files": sorted(self.files),
            "seqs": {stream: s.intervals for stream, s in sorted(self.committed.items())},
            "at": _now(),
        }
        self._write(self.directory / SNAPSHOT, state)
        self._through = through
        for entry in self._entries:
            entry.unlink(missing_ok=True)
        self._entries = []

    # -- the parts ----------------------------------------------------------------------------

    def _append(self, entry: dict[str, Any]) -> None:
        path = self.directory / f"{self._next:012d}.json"
        self._write(path, entry)
        self._next += 1
        self._apply(entry, path)
        self._entries.append(path)

    def _write(self, path: Path, content: dict[str, Any]) -> None:
        temp = self.directory / f"{_TEMP_PREFIX}{secrets.token_hex(4)}"
        data = json.dumps(content, separators=(",", ":")).encode()
        with open(temp, "wb") as f:
            f.write(data)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(temp, path)
        if self.fsync:
            fsync_directory(self.directory)

    def _apply(self, entry: dict[str, Any], path: Path) -> None:
        op = entry.get("op")
        if op == "commit":
            self.files.update(str(f) for f in _list(entry, "files", path))
            self._add_seqs(entry.get("seqs", {}), path)
        elif op == "compact":
            self.files.update(str(f) for f in _list(entry, "add", path))
            self.files.difference_update(str(f) for f in _list(entry, "remove", path))
        else:
            raise LedgerError(f"{path}: unknown operation {op!r}")

    def _add_seqs(self, seqs: Any, path: Path) -> None:
        if not isinstance(seqs, dict):
            raise LedgerError(f"{path}: 'seqs' is not an object")
        for stream, intervals in seqs.items():
            target = self.committed.setdefault(stream, SeqSet())
            try:
                for first, last in intervals:
                    target.add_range(int(first), int(last))
            except (TypeError, ValueError) as exc:
                raise LedgerError(f"{path}: bad intervals for stream {stream!r}: {exc}") from None

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        try:
            content = json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:
            raise LedgerError(f"{path}: cannot be read: {exc}") from exc
        if not isinstance(content, dict):
            raise LedgerError(f"{path}: not a JSON object")
        return content


def _int(state: dict[str, Any], key: str, path: Path) -> int:
    value = state.get(key)
    if not isinstance(value, int):
        raise LedgerError(f"{path}: {key!r} is not a number")
    return value


def _list(state: dict[str, Any], key: str, path: Path) -> list[Any]:
    value = state.get(key, [])
    if not isinstance(value, list):
        raise LedgerError(f"{path}: {key!r} is not a list")
    return value


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
