"""The backlog: a host's local index of the checkpoints that have work for it, fed by a watch
of the group's checkpoints.

Polling every checkpoint to find the few with work costs per checkpoint per poll: with
10,000 entities a poll read 10,000 values and a new event waited seconds for its turn. A
KV watch delivers each changed checkpoint once, so the cost is per change. The backlog keeps
what the changes said: a checkpoint is in it while it is lagging (active, version past its
position) or in retry, and nobody's reservation is written on it; a reservation, a position
caught up, a failure or a delete takes it out. What it holds is a hint, not the truth: the
worker re-checks the stored checkpoint when it reserves it (worker.py).
"""

from __future__ import annotations

import math
from collections.abc import Collection

import attrs
import trio

from headrace.checkpoints.checkpoint import Checkpoint, CheckpointId, Status


@attrs.define(slots=True)
class Backlog:
    """Checkpoints with work (lagging, or in retry), by id; :meth:`changed` wakes a waiter."""

    #: Subscriptions this host runs: others (a newer version of the group) are left alone.
    known: frozenset[str]
    _waiting: dict[CheckpointId, Checkpoint] = attrs.field(factory=dict, init=False)
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)

    def __len__(self) -> int:
        return len(self._waiting)

    def note(self, cp: Checkpoint) -> None:
        """``cp`` as just written: kept when it has work and nobody holds it, dropped else."""
        wanted = (
            cp.id.subscription in self.known
            and cp.reservation is None
            and (cp.lagging or (cp.status is Status.RETRY and cp.retry_at is not None))
        )
        if wanted:
            self._waiting[cp.id] = cp
            self.changed()
        else:
            self._waiting.pop(cp.id, None)

    def forget(self, cid: CheckpointId) -> None:
        """``cid`` deleted (or purged)."""
        self._waiting.pop(cid, None)

    def changed(self) -> None:
        """Something may have become takeable: wake :meth:`wait`."""
        self._wake.set()

    def due(self, now: float, busy: Collection[CheckpointId]) -> list[CheckpointId]:
        """Take out the checkpoints to process now (lagging, or retry due), but those
        ``busy`` (being processed here: they stay, and count again once done)."""
        ready = [
            cid
            for cid, cp in self._waiting.items()
            if cid not in busy and (cp.lagging or cp.retry_due(now))
        ]
        for cid in ready:
            del self._waiting[cid]
        return ready

    def next_retry(self) -> float:
        """When the earliest retry held falls due (infinity if none)."""
        return min(
            (cp.retry_at for cp in self._waiting.values() if cp.retry_at is not None),
            default=math.inf,
        )

    async def wait(self, until: float, clock_now: float) -> None:
        """Until :meth:`changed` is called, or the clock reaches ``until`` (a retry due)."""
        with trio.move_on_after(max(0.0, until - clock_now)):
            await self._wake.wait()
        self._wake = trio.Event()
