"""The stage of a stateful operator: keyed state or windows, snapshotted, exactly once.

The rule a stateful operator keeps: **a message is acked only once everything it contributed
to is durable**, and **an output is emitted only once the state that made it is durable**.

- A record that reaches the operator changes its state and is *held* (its message is not
  acked). Outputs (a window's result, a stateful map's output) are not sent on at once: each
  gets the next result number and waits in the state.
- Every ``snapshot_interval`` seconds (or ``snapshot_every`` held messages) the stage saves a
  snapshot to KV (``headrace.state.snapshots``): the operator's state, the stream sequences it
  has taken in, the results not yet known to be committed, and the next result number. Once
  it is saved, the held records are released (their messages are acked when nothing else
  holds them) and the new results go on downstream.
- A result is a record of its own, with a stand-in delivery (``ResultDelivery``) whose
  metadata names the operator's results as a stream (``<pipeline>.<operator>``, the lineage
  of the state as its identity) and the result's number as its sequence. Sinks leave out what
  they already committed by (stream, sequence), so a result sent twice across a crash is
  written once. When a result's records are committed, the tracker tells the stage, which
  leaves it out of the next snapshot.
- On start the stage loads the snapshot, sends on every result it holds (the sinks drop those
  already written), and skips records whose (stream, sequence) the state already took in (a
  message redelivered because its ack was lost or came too late); those are held and acked
  with the next snapshot.

A crash loses only what no snapshot holds: those messages were not acked and come again.
Two processes running one operator are found out by the snapshot's compare-and-set
(``StateFenced``); the second stops.

Event time and watermarks are the window operator's (``headrace.state.windows``). A record
behind the watermark is late: dead-lettered at once with :class:`LateRecord` as its reason.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import pickle
import time
import zlib
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

from headrace.commits.identity import StreamIdentity, iso
from headrace.commits.seqset import SeqSet
from headrace.jetstream.ack_reply import AckMetadata
from headrace.jetstream.message import JsMsg
from headrace.jetstream.transient import retry_transient
from headrace.pipeline.record import Record, ResultDelivery
from headrace.pipeline.stages import Stage, _End
from headrace.protocol.events import Msg
from headrace.state.disk import BLOCK, StateFile, Unpacker, is_file_snapshot
from headrace.state.disk_keyed import DiskKeyedOperator
from headrace.state.disk_windows import DiskWindowOperator
from headrace.state.errors import (
    LateRecord,
    SnapshotCorrupt,
    StateConflict,
    StateConsumerChanged,
    StateLimitExceeded,
    StateStreamRecreated,
)
from headrace.state.keyed import KeyedOperator
from headrace.state.snapshots import SnapshotStore
from headrace.state.windows import WindowOperator, from_micros, to_micros

if TYPE_CHECKING:
    from headrace.jetstream.context import JetStream
    from headrace.pipeline.ack_tracker import AckTracker
    from headrace.pipeline.keyed import StateSpec
    from headrace.pipeline.nodes import Node

#: The snapshot's own format (inside the store's chunks).
SNAPSHOT_FORMAT = 1
#: How often (seconds) the sequences taken in are trimmed to the consumers' ack floors.
TRIM_INTERVAL = 10.0
#: Windows fired between two checkpoints (about 60 ms of work on this machine).
FIRE_SLICE = 10_000


class StatefulHost(Protocol):
    """What a stateful stage needs of its run: the JetStream context, the pipeline's name
    and state bucket, where its results' identity is made known to the sinks, and the ack
    floor of the consumer of a stream (messages at or below it never come again)."""

    @property
    def js(self) -> JetStream: ...

    @property
    def pipeline_name(self) -> str: ...

    @property
    def state_bucket(self) -> str: ...

    @property
    def result_identities(self) -> dict[str, StreamIdentity]: ...

    async def ack_floors(self) -> Mapping[str, int]: ...

    async def stream_identities(self, node: Node) -> dict[str, str]: ...

    def stream_consumers(self, node: Node) -> dict[str, list[str]]: ...

    def held_limit(self, node: Node) -> int: ...


@attrs.define(slots=True)
class StateStats:
    """What a stateful operator holds and has done, for progress views and metrics."""

    keys: int = 0
    open_windows: int = 0
    #: The watermark and the newest event time (seconds since the epoch), if any.
    watermark: float | None = None
    max_event_time: float | None = None
    late: int = 0
    held: int = 0
    results_pending: int = 0
    results_emitted: int = 0
    skipped_redeliveries: int = 0
    snapshots: int = 0
    snapshot_bytes: int = 0
    snapshot_seconds: float = 0.0
    epoch: int = 0
    #: The size of the state's file (bytes; ``backend="disk"``, else 0).
    state_file_bytes: int = 0
    #: Whether the operator is waiting for its sinks to commit results before taking more
    #: records (``max_pending_results``), and how often it did.
    backpressured: bool = False
    backpressure_waits: int = 0


class ResultMsg(JsMsg):
    """The stand-in message of a result (see the module docs): no reply, nothing to ack."""

    __slots__ = ()

    def __init__(self, subject: str, data: bytes, meta: AckMetadata) -> None:
        super().__init__(Msg(subject=subject, sid=0, reply=None, data=data), None, ack_none=True)  # type: ignore[arg-type]
        self._meta = meta


def _result_bytes(value: Any) -> bytes:
    """A result as bytes, for the stand-in message's body (a dead letter's copy)."""
    to_dict = getattr(value, "to_dict", None)
    try:
        return json.dumps(to_dict() if callable(to_dict) else value, default=str).encode()
    except (TypeError, ValueError):
        return repr(value).encode()


class StatefulStage(Stage):
    """Runs one ``stateful`` node (see the module docs)."""

    def __init__(self, node: Node, tracker: AckTracker, host: StatefulHost) -> None:
        super().__init__(f"stateful:{node.name}", node, tracker)
        spec = node.state
        assert spec is not None
        self.spec: StateSpec = spec
        self.host = host
        self.stats = StateStats()
        self.result_stream = f"{host.pipeline_name}.{node.name}"
        self.store: SnapshotStore | None = None
        self.lineage = ""
        self._keyed: KeyedOperator | None = None
        self._windows: WindowOperator | None = None
        #: Records taken in since the last snapshot: released once one holds them.
        self._held: list[Record] = []
        #: Per stream, the sequences the state has taken in (above the ack floor).
        self._taken: dict[str, SeqSet] = {}
        #: Results by number, not yet known to be committed (emitted or not).
        self._pending: dict[int, tuple[Any, int]] = {}
        self._next_seq = 1
        #: Results numbered up to this one have been sent on by this process.
        self._sent_upto = 0
        self._last_record_at: float | None = None
        self._trimmed_at = 0.0
        #: The creation time of each stream feeding the operator, and the durable consumers
        #: it is read through, kept in the snapshot.
        self._streams: dict[str, str] = {}
        self._consumers: dict[str, list[str]] = {}
        #: The newest event time of each input (a join's two sides), kept in the snapshot.
        self._side_max: list[int | None] = [None] * spec.sides
        self._dirty = False
        #: Set while no snapshot is being saved (one at a time).
        self._saved = trio.Event()
        self._saved.set()
        #: The operator's file, when its state is on disk; the copies a save streams.
        self._file: StateFile | None = None
        self._copies = 0
        #: Set when a result settles or a save ends: an operator waiting for its sinks
        #: looks again.
        self._wake = trio.Event()
        #: The last result number a captured snapshot holds.
        self._captured_upto = 0

    # -- results settling (told by the tracker) ---------------------------------------------

    def result_settled(self, seq: int, *, committed: bool) -> None:
        """Result ``seq`` is committed (or dead-lettered): the next snapshot leaves it out."""
        if self._pending.pop(seq, None) is not None:
            self._dirty = True
            self._wake.set()

    # -- running ----------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            if self._file is not None:
                self._file.close()

    async def _run(self) -> None:
        spec = self.spec
        self.store = await SnapshotStore.open(
            self.host.js, self.host.pipeline_name, self.node.name, bucket=self.host.state_bucket
        )
        self._make_operator()
        self._streams = await retry_transient(lambda: self.host.stream_identities(self.node))
        self._consumers = self.host.stream_consumers(self.node)
        await self._restore()
        self.host.result_identities[self.result_stream] = StreamIdentity(
            self.result_stream, self.lineage
        )
        await self._send_results()
        inbox = self.inbox
        due = trio.current_time() + spec.snapshot_interval
        # Held messages that call for a snapshot before the interval ends: a quarter of what
        # the sources may have in flight, so that they never wait on the interval for room.
        every = spec.snapshot_every or max(1, self.host.held_limit(self.node) // 4)
        async with trio.open_nursery() as nursery:
            while True:
                item: Any = None
                with trio.move_on_at(due):
                    if len(self._pending) >= spec.max_pending_results:
                        await self._wait_for_commits(nursery)
                    item = await inbox.receive()
                if item is None:  # the interval passed with nothing new
                    self._tick()
                    await self._fire_due()
                    self._start_snapshot(nursery)
                    due = trio.current_time() + spec.snapshot_interval
                    continue
                if isinstance(item, _End):
                    if self.ended():
                        # The last snapshot, after the one being saved: what it holds is acked
                        # and its results sent on before the END.
                        await self._fire_due()
                        await self._saved.wait()
                        if self._held or self._dirty:
                            await self._save(*self._capture())
                        await self.forward_end()
                        return
                    continue
                self._take(item)
                await self._fire_due()
                if len(self._held) >= every or trio.current_time() >= due:
                    self._tick()
                    await self._fire_due()
                    if self._start_snapshot(nursery):
                        due = trio.current_time() + spec.snapshot_interval

    async def _wait_for_commits(self, nursery: trio.Nursery) -> None:
        """Backpressure: the sinks have not committed ``max_pending_results`` results (a sink
        down, or slower than the windows fire). Taking more records would only add results
        to hold, in memory and in every snapshot; the records wait in the stream instead,
        since upstream blocks on this stage's full inbox. Results that no snapshot holds yet
        cannot go to the sinks, so a snapshot is started for them at once rather than at the
        interval: otherwise each round of results would wait out an interval."""
        stats = self.stats
        stats.backpressured = True
        stats.backpressure_waits += 1
        try:
            while len(self._pending) >= self.spec.max_pending_results:
                if self._next_seq - 1 > self._captured_upto:
                    self._start_snapshot(nursery)
                self._wake = trio.Event()
                await self._wake.wait()
        finally:
            stats.backpressured = False

    def _make_operator(self) -> None:
        spec = self.spec
        if spec.backend == "disk":
            self._file = StateFile(directory=spec.state_dir, cache_bytes=spec.cache_bytes)
        self._windows, self._keyed = self._operators(self._file)

    def _operators(
        self, file: StateFile | None
    ) -> tuple[WindowOperator | None, KeyedOperator | None]:
        """A new, empty operator of the spec's kind, kept in ``file`` if there is one."""
        spec = self.spec
        if spec.kind == "window":
            assert spec.assigner is not None and spec.aggregate is not None
            lateness = dt.timedelta(seconds=spec.lateness)
            windows = (
                WindowOperator(spec.assigner, spec.aggregate, lateness)
                if file is None
                else DiskWindowOperator(spec.assigner, spec.aggregate, lateness, file=file)
            )
            windows.follow_events = spec.sides == 1
            return windows, None
        assert spec.fn is not None
        if file is None:
            keyed = KeyedOperator(
                spec.fn, ttl=spec.ttl, max_keys=spec.max_keys, name=self.node.name
            )
        else:
            keyed = DiskKeyedOperator(
                spec.fn, file=file, ttl=spec.ttl, max_keys=spec.max_keys, name=self.node.name
            )
        return None, keyed

    # -- taking records in ------------------------------------------------------------------

    def _take(self, batch: list[Record]) -> None:
        spec = self.spec
        taken = self._taken
        held = self._held
        keyed, windows = self._keyed, self._windows
        sides = spec.sides
        now_wall = time.time()
        late: list[tuple[Record, LateRecord]] = []
        failed: list[tuple[Record, BaseException]] = []
        for record in batch:
            meta = record.delivery.msg.metadata
            seen = taken.get(meta.stream)
            if seen is None:
                seen = taken[meta.stream] = SeqSet()
            if meta.stream_seq in seen:
                self.stats.skipped_redeliveries += 1
                held.append(record)  # in the state already: acked with the next snapshot
                continue
            value = record.value
            try:
                key = spec.key(value)
                if windows is not None:
                    t = self._event_time(record, now_wall)
                    if not windows.add(key, t, value):
                        # Not marked taken: if its dead letter fails, it comes again and is
                        # judged again (still late: the watermark never goes back).
                        late.append((record, self._late(t)))
                        continue
                    if sides > 1:
                        self._side_seen(windows, value[0], t)
                else:
                    assert keyed is not None
                    output = keyed.apply(key, value, now_wall)
                    if output is not None:
                        self._add_result((key, output) if spec.pair else output, meta.timestamp_ns)
            except StateConflict:
                raise
            except Exception as exc:
                if self.node.on_error == "crash":
                    raise
                failed.append((record, exc))
                continue
            seen.add(meta.stream_seq)
            held.append(record)
        if batch:
            self._last_record_at = trio.current_time()
            self._dirty = True
        if self._file is not None:
            self._file.commit()
        for record, error in late:
            self.stats.late += 1
            self.tracker.failed([record], error, self.name, self.node.name, poison=True)
        for record, problem in failed:
            self.tracker.failed([record], problem, self.name, self.node.name)
        self.stats.held = len(held)

    def _side_seen(self, windows: WindowOperator, side: int, t: int) -> None:
        """A record of input ``side`` at ``t``: the watermark of an operator of several inputs
        is the least of their newest event times (less the lateness), so that an input read
        ahead of another does not make the other's records late; none before every input
        has had a record."""
        newest = self._side_max
        seen = newest[side]
        if seen is None or t > seen:
            newest[side] = t
            known = [n for n in newest if n is not None]
            if len(known) == len(newest):
                windows.advance_to(min(known) - windows.lateness_us)

    def _event_time(self, record: Record, now_wall: float) -> int:
        source = self.spec.event_time
        if source == "stored":
            return record.delivery.msg.metadata.timestamp_ns // 1000
        if source == "processing":
            return int(now_wall * 1_000_000)
        assert callable(source)
        return to_micros(source(record.value))

    def _late(self, t: int) -> LateRecord:
        windows = self._windows
        assert windows is not None
        mark = windows.watermark
        return LateRecord(
            self.node.name,
            from_micros(t).isoformat(),
            from_micros(mark).isoformat() if mark is not None else "none",
        )

    def _tick(self) -> None:
        """The clock's part: processing-time windows and idle sources move the watermark
        (the caller fires what that makes due)."""
        windows = self._windows
        if windows is None:
            if self._keyed is not None and self._keyed.expire(time.time()):
                self._dirty = True
            return
        spec = self.spec
        if spec.event_time == "processing":
            windows.advance_to(int((time.time() - spec.lateness) * 1_000_000))
        elif spec.idle is not None and self._last_record_at is not None:
            quiet = trio.current_time() - self._last_record_at
            newest = windows.max_event_time
            if quiet >= spec.idle and newest is not None:
                windows.advance_to(newest + int((quiet - spec.lateness) * 1_000_000))

    async def _fire_due(self) -> None:
        """Number the windows the watermark has passed as results, a slice of
        :data:`FIRE_SLICE` at a time with a checkpoint between: one watermark move can close
        a window of every key (631,000 at once in `bench windows` with a million users),
        whose firing in one go held the event loop past the connection's 5 s flush. Every
        due window is fired, whatever ``max_pending_results`` says: bounding the firing by it
        made a burst drain one limit's worth per snapshot, each snapshot the whole state (the
        same bench's drain timed out with most windows unsent); the limit stops the intake
        instead. Then the operator's bound on keys."""
        windows = self._windows
        if windows is None:
            return
        while True:
            fired = windows.fire(FIRE_SLICE)
            for result in fired:
                self._add_result(result, to_micros(result.end) * 1000)
            if len(fired) < FIRE_SLICE:
                break
            await trio.lowlevel.checkpoint()
        if self._file is not None:
            self._file.commit()
        spec = self.spec
        if spec.max_keys is not None and windows.keys > spec.max_keys:
            raise StateLimitExceeded(
                f"{self.node.name!r} holds windows of {windows.keys} keys, over its max_keys "
                f"({spec.max_keys})"
            )

    def _add_result(self, value: Any, timestamp_ns: int) -> None:
        seq = self._next_seq
        self._next_seq = seq + 1
        self._pending[seq] = (value, timestamp_ns)
        self._dirty = True

    # -- snapshots --------------------------------------------------------------------------

    def _start_snapshot(self, nursery: trio.Nursery) -> bool:
        """Start saving a snapshot of the state as it is now, in the background, unless one is
        being saved or nothing changed; whether one started. The state is captured (pickled)
        at once, with the records it holds and the results it numbered: the save releases
        and sends on those only, while the stage goes on taking records (a save is a few KV
        round trips, which on a busy machine took 55 ms each: 36-40% of the stage's time in
        `bench windows` when it waited for them)."""
        if not self._saved.is_set() or not (self._held or self._dirty):
            return False
        self._saved = trio.Event()
        nursery.start_soon(self._save_in_background, *self._capture())
        return True

    def _capture(self) -> tuple[bytes | str, list[Record], int]:
        """The snapshot (its bytes; for an operator on disk, the path of a copy of its file),
        the records it covers and the last result number it holds; the stage's held records
        start afresh."""
        file = self._file
        if file is None:
            payload: bytes | str = zlib.compress(pickle.dumps(self._state(), protocol=5), 1)
        else:
            operator = self._windows if self._windows is not None else self._keyed
            assert isinstance(operator, DiskWindowOperator | DiskKeyedOperator)
            operator.checkpoint()
            file.set_meta("stage", self._state(operator=False))
            self._copies += 1
            payload = f"{file.path}.snapshot-{self._copies}"
            file.backup(payload)
            self.stats.state_file_bytes = file.size()
        held, self._held = self._held, []
        self.stats.held = 0
        self._dirty = False
        self._captured_upto = self._next_seq - 1
        return payload, held, self._captured_upto

    async def _save_in_background(
        self, payload: bytes | str, held: list[Record], upto: int
    ) -> None:
        try:
            await self._save(payload, held, upto)
        finally:
            self._saved.set()
            self._wake.set()

    async def _save(self, payload: bytes | str, held: list[Record], upto: int) -> None:
        """Save a captured snapshot; then ack what it covers and send on its results (those
        numbered up to ``upto``: later ones are in no saved snapshot yet)."""
        store = self.store
        assert store is not None
        started = trio.current_time()
        if isinstance(payload, bytes):
            head = await store.save(payload, self.lineage)
        else:
            try:
                head = await store.save_parts(_compressed(payload), self.lineage)
            finally:
                with contextlib.suppress(OSError):
                    os.remove(payload)
        stats = self.stats
        stats.snapshots += 1
        stats.epoch = head.epoch
        stats.snapshot_bytes = head.size
        stats.snapshot_seconds += trio.current_time() - started
        if held:
            self.tracker.release(held)
        self._note_stats()
        await self._send_results(upto)
        await self._trim()

    def _state(self, *, operator: bool = True) -> dict[str, Any]:
        """The stage's snapshot as plain data; without the ``operator``'s own state for an
        operator on disk, whose file holds it."""
        windows, keyed = self._windows, self._keyed
        return {
            "format": SNAPSHOT_FORMAT,
            "kind": self.spec.kind,
            "next_seq": self._next_seq,
            "pending": sorted(self._pending.items()),
            "taken": {name: seqs.intervals for name, seqs in self._taken.items() if seqs},
            "windows": windows.snapshot() if windows is not None and operator else None,
            "keyed": keyed.snapshot() if keyed is not None and operator else None,
            "late": self.stats.late,
            "streams": self._streams,
            "consumers": self._consumers,
            "sides": self._side_max,
        }

    async def _restore(self) -> None:
        store = self.store
        assert store is not None
        parts = await store.load_parts()
        if parts is None:
            self.lineage = iso(dt.datetime.now(dt.UTC))
            return
        try:
            self._restore_state(await self._receive(parts))
        except (StateConflict, KeyboardInterrupt):
            raise
        except Exception as exc:
            raise SnapshotCorrupt(
                f"{store.where}: snapshot epoch {store.epoch} does not restore into this "
                f"operator ({type(exc).__name__}: {exc}); was the operator changed? "
                "`headrace state reset` starts it afresh"
            ) from exc
        assert store.head is not None  # every part read: the head is the snapshot's
        self.lineage = store.head.lineage
        self.stats.epoch = store.epoch
        self._note_stats()

    async def _receive(self, parts: AsyncIterator[bytes]) -> bytes | StateFile:
        """A snapshot's bytes, or for a copy of a disk operator's file (told by its first
        part: a whole chunk, or the whole snapshot) the file, written as the parts come: a
        snapshot larger than memory is never held whole."""
        first = await anext(parts, b"")
        if not is_file_snapshot(first):
            return b"".join([first, *[part async for part in parts]])
        unpacker = Unpacker(directory=self.spec.state_dir, cache_bytes=self.spec.cache_bytes)
        try:
            unpacker.feed(first)
            async for part in parts:
                unpacker.feed(part)
        except BaseException:
            unpacker.abandon()
            raise
        return unpacker.finish()

    def _restore_state(self, payload: bytes | StateFile) -> None:
        """Take the state a snapshot holds, whichever backend saved it: a zlib stream of the
        pickled stage state, or a copy of a disk operator's file. Either goes into either
        backend: a plain snapshot is read into memory or written into the file; a file is
        opened in place (disk) or read into memory."""
        if isinstance(payload, bytes):
            state = pickle.loads(zlib.decompress(payload))
            self._take_stage_state(state)
            self._take_operator_state(state["windows"], state["keyed"])
            return
        saved = payload
        try:
            windows, keyed = self._reopened(saved)
            state = saved.get_meta("stage")
            if self._file is None:  # the operator runs in memory: read the file's state out
                plain_windows = windows.snapshot() if windows is not None else None
                plain_keyed = keyed.snapshot() if keyed is not None else None
        except BaseException:
            saved.close()
            raise
        if self._file is None:
            saved.close()
            self._take_stage_state(state)
            self._take_operator_state(plain_windows, plain_keyed)
            return
        self._file.close()
        self._file = saved
        self._windows, self._keyed = windows, keyed
        self._take_stage_state(state)

    def _reopened(
        self, file: StateFile
    ) -> tuple[DiskWindowOperator | None, DiskKeyedOperator | None]:
        """The operator whose state a restored snapshot's ``file`` holds."""
        windows, keyed = self._operators(file)
        if isinstance(windows, DiskWindowOperator):
            windows.load_checkpoint()
            return windows, None
        assert isinstance(keyed, DiskKeyedOperator)
        keyed.reopen()
        return None, keyed

    def _take_stage_state(self, state: Any) -> None:
        if state["format"] > SNAPSHOT_FORMAT or state["kind"] != self.spec.kind:
            raise ValueError(f"format {state['format']} of kind {state['kind']!r}")
        self._check_streams(state.get("streams") or {})
        self._check_consumers(state.get("consumers") or {})
        self._next_seq = state["next_seq"]
        self._pending = dict(state["pending"])
        self._taken = {name: SeqSet(ivs) for name, ivs in state["taken"].items()}
        self._side_max = list(state.get("sides") or self._side_max)
        self.stats.late = state.get("late", 0)

    def _take_operator_state(self, windows: Any, keyed: Any) -> None:
        """Load a plain snapshot of the operator into the (new, empty) operator."""
        spec = self.spec
        if self._windows is not None:
            assert spec.assigner is not None and spec.aggregate is not None
            lateness = dt.timedelta(seconds=spec.lateness)
            if self._file is None:
                self._windows = WindowOperator.restore(
                    spec.assigner, spec.aggregate, lateness, windows
                )
            else:
                self._windows = DiskWindowOperator.restore_into(
                    spec.assigner, spec.aggregate, lateness, windows, self._file
                )
            self._windows.follow_events = spec.sides == 1
        if self._keyed is not None:
            self._keyed.restore(keyed)

    def _check_streams(self, saved: Mapping[str, str]) -> None:
        """The snapshot's sequences name messages of the streams as they were when it was
        saved: a stream deleted and created again under the same name starts its sequences
        over, and the state would skip its new messages as taken. Refused in words."""
        for name, created in saved.items():
            now = self._streams.get(name)
            if now is not None and now != created:
                raise StateStreamRecreated(
                    f"{self.store.where if self.store else self.name}: stream {name!r} was "
                    f"created again (at {now}; the state holds messages of the one created at "
                    f"{created}): its sequences start over. `headrace state reset` starts the "
                    "operator afresh"
                )

    def _check_consumers(self, saved: Mapping[str, list[str]]) -> None:
        """The snapshot's sequences were taken from what its consumers delivered, and trimmed
        to their ack floors: another consumer of the stream would deliver again what the
        state already counted (or, starting at new messages, skip what it has not), silently.
        Refused in words (a pipeline renamed its durable, or two pipelines share a name)."""
        where = self.store.where if self.store else self.name
        for stream, names in saved.items():
            now = self._consumers.get(stream)
            if now is not None and sorted(now) != sorted(names):
                raise StateConsumerChanged(
                    f"{where}: the state holds what consumer {', '.join(names)} of stream "
                    f"{stream!r} delivered; this pipeline reads it through "
                    f"{', '.join(now)}, which would deliver again what the state counted. Go "
                    "back to that consumer, or `headrace state reset` to start the operator "
                    "afresh (or give this pipeline a name of its own)"
                )

    async def _trim(self) -> None:
        """Forget the sequences at or below each stream's ack floor: those never come
        again, and the set would otherwise grow with every message."""
        now = trio.current_time()
        if now - self._trimmed_at < TRIM_INTERVAL or not self._taken:
            return
        self._trimmed_at = now
        try:
            floors = await self.host.ack_floors()
        except Exception:  # a trim can wait: the set is only larger meanwhile
            return
        for name, floor in floors.items():
            seqs = self._taken.get(name)
            if seqs is not None and floor > 0:
                seqs.discard_through(floor)

    async def _send_results(self, upto: int | None = None) -> None:
        """Send on the results numbered after what this process sent, up to ``upto`` (all of
        them, after a restore): each as a record of its own stand-in delivery."""
        last = self._next_seq - 1 if upto is None else upto
        fresh = [(seq, v) for seq, v in self._pending.items() if self._sent_upto < seq <= last]
        if not fresh:
            return
        fresh.sort()
        now = trio.current_time()
        stream, name = self.result_stream, self.node.name
        records = []
        for seq, (value, timestamp_ns) in fresh:
            meta = AckMetadata(stream, name, 1, seq, seq, timestamp_ns, 0)
            msg = ResultMsg(stream, _result_bytes(value), meta)
            records.append(Record(value, ResultDelivery(msg, now, self.name, self, seq)))
        self._sent_upto = fresh[-1][0]
        self.stats.results_emitted += len(records)
        await self.forward(records)

    def _note_stats(self) -> None:
        stats = self.stats
        stats.results_pending = len(self._pending)
        windows = self._windows
        if windows is not None:
            stats.keys = windows.keys
            stats.open_windows = windows.open_windows
            mark, newest = windows.watermark, windows.max_event_time
            stats.watermark = None if mark is None else mark / 1e6
            stats.max_event_time = None if newest is None else newest / 1e6
        elif self._keyed is not None:
            stats.keys = self._keyed.keys
        if self._file is not None:
            stats.state_file_bytes = self._file.size()


async def _compressed(path: str) -> AsyncIterator[bytes]:
    """The file at ``path`` as a zlib stream, read and compressed a block at a time in a
    thread (a large file would otherwise stall every other task of the pipeline)."""
    compressor = zlib.compressobj(1)

    def block(f: Any) -> tuple[bytes, bool]:
        data = f.read(BLOCK)
        if not data:
            return compressor.flush(), True
        return compressor.compress(data), False

    f = await trio.to_thread.run_sync(open, path, "rb")
    try:
        done = False
        while not done:
            part, done = await trio.to_thread.run_sync(block, f)
            if part:
                yield part
    finally:
        f.close()
