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
from collections.abc import Callable
from typing import Any

import attrs
import trio

from headrace.checkpoints.checkpoint import AlreadyReserved, Checkpoint, CheckpointId
from headrace.checkpoints.retry import GiveUp, Retry, RetryPolicy
from headrace.checkpoints.store import CheckpointStore
from headrace.checkpoints.subscription import SubscriptionGroup
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

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        limiter = trio.CapacityLimiter(self.concurrency)
        busy: set[CheckpointId] = set()
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._recover_expired)
            while True:
                now = self.clock()
                async for stored in self.store.all(self.group.name):
                    cp = stored.checkpoint
                    # Reserved, even if expired: expired ones are the recovery task's.
                    if cp.id in busy or cp.reservation is not None:
                        continue
                    if cp.lagging or cp.retry_due(now):
                        busy.add(cp.id)
                        nursery.start_soon(self._guarded, cp.id, limiter, busy)
                await trio.sleep(self.poll_interval)

    async def _recover_expired(self) -> None:
        """Every ``recovery_interval``: release reservations that expired (their host died or
        hung), so that the next poll hands their checkpoints to a live worker."""
        while True:
            await trio.sleep(self.recovery_interval)
            await self.recover_expired()

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
        finally:
            busy.discard(cid)

    async def process(self, cid: CheckpointId) -> Checkpoint | None:
        """Reserve ``cid`` and process it up to its version (or its first failure); the
        checkpoint as left, or None when another worker holds it."""
        owner, timeout = self.owner, self.reservation
        try:
            stored = await self.store.change(
                cid, lambda cp: cp.reserve(owner, self.clock(), timeout)
            )
        except AlreadyReserved:
            return None
        cp = stored.checkpoint
        subscription = self.group.subscription(cid.subscription)
        handler = subscription.handler
        if handler is None:
            raise ValueError(f"subscription {cid.subscription!r} has no handler")
        position = cp.position
        header = self.group.type_header
        while position < cp.version:
            try:
                msg = await self.js.direct_get(
                    self.stream, seq=position + 1, next_by_subject=f"{cid.stream}.>"
                )
            except MessageNotFound:
                break
            if msg.seq > cp.version:
                break
            kind = _header(msg, header)
            if subscription.entity(msg.subject, kind) == cid.stream:
                try:
                    await handler(msg)
                except Exception as exc:
                    self.failures += 1
                    decision = self.retry.decide(exc, cp.failed_retries)
                    failed = _failed_at(position, msg.seq, exc, decision, self.clock())
                    return (await self.store.change(cid, failed)).checkpoint
                self.handled += 1
            position = msg.seq
            cp = (await self.store.change(cid, _advanced_to(position))).checkpoint
        return (await self.store.change(cid, _released(owner))).checkpoint


def _advanced_to(position: int) -> Callable[[Checkpoint], Checkpoint]:
    return lambda cp: cp.advanced(position)


def _failed_at(
    position: int, seq: int, error: BaseException, decision: Retry | GiveUp, now: float
) -> Callable[[Checkpoint], Checkpoint]:
    return lambda cp: cp.advanced(position).failed(error, decision, now, seq)


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
