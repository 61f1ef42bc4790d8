"""``KeyValue.get_many``: many keys' values in batched Direct Gets (ADR-31 multi-last), more
than one request's 1024 subjects included, markers and unknown keys left out; and the
checkpoint listing built on it."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from headrace.checkpoints import CheckpointId
from headrace.checkpoints.store import CheckpointStore
from headrace.jetstream import InvalidKey, JetStream, KeyValue, KeyValueConfig, create_key_value
from headrace.nats import connect


async def test_get_many_over_more_keys_than_one_request_takes(
    nats_server: Any, natspy: Any
) -> None:
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = await create_key_value(js, KeyValueConfig(bucket="many", history=3))
        keys = [f"k.{n}" for n in range(1100)]
        for n, key in enumerate(keys):
            await kv.put(key, b"old")
            await kv.put(key, b"v%d" % n)
        await kv.delete("k.3")
        await kv.purge("k.1099")
        expected = {k: b"v%d" % n for n, k in enumerate(keys) if k not in ("k.3", "k.1099")}

        with trio.fail_after(20):
            found = await kv.get_many([*keys, "k.never", "k.5"])
        assert {k: e.value for k, e in found.items()} == expected
        entry = found["k.5"]
        assert (entry.bucket, entry.key, entry.delta) == ("many", "k.5", 0)
        assert entry.revision == (await kv.get("k.5")).revision
        assert await kv.get_many([]) == {}
        with pytest.raises(InvalidKey):
            await kv.get_many(["k.*"])

        # A bucket read without Direct Get (a legacy one) gives the same, key by key.
        legacy = KeyValue(js, "many", direct=False)
        some = ["k.1", "k.3", "k.7", "k.never"]
        assert {k: e.value for k, e in (await legacy.get_many(some)).items()} == {
            "k.1": b"v1",
            "k.7": b"v7",
        }

    # An independent client agrees on what was read.
    await natspy.connect(nats_server.url)
    kv_py = await natspy.call(natspy.nc.jetstream().key_value, "many")
    for key in ("k.0", "k.1024", "k.1098"):
        assert (await natspy.call(kv_py.get, key)).value == expected[key]


async def test_listing_more_checkpoints_than_one_request_takes(nats_server: Any) -> None:
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="checkpoints"))
        store = CheckpointStore(kv)
        ids = [CheckpointId("billing", "invoices", f"orders.{n}") for n in range(1100)]
        for n, cid in enumerate(ids):
            await store.change(cid, lambda cp, n=n: cp.seen(n + 1), create=True)
        await store.change(
            CheckpointId("other", "s", "orders.1"), lambda cp: cp.seen(1), create=True
        )
        with trio.fail_after(20):
            listed = {s.checkpoint.id: s async for s in store.all("billing")}
        assert set(listed) == set(ids)
        assert all(listed[cid].checkpoint.version == n + 1 for n, cid in enumerate(ids))
        sample = await store.get(ids[1050])
        assert sample == listed[ids[1050]]
