"""Checkpoints kept in a JetStream KV bucket, one key per checkpoint, every change a
compare-and-set on the key's revision.

Several processes change the same checkpoint: the global stream consumer raises its version
while a worker advances its position, two workers race for a reservation, an operator retries
it. None of them may overwrite another's change, so each change reads the checkpoint, applies a
pure transition (checkpoint.py) and writes it conditional on the revision it read; a
:class:`~headrace.jetstream.kv.WrongRevision` means someone else wrote first, and the change is
applied again to what they wrote. A transition may refuse (``AlreadyReserved``): that ends the
attempt, since reading again would not change the answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

import attrs

from headrace.checkpoints.checkpoint import Checkpoint, CheckpointError, CheckpointId
from headrace.jetstream.kv import KeyNotFound, KeyValue, WrongRevision

#: Compare-and-set attempts before a change gives up: a key this contended is a bug.
MAX_ATTEMPTS = 50


class CheckpointContention(CheckpointError):
    """A change lost the compare-and-set race ``MAX_ATTEMPTS`` times in a row."""


@attrs.frozen(slots=True)
class Stored:
    """A checkpoint as read, with the KV revision a conditional write must name."""

    checkpoint: Checkpoint
    revision: int


class CheckpointStore:
    """Reads and changes checkpoints in ``kv`` (see the module docs)."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    async def get(self, checkpoint_id: CheckpointId) -> Stored | None:
        """The checkpoint and its revision, or None when it does not exist."""
        try:
            entry = await self.kv.get(checkpoint_id.key)
        except KeyNotFound:
            return None
        return Stored(Checkpoint.from_json(checkpoint_id, entry.value), entry.revision)

    async def change(
        self,
        checkpoint_id: CheckpointId,
        transition: Callable[[Checkpoint], Checkpoint],
        *,
        create: bool = False,
        current: Stored | None = None,
        missing: bool = False,
    ) -> Stored:
        """Apply ``transition`` to the stored checkpoint and write the result, retrying on a
        lost race. ``create``: a missing checkpoint starts empty (else ``KeyNotFound``). An
        unchanged result is not written. ``current``: the checkpoint as last seen (a watch,
        one's own last write), tried first without reading it: a worker's writes follow one
        another, so that saves a read each. Its write is conditional on its revision, so a
        stale one is refused and the change goes on as usual; a refusal or no change on it is
        not trusted either, but checked on a fresh read. ``missing`` (with ``create``): the
        checkpoint was just read as absent (a batched read), so its creation is tried first;
        if it was created meanwhile, the change goes on as usual."""
        if missing and create:
            new = transition(Checkpoint(id=checkpoint_id))
            try:
                return Stored(new, await self.kv.create(checkpoint_id.key, new.to_json()))
            except WrongRevision:
                pass
        elif current is not None:
            try:
                new = transition(current.checkpoint)
                if new != current.checkpoint:
                    revision = await self.kv.update(
                        checkpoint_id.key, new.to_json(), current.revision
                    )
                    return Stored(new, revision)
            except Exception:  # stale (or refused on a stale state): read and go on
                pass
        for _ in range(MAX_ATTEMPTS):
            stored = await self.get(checkpoint_id)
            if stored is None:
                if not create:
                    raise KeyNotFound(self.kv.bucket, checkpoint_id.key, why="no such checkpoint")
                new = transition(Checkpoint(id=checkpoint_id))
                try:
                    revision = await self.kv.create(checkpoint_id.key, new.to_json())
                except WrongRevision:
                    continue  # created meanwhile: apply the change to that one
                return Stored(new, revision)
            new = transition(stored.checkpoint)
            if new == stored.checkpoint:
                return stored
            try:
                revision = await self.kv.update(checkpoint_id.key, new.to_json(), stored.revision)
            except WrongRevision:
                continue
            return Stored(new, revision)
        raise CheckpointContention(
            f"checkpoint {checkpoint_id}: {MAX_ATTEMPTS} compare-and-set attempts lost in a row"
        )

    async def get_many(self, checkpoint_ids: Sequence[CheckpointId]) -> dict[CheckpointId, Stored]:
        """Those of ``checkpoint_ids`` that exist, as read at one moment, in one batched
        Direct Get per 1024 (``KeyValue.get_many``) instead of a request each."""
        keys = {cid.key: cid for cid in checkpoint_ids}
        entries = await self.kv.get_many(list(keys))
        return {
            keys[key]: Stored(Checkpoint.from_json(keys[key], entry.value), entry.revision)
            for key, entry in entries.items()
        }

    async def all(self, group: str | None = None) -> AsyncIterator[Stored]:
        """Every checkpoint (of ``group``), all as read at one moment; a checkpoint deleted
        meanwhile is left out.

        The keys come from one watch of the group, the checkpoints from batched Direct Gets
        (``KeyValue.get_many``: one request per 1024 keys, all at the first one's moment),
        not one request per checkpoint: workers poll this, and a group holds every entity
        ever seen.
        """
        pattern = f"{CheckpointId(group, '-', '-').key.split('.')[0]}.>" if group else ">"
        keys = await self.kv.keys(pattern)
        entries = await self.kv.get_many(keys)
        for key in keys:
            entry = entries.get(key)
            if entry is not None:
                cid = CheckpointId.from_key(key)
                yield Stored(Checkpoint.from_json(cid, entry.value), entry.revision)
