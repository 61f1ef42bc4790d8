"""A file output written by several workers at once through the commit protocol.

Layout (``<output>`` is the output directory; ``_headrace`` its control directory, which readers
skip because of the leading ``_``)::

    <output>/_headrace/output.json          the manifest: the output's id, owner, commit bucket
    <output>/_headrace/lock                 flock: shared by these workers, exclusive otherwise
    <output>/_headrace/staging/<token>/...  one attempt's files, at their final relative paths
    <output>/day=2026-11-25/part-<token>-00000.snappy.parquet     published data

An attempt, in order (each worker, one batch at a time):

1. its files are written under ``staging/<token>/`` with the names and subdirectories they will
   have in the output, and fsynced;
2. the commit state records the attempt (coordinator.py): the commit point;
3. the files are renamed into place (``publish``) and the staging directory removed.

Readers never see a file of an attempt that did not commit, and nothing in the output is ever
overwritten: tokens are unique, so file names never clash across workers or hosts.

Recovery (``sweep``, at ``open`` and then every ``sweep_interval``), by any worker, for any
worker: an attempt the state records as committed but whose worker did not finish publishing
it (killed between 2 and 3) is published, then taken out of the state; staged attempts that did
not commit and started more than ``stale_after`` ago are fenced off by raising the state's
horizon (so they can never commit) and only then deleted. Nothing depends on the dead worker
coming back, nor on its host name.

The output's id lives in the manifest, not in its path: hosts may mount a shared file system at
different places. The manifest is written after the commit state exists (so a manifest always
has a state behind it) by a hard link, which fails if another worker wrote it first; the loser
takes the winner's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import secrets
import shutil
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import trio

from headrace.commits.coordinator import CommitCoordinator
from headrace.commits.errors import CorruptCommitState, OutputOwned
from headrace.commits.identity import Attempt, now_ms
from headrace.jetstream.context import JetStream
from headrace.sinks.errors import OutputInUse
from headrace.sinks.output import DirectoryLock, fsync_directory, fsync_file, fsync_tree

CONTROL = "_headrace"
MANIFEST = "output.json"
STAGING = "staging"
LOCK = "lock"
#: Attempts that did not commit are deleted once this much older than their start (seconds).
STALE_AFTER = 300.0
#: Another worker's committed attempt is rolled forward by a sweep once this old (seconds): by
#: then its worker has published it or is gone.
SETTLE_AFTER = 30.0
#: Seconds between two sweeps of a running worker.
SWEEP_INTERVAL = 60.0


@attrs.frozen(slots=True)
class Manifest:
    """What an output is: its id (the key of its commit state), who writes it, and where the
    commit state lives."""

    id: str
    owner: str
    bucket: str
    created: str

    def to_json(self) -> bytes:
        data = {"version": 1, **attrs.asdict(self)}
        return json.dumps(data, indent=1).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes, where: Path) -> Manifest:
        try:
            raw = json.loads(data)
            if raw.get("version") != 1:
                raise ValueError(f"unknown version {raw.get('version')!r}")
            return cls(
                id=str(raw["id"]),
                owner=str(raw["owner"]),
                bucket=str(raw["bucket"]),
                created=str(raw["created"]),
            )
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CorruptCommitState(f"{where}: not an output manifest ({exc!r})") from exc


@attrs.frozen(slots=True)
class SweepReport:
    """What a sweep of a shared output did (``headrace outputs sweep``, a sink's upkeep)."""

    #: Committed attempts of other workers published, attempts deleted as dead, and attempts
    #: taken out of the state.
    rolled: int = 0
    removed: int = 0
    forgotten: int = 0
    #: The files the published attempts put in place (relative to the output).
    files: tuple[str, ...] = ()


class SharedOutput:
    """The files of an output shared by workers (see the module docs). Blocking: call from a
    worker thread. ``kind`` names the sink in errors; ``exclusive_markers``: paths (relative to
    the output) whose presence (a file, or a directory that is not empty) means the output is
    written in a single-process mode, which this one refuses."""

    def __init__(
        self,
        root: Path,
        *,
        kind: str,
        fsync: bool = True,
        exclusive_markers: Iterable[str] = (),
    ) -> None:
        self.root = root
        self.kind = kind
        self.fsync = fsync
        self.control = root / CONTROL
        self.staging_root = self.control / STAGING
        self.exclusive_markers = tuple(exclusive_markers)
        self.lock = DirectoryLock(self.control, LOCK, kind, shared=True)

    def __repr__(self) -> str:
        return f"<SharedOutput {self.root}>"

    # -- claiming ---------------------------------------------------------------------------

    def prepare(self) -> Manifest | None:
        """Make the directories, take the shared lock, refuse an output of the single-process
        mode; the manifest if there is one."""
        self.staging_root.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        try:
            for marker in self.exclusive_markers:
                path = self.root / marker
                if path.exists() and (not path.is_dir() or any(path.iterdir())):
                    raise OutputInUse(
                        f"{self.root} was written by a single-process {self.kind} "
                        f"({marker} exists): it cannot be shared by workers. Keep "
                        "writing it with commits='local', or give the pipeline a new output"
                    )
            return self.read_manifest()
        except BaseException:
            self.lock.release()
            raise

    def read_manifest(self) -> Manifest | None:
        path = self.control / MANIFEST
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return Manifest.from_json(data, path)

    def new_manifest(self, owner: str, bucket: str) -> Manifest:
        created = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
        return Manifest(id=uuid.uuid4().hex, owner=owner, bucket=bucket, created=created)

    def write_manifest(self, manifest: Manifest) -> Manifest:
        """Write ``manifest`` unless another worker wrote one first; the one in place."""
        path = self.control / MANIFEST
        temp = self.control / f".{MANIFEST}.{secrets.token_hex(4)}"
        with open(temp, "wb") as f:
            f.write(manifest.to_json())
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        try:
            os.link(temp, path)
        except FileExistsError:
            pass
        finally:
            temp.unlink(missing_ok=True)
        if self.fsync:
            fsync_directory(self.control)
        found = self.read_manifest()
        assert found is not None
        return found

    def release(self) -> None:
        self.lock.release()

    # -- attempts ---------------------------------------------------------------------------

    def staging(self, attempt: Attempt) -> Path:
        return self.staging_root / attempt.token

    def staged(self) -> list[tuple[Attempt | None, Path]]:
        """The staged attempts (None for a directory that is not one of ours)."""
        if not self.staging_root.exists():
            return []
        return [(Attempt.parse(p.name), p) for p in sorted(self.staging_root.iterdir())]

    def staged_files(self, attempt: Attempt) -> list[str]:
        """The files of a staged attempt, relative to its directory (= to the output)."""
        return sorted(rel for rel, _ in _files(self.staging(attempt)))

    def sync_staged(self, attempt: Attempt) -> None:
        """Make a staged attempt's files durable before it commits."""
        if not self.fsync:
            return
        directories: set[Path] = set()
        for _, path in _files(self.staging(attempt)):
            fsync_file(path)
            directories.add(path.parent)
        for directory in directories:
            fsync_directory(directory)

    def publish(self, token: str, replaces: Iterable[str] = ()) -> list[str]:
        """Put a committed attempt's files in place and delete the files it ``replaces``.
        Idempotent, and safe to run in two workers at once: a file already moved is skipped."""
        staging = self.staging_root / token
        placed: list[str] = []
        touched: set[Path] = set()
        for relative, source in _files(staging):
            final = self.root / relative
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(source, final)
            except FileNotFoundError:
                if not final.exists():
                    raise
            placed.append(relative)
            touched.add(final.parent)
        for relative in replaces:
            path = self.root / relative
            path.unlink(missing_ok=True)
            touched.add(path.parent)
        self._fsync_tree(touched)
        shutil.rmtree(staging, ignore_errors=True)
        return placed

    def discard(self, attempt: Attempt | Path) -> None:
        """Delete an attempt's staged files (one that never committed), or a stray file."""
        path = attempt if isinstance(attempt, Path) else self.staging(attempt)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def data_files(self, pattern: Any) -> Iterator[str]:
        """Published files (relative to the output) whose name matches ``pattern``."""
        for directory, dirs, names in os.walk(self.root):
            dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
            relative = Path(directory).relative_to(self.root).as_posix()
            prefix = "" if relative == "." else relative + "/"
            for name in names:
                if pattern.match(name):
                    yield prefix + name

    def _fsync_tree(self, directories: set[Path]) -> None:
        if self.fsync:
            fsync_tree(self.root, directories)


def _files(top: Path) -> Iterator[tuple[str, Path]]:
    """Files under ``top`` (relative path, path), hidden and ``_`` names left out."""
    for directory, dirs, names in os.walk(top):
        here = Path(directory)
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        relative_dir = here.relative_to(top).as_posix()
        prefix = "" if relative_dir == "." else relative_dir + "/"
        for name in names:
            if not name.startswith(("_", ".")):
                yield prefix + name, here / name


# -- with the coordinator (async: files in worker threads, the state on the loop) ---------------


async def claim(
    output: SharedOutput,
    js: JetStream,
    *,
    owner: str,
    worker: str,
    bucket: str,
    replicas: int,
    limiter: trio.CapacityLimiter | None = None,
) -> CommitCoordinator:
    """Take ``output`` for this worker: the shared lock, the manifest (made with the commit
    state if the output is new), the coordinator. :class:`OutputOwned` for an output of
    another owner; the lock is released if anything fails."""
    manifest = await trio.to_thread.run_sync(output.prepare, limiter=limiter)
    try:
        if manifest is None:
            fresh = output.new_manifest(owner, bucket)
            coordinator = await CommitCoordinator.open(
                js,
                output=fresh.id,
                owner=owner,
                worker=worker,
                bucket=bucket,
                replicas=replicas,
                create=True,
            )
            manifest = await trio.to_thread.run_sync(output.write_manifest, fresh, limiter=limiter)
            if manifest.id == fresh.id:
                return coordinator
            # Another worker made the output first: its state is the one.
            with contextlib.suppress(Exception):
                await coordinator.kv.delete(fresh.id)
        if manifest.owner != owner:
            raise OutputOwned(
                f"{output.root} is the output of {manifest.owner!r}, not of {owner!r}: two "
                "pipelines (or two sinks) cannot share an output. Give this one its own output"
            )
        return await CommitCoordinator.open(
            js,
            output=manifest.id,
            owner=owner,
            worker=worker,
            bucket=manifest.bucket,
            replicas=replicas,
        )
    except BaseException:
        output.release()
        raise


async def sweep(
    output: SharedOutput,
    coordinator: CommitCoordinator,
    *,
    stale_after: float = STALE_AFTER,
    settle_after: float = SETTLE_AFTER,
    published: Iterable[str] = (),
    limiter: trio.CapacityLimiter | None = None,
) -> SweepReport:
    """Recover what dead or stalled workers left (see the module docs). ``published``: the
    attempts this worker published itself (not to be touched). Must not run while this worker
    commits or publishes (the caller serialises them)."""
    published = set(published)
    staged = await trio.to_thread.run_sync(output.staged, limiter=limiter)
    state = await coordinator.refresh()
    now = now_ms()
    rolled: list[str] = []
    placed: list[str] = []
    for token, unpublished in sorted(state.unpublished.items()):
        if token in published:
            continue  # published by this worker; its next commit takes it out
        if unpublished.worker != coordinator.worker and now - unpublished.at < settle_after * 1000:
            continue  # its worker is publishing it now
        # Another worker's, old enough that it finished or died; or this worker's own whose
        # commit was cut off (cancelled while the write was in flight) and never published.
        placed += await trio.to_thread.run_sync(
            output.publish, token, unpublished.replaces, limiter=limiter
        )
        rolled.append(token)
    if rolled:
        state = await coordinator.forget(rolled)
    cutoff = now - int(stale_after * 1000)
    dead = [
        (attempt, path)
        for attempt, path in staged
        if attempt is not None
        and attempt.token not in state.unpublished
        and attempt.started < cutoff
    ]
    removed = 0
    if dead:
        state = await coordinator.fence(max(a.started for a, _ in dead) + 1)
        for attempt, path in dead:
            if attempt.token not in state.unpublished and attempt.started < state.horizon:
                await trio.to_thread.run_sync(output.discard, path, limiter=limiter)
                removed += 1
    strays = [path for attempt, path in staged if attempt is None]
    for path in strays:  # not ours (a crashed copy, a user's file): only when clearly old
        with contextlib.suppress(OSError):
            if path.stat().st_mtime * 1000 < cutoff:
                await trio.to_thread.run_sync(output.discard, path, limiter=limiter)
    return SweepReport(
        rolled=len(rolled), removed=removed, forgotten=len(rolled), files=tuple(placed)
    )
