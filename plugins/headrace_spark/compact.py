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
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from typing import Any

import attrs

from headrace_spark.ledger import CommitLedger
from headrace_spark.output import OutputDir, claim_output, new_token
from headrace_spark.targets import local_path


@attrs.frozen(slots=True)
class CompactionReport:
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


def compact(
    path: str | os.PathLike[str], *, spark: Any = None, min_files: int = 8, **session: Any
) -> CompactionReport:
    """Compact the output directory ``path`` of a Spark sink that is not running (it takes the
    sink's lock: :class:`~headrace.sinks.errors.OutputInUse` while one is). ``spark``: a session
    to use, else one is started with ``session`` (the arguments of ``start_session``)."""
    from headrace_spark.session import start_session

    claimed = claim_output(local_path(str(path), "path"))
    try:
        if spark is None:
            spark = start_session(**session)
        return compact_output(spark, claimed.out, claimed.ledger, min_files=min_files)
    finally:
        claimed.lock.release()
