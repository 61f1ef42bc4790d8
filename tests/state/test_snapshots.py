"""SnapshotStore's parts on a real server: saved from parts of any size and read back a few
chunks at a time, across the sizes where its layout changes (inline in the head, one chunk,
several, more than one read's worth), and a snapshot with a chunk changed under it refused
only once it was read through (nothing trusted before the digest)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest
import trio
from headrace.jetstream import JetStream
from headrace.jetstream.kv import key_value
from headrace.nats import connect
from headrace.state.errors import SnapshotCorrupt
from headrace.state.snapshots import CHUNK, INLINE, READ_AHEAD, SnapshotStore

SIZES = [0, 1, INLINE, INLINE + 1, CHUNK, CHUNK + 1, READ_AHEAD * CHUNK + 7]


async def in_parts(data: bytes, rng: random.Random) -> AsyncIterator[bytes]:
    at = 0
    while at < len(data):
        n = rng.choice([1, 100, CHUNK - 1, CHUNK, 3 * CHUNK])
        yield data[at : at + n]
        at += n


@pytest.mark.parametrize("size", SIZES)
async def test_parts_round_trip_at_every_layout(nats_server, size: int):
    rng = random.Random(size)
    data = rng.randbytes(size)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = await SnapshotStore.open(js, "parts", f"s{size}")
        head = await store.save_parts(in_parts(data, rng), "lineage")
        assert head.size == size
        assert head.chunks == (0 if size <= INLINE else -(-size // CHUNK))
        reader = await SnapshotStore.open(js, "parts", f"s{size}")
        parts = await reader.load_parts()
        assert parts is not None
        got = [part async for part in parts]
        assert b"".join(got) == data
        assert all(len(p) <= CHUNK for p in got) and reader.head == head


async def test_a_changed_chunk_is_refused_once_read_through(nats_server):
    data = random.Random(3).randbytes(3 * CHUNK)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = await SnapshotStore.open(js, "parts", "changed")
        head = await store.save(data, "lineage")
        kv = await key_value(js, "headrace_state")
        await kv.put(f"parts.changed.e{head.epoch}-{head.token}.1", b"x" * CHUNK)
        reader = await SnapshotStore.open(js, "parts", "changed")
        parts = await reader.load_parts()
        assert parts is not None
        with trio.fail_after(10), pytest.raises(SnapshotCorrupt, match="does not match"):
            async for _ in parts:
                assert reader.head is None  # nothing trusted before the digest
        await kv.purge(f"parts.changed.e{head.epoch}-{head.token}.2")
        with pytest.raises(SnapshotCorrupt, match="misses chunks"):
            await reader.load()
