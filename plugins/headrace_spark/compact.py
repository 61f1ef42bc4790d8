"""Compaction: fewer, larger files for the same rows.

Each batch writes at least one file per partition it touches, so a long-running sink leaves many
small files, which slow every reader. Compaction rewrites each directory that holds ``min_files``
or more of the sink's files into one file, with the same protocol as a batch: Spark writes it to
staging, it is put in place hidden, the ledger records the replacement (the new file committed,
the old ones not), it is renamed visible and the old files are deleted. A crash at any point
leaves either the old files or the new one committed, never both, and the next ``open`` removes
the other. Readers listing the directory in the instant between the rename and the deletions see
both: run compaction when no reader needs an exact count at that moment (nightly, for example).

The committed sequences do not change, so duplicates stay impossible after compaction.

An output shared by workers (``commits="shared"``) is compacted by one of them at a time: the
compacting worker takes a lease in the shared commit state (:func:`compact_shared`), commits
each replacement there (the new file, and the files it replaces), then renames the new file into
place and deletes the old ones. A worker killed in between leaves a committed replacement that
any worker's sweep finishes; a compaction that outlived its lease is refused at its commit.
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from typing import Any

import attrs
import trio
from headrace.commits import Attempt, now_ms
from headrace.sinks import OutputInUse

from headrace_spark.ledger import CommitLedger
from headrace_spark.output import DATA_FILE, OutputDir, claim_output, name_staged, new_token
from headrace_spark.targets import local_path


@attrs.frozen(slots=True)
class CompactionReport:
    """What a compaction did (``SparkSink.compact``, ``headrace_spark.compact``): how many
    directories it rewrote, and their data files before and after."""

    #: Directories rewritten.
    directories: int
    #: The sink's data files in those directories before, and after.
    files_before: int
    files_after: int


def compact_output(
    spark: Any, out: OutputDir, ledger: CommitLedger, *, min_files: int = 8
) -> CompactionReport:
    """Compact ``out`` (whose lock the caller holds, with ``ledger`` loaded)."""
    if min_files < 2:
        raise ValueError(f"min_files must be at least 2, not {min_files}")
    by_directory: dict[str, list[str]] = defaultdict(list)
    for relative in sorted(ledger.files):
        by_directory[relative.rpartition("/")[0]].append(relative)
    directories = before = after = 0
    for directory, files in sorted(by_directory.items()):
        if len(files) < min_files:
            continue
        token = new_token("compact")
        staging = out.staging(token)
        try:
            frame = spark.read.parquet(*[str(out.root / f) for f in files])
            frame.coalesce(1).write.format("parquet").mode("error").save(str(staging))
            added = out.stage_into_place(staging, token, under=directory)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        ledger.record_compaction(added, files)  # the commit point
        out.publish(added)
        out.remove(files)
        directories += 1
        before += len(files)
        after += len(added)
    ledger.fold()
    return CompactionReport(directories, before, after)


#: How long a compaction's lease lasts without renewal (renewed for each directory).
LEASE_SECONDS = 600.0


async def compact_shared(sink: Any, shared: Any, *, min_files: int = 8) -> CompactionReport:
    """Compact a shared output from a worker writing it (``SparkSink.compact`` in shared mode):
    the data files published in each directory holding ``min_files`` or more become one. Raises
    :class:`~headrace.sinks.OutputInUse` while another worker holds the lease."""
    if min_files < 2:
        raise ValueError(f"min_files must be at least 2, not {min_files}")
    coordinator, output = shared.coordinator, shared.output
    worker = coordinator.worker
    lease = Attempt.new("lease").token

    def take(state: Any) -> Any:
        taken = state.take_lease(worker, lease, now_ms() + int(LEASE_SECONDS * 1000), now_ms())
        return state if taken is None else taken

    def run_sync(fn: Any, *args: Any) -> Any:
        return trio.to_thread.run_sync(fn, *args, limiter=shared.limiter)

    async with shared._lock:
        state = await coordinator.change(take)
        if state.lease is None or state.lease.token != lease:
            held = state.lease
            raise OutputInUse(
                f"{output.root} is being compacted by worker {held.worker if held else '?'}; "
                "try again later"
            )
        try:
            files = await run_sync(lambda: sorted(output.data_files(DATA_FILE)))
            by_directory: dict[str, list[str]] = defaultdict(list)
            for relative in files:
                by_directory[relative.rpartition("/")[0]].append(relative)
            directories = before = after = 0
            for directory, olds in sorted(by_directory.items()):
                if len(olds) < min_files:
                    continue
                attempt = Attempt.new("compact")
                added = await run_sync(
                    _stage_directory, sink.spark, output, attempt, directory, olds
                )
                await coordinator.change(
                    lambda s, a=attempt, o=olds: s.commit_compaction(
                        a, worker, o, at=now_ms(), lease=lease
                    )
                )
                await run_sync(output.publish, attempt.token, olds)
                await coordinator.change(lambda s, a=attempt: take(s.forget([a.token])))
                directories += 1
                before += len(olds)
                after += len(added)
        finally:
            with trio.CancelScope(shield=True):
                await coordinator.change(lambda s: s.release_lease(lease))
    return CompactionReport(directories, before, after)


def _stage_directory(
    spark: Any, output: Any, attempt: Attempt, directory: str, files: list[str]
) -> list[str]:
    """One directory's files rewritten as one, staged as ``attempt`` at its final path."""
    staging = output.staging(attempt)
    target = staging / directory if directory else staging
    try:
        frame = spark.read.parquet(*[str(output.root / f) for f in files])
        frame.coalesce(1).write.format("parquet").mode("error").save(str(target))
        added: list[str] = name_staged(staging, attempt.token)
        output.sync_staged(attempt)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return added


def compact(
    path: str | os.PathLike[str], *, spark: Any = None, min_files: int = 8, **session: Any
) -> CompactionReport:
    """Compact the output directory ``path`` of a Spark sink that is not running (it takes the
    sink's lock: :class:`~headrace.sinks.OutputInUse` while one is). ``spark``: a session
    to use, else one is started with ``session`` (the arguments of ``start_session``)."""
    from headrace_spark.session import start_session

    claimed = claim_output(local_path(str(path), "path"))
    try:
        if spark is None:
            spark = start_session(**session)
        return compact_output(spark, claimed.out, claimed.ledger, min_files=min_files)
    finally:
        claimed.lock.release()
