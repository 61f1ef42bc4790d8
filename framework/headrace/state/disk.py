"""The local file of an operator whose state is kept on disk (``backend="disk"``).

An operator's state in memory grows with its keys and open windows until the process is
killed for it. Waiting does not shrink it: which windows are open at once is decided by the
data and the lateness, not by how fast records are read, so backpressure cannot bound it. What
can is keeping the state where there is room: a SQLite file on the local disk, whose pages
SQLite caches in a bounded amount of memory (:data:`DEFAULT_CACHE_BYTES`).

The file is a working copy, not the durable state: durability is the snapshot in KV, as for
an operator in memory. So the file is written without a journal and without syncs (a crash
loses it, and the operator starts from its last snapshot into a fresh file), and it is removed
when the operator stops. A snapshot is a consistent copy of the file made with SQLite's backup
API at the moment of the capture (:meth:`StateFile.backup`), which the stage then streams to
KV in chunks while the operator goes on (``headrace.pipeline.stateful``); a restore writes the
snapshot back into a file and opens it.

This module holds the file and its plumbing; what it holds is the operators' business
(``headrace.state.disk_windows``, ``headrace.state.disk_keyed``). Every SQLite error is turned
into :class:`~headrace.state.errors.StateStorageError` (a full disk, a directory that is not
writable), which stops the pipeline without acking anything the snapshots do not hold.

Keys are stored as their pickle: two keys are the same key when they pickle to the same bytes.
For the keys a pipeline uses (strings, numbers, bytes, tuples of them) that is equality,
except that ``1`` and ``1.0`` (and ``True``) are different keys on disk.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import sqlite3
import tempfile
import uuid
import zlib
from collections.abc import Iterable, Iterator
from typing import Any, Final

from headrace.state.errors import StateStorageError

#: What SQLite may keep of the file in memory (bytes): the bound on a disk operator's state in
#: memory, beside the records it holds and the results it has not sent.
DEFAULT_CACHE_BYTES: Final = 64 * 1024 * 1024
#: The first bytes of every SQLite file: how a snapshot of a disk operator is told from one of
#: an operator in memory (a zlib stream of a pickle).
MAGIC: Final = b"SQLite format 3\x00"

#: The blocks (bytes) a snapshot is decompressed into a file in.
BLOCK: Final = 1024 * 1024

#: ``pickle.dumps`` at the protocol the state files use (fixed: the same key must give the
#: same bytes in every process that opens the file).
PROTOCOL: Final = 5


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=PROTOCOL)


loads = pickle.loads


@contextlib.contextmanager
def storage_errors(what: str) -> Iterator[None]:
    """SQLite's errors as :class:`StateStorageError`, saying which file and what was being
    done (a full disk reads ``database or disk is full``)."""
    try:
        yield
    except sqlite3.Error as exc:
        raise StateStorageError(f"{what}: {type(exc).__name__}: {exc}") from exc


class StateFile:
    """One SQLite file of one operator (see the module docs). ``path`` None makes a new file
    in ``directory`` (the system's temporary directory by default); the file is removed by
    :meth:`close` unless ``keep``."""

    __slots__ = ("conn", "keep", "path")

    def __init__(
        self,
        path: str | None = None,
        *,
        directory: str | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        keep: bool = False,
    ) -> None:
        if cache_bytes < 1024 * 1024:
            raise ValueError(f"cache_bytes must be at least 1 MiB, not {cache_bytes!r}")
        if path is None:
            path = new_path(directory)
        self.path = path
        self.keep = keep
        with storage_errors(f"opening the state file {path}"):
            conn = sqlite3.connect(path, isolation_level="DEFERRED")
            # A working copy (module docs): no journal, no syncs, one process.
            conn.execute("PRAGMA journal_mode=OFF")
            conn.execute("PRAGMA synchronous=OFF")
            conn.execute("PRAGMA locking_mode=EXCLUSIVE")
            conn.execute("PRAGMA temp_store=FILE")
            conn.execute(f"PRAGMA cache_size=-{cache_bytes // 1024}")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value BLOB NOT NULL)"
            )
            conn.commit()
        self.conn = conn

    def __repr__(self) -> str:
        return f"<StateFile {self.path}>"

    def where(self, doing: str) -> str:
        return f"{doing} in the state file {self.path}"

    def create(self, schema: Iterable[str], what: str) -> None:
        """Run the ``CREATE ... IF NOT EXISTS`` statements of an operator's tables."""
        with storage_errors(self.where(f"creating {what}")):
            for statement in schema:
                self.conn.execute(statement)
            self.conn.commit()

    def commit(self) -> None:
        with storage_errors(self.where("committing")):
            self.conn.commit()

    def set_meta(self, name: str, value: Any) -> None:
        with storage_errors(self.where(f"writing {name!r}")):
            self.conn.execute(
                "INSERT INTO meta(name, value) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                (name, dumps(value)),
            )

    def get_meta(self, name: str) -> Any:
        """The value stored under ``name`` (None if none)."""
        with storage_errors(self.where(f"reading {name!r}")):
            row = self.conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return None if row is None else loads(row[0])

    def backup(self, path: str) -> None:
        """A consistent copy of the file as it is now (committed first) at ``path``: what a
        snapshot saves. The copy is a page-by-page one (SQLite's backup API), not a dump."""
        with storage_errors(self.where(f"copying it to {path}")):
            self.conn.commit()
            target = sqlite3.connect(path)
            try:
                self.conn.backup(target)
            finally:
                target.close()

    def size(self) -> int:
        """The file's size in bytes (0 if it went)."""
        try:
            return os.path.getsize(self.path)
        except OSError:
            return 0

    def close(self) -> None:
        """Close the file, and remove it unless it is kept."""
        with contextlib.suppress(sqlite3.Error):
            self.conn.close()
        if not self.keep:
            with contextlib.suppress(OSError):
                os.remove(self.path)


#: The name of every state file (and of its snapshot copies, which add a suffix): the pid
#: of the process that made it, so that a later process can tell a dead one's files.
PREFIX: Final = "headrace-state-"
_NAME = re.compile(r"^headrace-state-(\d+)-[0-9a-f]{32}\.db")
#: The directories swept in this process (once each).
_swept: set[str] = set()


def new_path(directory: str | None) -> str:
    """A new file name for a state file in ``directory`` (the temporary directory if None);
    the first in a directory sweeps it (:func:`sweep_stale`)."""
    folder = directory or tempfile.gettempdir()
    if folder not in _swept:
        _swept.add(folder)
        sweep_stale(folder)
    return os.path.join(folder, f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex}.db")


def sweep_stale(directory: str) -> list[str]:
    """Remove the state files (and snapshot copies) in ``directory`` whose process is gone: a
    worker killed with SIGKILL never closed its file, and nothing else would remove it. A
    file whose pid is alive is left, even if that pid now names another process (a leak in
    that rare case, never the removal of a live operator's file). The files removed."""
    gone: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return gone
    for name in names:
        match = _NAME.match(name)
        if match is None or _alive(int(match.group(1))):
            continue
        with contextlib.suppress(OSError):
            os.remove(os.path.join(directory, name))
            gone.append(name)
    return gone


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True


def is_file_snapshot(payload: bytes) -> bool:
    """Whether a snapshot's bytes are a state file (zlib-compressed) rather than a pickle."""
    try:
        return zlib.decompressobj().decompress(payload, len(MAGIC)) == MAGIC
    except zlib.error:
        return False


class Unpacker:
    """Writes a file snapshot into a new state file as its parts come (:meth:`feed`), a
    block at a time, and opens it (:meth:`finish`): a snapshot larger than memory is never
    held whole. :meth:`abandon` removes a file left unfinished."""

    __slots__ = ("_out", "_stream", "cache_bytes", "path")

    def __init__(
        self, *, directory: str | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES
    ) -> None:
        self.path = new_path(directory)
        self.cache_bytes = cache_bytes
        self._stream = zlib.decompressobj()
        try:
            self._out = open(self.path, "wb")  # noqa: SIM115 (closed by finish or abandon)
        except OSError as exc:
            raise StateStorageError(f"creating {self.path}: {exc}") from exc

    def feed(self, part: bytes) -> None:
        try:
            rest = part
            while rest:
                self._out.write(self._stream.decompress(rest, BLOCK))
                rest = self._stream.unconsumed_tail
        except OSError as exc:
            self.abandon()
            raise StateStorageError(f"writing a snapshot into {self.path}: {exc}") from exc

    def finish(self) -> StateFile:
        try:
            self._out.write(self._stream.flush())
            self._out.close()
        except OSError as exc:
            self.abandon()
            raise StateStorageError(f"writing a snapshot into {self.path}: {exc}") from exc
        return StateFile(self.path, cache_bytes=self.cache_bytes)

    def abandon(self) -> None:
        with contextlib.suppress(OSError):
            self._out.close()
        with contextlib.suppress(OSError):
            os.remove(self.path)


def unpack(
    payload: bytes, *, directory: str | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES
) -> StateFile:
    """The state file a whole snapshot holds (:class:`Unpacker` of one part)."""
    unpacker = Unpacker(directory=directory, cache_bytes=cache_bytes)
    unpacker.feed(payload)
    return unpacker.finish()
