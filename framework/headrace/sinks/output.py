"""What sinks that write files share: sets of committed sequence numbers (:class:`SeqSet`,
re-exported from :mod:`headrace.commits.seqset`), a lock on an output directory, and fsync of a
directory.

A sink that owns a directory alone must be the only writer there, in any process:
:class:`DirectoryLock` is an ``flock`` that goes away with its descriptor, so with the process
that held it, even after ``SIGKILL``. Sinks whose workers share an output through the commit
protocol (headrace.commits) take it *shared*: any number of them at once, never together with
an exclusive holder (a single-process sink or a compaction of its own) on the same host.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

from headrace.commits.seqset import SeqSet
from headrace.sinks.errors import OutputInUse

if sys.platform != "win32":
    import fcntl


__all__ = ["DirectoryLock", "SeqSet", "fsync_directory", "fsync_file", "fsync_tree"]


class DirectoryLock:
    """An ``flock`` on ``directory / name``, held until :meth:`release` (or the end of the
    process): exclusive, or with ``shared=True`` shared with other shared holders. ``owner``
    names the kind of sink in the :class:`OutputInUse` message."""

    def __init__(self, directory: Path, name: str, owner: str, *, shared: bool = False) -> None:
        self.path = directory / name
        self.owner = owner
        self.shared = shared
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
            fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            how = (
                "held exclusively by a sink of another mode (a single-process sink, or a "
                "compaction)"
                if self.shared
                else f"in use by another {self.owner}"
            )
            raise OutputInUse(f"{self.path.parent} is {how} (lock {self.path.name})") from None
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


def fsync_file(path: Path) -> None:
    """Make a file's content durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path, directories: Iterable[Path]) -> None:
    """fsync ``directories`` and their parents up to ``root``: a directory made for new files
    must be made durable in its parent too. A directory gone meanwhile is skipped."""
    todo: set[Path] = set()
    for directory in directories:
        while True:
            todo.add(directory)
            if directory == root or root not in directory.parents:
                break
            directory = directory.parent
    for directory in todo:
        try:
            fsync_directory(directory)
        except FileNotFoundError:
            pass
