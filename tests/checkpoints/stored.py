"""Waiting for a checkpoint's stored state, for the checkpoint tests: a watch of its key
brings every write as it lands, so a test waits on that event instead of reading and sleeping
in a loop."""

from __future__ import annotations

from collections.abc import Callable

import trio
from headrace.checkpoints import Checkpoint, CheckpointId, CheckpointStore
from headrace.jetstream.kv import Operation


async def until_stored(
    store: CheckpointStore,
    cid: CheckpointId,
    predicate: Callable[[Checkpoint], bool],
    timeout: float = 20,
) -> Checkpoint:
    """The checkpoint ``cid`` once a write of it satisfies ``predicate`` (its current value
    counts), within ``timeout`` seconds. A checkpoint not written yet is waited for."""
    seen: Checkpoint | None = None
    with trio.move_on_after(timeout):
        async with store.kv.watch(cid.key) as watcher:
            async for entry in watcher:
                if entry.operation is Operation.PUT:
                    seen = Checkpoint.from_json(cid, entry.value)
                    if predicate(seen):
                        return seen
    raise AssertionError(f"{cid}: not so within {timeout}s; last stored: {seen}")


async def until_group_stored(
    store: CheckpointStore,
    group: str,
    predicate: Callable[[dict[CheckpointId, Checkpoint]], bool],
    timeout: float = 20,
) -> dict[CheckpointId, Checkpoint]:
    """Every checkpoint of ``group`` (a name with nothing to escape), once ``predicate`` holds
    of them together, as a watch of the group brings each write; checked from the end of the
    watch's initial data on."""
    seen: dict[CheckpointId, Checkpoint] = {}
    with trio.move_on_after(timeout):
        async with store.kv.watch(f"{group}.>") as watcher:
            if watcher.initial_done and predicate(seen):  # (a group with no checkpoint)
                return seen
            async for entry in watcher:
                cid = CheckpointId.from_key(entry.key)
                if entry.operation is Operation.PUT:
                    seen[cid] = Checkpoint.from_json(cid, entry.value)
                else:
                    seen.pop(cid, None)
                if watcher.initial_done and predicate(seen):
                    return seen
    raise AssertionError(f"group {group}: not so within {timeout}s; last stored: {seen}")
