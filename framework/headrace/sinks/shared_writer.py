"""The write path of a file sink whose output is shared by workers: the commit protocol
(headrace.commits) around the sink's own way of writing files. The Spark sink and the jsonl
sink use it; a plugin writing files can too (docs/sinks.md, "Sharing an output").

Per batch (:meth:`SharedWriter.write`):

1. the records whose sequences the shared state holds are left out (a redelivery, or a batch
   another worker committed first). If any are, or the batch holds redeliveries, the state is
   read afresh first and the streams' identities looked up again: a stream recreated under
   its name must not pass for the old one (:class:`~headrace.commits.errors.StreamRecreated`);
2. the sink's ``stage`` writes the rest as a new attempt under ``_headrace/staging/<token>/``,
   each file at the path it will have in the output, fsynced (in a worker thread);
3. the commit, a compare-and-set on the state. If another worker committed part of these
   records meanwhile, the attempt is thrown away and the rest staged again (or nothing, if
   nothing is left); an attempt too old to commit (the horizon passed it) is staged again;
4. the files are renamed into place, and the sink's ``published`` hook runs (its counters, a
   table's catalog): only then does ``write_batch`` return and the pipeline ack.

Records left out as committed are acked too: before that, every attempt the state holds as
committed and not yet in place is put in place (its worker may have died between its commit
and its rename). So a record is visible in the output before any of its messages is acked,
whichever worker acks it.

A crash, a SIGKILL or a stall anywhere is recovered by any worker's sweep (shared_output.py):
before 3 the attempt is garbage, deleted once stale; after it, whoever sweeps publishes it.
Records are never written twice: only committed attempts are published, and an attempt commits
only records no other commit holds.

The sink also hands over messages delivered twice into one batch (a delivery and its
redelivery, taken together after a stall): :func:`once_per_message` keeps the first.
"""

from __future__ import annotations

import functools
import operator
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from headrace.commits.coordinator import CommitCoordinator
from headrace.commits.errors import OutputConflict, StreamRecreated
from headrace.commits.identity import Attempt, StreamIdentity
from headrace.commits.seqset import SeqSet
from headrace.commits.state import Committed, Expired, Overlap
from headrace.pipeline.sink import SinkError
from headrace.sinks.shared_output import (
    SETTLE_AFTER,
    STALE_AFTER,
    SWEEP_INTERVAL,
    SharedOutput,
    SweepReport,
    claim,
    sweep,
)

if TYPE_CHECKING:
    from headrace.pipeline.record import Record
    from headrace.pipeline.sink import SinkContext

#: A batch that keeps meeting other workers' commits is redone at most this many times (each
#: time with fewer records) before it fails and comes again.
MAX_REDO = 20
#: Seconds between two reports of the consumers' ack floors into the state.
FLOOR_INTERVAL = 10.0


@attrs.frozen(slots=True)
class Staged:
    """What a sink's ``stage`` wrote: the attempt, the sequences of the records it holds (per
    stream name), how many rows, the records it set aside as never writable (raised as
    ``RecordsRejected`` once the rest is committed), and anything the sink wants back in its
    ``published`` hook."""

    attempt: Attempt
    seqs: Mapping[str, SeqSet]
    rows: int
    rejected: Sequence[tuple[Record, BaseException]] = ()
    extra: Any = None


def batch_key(seqs: Mapping[str, SeqSet]) -> str:
    """``ORDERS-1-100`` (``+`` between streams): the ranges of a set of records."""
    return "+".join(
        f"{stream}-{s.intervals[0][0]}-{s.intervals[-1][1]}" for stream, s in sorted(seqs.items())
    )


def sequences(records: Sequence[Record]) -> dict[str, SeqSet]:
    """The sequences of ``records`` per stream (a sink with a faster way passes its own)."""
    by_stream: dict[str, list[int]] = {}
    for record in records:
        by_stream.setdefault(record.stream, []).append(record.stream_seq)
    return {stream: SeqSet.of(seqs) for stream, seqs in by_stream.items()}


def once_per_message(
    records: list[Record], seqs: Mapping[str, SeqSet] | None = None
) -> tuple[list[Record], int]:
    """``records`` without those of a second delivery of a message the batch already holds
    (the first delivery's are kept), and how many were left out. ``seqs``: the batch's
    sequences, if known: distinct messages are then counted without a pass per record, and
    records are looked at one by one only when there are fewer than deliveries."""
    if not records:
        return records, 0
    if seqs is None:
        seqs = sequences(records)
    messages = sum(len(s) for s in seqs.values())
    deliveries = len(set(map(operator.attrgetter("delivery"), records)))
    if messages == deliveries:
        return records, 0
    first: dict[tuple[str, int], object] = {}
    kept: list[Record] = []
    for record in records:
        owner = first.setdefault((record.stream, record.stream_seq), record.delivery)
        if owner is record.delivery:
            kept.append(record)
    return kept, len(records) - len(kept)


class SharedWriter:
    """One worker's side of an output shared by workers (see the module docs). Made by
    :meth:`open` in the sink's ``open``; ``write`` per batch, ``maintain`` when idle, ``close``.

    ``stats``: ``skipped`` records left out as committed, ``redone`` attempts staged again
    after meeting other commits, ``swept`` what the sweeps did.
    """

    def __init__(
        self,
        context: SinkContext,
        output: SharedOutput,
        coordinator: CommitCoordinator,
        *,
        limiter: trio.CapacityLimiter,
        stale_after: float = STALE_AFTER,
        sweep_interval: float = SWEEP_INTERVAL,
    ) -> None:
        self.context = context
        self.output = output
        self.coordinator = coordinator
        self.limiter = limiter
        self.stale_after = stale_after
        self.sweep_interval = sweep_interval
        self._lock = trio.Lock()
        self._next_sweep = 0.0
        self._next_floor = 0.0
        #: Seconds between two looks at the consumers' ack floors.
        self.floor_interval = FLOOR_INTERVAL
        #: Attempts this worker committed and published: taken out of the state by its next
        #: commit (or when idle, or at close). Only these: one whose commit was cut off (in
        #: doubt) is left to the sweep, which publishes it first.
        self._published: list[str] = []
        self.swept = SweepReport()
        self.redone = 0
        self.skipped = 0
        #: Called (in the loop) with each sweep's report: the sink learns of published files.
        self.on_sweep: Callable[[SweepReport], Any] | None = None

    @classmethod
    async def open(
        cls,
        context: SinkContext,
        root: Path,
        *,
        kind: str,
        fsync: bool = True,
        exclusive_markers: Sequence[str] = (),
        limiter: trio.CapacityLimiter | None = None,
        stale_after: float = STALE_AFTER,
        sweep_interval: float = SWEEP_INTERVAL,
    ) -> SharedWriter:
        """Claim ``root`` for this worker (made, or joined) and sweep it once."""
        limiter = limiter or trio.CapacityLimiter(1)
        output = SharedOutput(root, kind=kind, fsync=fsync, exclusive_markers=exclusive_markers)
        coordinator = await claim(
            output,
            context.js,
            owner=context.owner,
            worker=context.worker,
            bucket=context.commit_bucket,
            replicas=await context.replicas(),
            limiter=limiter,
        )
        writer = cls(
            context,
            output,
            coordinator,
            limiter=limiter,
            stale_after=stale_after,
            sweep_interval=sweep_interval,
        )
        try:
            if context.nursery is not None:
                # The other workers' commits come as they land: this worker's next
                # compare-and-set names the current revision (coordinator.py, watch).
                await context.nursery.start(coordinator.watch)
            await writer.sweep()
        except BaseException:
            output.release()
            raise
        return writer

    # -- the batch --------------------------------------------------------------------------

    async def write(
        self,
        records: list[Record],
        seqs: Mapping[str, SeqSet],
        *,
        stage: Callable[[list[Record]], Staged],
        published: Callable[[Staged, list[str], int], Any],
        refresh: bool = False,
    ) -> Any:
        """Commit ``records`` (whose sequences are ``seqs``) exactly once (see the module
        docs); ``stage(records)`` and ``published(staged, files, skipped)`` run in a worker
        thread. ``refresh``: read the state afresh first (the batch holds redeliveries).
        Returns what ``published`` returned, or None when nothing was left to write."""
        try:
            async with self._lock:
                return await self._write(records, seqs, stage, published, refresh)
        except StreamRecreated as exc:
            # Named by its directory, which `headrace outputs reset` takes (the state knows
            # only the output's id).
            raise StreamRecreated(
                str(self.output.root), exc.stream, exc.recorded, exc.current
            ) from None

    async def _write(
        self,
        records: list[Record],
        seqs: Mapping[str, SeqSet],
        stage: Callable[[list[Record]], Staged],
        published: Callable[[Staged, list[str], int], Any],
        refresh: bool,
    ) -> Any:
        if trio.current_time() >= self._next_sweep:
            await self.sweep()
        total = len(records)
        keep = await self._uncommitted(records, seqs, refresh=refresh)
        for redo in range(MAX_REDO + 1):
            if len(keep) < total:
                # Some records were committed by another attempt, perhaps of a worker that
                # died before it put the files in place: its messages are then about to be
                # acked, here, so its files must be visible first. (Idempotent, and cheap
                # when they are: nothing is staged any more.)
                await self._publish_committed()
            if not keep:
                self.skipped += total
                return None
            staged: Staged = await self._run(stage, keep)
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
            self.redone += 1
            if isinstance(outcome, Overlap):
                keep = _without(keep, outcome.committed)
            elif not isinstance(outcome, Expired):  # pragma: no cover - the three outcomes
                raise AssertionError(outcome)
            if redo == MAX_REDO:
                raise SinkError(
                    f"{self.output.root}: a batch was redone {MAX_REDO} times, each time "
                    "meeting other workers' commits; it comes again"
                )
        skipped = total - len(keep)
        self.skipped += skipped
        files = await self._run(self.output.publish, staged.attempt.token)
        self._published.append(staged.attempt.token)
        return await self._run(published, staged, files, skipped)

    async def _publish_committed(self) -> None:
        """Put in place every attempt the state holds as committed and not yet published
        (other workers' included, dead or alive: publishing is idempotent, and two workers
        renaming the same files is harmless). A worker acks records it found committed only
        after this, so a record is visible before any of its messages is acked."""
        placed: list[str] = []
        rolled = 0
        for token, unpublished in sorted(self.coordinator.state.unpublished.items()):
            if token in self._published:
                continue  # this worker's, in place already
            placed += await self._run(self.output.publish, token, unpublished.replaces)
            rolled += 1
        if placed and self.on_sweep is not None:
            self.on_sweep(SweepReport(rolled=rolled, files=tuple(placed)))

    async def _uncommitted(
        self, records: list[Record], seqs: Mapping[str, SeqSet], *, refresh: bool
    ) -> list[Record]:
        """The records the state does not hold, the streams' identities checked."""
        if not records:
            return records
        state = self.coordinator.state
        ids = await self._identified(seqs)
        if refresh or any(state.committed_part(i, s) for i, s in ids.items()):
            # Committed already, says this state: make sure of it (a fresh state, and the
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
        self, seqs: Mapping[str, SeqSet], *, fresh: bool = False
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
        """The consumers' ack floors, every ``FLOOR_INTERVAL`` seconds: they move the state's
        floors over sequences that never reach this sink (filtered, dead-lettered), so the
        state stays small. Only an optimisation: a failure to read them is a warning."""
        now = trio.current_time()
        if now < self._next_floor:
            return {}
        self._next_floor = now + self.floor_interval
        try:
            return await self.context.ack_floors()
        except Exception as exc:
            warnings.warn(
                f"{self.output.root}: could not read the consumers' ack floors ({exc!r})",
                RuntimeWarning,
                stacklevel=1,
            )
            return {}

    # -- recovery, upkeep, the end ----------------------------------------------------------

    async def sweep(self) -> SweepReport:
        """Publish what dead workers committed, delete their stale attempts."""
        report = await sweep(
            self.output,
            self.coordinator,
            stale_after=self.stale_after,
            settle_after=min(SETTLE_AFTER, self.stale_after),
            published=self._published,
            limiter=self.limiter,
        )
        self._next_sweep = trio.current_time() + self.sweep_interval
        self.swept = SweepReport(
            rolled=self.swept.rolled + report.rolled,
            removed=self.swept.removed + report.removed,
            forgotten=self.swept.forgotten + report.forgotten,
        )  # (counts only: the files are the report's, for on_sweep)
        if self.on_sweep is not None:
            self.on_sweep(report)
        return report

    async def maintain(self) -> None:
        """Between batches: a sweep if one is due (a worker with nothing to write still
        finishes what dead workers left), this worker's published attempts taken out, and the
        consumers' ack floors reported when due."""
        if self._lock.locked():
            return
        async with self._lock:
            try:
                if trio.current_time() >= self._next_sweep:
                    await self.sweep()
                if self._published:
                    await self.coordinator.forget(self._published)
                    self._published = []
                floors = await self._floors_due()
                if floors:
                    # Idle: what the consumers settled without this sink (filtered, dead
                    # letters) is folded into the floors now, not at the next commit.
                    await self.coordinator.report_floors(floors)
            except OutputConflict:
                raise
            except Exception as exc:
                # Upkeep, not a batch: the next turn tries again (a server failing over).
                self._next_sweep = trio.current_time() + self.sweep_interval
                warnings.warn(
                    f"{self.output.root}: upkeep failed, tried again later ({exc!r})",
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

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        call = functools.partial(fn, *args)
        return await trio.to_thread.run_sync(call, limiter=self.limiter, abandon_on_cancel=True)


def _without(records: list[Record], committed: Mapping[str, SeqSet]) -> list[Record]:
    out = []
    for record in records:
        seqs = committed.get(record.stream)
        if seqs is None or record.stream_seq not in seqs:
            out.append(record)
    return out
