"""Checkpoints in a real JetStream KV bucket: compare-and-set under concurrent writers, and the
stored form as an independent client (nats-py's KV) reads it."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from headrace.checkpoints import AlreadyReserved, Checkpoint, CheckpointId, Status
from headrace.checkpoints.store import CheckpointStore
from headrace.jetstream import JetStream
from headrace.jetstream.kv import KeyNotFound, KeyValueConfig, create_key_value
from headrace.nats import connect

CID = CheckpointId("billing", "invoices", "orders.42")


@pytest.fixture
async def store(nats_server: Any) -> Any:
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="checkpoints"))
        yield CheckpointStore(kv)


async def test_create_then_change(store: CheckpointStore) -> None:
    assert await store.get(CID) is None
    with pytest.raises(KeyNotFound):
        await store.change(CID, lambda cp: cp.seen(1))
    first = await store.change(CID, lambda cp: cp.seen(3), create=True)
    assert (first.checkpoint.version, first.checkpoint.position) == (3, 0)
    second = await store.change(CID, lambda cp: cp.advanced(2))
    assert second.revision > first.revision
    again = await store.get(CID)
    assert again == second
    # an unchanged result writes nothing
    assert await store.change(CID, lambda cp: cp.seen(1)) == second


async def test_concurrent_writers_lose_no_change(store: CheckpointStore) -> None:
    # The global consumer raises the version 1..40 while a worker advances the position
    # 1..40: interleaved compare-and-set writes, each applied to what the other wrote.
    await store.change(CID, lambda cp: cp, create=True)

    async def raise_version() -> None:
        for v in range(1, 41):
            await store.change(CID, lambda cp, v=v: cp.seen(v))

    async def advance() -> None:
        for p in range(1, 41):
            await store.change(CID, lambda cp, p=p: cp.advanced(p))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(raise_version)
            nursery.start_soon(advance)
    final = await store.get(CID)
    assert final is not None
    assert (final.checkpoint.version, final.checkpoint.position) == (40, 40)


async def test_one_of_racing_hosts_gets_the_reservation(store: CheckpointStore) -> None:
    await store.change(CID, lambda cp: cp.seen(5), create=True)
    winners: list[str] = []
    losers: list[str] = []

    async def take(owner: str) -> None:
        try:
            await store.change(CID, lambda cp: cp.reserve(owner, now=1000, timeout=300))
        except AlreadyReserved:
            losers.append(owner)
        else:
            winners.append(owner)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(take, f"host-{i}")
    assert len(winners) == 1 and len(losers) == 7
    stored = await store.get(CID)
    assert stored is not None and stored.checkpoint.reservation is not None
    assert stored.checkpoint.reservation.owner == winners[0]


async def test_racing_creates_make_one_checkpoint(store: CheckpointStore) -> None:
    async def create(v: int) -> None:
        await store.change(CID, lambda cp: cp.seen(v), create=True)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for v in range(1, 7):
                nursery.start_soon(create, v)
    stored = await store.get(CID)
    assert stored is not None and stored.checkpoint.version == 6


async def test_listing_and_the_stored_form_for_other_clients(
    store: CheckpointStore, nats_server: Any, natspy: Any
) -> None:
    other = CheckpointId("shipping", "labels", "orders.7")
    await store.change(CID, lambda cp: cp.seen(2), create=True)
    await store.change(other, lambda cp: cp.seen(9).advanced(9), create=True)
    everything = [s.checkpoint.id async for s in store.all()]
    assert sorted(everything) == sorted([CID, other])
    billing = [s.checkpoint async for s in store.all("billing")]
    assert billing == [Checkpoint(id=CID, version=2)]
    # nats-py reads the same key and JSON: the format is plain for operators' tools.
    await natspy.connect(nats_server.url)
    kv = await natspy.call(natspy.nc.jetstream().key_value, "checkpoints")
    entry = await natspy.call(kv.get, CID.key)
    assert json.loads(entry.value) == {
        "version": 2,
        "position": 0,
        "status": Status.ACTIVE,
        "seen_events": 0,
        "processed_events": 0,
    }
