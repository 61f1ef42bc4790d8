"""Checkpoint workers: take lagging checkpoints and dispatch each entity's messages, in order,
one at a time, to its subscription's handler (Beckett's model).

A worker reserves a checkpoint (compare-and-set, so two hosts never process it at once), reads
the entity's messages after its position with ADR-31 direct gets (``next_by_subject`` =
``<entity>.>``), calls the handler for those the subscription matches, and advances the
position after each one, so a crash re-delivers at most the message being handled. A handler
error puts the checkpoint into retry (or failed) as the retry policy says; other checkpoints go
on. A reservation left by a killed host expires; the recovery task (every
``recovery_interval``, a minute by default) releases it and the next poll hands it out.
"""

from __future__ import annotations

import os
import secrets
import time
import warnings
from collections.abc import Callable
from typing import Any

import attrs
import trio

from headrace.checkpoints.checkpoint import AlreadyReserved, Checkpoint, CheckpointId
from headrace.checkpoints.retry import GiveUp, Retry, RetryPolicy
from headrace.checkpoints.store import CheckpointStore
from headrace.checkpoints.subscription import Handler, Subscription, SubscriptionGroup
from headrace.jetstream import JetStream
from headrace.jetstream.errors import MessageNotFound
from headrace.jetstream.stored_message import StoredMessage

DEFAULT_RESERVATION = 300.0


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
    poll_interval: float = 0.5
    #: How often expired reservations (a killed host's) are released for others to take.
    recovery_interval: float = 60.0
    clock: Callable[[], float] = time.time
    #: Messages handled, handler failures, since start.
    handled: int = 0
    failures: int = 0
    #: Polls of the group's checkpoints done.
    polls: int = 0
    #: The last errors outside handlers (checkpoint, error), at most 100.
    errors: list[tuple[CheckpointId, Exception]] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        missing = [s.name for s in self.group.subscriptions if s.handler is None]
        if missing:
            raise ValueError(f"subscriptions without a handler: {missing}")
        if self.reservation <= 0 or self.poll_interval <= 0 or self.recovery_interval <= 0:
            raise ValueError("reservation, poll_interval and recovery_interval must be positive")

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        limiter = trio.CapacityLimiter(self.concurrency)
        busy: set[CheckpointId] = set()
        known = {s.name for s in self.group.subscriptions}
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._recover_expired)
            while True:
                now = self.clock()
                async for stored in self.store.all(self.group.name):
                    cp = stored.checkpoint
                    # Reserved, even if expired: expired ones are the recovery task's. Unknown
                    # subscriptions belong to hosts running a newer version of the group.
                    if (
                        cp.id in busy
                        or cp.reservation is not None
                        or cp.id.subscription not in known
                    ):
                        continue
                    if cp.lagging or cp.retry_due(now):
                        busy.add(cp.id)
                        nursery.start_soon(self._guarded, cp.id, limiter, busy)
                self.polls += 1
                await trio.sleep(self.poll_interval)

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
        self, cid: CheckpointId, limiter: trio.CapacityLimiter, busy: set[CheckpointId]
    ) -> None:
        try:
            async with limiter:
                await self.process(cid)
        except Exception as exc:
            # One checkpoint's trouble (a KV or direct-get timeout, a checkpoint that does not
            # read back) must not stop the host: said, and the checkpoint left for a later poll.
            self.errors.append((cid, exc))
            del self.errors[:-100]
            warnings.warn(
                f"checkpoint {cid}: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=1
            )
        finally:
            busy.discard(cid)

    async def process(self, cid: CheckpointId) -> Checkpoint | None:
        """Reserve ``cid`` and process it up to its version (or its first failure); the
        checkpoint as left, or None when there was nothing to do for this worker (reserved by
        another, no longer lagging or due, or taken over while it ran)."""
        owner = self.owner
        subscription = self.group.subscription(cid.subscription)
        handler = subscription.handler
        assert handler is not None  # checked when the workers were made
        try:
            stored = await self.store.change(cid, self._transition(_reserve))
        except (AlreadyReserved, _NothingToDo):
            return None
        try:
            return await self._process(cid, stored.checkpoint, subscription, handler)
        except _LostReservation:
            return None  # another host (or an operator) took over: stop, write nothing
        finally:
            # However it ends (cancelled included): give the checkpoint back at once, rather
            # than leave it reserved until expiry.
            with trio.move_on_after(5, shield=True):
                try:
                    await self.store.change(cid, _released(owner))
                except Exception:  # the recovery task frees it after expiry
                    pass

    async def _process(
        self, cid: CheckpointId, cp: Checkpoint, subscription: Subscription, handler: Handler
    ) -> Checkpoint:
        position = cp.position
        header = self.group.type_header
        while position < cp.version:
            try:
                msg = await self.js.direct_get(
                    self.stream, seq=position + 1, next_by_subject=f"{cid.stream}.>"
                )
            except MessageNotFound:
                msg = None
            if msg is None or msg.seq > cp.version:
                # Nothing of the entity's is left up to the version (deleted, purged, aged
                # out): done with it, else it would stay lagging (or due) for ever.
                position = cp.version
                cp = (await self.store.change(cid, self._transition(_advance(position)))).checkpoint
                break
            kind = _header(msg, header)
            if subscription.entity(msg.subject, kind) == cid.stream:
                try:
                    await handler(msg)
                except Exception as exc:
                    self.failures += 1
                    decision = self.retry.decide(exc, cp.failed_retries)
                    failed = _fail(position, msg.seq, exc, decision)
                    return (await self.store.change(cid, self._transition(failed))).checkpoint
                self.handled += 1
            position = msg.seq
            cp = (await self.store.change(cid, self._transition(_advance(position)))).checkpoint
        return cp

    def _transition(
        self, step: Callable[[Checkpoint, str, float, float], Checkpoint]
    ) -> Callable[[Checkpoint], Checkpoint]:
        """``step`` with this worker's identity, clock and reservation length."""
        return lambda cp: step(cp, self.owner, self.clock(), self.reservation)


class _NothingToDo(Exception):
    pass


class _LostReservation(Exception):
    pass


def _reserve(cp: Checkpoint, owner: str, now: float, timeout: float) -> Checkpoint:
    # Re-checked on the stored value: the poll's snapshot may be stale (another host may have
    # processed it, failed it, or scheduled its retry later).
    if not (cp.lagging or cp.retry_due(now)):
        raise _NothingToDo
    return cp.reserve(owner, now, timeout)


def _owned(cp: Checkpoint, owner: str, now: float, timeout: float, position: int) -> Checkpoint:
    """``cp`` still ours (our reservation, our position), its reservation renewed."""
    mine = cp.reservation is not None and cp.reservation.owner == owner
    if not mine or cp.position > position:
        raise _LostReservation
    return cp.reserve(owner, now, timeout)


def _advance(position: int) -> Callable[[Checkpoint, str, float, float], Checkpoint]:
    def step(cp: Checkpoint, owner: str, now: float, timeout: float) -> Checkpoint:
        return _owned(cp, owner, now, timeout, position).advanced(position)

    return step


def _fail(
    position: int, seq: int, error: BaseException, decision: Retry | GiveUp
) -> Callable[[Checkpoint, str, float, float], Checkpoint]:
    def step(cp: Checkpoint, owner: str, now: float, timeout: float) -> Checkpoint:
        return _owned(cp, owner, now, timeout, position).failed(error, decision, now, seq)

    return step


def _release_if_expired(now: float) -> Callable[[Checkpoint], Checkpoint]:
    def release(cp: Checkpoint) -> Checkpoint:
        # Re-checked on the value being replaced: a host may have renewed it meanwhile.
        if cp.reservation is not None and not cp.reserved(now):
            return cp.release()
        return cp

    return release


def _released(owner: str) -> Callable[[Checkpoint], Checkpoint]:
    def release(cp: Checkpoint) -> Checkpoint:
        if cp.reservation is not None and cp.reservation.owner == owner:
            return cp.release()
        return cp

    return release


def _header(msg: StoredMessage, name: str) -> Any:
    headers = msg.headers
    return headers.get(name) if headers else None
