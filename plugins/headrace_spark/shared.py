"""The Spark sink's write path when workers share its output (``commits="shared"``, the default
inside a pipeline): the commit protocol of headrace.commits around Spark's (or Arrow's) write.

Per batch:

1. records of a message that came twice in the batch (a delivery and its redelivery, taken
   together after a stall) are kept once;
2. records whose sequences the shared state holds are left out (a redelivery, or a batch another
   worker committed first); if any are, or the batch holds redeliveries, the state is read
   afresh first, and the streams' identities looked up again (a stream recreated under the same
   name must not pass for the old one);
3. the rest is written into ``_headrace/staging/<token>/`` under the names the files will have,
   and fsynced;
4. the commit: a compare-and-set on the state. If another worker committed part of these
   records meanwhile, the staged files are thrown away and the rest written again (or nothing,
   if nothing is left); an attempt too old to commit (the horizon passed it) is redone;
5. the files are renamed into place; only then does ``write_batch`` return and the pipeline ack.

A crash, a SIGKILL or a stall anywhere is recovered by any worker's sweep
(headrace.sinks.shared_output): before 4 the attempt is garbage, deleted once stale; after it,
the attempt is published by whoever sweeps. The records are never written twice: only a
committed attempt is ever published, and an attempt commits only records no other commit holds.
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio
from headrace.commits.coordinator import CommitCoordinator
from headrace.commits.errors import OutputConflict, StreamRecreated
from headrace.commits.identity import Attempt, StreamIdentity
from headrace.commits.seqset import SeqSet
from headrace.commits.state import Committed, Expired, Overlap
from headrace.sinks.errors import RecordsRejected
from headrace.sinks.shared_output import (
    SETTLE_AFTER,
    SharedOutput,
    SweepReport,
    claim,
    sweep,
)

from headrace_spark.errors import SparkSinkError
from headrace_spark.metadata import BatchMetadata, once_per_message

if TYPE_CHECKING:
    from headrace.pipeline.batch import Batch
    from headrace.pipeline.record import Record
    from headrace.pipeline.sink import SinkContext

    from headrace_spark.sink import CommitInfo, SparkSink

#: A batch that keeps meeting other workers' commits is redone at most this many times (each
#: time with fewer records) before it fails and comes again.
MAX_REDO = 20
#: Seconds between two reports of the consumers' ack floors into the state.
FLOOR_INTERVAL = 10.0
#: Our data files: ``part-<token>-00000.snappy.parquet``.
DATA_FILE = re.compile(r"^part-[A-Za-z0-9_+-]+\.[0-9a-f]{19}-\d{5}(\..+)?$")


@attrs.frozen(slots=True)
class _Staged:
    attempt: Attempt
    seqs: dict[str, SeqSet]
    rows: int
    rejected: Sequence[tuple[Record, BaseException]]


class SharedWriter:
    """The shared-mode half of a :class:`~headrace_spark.sink.SparkSink` (see the module
    docs); made by the sink's ``open``."""

    def __init__(
        self,
        sink: SparkSink,
        context: SinkContext,
        output: SharedOutput,
        coordinator: CommitCoordinator,
        limiter: trio.CapacityLimiter,
    ) -> None:
        self.sink = sink
        self.context = context
        self.output = output
        self.coordinator = coordinator
        self.limiter = limiter
        self._lock = trio.Lock()
        self._next_sweep = 0.0
        self._next_floor = 0.0
        self._floors: dict[StreamIdentity, int] = {}
        #: Attempts this worker committed and published: taken out of the state by its next
        #: commit (or at close). Only these: one whose commit was cut off is the sweep's.
        self._published: list[str] = []
        #: What the sweeps did since open.
        self.swept = SweepReport()
        #: Batches redone because another worker committed part of them first.
        self.redone = 0

    @classmethod
    async def open(
        cls, sink: SparkSink, context: SinkContext, root: Path, limiter: trio.CapacityLimiter
    ) -> SharedWriter:
        output = SharedOutput(
            root, kind="SparkSink", fsync=sink.fsync, exclusive_markers=("ledger",)
        )
        coordinator = await claim(
            output,
            context.js,
            owner=context.owner,
            worker=context.worker,
            bucket=context.commit_bucket,
            replicas=await context.replicas(),
            limiter=limiter,
        )
        writer = cls(sink, context, output, coordinator, limiter)
        try:
            await writer.sweep()
        except BaseException:
            output.release()
            raise
        return writer

    # -- the batch --------------------------------------------------------------------------

    async def write(self, batch: Batch, tag: str) -> CommitInfo | None:
        try:
            return await self._write(batch, tag)
        except StreamRecreated as exc:
            # Named by its directory, which `headrace outputs reset` takes (the state knows
            # only the output's id).
            raise StreamRecreated(
                str(self.output.root), exc.stream, exc.recorded, exc.current
            ) from None

    async def _write(self, batch: Batch, tag: str) -> CommitInfo | None:
        async with self._lock:
            if trio.current_time() >= self._next_sweep:
                await self.sweep()
            started = time.perf_counter()
            records, meta, duplicates, redelivered = await self._run(once_per_message, batch)
            keep = await self._uncommitted(records, meta, refresh=redelivered or duplicates > 0)
            keep_meta: BatchMetadata | None = meta if keep is records else None
            skipped = len(batch.records) - len(keep)
            for redo in range(MAX_REDO + 1):
                if not keep:
                    self.sink.duplicates_skipped += skipped
                    return None
                staged = await self._run(self.sink._stage_shared, keep, keep_meta, tag, self.output)
                outcome = await self.coordinator.commit(
                    staged.attempt,
                    await self._identified(staged.seqs),
                    floors=await self._floors_due(),
                    forget=self._published,
                )
                if isinstance(outcome, Committed):
                    self._published = []
                    break
                await self._run(self.output.discard, staged.attempt)
                if isinstance(outcome, Overlap):
                    keep, keep_meta = _without(keep, outcome.committed), None
                    skipped = len(batch.records) - len(keep)
                    self.redone += 1
                elif isinstance(outcome, Expired):
                    self.redone += 1
                if redo == MAX_REDO:
                    raise SparkSinkError(
                        f"{self.sink!r}: batch {batch.key} was redone {MAX_REDO} times, each "
                        "time meeting other workers' commits; it comes again"
                    )
            self.sink.duplicates_skipped += skipped
            info: CommitInfo = await self._run(
                self.sink._publish_shared, self.output, staged, skipped, started
            )
            self._published.append(staged.attempt.token)
        if staged.rejected:
            raise RecordsRejected(staged.rejected)
        return info

    async def _uncommitted(
        self, records: list[Record], meta: BatchMetadata, *, refresh: bool
    ) -> list[Record]:
        """The records the shared state does not hold, with the streams' identities checked."""
        if not records:
            return records
        seqs = meta.sequences()
        state = self.coordinator.state
        ids = await self._identified(seqs)
        if refresh or any(state.committed_part(i, s) for i, s in ids.items()):
            # Committed already, by this state: make sure of it (a fresh state, and the
            # streams' identities looked up again) before leaving anything out.
            state = await self.coordinator.refresh()
            ids = await self._identified(seqs, fresh=True)
        committed = {
            identity.name: found
            for identity, part in ids.items()
            if (found := state.committed_part(identity, part))
        }
        return _without(records, committed) if committed else records

    async def _identified(
        self, seqs: dict[str, SeqSet], *, fresh: bool = False
    ) -> dict[StreamIdentity, SeqSet]:
        out: dict[StreamIdentity, SeqSet] = {}
        for name, part in seqs.items():
            identity = await self.context.stream_identity(name, fresh=fresh)
            known = self.coordinator.state.streams.get(name)
            if known is not None and known.created != identity.created and not fresh:
                identity = await self.context.stream_identity(name, fresh=True)
            self.coordinator.state.check_identity(identity)
            out[identity] = part
        return out

    async def _floors_due(self) -> dict[StreamIdentity, int]:
        """The consumers' ack floors, looked up every ``FLOOR_INTERVAL`` seconds: they move
        the state's floors over sequences that never reach this sink (filtered, dead)."""
        now = trio.current_time()
        if now >= self._next_floor:
            self._next_floor = now + FLOOR_INTERVAL
            try:
                self._floors = await self.context.ack_floors()
            except Exception as exc:  # only an optimisation: the next look may work
                warnings.warn(
                    f"{self.sink!r}: could not read the consumers' ack floors ({exc!r})",
                    RuntimeWarning,
                    stacklevel=1,
                )
                self._floors = {}
            return self._floors
        return {}

    # -- recovery, and the end ------------------------------------------------------------

    async def sweep(self) -> SweepReport:
        """Publish what dead workers committed, delete their stale attempts."""
        report = await sweep(
            self.output,
            self.coordinator,
            stale_after=self.sink.stale_after,
            settle_after=min(SETTLE_AFTER, self.sink.stale_after),
            published=self._published,
            limiter=self.limiter,
        )
        self._next_sweep = trio.current_time() + self.sink.sweep_interval
        self.swept = SweepReport(
            rolled=self.swept.rolled + report.rolled,
            removed=self.swept.removed + report.removed,
            forgotten=self.swept.forgotten + report.forgotten,
        )
        if report.rolled and self.sink.target.partition_by:
            # Files another worker committed are in place now; a table learns its partitions.
            await self._run(self.sink._register, [])
        return report

    async def maintain(self) -> None:
        """Between batches: a sweep if one is due (a worker with nothing to write still
        finishes what dead workers left), and this worker's published attempts taken out."""
        if self._lock.locked():
            return
        async with self._lock:
            try:
                if trio.current_time() >= self._next_sweep:
                    await self.sweep()
                if self._published:
                    # Idle: the last attempt's files are in place; no next commit is coming
                    # soon to take it out of the state, so take it out now.
                    await self.coordinator.forget(self._published)
                    self._published = []
            except OutputConflict:
                raise
            except Exception as exc:
                # Upkeep, not a batch: the next turn tries again (a server failing over).
                self._next_sweep = trio.current_time() + self.sink.sweep_interval
                warnings.warn(
                    f"{self.sink!r}: the output's upkeep failed, tried again later ({exc!r})",
                    RuntimeWarning,
                    stacklevel=1,
                )

    async def close(self) -> None:
        """Publish what this worker committed and did not publish (a cut-off commit), take its
        attempts out of the state, release the output."""
        try:
            async with self._lock:
                await self.sweep()
                if self._published:
                    await self.coordinator.forget(self._published)
                    self._published = []
        finally:
            self.output.release()

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await trio.to_thread.run_sync(
            fn, *args, limiter=self.limiter, abandon_on_cancel=True
        )


def _without(records: list[Record], committed: dict[str, SeqSet]) -> list[Record]:
    out = []
    for record in records:
        seqs = committed.get(record.stream)
        if seqs is None or record.stream_seq not in seqs:
            out.append(record)
    return out
