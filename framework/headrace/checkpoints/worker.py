"""Checkpoint workers: take lagging checkpoints and dispatch each entity's messages, in order,
one at a time, to its subscription's handler (Beckett's model).

A worker reserves a checkpoint (compare-and-set, so two hosts never process it at once), reads
the entity's messages after its position with ADR-31 batched direct gets (``next_by_subj`` =
``<entity>.>``; 1, 2, 4, ... up to 64 a request), calls the handler for those the subscription
matches, and advances the position after each one, so a crash re-delivers at most the message being
handled. A handler error puts the checkpoint into retry (or failed) as the retry policy says;
other checkpoints go on. A reservation left by a killed host expires; the recovery task (every
``recovery_interval``, a minute by default) releases it, and the watch hands it out.

Which checkpoints have work comes from a watch of the group's checkpoints (backlog.py): the
cost is per change, not per checkpoint, and a new event is taken as soon as the global consumer
raises its checkpoint's version. A poll of every checkpoint every ``poll_interval`` (30 s) is
only the safety net. Neither a failed watch nor a failed poll ends :meth:`CheckpointWorkers.run`:
a server restarting or a stream without a leader is said and waited out.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import attrs
import trio

from headrace.checkpoints.backlog import Backlog
from headrace.checkpoints.checkpoint import (
    AlreadyReserved,
    Checkpoint,
    CheckpointError,
    CheckpointId,
    ReservationLost,
    Status,
)
from headrace.checkpoints.fencing import (
    HandlerContext,
    expiry_deadline,
    lose,
    renew_once,
    takes_context,
)
from headrace.checkpoints.retry import GiveUp, Retry, RetryPolicy
from headrace.checkpoints.store import CheckpointStore, Stored
from headrace.checkpoints.stream_check import MissingEvents
from headrace.checkpoints.subscription import Handler, Subscription, SubscriptionGroup
from headrace.jetstream import JetStream
from headrace.jetstream.direct_batch import BatchGetUnsupported
from headrace.jetstream.errors import MessageNotFound
from headrace.jetstream.kv import Entry, KeyNotFound, Operation
from headrace.jetstream.stored_message import StoredMessage

DEFAULT_RESERVATION = 300.0
#: Seconds between safety-net polls: every checkpoint of the group read, so rarely.
DEFAULT_POLL_INTERVAL = 30.0
#: The most of an entity's messages one read asks for (one batched Direct Get).
READ_AHEAD = 64


def default_concurrency() -> int:
    """Beckett's default: five per CPU, at most 20."""
    return min((os.cpu_count() or 1) * 5, 20)


@attrs.define(slots=True)
class CheckpointWorkers:
    """Processes ``group``'s checkpoints from ``stream``; :meth:`run` until cancelled."""

    js: JetStream
    stream: str
    group: SubscriptionGroup
    store: CheckpointStore
    owner: str = attrs.field(factory=lambda: f"{os.uname().nodename}-{secrets.token_hex(4)}")
    concurrency: int = attrs.field(factory=default_concurrency)
    reservation: float = DEFAULT_RESERVATION
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    #: The safety-net poll of every checkpoint (work normally arrives through the watch).
    poll_interval: float = DEFAULT_POLL_INTERVAL
    #: How often expired reservations (a killed host's) are released for others to take.
    recovery_interval: float = 60.0
    clock: Callable[[], float] = time.time
    #: Messages handled, handler failures, since start.
    handled: int = 0
    failures: int = 0
    #: Polls of the group's checkpoints done.
    polls: int = 0
    #: What keeps the watch or the poll from the bucket right now (a server restarting, no
    #: stream leader), or None; and how many such failures since start.
    outage: str | None = None
    outages: int = 0
    #: Reservations lost while processing (taken over after a stall, or released by hand).
    lost: int = 0
    #: Checkpoints failed because events they counted were gone from the stream.
    missing: int = 0
    #: The checkpoints being processed: what their handlers know of the reservation, and the
    #: processing's cancel scope (a lost reservation cancels it).
    _holding: dict[CheckpointId, _Holding] = attrs.field(factory=dict, init=False, repr=False)
    #: Per subscription: whether its handler takes a HandlerContext as second argument.
    _with_context: dict[str, bool] = attrs.field(factory=dict, init=False, repr=False)
    #: Checkpoints whose release failed (a server restart), with the claim's fencing token.
    _unreleased: dict[CheckpointId, int] = attrs.field(factory=dict, init=False, repr=False)
    #: This worker's last write of each checkpoint it holds (store.change's ``current``).
    _last: dict[CheckpointId, Stored] = attrs.field(factory=dict, init=False, repr=False)
    #: Whether the server answers batched Direct Gets (it does from 2.11).
    _batches: bool = attrs.field(default=True, init=False, repr=False)
    #: The last errors outside handlers (checkpoint, error), at most 100.
    errors: list[tuple[CheckpointId, Exception]] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        missing = [s.name for s in self.group.subscriptions if s.handler is None]
        if missing:
            raise ValueError(f"subscriptions without a handler: {missing}")
        self._with_context = {
            s.name: s.handler is not None and takes_context(s.handler)
            for s in self.group.subscriptions
        }
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {self.concurrency}")
        if self.reservation <= 0 or self.poll_interval <= 0 or self.recovery_interval <= 0:
            raise ValueError("reservation, poll_interval and recovery_interval must be positive")

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Process the group's work until cancelled, riding out server restarts and leader
        changes: a watch of the group's checkpoints feeds the backlog (so a new event is
        taken as soon as the global consumer raises its version), a poll every
        ``poll_interval`` is the safety net, and either one failing is said
        (:attr:`outage`, a warning) and tried again, never the end of the host."""
        busy: set[CheckpointId] = set()
        backlog = Backlog(frozenset(s.name for s in self.group.subscriptions))
        slots = trio.Semaphore(self.concurrency)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._recover_expired)
            nursery.start_soon(self._release_left)
            nursery.start_soon(self._keep_held, nursery)
            await nursery.start(self._watch, backlog)
            nursery.start_soon(self._poll, backlog)
            task_status.started()
            while True:
                # Only as many as can run: the rest wait in the backlog, not as tasks.
                for seen in backlog.due(self.clock(), busy, slots.value):
                    slots.acquire_nowait()
                    busy.add(seen.checkpoint.id)
                    slot = _Slot(slots, backlog.changed)
                    nursery.start_soon(self._guarded, seen, busy, backlog, slot)
                await backlog.wait(backlog.next_retry(), self.clock())

    async def _watch(
        self, backlog: Backlog, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Feed ``backlog`` from a watch of the group's checkpoints: first every checkpoint
        (started once that pass is read, or failed), then each change. A failed watch (the
        server restarting, no stream leader) is said and opened again after a pause."""
        pause = 0.1
        pattern = f"{CheckpointId(self.group.name, '-', '-').key.split('.')[0]}.>"
        while True:
            try:
                async with self.store.kv.watch(pattern) as watcher:
                    async for entry in watcher.initial():
                        self._noted(backlog, entry)
                    self._recovered("watch")
                    task_status.started()
                    task_status = trio.TASK_STATUS_IGNORED
                    pause = 0.1
                    async for entry in watcher:
                        self._noted(backlog, entry)
                raise ConnectionError("the watch ended")  # pragma: no cover - it does not
            except Exception as exc:
                self._outage("watch", exc)
            task_status.started()  # running without it: the poll is the safety net
            task_status = trio.TASK_STATUS_IGNORED
            await trio.sleep(pause)
            pause = min(2 * pause, 2.0)

    def _noted(self, backlog: Backlog, entry: Entry) -> None:
        cid = CheckpointId.from_key(entry.key)
        if entry.operation is not Operation.PUT:
            backlog.forget(cid)
            return
        try:
            backlog.note(Stored(Checkpoint.from_json(cid, entry.value), entry.revision))
        except CheckpointError as exc:  # one unreadable checkpoint: said, the rest go on
            self._note(cid, exc)

    async def _poll(self, backlog: Backlog) -> None:
        """The safety net, every ``poll_interval``: every checkpoint of the group read again
        into the backlog (a change the watch missed, a retry whose time came)."""
        while True:
            await trio.sleep(self.poll_interval)
            try:
                async for stored in self.store.all(self.group.name):
                    backlog.note(stored)
            except Exception as exc:
                self._outage("poll", exc)
            else:
                self._recovered("poll")
                backlog.changed()
            self.polls += 1

    def _outage(self, what: str, exc: Exception) -> None:
        """The watch or the poll failed: kept in :attr:`outage` until it works again, and
        said (once per kind of failure in a row, not at every attempt)."""
        text = f"{what}: {type(exc).__name__}: {exc}"
        self.outages += 1
        if self.outage is None or not self.outage.startswith(f"{what}: {type(exc).__name__}"):
            warnings.warn(
                f"checkpoint workers of {self.group.name!r}: {text} (trying again)",
                RuntimeWarning,
                stacklevel=1,
            )
        self.outage = text

    def _recovered(self, what: str) -> None:
        if self.outage is not None and self.outage.startswith(f"{what}:"):
            warnings.warn(
                f"checkpoint workers of {self.group.name!r}: {what} works again",
                RuntimeWarning,
                stacklevel=1,
            )
            self.outage = None

    async def _recover_expired(self) -> None:
        """Every ``recovery_interval``: release reservations that expired (their host died or
        hung), so that the next poll hands their checkpoints to a live worker."""
        while True:
            await trio.sleep(self.recovery_interval)
            try:
                await self.recover_expired()
            except Exception as exc:  # a KV hiccup: the next round tries again
                warnings.warn(f"reservation recovery: {exc}", RuntimeWarning, stacklevel=1)

    async def recover_expired(self) -> int:
        """Release every expired reservation of the group now; how many were released."""
        released = 0
        now = self.clock()
        async for stored in self.store.all(self.group.name):
            cp = stored.checkpoint
            if cp.reservation is not None and not cp.reserved(now):
                await self.store.change(cp.id, _release_if_expired(now))
                released += 1
        return released

    async def _guarded(
        self,
        seen: Stored,
        busy: set[CheckpointId],
        backlog: Backlog,
        slot: _Slot,
    ) -> None:
        cid = seen.checkpoint.id
        try:
            await self._claimed(cid, seen, slot)
        except Exception as exc:
            # One checkpoint's trouble (a KV or direct-get timeout, a checkpoint that does not
            # read back) must not stop the host: said, and the checkpoint left for a later poll.
            self.errors.append((cid, exc))
            del self.errors[:-100]
            warnings.warn(
                f"checkpoint {cid}: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=1
            )
        finally:
            slot.give_back()
            busy.discard(cid)
            backlog.changed()  # work noted for it meanwhile can be taken now

    async def process(self, cid: CheckpointId, *, seen: Stored | None = None) -> Checkpoint | None:
        """Reserve ``cid`` and process it (see :meth:`_claimed`); its reservation is renewed
        by a renewal task of this call (under :meth:`run`, the host's)."""
        alone = trio.Semaphore(1)
        alone.acquire_nowait()
        async with trio.open_nursery() as renewals:
            renewals.start_soon(self._keep_held, renewals)
            try:
                return await self._claimed(cid, seen, _Slot(alone, lambda: None))
            finally:
                renewals.cancel_scope.cancel()

    async def _claimed(
        self, cid: CheckpointId, seen: Stored | None, slot: _Slot
    ) -> Checkpoint | None:
        """Reserve ``cid`` and process it up to its version (or its first failure); the
        checkpoint as left, or None when there was nothing to do for this worker (reserved by
        another, no longer lagging or due, or taken over while it ran). ``seen``: the
        checkpoint as the watch last showed it, so that the reservation is tried on it without
        reading it first (a stale one costs the read).

        The write that ends the processing (caught up, or a failure) also releases the
        reservation, so a new event costs three requests (reserve, read, advance) and its
        checkpoint three watch entries; only a processing cut short (lost, cancelled, an
        error) releases it in a write of its own."""
        owner = self.owner
        subscription = self.group.subscription(cid.subscription)
        handler = subscription.handler
        assert handler is not None  # checked when the workers were made
        stored, first = await self._reserve(cid, seen)
        if stored is None:
            return None
        reserved = stored.checkpoint
        assert reserved.reservation is not None
        ctx = HandlerContext(cid, reserved.fence, reserved.reservation.expires_at, self.clock)
        left: Checkpoint | None = None
        error: Exception | None = None
        try:
            # The reservation is renewed in the background while we hold it (a handler may
            # outlive it): the host's renewal task (:meth:`_keep_held`) sees it in
            # ``_holding``, and cancels ``processing`` when it finds it lost (fencing.py).
            # The scope's deadline is the reservation's expiry (moved by each renewal): a
            # processing whose renewals did not get through is cancelled at that moment, not
            # at the renewal task's next look.
            with trio.CancelScope(deadline=expiry_deadline(ctx)) as processing:
                self._holding[cid] = _Holding(ctx, processing)
                try:
                    left = await self._process(cid, reserved, subscription, handler, first, slot)
                except Exception as exc:
                    error = exc
            if processing.cancelled_caught and ctx.lost is None:
                ctx.lost = f"not renewed before it expired at {ctx.expires_at:.3f}"
            if error is not None:
                raise error
            if ctx.lost is not None and not _released_by(left, owner, ctx.fence):
                # (A renewal that raced with the final write, which released the checkpoint,
                # finds it not held: not a loss.)
                raise ReservationLost(ctx.lost)
            return left
        except ReservationLost as exc:
            # Another host (or an operator) took over: stop, write nothing.
            ctx.lost = ctx.lost or str(exc)
            self.lost += 1
            warnings.warn(
                f"checkpoint {cid}: reservation lost: {exc}", RuntimeWarning, stacklevel=1
            )
            return None
        finally:
            self._holding.pop(cid, None)
            last = self._last.pop(cid, None)
            if last is None or last.checkpoint.held_by(owner, ctx.fence):
                # Cut short (cancelled included): give the checkpoint back at once, rather
                # than leave it reserved until expiry (only if it is still this claim).
                with trio.move_on_after(5, shield=True) as releasing:
                    try:
                        await self.store.change(cid, _released(owner, ctx.fence), current=last)
                    except Exception:  # a server restarting: released again later
                        self._unreleased[cid] = ctx.fence
                if releasing.cancelled_caught:
                    self._unreleased[cid] = ctx.fence

    async def _keep_held(self, renewals: trio.Nursery) -> None:
        """The host's renewal task: every sixth of ``reservation``, renew each reservation
        held for a third of it or more (in a task of its own in ``renewals``, so that one
        slow renewal holds up no other), and cancel the processing of any that expired
        before a renewal got through. One task for the host rather than one per
        processing: most processings end long before their first renewal is due, and a
        task started and cancelled per event cost a fifth of the event loop's steps."""
        renewing: set[HandlerContext] = set()
        every = self.reservation / 6
        while True:
            await trio.sleep(every)
            now = self.clock()
            for ctx, processing in list(self._holding.values()):
                if ctx in renewing:
                    continue
                if not ctx.held():
                    lose(ctx, processing, f"not renewed before it expired at {ctx.expires_at:.3f}")
                elif ctx.expires_at - now <= self.reservation * 2 / 3:
                    renewing.add(ctx)
                    renewals.start_soon(self._renew, ctx, processing, renewing)

    async def _renew(
        self, ctx: HandlerContext, processing: trio.CancelScope, renewing: set[HandlerContext]
    ) -> None:
        """One renewal of ``ctx``'s reservation (fencing.renew_once). A renewal still under
        way when the processing ends may wake up after it: it writes only while this same
        processing holds the checkpoint (the identity of ``ctx`` in ``_holding``), never after
        the final write released it."""
        owner, cid = self.owner, ctx.checkpoint

        def renew(cp: Checkpoint) -> Checkpoint:
            holding = self._holding.get(cid)
            if holding is None or holding.ctx is not ctx or not cp.held_by(owner, ctx.fence):
                holder = cp.reservation.owner if cp.reservation else "nobody"
                raise ReservationLost(
                    f"reserved by {holder} with fence {cp.fence}, not by {owner} with "
                    f"fence {ctx.fence}"
                )
            return _renew(cp, owner, self.clock(), self.reservation)

        try:
            await renew_once(self.store, ctx, renew, processing, lambda exc: self._note(cid, exc))
        finally:
            renewing.discard(ctx)

    async def _reserve(
        self, cid: CheckpointId, seen: Stored | None
    ) -> tuple[Stored | None, list[StoredMessage]]:
        """Reserve ``cid`` (None when there is nothing to do for this worker), and read its
        next message meanwhile: the read does not depend on the reservation, only on the
        position, so it is sent with it rather than after it, and a new event waits for two
        round trips and its handler instead of three. What was read is returned (the next
        message last) only if the reservation found the position the read started from."""
        read_from = seen.checkpoint.position if seen is not None else None
        reading = None
        if read_from is not None:
            with contextlib.suppress(Exception):  # read again once reserved
                reading = self.js.direct_get_soon(
                    self.stream, seq=read_from + 1, next_by_subject=f"{cid.stream}.>"
                )
        try:
            stored = await self._change(cid, self._transition(_reserve), current=seen)
        except BaseException as exc:  # the read is not waited for: its reply is dropped
            if reading is not None:
                reading.abandon()
            if isinstance(exc, AlreadyReserved | _NothingToDo):
                return None, []
            raise
        first: list[StoredMessage] = []
        if reading is not None:
            if stored.checkpoint.position != read_from:
                reading.abandon()
            else:
                with contextlib.suppress(Exception):  # MessageNotFound, a timeout: read again
                    first.append(await reading.result())
        return stored, first

    async def _release_left(self) -> None:
        """Every second: release again what a failed release left reserved (the server
        restarting as a run ended), rather than leave its entity waiting for the expiry
        (``reservation`` and ``recovery_interval``: minutes). Only this claim is released."""
        while True:
            await trio.sleep(1.0)
            for cid, fence in list(self._unreleased.items()):
                try:
                    await self.store.change(cid, _released(self.owner, fence))
                except KeyNotFound:
                    pass
                except Exception:  # still away: the next round
                    continue
                if self._unreleased.get(cid) == fence:
                    del self._unreleased[cid]

    async def _change(
        self,
        cid: CheckpointId,
        transition: Callable[[Checkpoint], Checkpoint],
        current: Stored | None = None,
    ) -> Stored:
        """``store.change``, starting from this worker's last write of ``cid`` (its writes
        follow one another: a read saved each; a stale one costs the read back), or from
        ``current`` before the first."""
        try:
            stored = await self.store.change(cid, transition, current=self._last.get(cid, current))
        except BaseException:
            self._last.pop(cid, None)
            raise
        self._last[cid] = stored
        return stored

    def _note(self, cid: CheckpointId, exc: Exception) -> None:
        """An error outside handlers: kept (the last 100) and said."""
        self.errors.append((cid, exc))
        del self.errors[:-100]
        warnings.warn(
            f"checkpoint {cid}: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=1
        )

    async def _handle(self, handler: Handler, msg: StoredMessage, cid: CheckpointId) -> None:
        """Call the handler, with its HandlerContext when it takes one; none is started once
        this worker knows its claim lost or expired (a stall between messages)."""
        ctx = self._holding[cid].ctx
        ctx.ensure_held()
        if not self._with_context[cid.subscription]:
            await handler(msg)
            return
        ctx.seq = msg.seq
        try:
            await handler(msg, ctx)
        finally:
            ctx.seq = 0

    async def _process(
        self,
        cid: CheckpointId,
        cp: Checkpoint,
        subscription: Subscription,
        handler: Handler,
        ahead: list[StoredMessage],
        slot: _Slot,
    ) -> Checkpoint:
        """Handle ``cid``'s messages from its position up to its version (``ahead``: those
        already read, the next one last). Its handler slot is given back while the position
        write after the last known message is on the way, and taken again (waiting for one)
        if that write finds the version raised meanwhile: ``concurrency`` bounds the handlers
        running, and a processing's last write overlaps the next one's start."""
        position = cp.position
        processed = cp.processed_events  # events of the subscription handled, absolute
        header = self.group.type_header
        size = 2 if ahead else 1
        if position >= cp.version and cp.status is not Status.ACTIVE:
            # A retry with nothing left to handle (a failure parked on missing events, then
            # retried by hand): active again.
            advance = _advance(position, processed, self.stream)
            return (await self._change(cid, self._transition(advance))).checkpoint
        while position < cp.version:
            if not ahead:
                ahead = await self._read_ahead(cid, position, size)
                size = min(2 * size, READ_AHEAD)
            msg = ahead.pop() if ahead else None
            if msg is None or msg.seq > cp.version:
                # The message the version counts (the entity's last seen) is gone, deleted,
                # purged or dropped by a limit before it was handled: failed, never caught up.
                return await self._missing(cid, position, cp.version)
            kind = _header(msg, header)
            if subscription.entity(msg.subject, kind) == cid.stream:
                try:
                    await self._handle(handler, msg, cid)
                except ReservationLost:
                    raise  # the handler found it lost (HandlerContext.ensure_held)
                except Exception as exc:
                    self.failures += 1
                    decision = self.retry.decide(exc, cp.failed_retries)
                    failed = _fail(position, msg.seq, exc, decision)
                    return (await self._change(cid, self._transition(failed))).checkpoint
                self.handled += 1
                if processed is not None:
                    processed += 1
            position = msg.seq
            advance = _advance(position, processed, self.stream)
            if position >= cp.version:
                slot.give_back()
            cp = (await self._change(cid, self._transition(advance))).checkpoint
            if position < cp.version:
                await slot.take()
        if cp.status is Status.FAILED and cp.error and cp.error.startswith("MissingEvents"):
            self.missing += 1
            warnings.warn(f"checkpoint {cid}: {cp.error}", RuntimeWarning, stacklevel=1)
        return cp

    async def _missing(self, cid: CheckpointId, position: int, version: int) -> Checkpoint:
        """Park ``cid`` as failed on its lost event #``version`` (an operator's skip accepts
        the loss and resumes it)."""
        self.missing += 1
        gone = MissingEvents(
            f"event #{version} of {cid.stream} is gone from stream {self.stream!r} before it "
            "was handled (deleted, purged, or dropped by a limit); skip it to accept the loss"
        )
        warnings.warn(f"checkpoint {cid}: {gone}", RuntimeWarning, stacklevel=1)
        failed = _fail(position, version, gone, GiveUp(0))
        return (await self._change(cid, self._transition(failed))).checkpoint

    async def _read_ahead(self, cid: CheckpointId, position: int, size: int) -> list[StoredMessage]:
        """The entity's next ``size`` messages after ``position``, last first; empty when it
        has none. More than one is one batched Direct Get (ADR-31; one at a time on a server
        before 2.11).

        The caller doubles ``size`` from 1 up to :data:`READ_AHEAD` while it keeps using what
        it read: the server cannot stop a batch at the checkpoint's version (an entity's
        messages are spread over the stream, so the version does not say how many of them
        come before it), and a worker that reads far past it parses messages it will not
        handle before the checkpoint is reserved again. Doubling reads at most as many
        messages past the version as it handled.
        """
        subject = f"{cid.stream}.>"
        if size > 1 and self._batches:
            try:
                page = await self.js.direct_get_batch(
                    self.stream, size, subject=subject, seq=position + 1
                )
                return list(reversed(page.messages))
            except BatchGetUnsupported:
                self._batches = False
        try:
            return [
                await self.js.direct_get(self.stream, seq=position + 1, next_by_subject=subject)
            ]
        except MessageNotFound:
            return []

    def _transition(
        self, step: Callable[[Checkpoint, str, float, float], Checkpoint]
    ) -> Callable[[Checkpoint], Checkpoint]:
        """``step`` with this worker's identity, clock and reservation length; while this
        worker holds the checkpoint, refused (:class:`ReservationLost`) unless the stored
        reservation is still its claim (owner and fencing token)."""

        def apply(cp: Checkpoint) -> Checkpoint:
            holding = self._holding.get(cp.id)
            if holding is not None and not cp.held_by(self.owner, holding.ctx.fence):
                holder = cp.reservation.owner if cp.reservation else "nobody"
                # Said without the checkpoint: the warning of process() names it.
                raise ReservationLost(
                    f"reserved by {holder} with fence {cp.fence}, not by {self.owner} with "
                    f"fence {holding.ctx.fence}"
                )
            return step(cp, self.owner, self.clock(), self.reservation)

        return apply


class _NothingToDo(Exception):
    pass


class _Slot:
    """One of the host's ``concurrency`` handler slots (a semaphore's unit), held by a
    processing: given back while its last position write is on the way, taken again if it
    has more to handle."""

    __slots__ = ("_freed", "_held", "_slots")

    def __init__(self, slots: trio.Semaphore, freed: Callable[[], None]) -> None:
        self._slots = slots
        self._freed = freed  # wakes the dispatcher
        self._held = True

    def give_back(self) -> None:
        if self._held:
            self._held = False
            self._slots.release()
            self._freed()

    async def take(self) -> None:
        if not self._held:
            await self._slots.acquire()
            self._held = True


class _Holding(NamedTuple):
    """A processing in progress, as the host's renewal task and the writes see it."""

    ctx: HandlerContext
    processing: trio.CancelScope


def _reserve(cp: Checkpoint, owner: str, now: float, timeout: float) -> Checkpoint:
    # Re-checked on the stored value: the poll's snapshot may be stale (another host may have
    # processed it, failed it, or scheduled its retry later).
    if not (cp.lagging or cp.retry_due(now)):
        raise _NothingToDo
    current = cp.reservation
    if current is not None and cp.reserved(now):
        # Ours included: a fresh claim never joins a run in progress (a host restarted under
        # the same owner name); a stale run is fenced by the new claim's token.
        raise AlreadyReserved(f"checkpoint {cp.id} is reserved by {current.owner!r}")
    return cp.release().reserve(owner, now, timeout)


def _renew(cp: Checkpoint, owner: str, now: float, timeout: float) -> Checkpoint:
    """A renewal while processing (the claim itself is checked by ``_transition``)."""
    return cp.reserve(owner, now, timeout)


def _owned(cp: Checkpoint, owner: str, now: float, timeout: float, position: int) -> Checkpoint:
    """``cp`` still ours (our reservation, our position), its reservation renewed."""
    mine = cp.reservation is not None and cp.reservation.owner == owner
    if not mine or cp.position > position:
        raise ReservationLost(f"moved to position {cp.position} under {owner}")
    return cp.reserve(owner, now, timeout)


def _advance(
    position: int, processed: int | None, stream: str
) -> Callable[[Checkpoint, str, float, float], Checkpoint]:
    """Processed up to ``position``, ``processed`` events handled in all; released in the
    same write once that catches up with the version (as stored: a version raised meanwhile
    keeps the reservation, and the worker goes on). Caught up with fewer events processed
    than the global consumer counted, some went missing from ``stream`` in the middle of the
    backlog: failed (:class:`MissingEvents`) rather than caught up in silence."""

    def step(cp: Checkpoint, owner: str, now: float, timeout: float) -> Checkpoint:
        done = _owned(cp, owner, now, timeout, position).advanced(position)
        if processed is not None and done.processed_events is not None:
            done = attrs.evolve(done, processed_events=processed)
        if done.lagging:
            return done
        missing = done.events_missing
        done = done.caught_up_counts().release()
        if not missing:
            return done
        gone = MissingEvents(
            f"{missing} of the {done.seen_events} events of {cp.id.stream} counted up to "
            f"#{done.version} are gone from stream {stream!r} before they were handled "
            "(deleted, purged, or dropped by a limit); every event still there was handled. "
            "Skip or retry to accept the loss"
        )
        return done.failed(gone, GiveUp(0), now, position)

    return step


def _fail(
    position: int, seq: int, error: BaseException, decision: Retry | GiveUp
) -> Callable[[Checkpoint, str, float, float], Checkpoint]:
    """A failure at ``seq``, written with the reservation released: it ends the processing."""

    def step(cp: Checkpoint, owner: str, now: float, timeout: float) -> Checkpoint:
        owned = _owned(cp, owner, now, timeout, position)
        return owned.failed(error, decision, now, seq).release()

    return step


def _released_by(cp: Checkpoint | None, owner: str, fence: int) -> bool:
    """Whether ``cp``, this worker's last write, gave up ``owner``'s claim ``fence``: the
    processing ended in its own write."""
    return cp is not None and cp.reservation is None and cp.fence == fence


def _release_if_expired(now: float) -> Callable[[Checkpoint], Checkpoint]:
    def release(cp: Checkpoint) -> Checkpoint:
        # Re-checked on the value being replaced: a host may have renewed it meanwhile.
        if cp.reservation is not None and not cp.reserved(now):
            return cp.release()
        return cp

    return release


def _released(owner: str, fence: int) -> Callable[[Checkpoint], Checkpoint]:
    def release(cp: Checkpoint) -> Checkpoint:
        if cp.held_by(owner, fence):
            return cp.release()
        return cp

    return release


def _header(msg: StoredMessage, name: str) -> Any:
    headers = msg.headers
    return headers.get(name) if headers else None
