"""The output directory of a Spark sink: where Spark stages a batch, how its files are put in
place, and how a crash is recovered.

Layout (``<output>`` is the parquet path or the table's location)::

    <output>/_headrace/lock             one sink at a time (flock)
    <output>/_headrace/ledger/          the commit ledger (ledger.py)
    <output>/_headrace/staging/<token>/ Spark's output for one attempt at a batch
    <output>/day=2026-11-25/part-<token>-00000.snappy.parquet   committed data

``<token>`` is ``<batch id>.<nonce>``: the batch id comes from the batch's sequence ranges, the
nonce is new for every attempt, so two attempts at the same batch never share a file name.

Placing a batch, in order:

1. each staged file moves next to its final place under a hidden name (``.part-...pending``;
   Spark skips names starting with ``.``), fsynced with its directory;
2. the ledger records the commit (the commit point);
3. the hidden files are renamed to their final names.

So a reader never sees a file of an uncommitted attempt. After a crash, :func:`recover` rolls
forward what the ledger committed (hidden files renamed) and removes the rest (hidden files no
entry names, and staging directories).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import attrs
from headrace.sinks import CONTROL, MANIFEST, DirectoryLock, OutputInUse, fsync_file, fsync_tree

from headrace_spark.ledger import CommitLedger

#: The lock file under the control directory: one sink (or compaction) per output.
LOCK_NAME = "lock"
_SAFE_ID = re.compile(r"^[A-Za-z0-9_+-]{1,100}$")
_OURS = re.compile(r"^part-(?P<token>[A-Za-z0-9_+-]+\.[0-9a-f]{8})-(?P<n>\d{5})(?P<ext>\..+)?$")
PENDING = ".pending"
#: The data files of a shared output: ``part-<token>-00000.snappy.parquet``, the token an
#: attempt's (headrace.commits.identity: a batch id, then 19 hex digits).
DATA_FILE = re.compile(r"^part-[A-Za-z0-9_+-]+\.[0-9a-f]{19}-\d{5}(\..+)?$")


def batch_id(key: str) -> str:
    """A file-name-safe id for a batch key: the key itself when it is short and plain (so file
    names say which sequences they hold), else a hash of it."""
    if _SAFE_ID.match(key):
        return key
    return "h" + hashlib.sha256(key.encode()).hexdigest()[:32]


def new_token(batch: str) -> str:
    return f"{batch_id(batch)}.{secrets.token_hex(4)}"


def name_staged(staging: Path, token: str) -> list[str]:
    """Give the data files Spark (or Arrow) wrote under ``staging`` the names they will have in
    the output (``part-<token>-00000.snappy.parquet``, in the same partition directories) and
    delete the rest (``_SUCCESS``, ``.crc`` checksums): the staged attempt of a shared output
    (headrace.sinks.SharedOutput) then holds exactly the files to publish. Their final paths,
    relative to the output."""
    named: list[str] = []
    for n, (staged_dir, source) in enumerate(sorted(OutputDir._staged_files(staging))):
        name = f"part-{token}-{n:05d}{_extension(source.name)}"
        os.rename(source, source.with_name(name))
        named.append(f"{staged_dir}/{name}" if staged_dir else name)
    for directory, _dirs, names in os.walk(staging):
        for name in names:
            if name.startswith(("_", ".")):
                os.unlink(os.path.join(directory, name))
    return named


def hidden(relative: str) -> str:
    """The pending (hidden) name of a committed file's final name."""
    head, _, name = relative.rpartition("/")
    pending = f".{name}{PENDING}"
    return f"{head}/{pending}" if head else pending


class OutputDir:
    """Files of one output directory (see the module docs)."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = root
        self.fsync = fsync
        self.control = root / CONTROL
        self.ledger_dir = self.control / "ledger"
        self.staging_root = self.control / "staging"

    def prepare(self) -> None:
        self.staging_root.mkdir(parents=True, exist_ok=True)
        self.ledger_dir.mkdir(parents=True, exist_ok=True)

    def staging(self, token: str) -> Path:
        return self.staging_root / token

    def clear_staging(self) -> None:
        if self.staging_root.exists():
            for entry in self.staging_root.iterdir():
                shutil.rmtree(entry, ignore_errors=True)

    # -- placing a batch ----------------------------------------------------------------------

    def stage_into_place(self, staging: Path, token: str, under: str = "") -> list[str]:
        """Move the data files Spark wrote under ``staging`` next to their final places (below
        the directory ``under``, relative to the output), hidden; return their final names
        relative to the output."""
        placed: list[str] = []
        directories: set[Path] = set()
        for n, (staged_dir, source) in enumerate(sorted(self._staged_files(staging))):
            relative_dir = "/".join(p for p in (under, staged_dir) if p)
            ext = _extension(source.name)
            name = f"part-{token}-{n:05d}{ext}"
            final = f"{relative_dir}/{name}" if relative_dir else name
            target = self.root / hidden(final)
            target.parent.mkdir(parents=True, exist_ok=True)
            if self.fsync:
                fsync_file(source)
            os.rename(source, target)
            directories.add(target.parent)
            placed.append(final)
        self._fsync_tree(directories)
        return placed

    def publish(self, files: list[str]) -> None:
        """Rename committed hidden files to their final names."""
        directories: set[Path] = set()
        for final in files:
            pending = self.root / hidden(final)
            os.rename(pending, self.root / final)
            directories.add(pending.parent)
        self._fsync_tree(directories)

    def remove(self, files: list[str]) -> None:
        directories: set[Path] = set()
        for relative in files:
            path = self.root / relative
            path.unlink(missing_ok=True)
            directories.add(path.parent)
        self._fsync_tree(directories)

    # -- recovery -----------------------------------------------------------------------------

    def recover(self, committed: set[str]) -> tuple[int, int, list[str]]:
        """After a crash: publish committed files still hidden, remove hidden or visible files of
        ours that no commit names, clear staging. Returns how many were rolled forward, how many
        removed, and the committed files that are gone (deleted by something else: a retention
        job, a user)."""
        rolled = removed = 0
        seen: set[str] = set()
        touched: set[Path] = set()
        for relative, is_pending in self.data_files(include_pending=True):
            path = self.root / (hidden(relative) if is_pending else relative)
            if relative in committed:
                seen.add(relative)
                if is_pending:
                    os.rename(path, self.root / relative)
                    touched.add(path.parent)
                    rolled += 1
            else:
                path.unlink()
                touched.add(path.parent)
                removed += 1
        self.clear_staging()
        self._fsync_tree(touched)
        return rolled, removed, sorted(committed - seen)

    def data_files(self, include_pending: bool = False) -> Iterator[tuple[str, bool]]:
        """Our data files, as (final name relative to the output, still hidden)."""
        for directory, dirs, names in os.walk(self.root):
            here = Path(directory)
            dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
            relative_dir = here.relative_to(self.root).as_posix()
            prefix = "" if relative_dir == "." else relative_dir + "/"
            for name in names:
                pending = name.startswith(".") and name.endswith(PENDING)
                if pending:
                    if not include_pending:
                        continue
                    name = name[1 : -len(PENDING)]
                if _OURS.match(name):
                    yield prefix + name, pending

    # -- the parts ----------------------------------------------------------------------------

    @staticmethod
    def _staged_files(staging: Path) -> Iterator[tuple[str, Path]]:
        for directory, dirs, names in os.walk(staging):
            here = Path(directory)
            dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
            relative_dir = here.relative_to(staging).as_posix()
            for name in names:
                if name.startswith(("_", ".")):
                    continue  # _SUCCESS, .crc checksums
                yield ("" if relative_dir == "." else relative_dir), here / name

    def _fsync_tree(self, directories: set[Path]) -> None:
        if self.fsync:
            fsync_tree(self.root, directories)


def _extension(name: str) -> str:
    """``.snappy.parquet`` of ``part-00000-<uuid>-c000.snappy.parquet``."""
    base = name.split("-c000", 1)[1] if "-c000" in name else ""
    if base.startswith("."):
        return base
    suffixes = Path(name).suffixes
    return "".join(suffixes[-2:]) if suffixes else ""


@attrs.frozen(slots=True)
class ClaimedOutput:
    """An output directory held by this process: its lock taken, its ledger loaded, a crashed
    attempt recovered (see :func:`claim_output`)."""

    out: OutputDir
    lock: DirectoryLock
    ledger: CommitLedger
    #: Committed files renamed visible, and files of uncommitted attempts removed.
    rolled: int
    removed: int
    #: Committed files that were gone (deleted outside the sink); the ledger forgets them.
    missing: list[str]


def claim_output(root: Path, *, fsync: bool = True) -> ClaimedOutput:
    """Take ``root`` for this process, in the order the commit protocol needs: lock first
    (:class:`~headrace.sinks.OutputInUse` if a sink holds it), then the ledger, then
    recovery, then the ledger told of committed files that are gone, so that nothing (a
    compaction, a table's registration) later reads a file that no longer exists. The lock
    is released if any step fails; otherwise the caller releases it."""
    out = OutputDir(root, fsync=fsync)
    out.prepare()
    lock = DirectoryLock(out.control, LOCK_NAME, "SparkSink")
    lock.acquire()
    try:
        if (out.control / MANIFEST).exists():
            # Before recovery, which would delete every file no local ledger entry names.
            raise OutputInUse(
                f"{root} is shared by the workers of a pipeline (it has {CONTROL}/{MANIFEST}): "
                "its commits are in JetStream, not in a local ledger. Write it from its "
                "pipeline (commits='shared'), not with commits='local'"
            )
        ledger = CommitLedger(out.ledger_dir, fsync=fsync)
        ledger.load()
        rolled, removed, missing = out.recover(ledger.files)
        if missing:
            ledger.record_compaction([], missing)
    except BaseException:
        lock.release()
        raise
    return ClaimedOutput(out, lock, ledger, rolled, removed, missing)
