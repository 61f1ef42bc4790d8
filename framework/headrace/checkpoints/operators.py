"""What an operator does with checkpoints: look (all, lagging, failed, reserved) and act
(retry, skip, release), each action a compare-and-set like every other change (store.py).

Retry and skip name the checkpoint state they act on: skip the failing message (its stream
sequence, required), retry that or the position (or, given neither, the state read when the
action starts). A checkpoint that has moved on (processed, skipped or retried by someone else
meanwhile) is refused with :class:`CheckpointMoved`, so an action run twice, or by two
operators at once, acts once: a second skip never skips the next failing message.

``headrace checkpoints`` is the same from the command line (cli/checkpoints.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from headrace.checkpoints.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointId,
    CheckpointMoved,
    Status,
)
from headrace.checkpoints.store import CheckpointStore
from headrace.jetstream.kv import KeyNotFound

Clock = Callable[[], float]

VIEWS = ("list", "lagging", "failed", "reservations")


async def view(
    store: CheckpointStore, which: str, group: str | None = None, clock: Clock = time.time
) -> list[Checkpoint]:
    """The checkpoints of one view, sorted by id: ``list`` (all), ``lagging`` (version ahead
    of position, whatever the status: active ones waiting for a worker, and those in retry or
    failed that are behind, which are the ones an operator looks for), ``failed``, or
    ``reservations`` (held now)."""
    now = clock()
    keep: dict[str, Callable[[Checkpoint], bool]] = {
        "list": lambda cp: True,
        "lagging": lambda cp: cp.version > cp.position,
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


def _failure(cp: Checkpoint) -> tuple[Any, ...]:
    """What an action read of a checkpoint's trouble, to see whether it is still the same."""
    return (cp.status, cp.attempt, cp.retry_at, cp.failing_seq, cp.error)


async def _expect(
    store: CheckpointStore,
    cid: CheckpointId,
    position: int | None,
    action: str,
    failing: int | None = None,
) -> Callable[[Checkpoint], None]:
    """A check that ``cid`` still fails at message ``failing`` and/or is still at
    ``position``; with neither, that it is still where it is now (position and failure):
    raises :class:`CheckpointMoved` once it is not."""
    if position is not None and position < 0:
        raise ValueError(f"a position is not negative, not {position}")
    if failing is not None and failing < 1:
        raise ValueError(f"a failing message's stream sequence is at least 1, not {failing}")
    failure = None
    if position is None and failing is None:
        stored = await store.get(cid)
        if stored is None:
            raise KeyNotFound(store.kv.bucket, cid.key, why="no such checkpoint")
        position, failure = stored.checkpoint.position, _failure(stored.checkpoint)

    def check(cp: Checkpoint) -> None:
        if failing is not None and (cp.status is Status.ACTIVE or cp.failing_seq != failing):
            now = f"failing at #{cp.failing_seq}" if cp.failing_seq else cp.status.value
            raise CheckpointMoved(
                f"checkpoint {cid} is not failing at message #{failing} (it is {now}, at "
                f"position {cp.position}): it moved on; nothing to {action}"
            )
        if position is not None and cp.position != position:
            raise CheckpointMoved(
                f"checkpoint {cid} is at position {cp.position}, not {position}: it moved on "
                f"(processed, or skipped by someone else); nothing to {action}"
            )
        if failure is not None and _failure(cp) != failure:
            raise CheckpointMoved(
                f"checkpoint {cid} changed since it was read (now {cp.status.value}, attempt "
                f"{cp.attempt}): someone else acted on it; nothing to {action}"
            )

    return check


async def retry(
    store: CheckpointStore,
    cid: CheckpointId,
    clock: Clock = time.time,
    *,
    position: int | None = None,
    failing: int | None = None,
) -> Checkpoint:
    """Retry a failed (or retrying) checkpoint now, with a fresh retry budget, if it still
    fails at message ``failing`` and/or is still at ``position`` (with neither: as read now,
    failure included; :class:`CheckpointMoved` if not). One already due for its first retry
    is refused: retrying it again would change nothing."""
    still = await _expect(store, cid, position, "retry", failing)

    def go(cp: Checkpoint) -> Checkpoint:
        now = clock()
        still(cp)
        if cp.status is Status.ACTIVE:
            raise CheckpointError(f"checkpoint {cid} is active: nothing to retry")
        _not_in_work(cp, now, "retry")
        if cp.status is Status.RETRY and cp.attempt <= 1 and cp.retry_due(now):
            raise CheckpointMoved(
                f"checkpoint {cid} is already due for a retry at position {cp.position}; "
                "nothing done"
            )
        return cp.retry_now(now)

    return (await store.change(cid, go)).checkpoint


async def skip(
    store: CheckpointStore,
    cid: CheckpointId,
    clock: Clock = time.time,
    *,
    failing: int,
    position: int | None = None,
) -> Checkpoint:
    """Count the failing message #``failing`` (the stream sequence the views print as
    ``failing #N``) as processed and go on with the next, only while the checkpoint still
    fails at that message (and, if given, is still at ``position``); :class:`CheckpointMoved`
    if not.

    The message is named, not read: a skip loses that event for good, so it must be the one
    the operator looked at. A skip run again (a script, a second operator) is refused
    rather than skipping whichever message failed next, even when the checkpoint's position
    did not move (a failure on events missing from the stream)."""
    still = await _expect(store, cid, position, "skip", failing)

    def go(cp: Checkpoint) -> Checkpoint:
        still(cp)
        _not_in_work(cp, clock(), "skip")
        return cp.skip()

    return (await store.change(cid, go)).checkpoint


async def release(store: CheckpointStore, cid: CheckpointId) -> Checkpoint:
    """Drop a reservation (a host known to be gone) so another worker takes it at once."""
    return (await store.change(cid, lambda cp: cp.release())).checkpoint


def describe(cp: Checkpoint, now: float) -> str:
    """One line for a checkpoint: id, status, position/version, and what holds it."""
    parts = [str(cp.id), cp.status.value, f"{cp.position}/{cp.version}"]
    if cp.version > cp.position:
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
