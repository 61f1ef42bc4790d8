"""``JsonlSink``: JSON-lines files, one per batch, durable and free of duplicates.

Layout: every batch becomes ``<batch key>.jsonl`` in the output directory (``ORDERS-1-100.jsonl``,
``A-1-5+B-3-9.jsonl`` for a batch of two streams), one line per record in the format of
:mod:`headrace.sinks.lines`, lines ordered by stream and stream sequence.

Durability: a file is written to a hidden temporary file in the same directory, flushed and
fsynced, renamed over its final name, and the directory fsynced, all before ``write_batch``
returns; a reader never sees a partial file, and what ``write_batch`` reported written survives
a crash of the process or the machine. With ``fsync=False`` the two fsyncs are skipped: files are
still replaced atomically and survive a crash of the process, not of the machine.

Idempotence: the output never holds the same (stream, stream_seq) from two deliveries, even when
a crash is followed by redeliveries cut into batches differently. At ``open()`` the sink reads
every existing file (and removes temporary files left by a crash) to learn the exact set of
(stream, stream_seq) already committed; then, for each batch:

- if its key names an existing file, that file is rewritten with the batch's records replacing
  its records of the same (stream, stream_seq) and its other records kept; records committed in
  another file are left out;
- otherwise records already committed are skipped, and a batch left empty writes nothing.

A batch that holds two deliveries of one message (the second taken while the batch filled,
after a stall past ``ack_wait``) is written with the first delivery's records only.

A file's name gives the range of its batch, not its content: a message of that range may be
missing from it (filtered, or failed in an operator and redelivered into a later batch), and is
written when it comes again. Several records derived from one message (a ``flat_map``) share its
(stream, stream_seq): they are written together, from the batch that holds them (the pipeline
must not split one message's records across two batches of a sink: the second part would be
skipped as committed).

The cost: ``open()`` reads all the existing output, and the sink keeps the committed sequence
numbers in memory (as intervals, so a contiguous run costs the same as one number). One sink
owns a directory at a time: ``open()`` takes a lock (``flock``), and a second sink on the same
directory gets :class:`~headrace.sinks.errors.OutputInUse`.

All that is the single-process mode (``commits="local"``, the default when the sink is used on
its own). Inside a pipeline (``commits="auto"``, or ``"shared"``) the directory is shared by
every worker of the pipeline through the commit protocol (headrace.sinks.shared_writer): each
batch becomes one file ``part-<token>.jsonl`` (same lines, same order), staged, committed in
the shared state in JetStream, then renamed into place; a record is in exactly one file, across
workers, kills and stalls. Readers read every ``*.jsonl`` of the directory. A directory is
written in one mode for its whole life; the other mode refuses it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from headrace.commits.identity import Attempt
from headrace.pipeline.sink import Sink, SinkError, SinkNotOpen
from headrace.sinks.errors import CorruptOutput, OutputInUse
from headrace.sinks.lines import record_to_line
from headrace.sinks.output import DirectoryLock, SeqSet, fsync_directory
from headrace.sinks.shared_output import CONTROL, MANIFEST, STALE_AFTER, SWEEP_INTERVAL
from headrace.sinks.shared_writer import (
    SharedWriter,
    Staged,
    batch_key,
    once_per_message,
    sequences,
)

if TYPE_CHECKING:
    from headrace.pipeline.batch import Batch
    from headrace.pipeline.record import Record
    from headrace.pipeline.sink import SinkContext

SUFFIX = ".jsonl"
TEMP_PREFIX = ".headrace-"
TEMP_SUFFIX = ".tmp"
LOCK_NAME = ".headrace-jsonl.lock"
#: How batches are committed (see the module docs).
COMMITS = ("auto", "shared", "local")

_Key = tuple[str, int]


class JsonlSink(Sink):
    """Durable, duplicate-free JSON-lines files in ``directory``; see the module docs.

    A sync sink: the pipeline runs its methods in a worker thread. ``commits``: ``"auto"``
    (shared by the pipeline's workers when a pipeline binds the sink, else local),
    ``"shared"`` or ``"local"``; ``stale_after`` and ``sweep_interval`` as for the Spark sink
    (docs/scaling.md).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        fsync: bool = True,
        commits: str = "auto",
        stale_after: float = STALE_AFTER,
        sweep_interval: float = SWEEP_INTERVAL,
    ) -> None:
        if commits not in COMMITS:
            raise SinkError(f"commits must be one of {list(COMMITS)}, not {commits!r}")
        self.directory = Path(directory).expanduser()
        self.fsync = fsync
        self.commits = commits
        self.stale_after = stale_after
        self.sweep_interval = sweep_interval
        self._context: SinkContext | None = None
        self._shared: SharedWriter | None = None
        #: Records left out because their (stream, stream_seq) was already committed.
        self.duplicates_skipped = 0
        #: Files written (new or rewritten) since ``open()``.
        self.files_written = 0
        self._committed: dict[str, SeqSet] | None = None
        self._lock = DirectoryLock(self.directory, LOCK_NAME, "JsonlSink")
        self._broken: BaseException | None = None

    def __repr__(self) -> str:
        return f"JsonlSink({str(self.directory)!r}, fsync={self.fsync})"

    # -- the sink contract --------------------------------------------------------------------

    def bind(self, context: SinkContext) -> None:
        """The pipeline says where the sink runs: with ``commits="auto"`` the directory is
        then shared by the pipeline's workers."""
        self._context = context

    @property
    def shared(self) -> SharedWriter | None:
        """The shared-mode writer, once open shared."""
        return self._shared

    def open(self) -> None:
        """Local mode: lock the directory (creating it if needed), remove stale temporary files
        and read the existing output to learn what is committed. Shared mode: join the
        directory's shared output (made if new) and sweep it."""
        if self._lock.held or self._shared is not None:
            self.close()
        mode = self.commits
        if mode == "auto":
            mode = "shared" if self._context is not None else "local"
        if mode == "shared":
            self._open_shared()
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            if (self.directory / CONTROL / MANIFEST).exists():
                raise OutputInUse(
                    f"{self.directory} is shared by the workers of a pipeline (it has "
                    f"{CONTROL}/{MANIFEST}): write it from its pipeline, not with "
                    "commits='local'"
                )
            committed: dict[str, SeqSet] = {}
            with os.scandir(self.directory) as entries:
                names = sorted(e.name for e in entries if e.is_file())
            for name in names:
                if name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX):
                    os.unlink(self.directory / name)
                elif name.endswith(SUFFIX):
                    for stream, seq in self._read(self.directory / name):
                        committed.setdefault(stream, SeqSet()).add(seq)
            # What was read counts as committed from now on: make it durable (a crash may
            # have come between a rename and the directory's fsync).
            self._fsync_directory()
        except BaseException:
            self._lock.release()
            raise
        self._committed = committed
        self._broken = None
        self.duplicates_skipped = 0
        self.files_written = 0

    def write_batch(self, batch: Batch) -> None:
        """Write ``batch`` durably, leaving out records already committed (counted in
        ``batch.skipped``); see the module docs."""
        before = self.duplicates_skipped
        if self._shared is not None:
            trio.from_thread.run(self._write_shared, self._shared, batch)
        else:
            self._write_local(batch)
        batch.skipped += self.duplicates_skipped - before

    def _write_local(self, batch: Batch) -> None:
        committed = self._committed
        if committed is None:
            raise SinkNotOpen(f"{self!r} is not open: call open() before write_batch()")
        if self._broken is not None:
            raise SinkError(
                f"{self!r}: an earlier fsync of the directory failed ({self._broken!r}); "
                "close and open the sink again"
            ) from self._broken
        if not batch.records:
            return
        name = batch.key + SUFFIX
        if "/" in name or "\\" in name or "\0" in name:
            raise SinkError(f"batch key {batch.key!r} cannot name a file")
        final = self.directory / name

        # A batch may hold two deliveries of one message (a stall past ack_wait mid-batch
        # lets the redelivery join the batch the first delivery is in): the first is kept.
        records, twice = once_per_message(batch.records)
        self.duplicates_skipped += twice
        groups: dict[_Key, list[bytes]] = {}
        for record in records:
            meta = record.delivery.msg.metadata
            line = record_to_line(record).encode("utf-8")
            groups.setdefault((meta.stream, meta.stream_seq), []).append(line)

        existing = self._read_lines(final) if final.exists() else None
        in_file = existing.keys() if existing is not None else set()
        fresh: dict[_Key, list[bytes]] = {}
        for key, lines in groups.items():
            seqs = committed.get(key[0])
            if key in in_file or seqs is None or key[1] not in seqs:
                fresh[key] = lines
            else:
                self.duplicates_skipped += len(lines)
        if not fresh:
            return
        merged = {**existing, **fresh} if existing is not None else fresh
        data = b"".join(line for key in sorted(merged) for line in merged[key])

        self._write_file(final, data)
        for stream, seq in fresh:
            committed.setdefault(stream, SeqSet()).add(seq)
        self.files_written += 1
        try:
            self._fsync_directory()
        except BaseException as exc:
            # The file is visible, so its records count as committed, but perhaps not
            # durably: refuse further batches until open() has made the directory durable.
            self._broken = exc
            raise

    def maintain(self) -> None:
        """Idle upkeep of a shared directory (a sweep, when due)."""
        if self._shared is not None:
            trio.from_thread.run(self._shared.maintain)

    def close(self) -> None:
        """Release the directory; ``open()`` may be called again."""
        shared, self._shared = self._shared, None
        if shared is not None:
            trio.from_thread.run(shared.close)
        self._committed = None
        self._lock.release()

    # -- shared mode (in the loop, from the sink's worker thread) ------------------------------

    def _open_shared(self) -> None:
        context = self._context
        if context is None:
            raise SinkError(
                f"{self!r}: commits='shared' needs the sink bound to a JetStream connection: "
                "run it in a pipeline, or call bind(SinkContext(js, pipeline=..., sink=...))"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        self._shared = trio.from_thread.run(
            functools.partial(
                SharedWriter.open,
                context,
                self.directory,
                kind="JsonlSink",
                fsync=self.fsync,
                exclusive_markers=(LOCK_NAME,),  # the local mode's lock file: refused
                stale_after=self.stale_after,
                sweep_interval=self.sweep_interval,
            )
        )
        self.duplicates_skipped = 0
        self.files_written = 0

    async def _write_shared(self, shared: SharedWriter, batch: Batch) -> None:
        records, duplicates = once_per_message(batch.records)
        redelivered = any(r.num_delivered > 1 for r in records)

        def published(staged: Staged, files: list[str], skipped: int) -> list[str]:
            self.files_written += len(files)
            self.duplicates_skipped += skipped + duplicates
            return files

        done: Any = await shared.write(
            records,
            sequences(records),
            stage=functools.partial(self._stage, shared),
            published=published,
            refresh=redelivered or duplicates > 0,
        )
        if done is None:  # all committed already
            self.duplicates_skipped += len(batch.records)

    def _stage(self, shared: SharedWriter, records: list[Record]) -> Staged:
        """One attempt: the records as one file ``part-<token>.jsonl``, fsynced, in staging."""
        seqs = sequences(records)
        attempt = Attempt.of_batch(batch_key(seqs))
        staging = shared.output.staging(attempt)
        staging.mkdir(parents=True)
        keyed = sorted(
            ((r.stream, r.stream_seq), i, record_to_line(r).encode("utf-8"))
            for i, r in enumerate(records)
        )
        path = staging / f"part-{attempt.token}{SUFFIX}"
        with open(path, "xb") as f:
            f.write(b"".join(line for _, _, line in keyed))
        shared.output.sync_staged(attempt)
        return Staged(attempt, seqs, len(records))

    # -- files --------------------------------------------------------------------------------

    def _write_file(self, final: Path, data: bytes) -> None:
        tmp = self.directory / f"{TEMP_PREFIX}{final.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        try:
            with open(tmp, "xb") as f:
                f.write(data)
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _fsync_directory(self) -> None:
        if self.fsync:
            fsync_directory(self.directory)

    def _read_lines(self, path: Path) -> dict[_Key, list[bytes]]:
        """The lines of an output file by (stream, stream_seq), in file order."""
        lines: dict[_Key, list[bytes]] = {}
        with open(path, "rb") as f:
            for number, line in enumerate(f, 1):
                lines.setdefault(self._key_of(path, number, line), []).append(line)
        return lines

    def _read(self, path: Path) -> set[_Key]:
        with open(path, "rb") as f:
            return {self._key_of(path, number, line) for number, line in enumerate(f, 1)}

    @staticmethod
    def _key_of(path: Path, number: int, line: bytes) -> _Key:
        if not line.endswith(b"\n"):
            raise CorruptOutput(str(path), number, "incomplete line (no newline at the end)")
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise CorruptOutput(str(path), number, f"not JSON: {exc}") from None
        stream = obj.get("stream") if isinstance(obj, dict) else None
        seq = obj.get("stream_seq") if isinstance(obj, dict) else None
        if not isinstance(stream, str) or not isinstance(seq, int) or isinstance(seq, bool):
            raise CorruptOutput(str(path), number, "no 'stream' string and 'stream_seq' integer")
        return stream, seq

    # -- the directory lock -------------------------------------------------------------------
