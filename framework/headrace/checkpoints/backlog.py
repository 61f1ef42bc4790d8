"""The backlog: a host's local index of the checkpoints that have work for it, fed by a watch
of the group's checkpoints.

Polling every checkpoint to find the few with work costs per checkpoint per poll: with
10,000 entities a poll read 10,000 values and a new event waited seconds for its turn. A
KV watch delivers each changed checkpoint once, so the cost is per change. The backlog keeps
what the changes said: a checkpoint is in it while it is lagging (active, version past its
position) or in retry, and nobody's reservation is written on it; a reservation, a position
caught up, a failure or a delete takes it out. What it holds is a hint, not the truth: the
worker re-checks the stored checkpoint when it reserves it (worker.py). It keeps each
checkpoint's KV revision too, so that the reservation is a compare-and-set on what the watch
said, without reading the checkpoint again first; and so that an older read (the safety-net
poll) never replaces a newer one.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import attrs
import trio

from headrace.checkpoints.checkpoint import CheckpointId, Status
from headrace.checkpoints.store import Stored


@attrs.define(slots=True)
class Backlog:
    """Checkpoints with work (lagging, or in retry), by id; :meth:`changed` wakes a waiter.

    Lagging ones are handed out first come, first served; those in retry when their time
    comes. Nothing is handed out beyond what the worker can start (``due``'s ``limit``), so
    10,000 entities with new events cost 10,000 small entries here, not 10,000 tasks.
    """

    #: Subscriptions this host runs: others (a newer version of the group) are left alone.
    known: frozenset[str]
    _lagging: dict[CheckpointId, Stored] = attrs.field(factory=dict, init=False)
    _retrying: dict[CheckpointId, Stored] = attrs.field(factory=dict, init=False)
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)

    def __len__(self) -> int:
        return len(self._lagging) + len(self._retrying)

    def note(self, stored: Stored) -> None:
        """A checkpoint as just written: kept when it has work and nobody holds it, dropped
        else; ignored when the backlog holds a newer revision of it."""
        cp = stored.checkpoint
        held = self._lagging.get(cp.id) or self._retrying.get(cp.id)
        if held is not None and held.revision > stored.revision:
            return
        self.forget(cp.id)
        if cp.id.subscription not in self.known or cp.reservation is not None:
            return
        if cp.lagging:
            self._lagging[cp.id] = stored
        elif cp.status is Status.RETRY and cp.retry_at is not None:
            self._retrying[cp.id] = stored
        else:
            return
        self.changed()

    def forget(self, cid: CheckpointId) -> None:
        """``cid`` deleted (or purged), or not waiting any more."""
        self._lagging.pop(cid, None)
        self._retrying.pop(cid, None)

    def changed(self) -> None:
        """Something may have become takeable: wake :meth:`wait`."""
        self._wake.set()

    def due(
        self, now: float, busy: Collection[CheckpointId], limit: float = math.inf
    ) -> list[Stored]:
        """Take out up to ``limit`` checkpoints to process now (retries due, then lagging
        ones in the order they came), as last seen, but those ``busy`` (being processed here:
        they stay, and count again once done)."""
        if limit <= 0:
            return []
        ready = [
            stored
            for cid, stored in self._retrying.items()
            if cid not in busy and stored.checkpoint.retry_due(now)
        ][: int(min(limit, len(self._retrying)))]
        for cid, stored in self._lagging.items():
            if len(ready) >= limit:
                break
            if cid not in busy:
                ready.append(stored)
        for stored in ready:
            self.forget(stored.checkpoint.id)
        return ready

    def next_retry(self) -> float:
        """When the earliest retry held falls due (infinity if none)."""
        return min(
            (
                s.checkpoint.retry_at
                for s in self._retrying.values()
                if s.checkpoint.retry_at is not None
            ),
            default=math.inf,
        )

    async def wait(self, until: float, clock_now: float) -> None:
        """Until :meth:`changed` is called, or the clock reaches ``until`` (a retry due)."""
        with trio.move_on_after(max(0.0, until - clock_now)):
            await self._wake.wait()
        self._wake = trio.Event()
