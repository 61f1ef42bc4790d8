"""Snapshots of an operator's state in a JetStream KV bucket, changed by compare-and-set.

One stateful operator of one pipeline owns one *head* key, ``<pipeline>.<operator>.head``,
whose value says which snapshot is current: its epoch, how many chunks it has, its size and its
SHA-256. The snapshot itself is in chunk keys ``<pipeline>.<operator>.e<epoch>-<token>.<i>``
(the token is random for each save: a writer that is about to be fenced never overwrites the
chunks of the snapshot that is current), each at most :data:`CHUNK` bytes (a KV value is one
message, and a server refuses one larger than its
``max_payload``, 1 MiB by default).

Saving writes the new epoch's chunks first and then moves the head with a compare-and-set on
the revision this process last saw. So:

- a crash between the two leaves the previous snapshot whole (the new chunks are orphans,
  removed by the next save);
- a second process running the same operator is found out: its head update fails, and
  :class:`~headrace.state.errors.StateFenced` stops it (state owned twice would count twice);
- a head update whose answer was lost (a timeout, a failover) is settled by reading the head
  again: if it names our epoch and digest, the save happened.

The previous epoch's chunks are purged after the head moved (best effort: a leftover chunk is
only space). The bucket keeps one revision per key: only the current snapshot matters.

This module stores bytes; what they hold (the operator's state, the sequences it covers, the
results not yet committed) is the stateful stage's business (``headrace.pipeline.stateful``).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import re
import secrets
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import attrs

from headrace.jetstream.kv import (
    KeyExists,
    KeyNotFound,
    KeyValue,
    KeyValueConfig,
    WrongRevision,
    leader_bucket,
)
from headrace.jetstream.transient import retry_transient
from headrace.state.errors import SnapshotCorrupt, StateFenced

if TYPE_CHECKING:
    from headrace.jetstream.context import JetStream

#: The bucket snapshots live in unless a pipeline names another (``state_bucket``).
DEFAULT_STATE_BUCKET = "headrace_state"
#: The largest chunk of a snapshot (bytes): under a server's default ``max_payload`` (1 MiB)
#: with room for the KV headers.
CHUNK = 512 * 1024
#: A snapshot up to this size (bytes) is kept in the head itself: 0.43 ms a save on an idle
#: server against 1.27 ms for a chunk, the head and a purge (6 KB; bench/README.md).
INLINE = 256 * 1024
#: Chunks read per request when a snapshot is loaded (4 MiB at most in memory at a time).
READ_AHEAD = 8
#: The head's format; a head of a newer one is refused rather than misread.
FORMAT = 1


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


_PLAIN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def key_token(name: str) -> str:
    """``name`` as one KV key token: itself when short and plain, else a hash of it (KV keys
    allow few characters, and a dot would split a name into two tokens)."""
    if _PLAIN.match(name):
        return name
    return "h" + hashlib.sha256(name.encode()).hexdigest()[:32]


@attrs.frozen(slots=True)
class SnapshotHead:
    """What the head key says: the current snapshot's epoch (1 for the first), its chunks,
    size and digest, its lineage (when the state began: a reset starts a new one, which the
    results' identity carries, so a sink tells results of a new state from the old one) and
    when it was saved. ``pipeline`` and ``operator`` name whose state it is (the key holds
    them as tokens, which may be hashes); empty in heads written before they were kept."""

    epoch: int
    token: str
    chunks: int
    size: int
    digest: str
    lineage: str
    saved: str
    format: int = FORMAT
    pipeline: str = ""
    operator: str = ""
    #: The snapshot itself, base64, when it is small enough to travel in the head
    #: (:data:`INLINE`; ``chunks`` is 0 then): one compare-and-set a save instead of a chunk
    #: put, the head's update and the old chunk's purge.
    inline: str = attrs.field(default="", repr=False)

    def to_json(self) -> bytes:
        return json.dumps(attrs.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> SnapshotHead:
        try:
            data = json.loads(raw)
            head = cls(**data)
        except (ValueError, TypeError) as exc:
            raise SnapshotCorrupt(f"{where}: the snapshot head does not decode ({exc})") from None
        if head.format > FORMAT:
            raise SnapshotCorrupt(
                f"{where}: the snapshot was written in format {head.format} by a newer "
                f"headrace; this one reads format {FORMAT}"
            )
        return head


class SnapshotStore:
    """The snapshots of one operator (see the module docs). Not safe for two tasks at once:
    the operator's stage is its only user."""

    def __init__(self, kv: KeyValue, pipeline: str, operator: str) -> None:
        self.kv = kv
        self.pipeline = pipeline
        self.operator = operator
        self.prefix = f"{key_token(pipeline)}.{key_token(operator)}"
        self.head_key = f"{self.prefix}.head"
        #: The head as this process last read or wrote it, and its revision.
        self.head: SnapshotHead | None = None
        self.revision: int | None = None

    def __repr__(self) -> str:
        return f"<SnapshotStore {self.kv.bucket}/{self.prefix} epoch {self.epoch}>"

    @property
    def epoch(self) -> int:
        return self.head.epoch if self.head is not None else 0

    @property
    def where(self) -> str:
        return f"state of {self.pipeline}/{self.operator} (bucket {self.kv.bucket!r})"

    @classmethod
    async def open(
        cls,
        js: JetStream,
        pipeline: str,
        operator: str,
        *,
        bucket: str = DEFAULT_STATE_BUCKET,
        replicas: int = 1,
        create: bool = True,
    ) -> SnapshotStore:
        """The store of ``operator`` of ``pipeline`` in ``bucket`` (made if missing and
        ``create``)."""
        kv = await retry_transient(lambda: _bucket(js, bucket, replicas, create))
        return cls(kv, pipeline, operator)

    def _chunk_key(self, epoch: int, token: str, i: int) -> str:
        return f"{self.prefix}.e{epoch}-{token}.{i}"

    async def load(self, *, sweep: bool = True) -> bytes | None:
        """The current snapshot's bytes, or None when the operator has none yet; remembers
        the head for the next :meth:`save`'s compare-and-set. ``sweep=False`` leaves other
        chunks alone: for a reader that does not own the state (``headrace state show``),
        where they may be a running worker's save in progress."""
        parts = await self.load_parts(sweep=sweep)
        if parts is None:
            return None
        return b"".join([part async for part in parts])

    async def load_parts(self, *, sweep: bool = True) -> AsyncIterator[bytes] | None:
        """:meth:`load` as the snapshot's parts, read a few chunks at a time: a snapshot
        larger than memory (an operator on disk) is written to its file as it comes. None
        when there is no snapshot. The digest is checked once the last part was read
        (:class:`SnapshotCorrupt` then, from the iteration), and only then is the head
        remembered: read every part before trusting any."""
        try:
            entry = await retry_transient(lambda: self.kv.get(self.head_key))
        except KeyNotFound:
            self.head, self.revision = None, None
            return None
        head = SnapshotHead.from_json(entry.value, self.where)
        return self._parts(head, entry.revision, sweep)

    async def _parts(self, head: SnapshotHead, revision: int, sweep: bool) -> AsyncIterator[bytes]:
        digest = hashlib.sha256()
        size = 0
        groups = self._inline(head) if head.chunks == 0 else self._chunk_groups(head)
        async for group in groups:
            for part in group:
                digest.update(part)
                size += len(part)
                yield part
        if size != head.size or digest.hexdigest() != head.digest:
            raise SnapshotCorrupt(
                f"{self.where}: snapshot epoch {head.epoch} does not match its digest"
            )
        self.head, self.revision = head, revision
        if sweep:
            await self._sweep(head)

    async def _inline(self, head: SnapshotHead) -> AsyncIterator[list[bytes]]:
        """The snapshot kept in ``head`` itself, as one group of one part."""
        try:
            payload = base64.b64decode(head.inline, validate=True)
        except ValueError:
            raise SnapshotCorrupt(
                f"{self.where}: snapshot epoch {head.epoch} in its head does not decode"
            ) from None
        yield [payload]

    async def _chunk_groups(self, head: SnapshotHead) -> AsyncIterator[list[bytes]]:
        """The chunks of ``head``, :data:`READ_AHEAD` of them per request."""
        keys = [self._chunk_key(head.epoch, head.token, i) for i in range(head.chunks)]
        for at in range(0, len(keys), READ_AHEAD):
            wanted = keys[at : at + READ_AHEAD]
            found = await retry_transient(lambda wanted=wanted: self.kv.get_many(wanted))  # type: ignore[misc]
            missing = [k for k in wanted if k not in found]
            if missing:
                raise SnapshotCorrupt(
                    f"{self.where}: snapshot epoch {head.epoch} misses chunks of its "
                    f"{head.chunks} ({missing[0]}, ...)"
                )
            yield [found[k].value for k in wanted]

    async def save(self, payload: bytes, lineage: str) -> SnapshotHead:
        """Store ``payload`` as the next epoch and make it current (see the module docs).
        :class:`StateFenced` if another process moved the head since this one saw it."""
        return await self.save_parts(_one(payload), lineage)

    async def save_parts(self, parts: AsyncIterator[bytes], lineage: str) -> SnapshotHead:
        """:meth:`save` of the bytes ``parts`` yields one after another, holding at most a
        chunk of them at a time: a snapshot larger than memory (an operator on disk) is
        streamed from its file."""
        previous = self.head
        epoch = self.epoch + 1
        token = secrets.token_hex(4)
        digest = hashlib.sha256()
        size = chunks = 0
        buffer = bytearray()
        async for part in parts:
            digest.update(part)
            size += len(part)
            buffer += part
            while len(buffer) > CHUNK:
                await self._put_chunk(epoch, token, chunks, bytes(buffer[:CHUNK]))
                del buffer[:CHUNK]
                chunks += 1
        inline = chunks == 0 and len(buffer) <= INLINE
        if not inline and buffer:
            await self._put_chunk(epoch, token, chunks, bytes(buffer))
            chunks += 1
        head = SnapshotHead(
            epoch=epoch,
            token=token,
            chunks=chunks,
            size=size,
            digest=digest.hexdigest(),
            lineage=lineage,
            saved=_now_iso(),
            pipeline=self.pipeline,
            operator=self.operator,
            inline=base64.b64encode(buffer).decode() if inline else "",
        )
        try:
            self.revision = await self._move_head(head)
        except StateFenced:
            await self._forget(head)  # ours, never current
            raise
        self.head = head
        if previous is not None:
            await self._forget(previous)
        return head

    async def _put_chunk(self, epoch: int, token: str, i: int, chunk: bytes) -> None:
        key = self._chunk_key(epoch, token, i)
        await retry_transient(lambda: self.kv.put(key, chunk))

    async def _move_head(self, head: SnapshotHead) -> int:
        value = head.to_json()
        revision = self.revision
        try:
            if revision is None:
                return await retry_transient(lambda: self.kv.create(self.head_key, value))
            return await retry_transient(lambda: self.kv.update(self.head_key, value, revision))
        except (KeyExists, WrongRevision):
            pass
        # Moved by someone: another process, or our own write whose answer was lost.
        try:
            entry = await retry_transient(lambda: self.kv.get(self.head_key))
        except KeyNotFound:
            raise StateFenced(f"{self.where}: the snapshot head was deleted meanwhile") from None
        if SnapshotHead.from_json(entry.value, self.where) == head:
            return entry.revision
        raise StateFenced(
            f"{self.where}: another process saved a snapshot since this one loaded it (two "
            "workers run this stateful operator); this one stops and leaves its messages to "
            "the other"
        )

    async def _forget(self, old: SnapshotHead) -> None:
        """Purge ``old``'s chunks. Best effort: a leftover chunk is only space, which the
        sweep at the next load removes."""
        try:
            for i in range(old.chunks):
                await self.kv.purge(self._chunk_key(old.epoch, old.token, i))
        except Exception:
            return

    async def _sweep(self, keep: SnapshotHead) -> None:
        """Purge every chunk but ``keep``'s: orphans of saves cut short or fenced (listing the
        keys is a watch of the prefix: done once per load, not per save)."""
        kept = {self._chunk_key(keep.epoch, keep.token, i) for i in range(keep.chunks)}
        try:
            found = await self.kv.keys(f"{self.prefix}.>")
            for key in found:
                if key != self.head_key and key not in kept:
                    await self.kv.purge(key)
        except Exception:
            return

    async def reset(self) -> bool:
        """Remove the operator's state (its head and every chunk); whether there was any."""
        keys = await retry_transient(lambda: self.kv.keys(f"{self.prefix}.>"))
        for key in keys:
            await retry_transient(lambda key=key: self.kv.purge(key))  # type: ignore[misc]
        self.head, self.revision = None, None
        return bool(keys)


async def _one(payload: bytes) -> AsyncIterator[bytes]:
    yield payload


async def _bucket(js: JetStream, bucket: str, replicas: int, create: bool) -> KeyValue:
    config = KeyValueConfig(
        bucket=bucket,
        description="headrace: snapshots of the state of stateful operators",
        history=1,
        replicas=replicas,
    )
    # Leader reads: a replica behind would hand back an older head than the one saved.
    return await leader_bucket(js, config, create=create)
