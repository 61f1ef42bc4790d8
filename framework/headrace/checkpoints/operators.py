"""What an operator does with checkpoints: look (all, lagging, failed, reserved) and act
(retry, skip, release), each action a compare-and-set like every other change (store.py).

``headrace checkpoints`` is the same from the command line (cli/checkpoints.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from headrace.checkpoints.checkpoint import Checkpoint, CheckpointError, CheckpointId, Status
from headrace.checkpoints.store import CheckpointStore

Clock = Callable[[], float]

VIEWS = ("list", "lagging", "failed", "reservations")


async def view(
    store: CheckpointStore, which: str, group: str | None = None, clock: Clock = time.time
) -> list[Checkpoint]:
    """The checkpoints of one view, sorted by id: ``list`` (all), ``lagging`` (work waiting),
    ``failed``, or ``reservations`` (held now)."""
    now = clock()
    keep: dict[str, Callable[[Checkpoint], bool]] = {
        "list": lambda cp: True,
        "lagging": lambda cp: cp.lagging,
        "failed": lambda cp: cp.status is Status.FAILED,
        "reservations": lambda cp: cp.reserved(now),
    }
    if which not in keep:
        raise ValueError(f"no view {which!r}; views are {', '.join(VIEWS)}")
    chosen = [s.checkpoint async for s in store.all(group) if keep[which](s.checkpoint)]
    return sorted(chosen, key=lambda cp: cp.id)


def _not_in_work(cp: Checkpoint, now: float, action: str) -> None:
    """Retry and skip change a checkpoint a worker may be processing: refused while a
    reservation holds (release it first if its host is known to be gone)."""
    if cp.reserved(now) and cp.reservation is not None:
        raise CheckpointError(
            f"checkpoint {cp.id} is being processed by {cp.reservation.owner!r} (reserved for "
            f"{cp.reservation.expires_at - now:.0f} s more); {action} it once that ends, or "
            "release it first if that host is gone"
        )


async def retry(store: CheckpointStore, cid: CheckpointId, clock: Clock = time.time) -> Checkpoint:
    """Retry a failed (or retrying) checkpoint now, with a fresh retry budget."""

    def go(cp: Checkpoint) -> Checkpoint:
        if cp.status is Status.ACTIVE:
            raise CheckpointError(f"checkpoint {cid} is active: nothing to retry")
        _not_in_work(cp, clock(), "retry")
        return cp.retry_now(clock())

    return (await store.change(cid, go)).checkpoint


async def skip(store: CheckpointStore, cid: CheckpointId, clock: Clock = time.time) -> Checkpoint:
    """Count the failing message as processed and go on with the next."""

    def go(cp: Checkpoint) -> Checkpoint:
        _not_in_work(cp, clock(), "skip")
        return cp.skip()

    return (await store.change(cid, go)).checkpoint


async def release(store: CheckpointStore, cid: CheckpointId) -> Checkpoint:
    """Drop a reservation (a host known to be gone) so another worker takes it at once."""
    return (await store.change(cid, lambda cp: cp.release())).checkpoint


def describe(cp: Checkpoint, now: float) -> str:
    """One line for a checkpoint: id, status, position/version, and what holds it."""
    parts = [str(cp.id), cp.status.value, f"{cp.position}/{cp.version}"]
    if cp.lagging:
        parts.append(f"lag {cp.version - cp.position}")
    if cp.status is Status.RETRY and cp.retry_at is not None:
        parts.append(f"retry {cp.attempt} in {max(cp.retry_at - now, 0):.0f}s")
    if cp.failing_seq is not None:
        parts.append(f"failing #{cp.failing_seq}")
    if cp.reserved(now) and cp.reservation is not None:
        parts.append(
            f"reserved by {cp.reservation.owner} for {cp.reservation.expires_at - now:.0f}s"
        )
    if cp.error:
        parts.append(f"error: {cp.error}")
    return "  ".join(parts)
