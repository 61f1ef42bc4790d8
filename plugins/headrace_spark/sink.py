"""``SparkSink``: pipeline batches into parquet files or a table through PySpark, each record
exactly once.

Per batch, in a worker thread (Spark calls block; the trio loop never waits on them):

1. records whose (stream, stream_seq) the ledger already holds are left out (a redelivery);
2. the rest become a ``pyarrow.Table`` with an explicit schema (schema.py), then a DataFrame by
   ``spark.createDataFrame(table)``, optionally ``transform``-ed;
3. Spark writes it into a staging directory of its own, its jobs tagged with the batch's tag;
4. the files are put in place hidden, the ledger commits them, they are renamed visible
   (output.py): only then does ``write_batch`` return and the pipeline ack the messages.

A crash at any point loses nothing and duplicates nothing: before the ledger entry the attempt
does not exist (its files are removed on the next ``open``, and the messages, never acked, come
again); after it, the records are committed and their redelivery is skipped.

Cancelling ``write_batch`` (the pipeline stopping hard) cancels the batch's Spark jobs by tag
and returns at once; an attempt that Spark finishes anyway is not committed.

``writer="arrow"`` replaces step 3 for parquet paths: Arrow writes the table into the staging
directory (arrow_writer.py) and no Spark job runs; everything around it is the same.

Two ways to commit (``commits=``):

- ``"shared"``: the output is shared by every worker of the pipeline (processes on one host or
  many), coordinated through a commit state in a JetStream KV bucket
  (headrace.sinks.SharedWriter, headrace.commits). The default inside a pipeline
  (``"auto"``): the pipeline binds the sink to its JetStream connection;
- ``"local"``: the ledger above, in the output directory; one process at a time (it holds an
  exclusive lock). The default when the sink is used on its own, without ``bind``.

An output is written in one mode for its whole life; the other is refused with a clear error.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pyarrow as pa
import trio
from headrace.commits import Attempt
from headrace.pipeline import RecordsRejected, Sink, SinkNotOpen
from headrace.sinks import (
    STALE_AFTER,
    SWEEP_INTERVAL,
    DirectoryLock,
    SharedWriter,
    Staged,
    SweepReport,
    batch_key,
)

from headrace_spark.arrow_writer import write_parquet
from headrace_spark.errors import (
    SparkJobCancelled,
    SparkPythonError,
    SparkSchemaError,
    SparkSinkError,
    SparkWriteError,
)
from headrace_spark.failures import connection_lost, python_failure
from headrace_spark.ledger import FOLD_AFTER, CommitLedger
from headrace_spark.metadata import BatchMetadata, once_per_message
from headrace_spark.output import OutputDir, claim_output, name_staged, new_token
from headrace_spark.schema import TableBuilder
from headrace_spark.session import JobTags, empty_frame, first_line, is_connect, start_session
from headrace_spark.staged_input import remove_stale_inputs, stageable, staged_frame
from headrace_spark.targets import ParquetTarget, TableTarget

if TYPE_CHECKING:
    from headrace.pipeline import Batch, Record, SinkContext


#: How a batch's table becomes files: a Spark job (``createDataFrame(table).write``), or
#: Arrow's parquet writer for parquet paths (arrow_writer.py; no JVM work per batch).
WRITERS = ("spark", "arrow")
#: How batches are committed (see the module docs).
COMMITS = ("auto", "shared", "local")


@attrs.frozen(slots=True)
class CommitInfo:
    """What one committed batch wrote (given to ``on_commit``)."""

    #: The key of the records written (their sequence ranges).
    batch: str
    #: Data files added, relative to the output directory.
    files: tuple[str, ...]
    rows: int
    #: Records of the batch left out as already committed.
    skipped: int
    seconds: float
    #: Records set aside as not fitting the schema (raised as RecordsRejected after commit).
    rejected: int = 0
    #: The worker that committed it (shared outputs), and its attempt's token.
    worker: str = ""
    token: str = ""


class SparkSink(Sink):
    """Writes batches to ``path`` (parquet) or ``table`` through Spark; see the module docs
    and docs/spark.md.

    Columns: by default the message metadata (subject, data, headers, stream, stream_seq,
    consumer_seq, num_delivered, timestamp); with ``schema`` (a ``pyarrow.Schema`` or an attrs
    class) the fields of each record's value, or of ``decode(record)``, plus the metadata
    columns if ``keep_metadata`` (True, or the names of the ones to keep). ``transform`` may
    change the DataFrame before it is written (derived columns, casts). ``partition_by`` names
    columns of the written DataFrame.

    Session: ``spark`` (yours; never stopped by the sink), else one started on ``master``
    (``local[*]``, a cluster URL, or ``sc://`` for Spark Connect) with ``conf`` over quiet,
    fast-starting defaults; ``hive=True`` with ``warehouse`` for a Hive catalog.

    ``writer``: ``"spark"`` (a Spark job per batch) or ``"arrow"`` (Arrow's parquet writer, for
    ``path=`` without ``transform``; no session needed until ``compact``); see docs/spark.md.

    ``commits``: ``"auto"`` (shared when a pipeline binds the sink, else local), ``"shared"``
    or ``"local"`` (see the module docs and docs/scaling.md). Shared outputs: staged attempts
    that never committed are deleted ``stale_after`` seconds after they started (an attempt
    still running then must start again), by a sweep every ``sweep_interval`` seconds.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        table: str | None = None,
        partition_by: Sequence[str] = (),
        schema: pa.Schema | type | None = None,
        decode: Callable[[Record], Any] | None = None,
        keep_metadata: bool | Sequence[str] = False,
        metadata_prefix: str = "",
        transform: Callable[[Any], Any] | None = None,
        spark: Any = None,
        master: str = "local[*]",
        conf: Mapping[str, str] | None = None,
        hive: bool = False,
        warehouse: str | os.PathLike[str] | None = None,
        app_name: str = "headrace",
        files_per_batch: int | None = 1,
        fsync: bool = True,
        on_commit: Callable[[CommitInfo], None] | None = None,
        stop_session: bool = False,
        writer: str = "spark",
        commits: str = "auto",
        stale_after: float = STALE_AFTER,
        sweep_interval: float = SWEEP_INTERVAL,
        staged_input: bool = False,
    ) -> None:
        if staged_input and writer != "spark":
            raise SparkSinkError("staged_input=True is a way of the Spark writer (writer='spark')")
        if (path is None) == (table is None):
            raise SparkSinkError("SparkSink needs exactly one of path= (parquet) or table=")
        if writer not in WRITERS:
            raise SparkSinkError(f"writer must be one of {list(WRITERS)}, not {writer!r}")
        if writer == "arrow" and table is not None:
            raise SparkSinkError(
                "writer='arrow' writes parquet paths (path=); a table needs Spark's catalog, "
                "so write tables with writer='spark'"
            )
        if writer == "arrow" and files_per_batch != 1:
            raise SparkSinkError(
                "writer='arrow' writes one file per partition of a batch; files_per_batch "
                "applies to writer='spark'"
            )
        if writer == "arrow" and transform is not None:
            raise SparkSinkError(
                "writer='arrow' makes no DataFrame, so it cannot apply transform=; derive the "
                "columns in the pipeline (map, decode) or use writer='spark'"
            )
        if commits not in COMMITS:
            raise SparkSinkError(f"commits must be one of {list(COMMITS)}, not {commits!r}")
        if not stale_after > 0 or not sweep_interval > 0:
            raise SparkSinkError("stale_after and sweep_interval must be positive (seconds)")
        if files_per_batch is not None and files_per_batch < 1:
            raise SparkSinkError(f"files_per_batch must be at least 1, not {files_per_batch}")
        self.target: ParquetTarget | TableTarget = (
            ParquetTarget(path, partition_by)
            if path is not None
            else TableTarget(str(table), partition_by)
        )
        self.builder = TableBuilder(schema, decode, keep_metadata, metadata_prefix)
        self.transform = transform
        self.writer = writer
        self.files_per_batch = files_per_batch
        self.fsync = fsync
        self.on_commit = on_commit
        self.stop_session = stop_session
        self.commits = commits
        self.stale_after = stale_after
        #: Hand each batch to Spark as a parquet file Arrow staged (staged_input.py) where the
        #: types allow; off by default: faster for some tables, slower for others (measured).
        self.staged_input = staged_input
        self.sweep_interval = sweep_interval
        self._context: SinkContext | None = None
        self._shared: SharedWriter | None = None
        self._given_spark = spark
        self._session_args: dict[str, Any] = {
            "master": master,
            "app_name": app_name,
            "conf": dict(conf or {}),
            "hive": hive,
            "warehouse": warehouse,
        }
        self.spark: Any = spark
        self._tags: JobTags | None = None
        self._out: OutputDir | None = None
        self._ledger: CommitLedger | None = None
        self._lock: DirectoryLock | None = None
        self._mutex = threading.Lock()  # one commit at a time, an abandoned one included
        self._limiter = trio.CapacityLimiter(1)
        self._cancelled: set[str] = set()
        self._unregistered: list[str] = []  # committed files whose partitions a table lacks
        #: Batches committed, rows written and records skipped as committed, since open().
        self.batches_committed = 0
        self.rows_written = 0
        self.duplicates_skipped = 0
        #: Records set aside because they do not fit the schema (poison records).
        self.records_rejected = 0
        #: Files of uncommitted attempts removed, and committed ones rolled forward, at open().
        self.recovered_removed = 0
        self.recovered_rolled = 0

    def __repr__(self) -> str:
        how = ", arrow writer" if self.writer == "arrow" else ""
        return f"SparkSink({self.target.describe()}{how})"

    @property
    def output(self) -> Path | None:
        """The output directory (a table's location), once open."""
        if self._shared is not None:
            return self._shared.output.root
        return self._out.root if self._out is not None else None

    @property
    def shared(self) -> SharedWriter | None:
        """The shared-mode writer (its coordinator, its sweeps' counts), once open shared."""
        return self._shared

    # -- the sink contract --------------------------------------------------------------------

    def bind(self, context: SinkContext) -> None:
        """The pipeline says where the sink runs: with ``commits="auto"`` the output is then
        shared by the pipeline's workers."""
        self._context = context

    async def open(self) -> None:
        """Take the output: in local mode its lock and ledger (recovering what a crash of an
        earlier writer left), in shared mode a writer on the pipeline's commit state. Called by
        the pipeline before the first batch and again after a failure of the sink."""
        if self._shared is not None or self._ledger is not None:
            await self.close()
        mode = self.commits
        if mode == "auto":
            mode = "shared" if self._context is not None else "local"
        if mode == "local":
            await trio.to_thread.run_sync(self._open_sync, abandon_on_cancel=True)
            return
        if self._context is None:
            raise SparkSinkError(
                f"{self!r}: commits='shared' needs the sink bound to a JetStream connection: run "
                "it in a pipeline, or call bind(SinkContext(js, pipeline=..., sink=...)) first"
            )
        root = await trio.to_thread.run_sync(self._locate, abandon_on_cancel=True)
        self._shared = await SharedWriter.open(
            self._context,
            root,
            kind="SparkSink",
            fsync=self.fsync,
            exclusive_markers=("_headrace/ledger",),  # the local mode's ledger: refused
            limiter=self._limiter,
            stale_after=self.stale_after,
            sweep_interval=self.sweep_interval,
        )
        self._shared.on_sweep = self._on_sweep
        self.batches_committed = self.rows_written = self.duplicates_skipped = 0
        self.records_rejected = 0
        self.recovered_rolled = self._shared.swept.rolled
        self.recovered_removed = self._shared.swept.removed

    async def write_batch(self, batch: Batch) -> None:
        """Write ``batch`` and return once it is committed (its files in place and recorded),
        so that the pipeline may ack its messages; records already in the output are skipped.
        A cancelled write also cancels its Spark jobs."""
        if self._ledger is None and self._shared is None:
            raise SinkNotOpen(f"{self!r} is not open")
        tag = f"headrace-spark-{secrets.token_hex(6)}"
        before = self.duplicates_skipped
        try:
            if self._shared is not None:
                await self._write_shared(self._shared, batch, tag)
            else:
                await trio.to_thread.run_sync(
                    self._write_sync, batch, tag, limiter=self._limiter, abandon_on_cancel=True
                )
        except trio.Cancelled:
            self._cancelled.add(tag)
            # Cancelling is a quick call into Spark, but still a call that could block: from a
            # thread of its own, so the loop goes on at once.
            threading.Thread(target=self._cancel_jobs, args=(tag,), daemon=True).start()
            raise
        finally:
            # Records left out as committed already: the pipeline counts them apart (also
            # when some records were rejected and the rest committed).
            batch.skipped += self.duplicates_skipped - before

    async def maintain(self) -> None:
        """Idle upkeep (the pipeline calls it between batches): a shared output's sweep, when
        one is due."""
        if self._shared is not None:
            await self._shared.maintain()
            if self._unregistered:  # partitions of files another worker's commit put in place
                await trio.to_thread.run_sync(self._register, [], limiter=self._limiter)

    async def close(self) -> None:
        """Release the output (its lock, or the shared writer); with ``stop_session=True`` also
        stop the Spark session the sink started (never one passed in as ``spark``)."""
        shared, self._shared = self._shared, None
        if shared is not None:
            try:
                await shared.close()
            finally:
                await trio.to_thread.run_sync(self._stop_session, abandon_on_cancel=True)
            return
        await trio.to_thread.run_sync(self._close_sync, abandon_on_cancel=True)

    async def compact(self, min_files: int = 8) -> Any:
        """Rewrite each directory holding ``min_files`` or more small files of this sink into
        one file (compact.py); returns a :class:`~headrace_spark.compact.CompactionReport`."""
        from headrace_spark.compact import compact_output, compact_shared

        if self._shared is not None:
            if self.spark is None:
                self.spark = await trio.to_thread.run_sync(
                    lambda: start_session(**self._session_args), limiter=self._limiter
                )
            return await compact_shared(self, self._shared, min_files=min_files)
        if self._ledger is None or self._out is None:
            raise SinkNotOpen(f"{self!r} is not open")
        out, ledger = self._out, self._ledger

        def run() -> Any:
            with self._mutex:
                if self.spark is None:  # the arrow writer needs no session until now
                    self.spark = start_session(**self._session_args)
                return compact_output(self.spark, out, ledger, min_files=min_files)

        return await trio.to_thread.run_sync(run, limiter=self._limiter)

    # -- in the worker thread -----------------------------------------------------------------

    def _locate(self) -> Path:
        """The output directory, with the session started (Spark writer) and ``partition_by``
        checked against the columns written."""
        if self.writer == "arrow":
            # No Spark job per batch, so no session unless the application gave one.
            self._check_partitions(self.builder.arrow_schema.names)
            return self.target.location(self.spark, None)
        if self.spark is None:
            self.spark = start_session(**self._session_args)
        spark = self.spark
        self._tags = JobTags(spark)
        template = empty_frame(spark, self.builder.arrow_schema)
        if self.transform is not None:
            template = self.transform(template)
        self._check_partitions(list(template.columns))
        return self.target.location(spark, template)

    def _open_sync(self) -> None:
        with self._mutex:
            if self._lock is not None:
                self._release()
            root = self._locate()
            claimed = claim_output(root, fsync=self.fsync)
            out, ledger, lock = claimed.out, claimed.ledger, claimed.lock
            try:
                if claimed.missing:
                    warnings.warn(
                        f"{self!r}: {len(claimed.missing)} committed data files were deleted "
                        f"outside the sink (for example {claimed.missing[0]}); their rows are "
                        "gone, and their sequences stay committed (a redelivery does not bring "
                        "them back)",
                        RuntimeWarning,
                        stacklevel=1,
                    )
                if claimed.rolled:
                    self._register(sorted(ledger.files))
                if ledger.entries >= FOLD_AFTER:
                    ledger.fold()
            except BaseException:
                lock.release()
                raise
            self._out, self._ledger, self._lock = out, ledger, lock
            self.recovered_rolled, self.recovered_removed = claimed.rolled, claimed.removed
            self.batches_committed = self.rows_written = self.duplicates_skipped = 0
            self.records_rejected = 0

    def _check_partitions(self, columns: list[str]) -> None:
        """``partition_by`` must name columns of the written DataFrame, and leave some for the
        files: said at ``open`` rather than by Spark at the first batch."""
        partition_by = self.target.partition_by
        unknown = [c for c in partition_by if c not in columns]
        if unknown:
            raise SparkSchemaError(
                f"{self!r}: partition_by names {unknown}, which the written DataFrame lacks; "
                f"its columns are {columns}",
                unknown[0],
            )
        if partition_by and len(partition_by) == len(columns):
            raise SparkSchemaError(
                f"{self!r}: partition_by {list(partition_by)} takes every column; the data "
                "files would hold none"
            )

    def _write_sync(self, batch: Batch, tag: str) -> CommitInfo | None:
        with self._mutex:
            out, ledger = self._out, self._ledger
            if out is None or ledger is None:
                raise SinkNotOpen(f"{self!r} was closed")
            started = time.perf_counter()
            # The batch's delivery metadata, parsed in bulk once: the ledger's check, the
            # metadata columns and the commit entry all come from it.
            # A message delivered twice into one batch (after a stall) is written once.
            records, meta, _, _ = once_per_message(batch)
            keep = self._not_committed(records, meta, ledger)
            skipped = len(batch) - len(keep)
            self.duplicates_skipped += skipped
            if not keep:
                return None
            if keep is not records:
                meta = BatchMetadata.of(keep)
            table, keep, rejected, seqs, key = self._build(keep, meta)
            token = new_token(key)
            staging = out.staging(token)
            self._write_staging(table, staging, tag, key)
            files = out.stage_into_place(staging, token)
            ledger.record_commit(key, files, seqs, len(keep))  # the commit point
            out.publish(files)
            shutil.rmtree(staging, ignore_errors=True)
            self._register(files)
            if ledger.entries >= FOLD_AFTER:
                ledger.fold()
            self.batches_committed += 1
            self.rows_written += len(keep)
            self.records_rejected += len(rejected)
            elapsed = time.perf_counter() - started
            info = CommitInfo(key, tuple(files), len(keep), skipped, elapsed, len(rejected))
        if self.on_commit is not None:
            self.on_commit(info)
        if rejected:
            raise RecordsRejected(rejected)  # committed; the pipeline fails only these
        return info

    async def _write_shared(self, shared: SharedWriter, batch: Batch, tag: str) -> None:
        """A batch into a shared output (headrace.sinks.SharedWriter): the metadata parsed in
        bulk once, a message delivered twice in the batch written once."""
        started = time.perf_counter()
        records, meta, duplicates, redelivered = await trio.to_thread.run_sync(
            once_per_message, batch, limiter=self._limiter, abandon_on_cancel=True
        )

        def stage(keep: list[Record]) -> Staged:
            return self._stage_shared(keep, meta if keep is records else None, tag, shared)

        def published(staged: Staged, files: list[str], skipped: int) -> CommitInfo:
            return self._published_shared(staged, files, skipped + duplicates, started)

        info = await shared.write(
            records,
            meta.sequences(),
            stage=stage,
            published=published,
            refresh=redelivered or duplicates > 0,
        )
        if info is None:  # every record committed already
            self.duplicates_skipped += len(batch.records)

    def _stage_shared(
        self, keep: list[Record], meta: BatchMetadata | None, tag: str, shared: SharedWriter
    ) -> Staged:
        """Write ``keep`` as a new attempt under the shared output's staging directory, each
        file under its final name, fsynced: ready to commit."""
        if meta is None:
            meta = BatchMetadata.of(keep)
        table, accepted, rejected, seqs, key = self._build(keep, meta)
        attempt = Attempt.of_batch(key)
        staging = shared.output.staging(attempt)
        self._write_staging(table, staging, tag, key)
        try:
            name_staged(staging, attempt.token)
            shared.output.sync_staged(attempt)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return Staged(attempt, seqs, len(accepted), rejected)

    def _build(
        self, keep: list[Record], meta: BatchMetadata
    ) -> tuple[pa.Table, list[Record], list[tuple[Record, BaseException]], dict[str, Any], str]:
        """The table of the records that fit the schema (a record that does not is set aside,
        not the batch with it: :class:`RecordsRejected` if none fits), those records, the
        rejected ones, their sequences per stream, and the batch key naming them."""
        table, accepted, rejected = self.builder.build_accepting(keep, meta)
        if not accepted:
            self.records_rejected += len(rejected)
            raise RecordsRejected(rejected)
        if len(accepted) != len(keep):
            meta = BatchMetadata.of(accepted)
        seqs = meta.sequences()
        return table, accepted, list(rejected), seqs, batch_key(seqs)

    def _write_staging(self, table: pa.Table, staging: Path, tag: str, key: str) -> None:
        """Spark's (or Arrow's) write of ``table`` into ``staging``; nothing is left there if
        it fails or the pipeline stopped meanwhile."""
        try:
            if self.writer == "arrow":
                write_parquet(table, staging, self.target.partition_by)
            else:
                self._spark_write(table, staging, tag)
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, Exception):
                raise self._write_error(exc, tag, key) from exc
            raise
        if tag in self._cancelled:
            shutil.rmtree(staging, ignore_errors=True)
            raise SparkJobCancelled(f"batch {key}: the pipeline stopped; not committed")

    def _published_shared(
        self, staged: Staged, files: list[str], skipped: int, started: float
    ) -> CommitInfo:
        """A committed attempt's files are in place: the catalog, the counters, ``on_commit``;
        then the records set aside as not fitting the schema fail (``RecordsRejected``)."""
        self._register(files)
        self.batches_committed += 1
        self.rows_written += staged.rows
        self.duplicates_skipped += skipped
        self.records_rejected += len(staged.rejected)
        worker = self._context.worker if self._context is not None else ""
        info = CommitInfo(
            batch_key(staged.seqs),
            tuple(files),
            staged.rows,
            skipped,
            time.perf_counter() - started,
            len(staged.rejected),
            worker=worker,
            token=staged.attempt.token,
        )
        if self.on_commit is not None:
            self.on_commit(info)  # in the worker thread, as in the local mode
        if staged.rejected:
            raise RecordsRejected(staged.rejected)  # committed; the pipeline fails only these
        return info

    def _on_sweep(self, report: SweepReport) -> None:
        """Another worker's commit was put in place by a sweep: a table learns its partitions
        (with the next batch, or the next idle turn)."""
        if report.files and self.target.partition_by:
            self._unregistered.extend(report.files)

    @staticmethod
    def _not_committed(
        records: list[Record], meta: BatchMetadata, ledger: CommitLedger
    ) -> list[Record]:
        """The records the ledger does not hold yet. A batch whose sequence ranges miss every
        committed interval (the usual case) is kept whole without a lookup per record."""
        if not any(
            (committed := ledger.committed.get(stream)) is not None
            and committed.overlaps(first, last)
            for stream, first, last in meta.ranges()
        ):
            return records
        return [r for r in records if not ledger.is_committed(r.stream, r.stream_seq)]

    def _spark_write(self, table: pa.Table, staging: Path, tag: str) -> None:
        assert self._tags is not None
        self._tags.start(tag)
        try:
            with contextlib.ExitStack() as inputs:
                df = self._frame(table, staging, inputs)
                self._spark_save(df, staging)
        finally:
            self._tags.end(tag)

    def _frame(self, table: pa.Table, staging: Path, inputs: contextlib.ExitStack) -> Any:
        """The batch's DataFrame: with ``staged_input``, read from a parquet file Arrow staged
        where that is the same DataFrame (staged_input.py), else ``createDataFrame``."""
        if self.staged_input and not is_connect(self.spark) and stageable(table.schema):
            # staging is <output>/_headrace/staging/<attempt>, in both commit modes
            control = staging.parent.parent
            remove_stale_inputs(control, self.stale_after)
            return inputs.enter_context(staged_frame(self.spark, table, control, staging.name))
        return self.spark.createDataFrame(table)

    def _spark_save(self, df: Any, staging: Path) -> None:
        if self.transform is not None:
            df = self.transform(df)
        if self.files_per_batch is not None:
            df = df.coalesce(self.files_per_batch)
        # "error" (= errorifexists), the one spelling Spark Connect accepts too
        writer = df.write.format("parquet").mode("error")
        for column in self.builder.unique_columns:
            # A dictionary of values that never repeat: building it until parquet gives
            # up on it cost the JVM ~0.1 CPU-s per 100k rows (sequences and timestamp
            # together) and made the files larger, not smaller. Measured. A column the
            # transform dropped is simply not there to look up.
            writer = writer.option(f"parquet.enable.dictionary#{column}", "false")
        if self.target.partition_by:
            writer = writer.partitionBy(*self.target.partition_by)
        writer.save(str(staging))

    def _write_error(self, exc: Exception, tag: str, key: str) -> SparkSinkError:
        if isinstance(exc, SparkSinkError):
            return exc
        text = str(exc)
        if tag in self._cancelled or "SPARK_JOB_CANCELLED" in text:
            return SparkJobCancelled(f"batch {key}: its Spark job was cancelled; not committed")
        who = "Arrow" if self.writer == "arrow" else "Spark"
        where = f"{who} could not write batch {key} to {self.target.describe()}"
        failure = python_failure(exc) if self.writer == "spark" else None
        if failure is not None:
            if failure.in_function:
                said = f"a Python function it ran on the rows raised {failure.message}"
            else:
                said = f"its Python worker failed ({failure.message}); {self._worker_python()}"
            return SparkPythonError(
                f"{where}: {said}", failure.message, in_function=failure.in_function
            )
        lost = connection_lost(exc)
        return SparkWriteError(f"{where}: {first_line(exc)}", transient=True if lost else None)

    def _worker_python(self) -> str:
        """Which interpreter the Python workers run, to say so when they fail."""
        try:
            python = self.spark.sparkContext.pythonExec
        except Exception:  # Spark Connect: the server's workers, its own setting
            return "the workers run the Spark Connect server's Python"
        return (
            f"the workers run {python!r} (spark.pyspark.python, or PYSPARK_PYTHON; it needs "
            "pyspark's dependencies, pyarrow among them)"
        )

    def _register(self, files: list[str]) -> None:
        """Tell the catalog about committed files (a table's new partitions). The data is
        committed whatever happens here: a failure is retried with the next batch."""
        pending = [*self._unregistered, *files]
        try:
            self.target.after_commit(self.spark, pending)
        except Exception as exc:
            self._unregistered = pending
            warnings.warn(
                f"{self!r}: committed, but the catalog was not updated ({first_line(exc)}); "
                "retried with the next batch",
                RuntimeWarning,
                stacklevel=1,
            )
        else:
            self._unregistered = []

    def _cancel_jobs(self, tag: str) -> None:
        try:
            if self._tags is not None:
                self._tags.cancel(tag)
        except Exception:  # the session is gone: nothing runs any more
            pass

    def _stop_session(self) -> None:
        if self.stop_session and self._given_spark is None and self.spark is not None:
            self.spark.stop()
            self.spark = None

    def _close_sync(self) -> None:
        # An abandoned write (cancelled, its Spark job being interrupted) may still hold the
        # mutex; the lock on the output is released only once nothing can commit any more.
        if not self._mutex.acquire(timeout=30):
            return
        try:
            self._release()
            if self.stop_session and self._given_spark is None and self.spark is not None:
                self.spark.stop()
                self.spark = None
        finally:
            self._mutex.release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
        self._out = self._ledger = self._lock = None
        self._cancelled.clear()
