"""Key-Value per-key TTLs and limit markers (ADR-48), watch resume (ADR-8 watch options),
bucket updates and ``purge_deletes``, against a real nats-server, with nats-py's KV as the
independent peer.

Expiry is waited for on the server's event, never with a sleep: a bucket with limit markers
gets a ``Nats-Marker-Reason: MaxAge`` marker when a key's last entry runs out, and a watcher
delivers it.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from headrace.jetstream import (
    BucketConfigRefused,
    BucketNotFound,
    InvalidMessageTTL,
    JetStream,
    KeyTTLDisabled,
    LimitMarkersNotSupported,
    MessageTTLDisabled,
    StorageType,
    create_or_update_key_value,
    update_key_value,
)
from headrace.jetstream.kv import (
    Entry,
    KeyNotFound,
    KeyValue,
    KeyValueConfig,
    KeyWatcher,
    Operation,
    create_key_value,
)
from headrace.nats import connect

TIMEOUT = 10


async def next_entry(watcher: KeyWatcher) -> Entry:
    with trio.fail_after(TIMEOUT):
        return await anext(watcher)


async def initial(watcher: KeyWatcher) -> list[tuple[str, bytes, Operation, int]]:
    with trio.fail_after(TIMEOUT):
        return [(e.key, e.value, e.operation, e.revision) async for e in watcher.initial()]


async def marker_bucket(js: JetStream, bucket: str, **config: Any) -> KeyValue:
    config.setdefault("limit_marker_ttl", 60)
    return await create_key_value(js, KeyValueConfig(bucket=bucket, **config))


# -- configuration --------------------------------------------------------------------------------


def test_limit_marker_ttl_config() -> None:
    stream = KeyValueConfig(bucket="B", limit_marker_ttl=5).stream_config()
    assert (stream.allow_msg_ttl, stream.subject_delete_marker_ttl) == (True, 5)
    plain = KeyValueConfig(bucket="B").stream_config()
    assert (plain.allow_msg_ttl, plain.subject_delete_marker_ttl) == (None, None)
    for bad in (0, 0.5, -1, float("nan")):
        with pytest.raises(ValueError, match="limit_marker_ttl"):
            KeyValueConfig(bucket="B", limit_marker_ttl=bad)


async def test_bucket_with_limit_markers(nats_server, natspy):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = await marker_bucket(js, "LM", limit_marker_ttl=90)
        info = await js.stream_info("KV_LM")
        assert info.config.allow_msg_ttl is True
        assert info.config.subject_delete_marker_ttl == 90
        assert (await kv.status()).limit_marker_ttl == 90
        plain = await create_key_value(js, KeyValueConfig(bucket="PLAIN"))
        assert (await plain.status()).limit_marker_ttl is None

    nc_py = await natspy.connect(nats_server.url)

    async def read() -> Any:
        status = await (await nc_py.jetstream().key_value("LM")).status()
        return status.marker_ttl

    assert await natspy.call(read) == 90


# -- per-key TTL ----------------------------------------------------------------------------------


async def test_create_with_ttl_expires_into_a_purge_marker(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await marker_bucket(JetStream(nc), "EXP", limit_marker_ttl=30)
        await kv.put("stays", b"s")
        async with kv.watch("short") as watcher:
            assert await initial(watcher) == []
            rev = await kv.create("short", b"v", ttl=1)
            put = await next_entry(watcher)
            assert (put.revision, put.operation, put.value) == (rev, Operation.PUT, b"v")
            marker = await next_entry(watcher)
        assert marker.operation is Operation.PURGE
        assert (marker.key, marker.value) == ("short", b"")
        assert marker.revision > rev

        with pytest.raises(KeyNotFound) as caught:
            await kv.get("short")
        assert caught.value.entry is not None
        assert caught.value.entry.revision == marker.revision
        assert caught.value.entry.operation is Operation.PURGE
        # The server rolled the key up to its marker: the value is gone from the history.
        assert [(e.operation, e.revision) for e in await kv.history("short")] == [
            (Operation.PURGE, marker.revision)
        ]
        assert await kv.keys() == ["stays"]
        # The key has no value, so create works again, on top of the marker.
        again = await kv.create("short", b"w")
        assert (await kv.get("short")).revision == again


@pytest.mark.slow
async def test_bucket_ttl_with_markers_tells_watchers(nats_server):
    """A value removed by the bucket's own ttl (max_age) leaves a MaxAge marker too."""
    async with connect(nats_server.url) as nc:
        kv = await marker_bucket(JetStream(nc), "AGE", ttl=1, limit_marker_ttl=30)
        async with kv.watch(updates_only=True) as watcher:
            rev = await kv.put("k", b"v")
            assert (await next_entry(watcher)).revision == rev
            marker = await next_entry(watcher)
        assert (marker.key, marker.operation) == ("k", Operation.PURGE)


@pytest.mark.slow
async def test_purge_with_ttl_leaves_no_trace(nats_server):
    """The purge marker goes after its ttl, and the server places no marker for a marker.
    Its removal has no event of its own: a key created after it with the same ttl expires no
    earlier, and that key's MaxAge marker is the event waited for."""
    async with connect(nats_server.url) as nc:
        kv = await marker_bucket(JetStream(nc), "PT", limit_marker_ttl=30)
        await kv.put("k", b"1")
        await kv.put("k", b"2")
        purged = await kv.purge("k", ttl=1)
        assert [(e.operation, e.revision) for e in await kv.history("k")] == [
            (Operation.PURGE, purged)
        ]
        async with kv.watch("sentinel") as watcher:
            await kv.create("sentinel", b"", ttl=1)
            await next_entry(watcher)
            assert (await next_entry(watcher)).operation is Operation.PURGE
        assert await kv.history("k") == []
        with pytest.raises(KeyNotFound) as caught:
            await kv.get("k")
        assert caught.value.entry is None


async def test_ttl_in_bucket_without_markers_is_refused(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="NOM"))
        with pytest.raises(KeyTTLDisabled, match="limit_marker_ttl") as caught:
            await kv.create("k", b"v", ttl=5)
        assert isinstance(caught.value, MessageTTLDisabled)
        assert caught.value.err_code == 10166
        with pytest.raises(KeyTTLDisabled):
            await kv.purge("k", ttl="1m")
        assert await kv.history("k") == []
        with pytest.raises(InvalidMessageTTL):
            await kv.create("k", b"v", ttl=0.2)


async def test_history_bucket_raises_short_ttls_to_the_marker_ttl(nats_server):
    """ADR-43: unless a key keeps one revision, the server raises a per-key TTL below the
    limit marker TTL to it, and stores the raised value."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = await marker_bucket(js, "HIST", history=5, limit_marker_ttl=120)
        rev = await kv.create("k", b"v", ttl=2)
        stored = await js.get_msg("KV_HIST", rev)
        assert stored.headers is not None and stored.headers.get("Nats-TTL") == "120"


@pytest.mark.slow  # 2.3 s or more of timers: the full suite runs it
async def test_natspy_sees_headrace_ttl_and_headrace_sees_natspy_ttl(nats_server, natspy):
    """nats-py's watcher sees a key written by headrace with a TTL expire (as a PURGE), and a
    headrace watcher sees one nats-py created with a TTL expire."""
    nc_py = await natspy.connect(nats_server.url)
    async with connect(nats_server.url) as nc:
        kv = await marker_bucket(JetStream(nc), "PEER", limit_marker_ttl=30)
        # Two seconds: the peer's watch starts well within them and gets the value as its
        # initial data, then the marker as an update.
        rev = await kv.create("from-headrace", b"v", ttl=2)

        async def py_watch_expiry() -> list[tuple[Any, ...]]:
            pkv = await nc_py.jetstream().key_value("PEER")
            watcher = await pkv.watch("from-headrace")
            seen: list[tuple[Any, ...]] = []
            while len(seen) < 2:
                entry = await watcher.updates(timeout=TIMEOUT)
                if entry is not None:
                    seen.append((entry.operation, entry.value, entry.revision))
            await watcher.stop()
            return seen

        seen = await natspy.call(py_watch_expiry)
        assert seen[0] == (None, b"v", rev)  # nats-py leaves a PUT's operation unset
        assert seen[1][:2] == ("PURGE", b"") and seen[1][2] > rev

        async with kv.watch("from-natspy", updates_only=True) as watcher:

            async def py_create() -> int:
                pkv = await nc_py.jetstream().key_value("PEER")
                return int(await pkv.create("from-natspy", b"p", msg_ttl=1))

            py_rev = await natspy.call(py_create)
            put = await next_entry(watcher)
            marker = await next_entry(watcher)
        assert (put.revision, put.operation) == (py_rev, Operation.PUT)
        assert marker.operation is Operation.PURGE


# -- watch resume ---------------------------------------------------------------------------------


async def test_watch_resume_from_revision(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="RES", history=5))
        await kv.put("a", b"1")
        r2 = await kv.put("a", b"2")
        r3 = await kv.put("b", b"1")
        r4 = await kv.delete("a")
        async with kv.watch(resume_from_revision=r2) as watcher:
            # Every entry from r2 on, not the keys' last values (which would skip r2).
            assert await initial(watcher) == [
                ("a", b"2", Operation.PUT, r2),
                ("b", b"1", Operation.PUT, r3),
                ("a", b"", Operation.DEL, r4),
            ]
            r5 = await kv.put("c", b"1")
            assert (await next_entry(watcher)).revision == r5
        async with kv.watch("b", resume_from_revision=1) as watcher:
            assert [e[3] for e in await initial(watcher)] == [r3]
        async with kv.watch(resume_from_revision=r5 + 1) as watcher:
            assert watcher.initial_done
            r6 = await kv.put("d", b"1")
            assert (await next_entry(watcher)).revision == r6


async def test_watch_resume_from_a_revision_that_is_gone(nats_server):
    """History 1: the key's older revision was pushed out; the watch starts at the next one
    the bucket holds."""
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="GONE"))
        r1 = await kv.put("a", b"1")
        r2 = await kv.put("a", b"2")
        with pytest.raises(KeyNotFound):
            await kv.get("a", revision=r1)
        async with kv.watch(resume_from_revision=r1) as watcher:
            assert await initial(watcher) == [("a", b"2", Operation.PUT, r2)]


async def test_watch_resume_refuses_other_starts(nats_server) -> None:
    async with connect(nats_server.url) as nc:
        kv = KeyValue(JetStream(nc), "B")  # refused before any request is made
        await _refuses_other_starts(kv)


async def _refuses_other_starts(kv: KeyValue) -> None:
    for options in (
        {"resume_from_revision": 0},
        {"resume_from_revision": 3, "include_history": True},
        {"resume_from_revision": 3, "updates_only": True},
    ):
        with pytest.raises(ValueError):
            async with kv.watch(**options):
                pass


# -- updating a bucket ----------------------------------------------------------------------------


async def test_update_key_value(nats_server, natspy):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = await create_key_value(js, KeyValueConfig(bucket="UP"))
        await kv.put("k", b"1")
        updated = await update_key_value(
            js,
            KeyValueConfig(
                bucket="UP",
                description="now with history",
                history=5,
                ttl=3600,
                max_bytes=1 << 20,
                limit_marker_ttl=60,
            ),
        )
        info = await js.stream_info("KV_UP")
        assert info.config.max_msgs_per_subject == 5
        assert info.config.description == "now with history"
        assert info.config.max_age == 3600
        assert info.config.duplicate_window == 120
        assert info.config.max_bytes == 1 << 20
        assert info.config.subject_delete_marker_ttl == 60
        # The data survives; the new history applies.
        await updated.put("k", b"2")
        assert [e.value for e in await updated.history("k")] == [b"1", b"2"]

    nc_py = await natspy.connect(nats_server.url)

    async def read() -> Any:
        status = await (await nc_py.jetstream().key_value("UP")).status()
        return status.history, status.ttl

    assert await natspy.call(read) == (5, 3600)


async def test_update_key_value_refusals(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        with pytest.raises(BucketNotFound):
            await update_key_value(js, KeyValueConfig(bucket="NONE"))
        await create_key_value(js, KeyValueConfig(bucket="R", limit_marker_ttl=10))
        refusals = {
            "storage type": KeyValueConfig(
                bucket="R", limit_marker_ttl=10, storage=StorageType.MEMORY
            ),
            "TTL status": KeyValueConfig(bucket="R"),  # limit markers off
            "replicas": KeyValueConfig(bucket="R", limit_marker_ttl=10, replicas=3),
        }
        for words, config in refusals.items():
            with pytest.raises(BucketConfigRefused, match=words) as caught:
                await update_key_value(js, config)
            assert caught.value.err_code in (10052, 10074)
        info = await js.stream_info("KV_R")
        assert info.config.storage is StorageType.FILE
        assert info.config.subject_delete_marker_ttl == 10


async def test_create_or_update_key_value(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = await create_or_update_key_value(js, KeyValueConfig(bucket="CU", history=2))
        await kv.put("k", b"1")
        assert (await kv.status()).history == 2
        kv = await create_or_update_key_value(js, KeyValueConfig(bucket="CU", history=7))
        status = await kv.status()
        assert (status.history, status.values) == (7, 1)


# -- purge_deletes --------------------------------------------------------------------------------


async def test_purge_deletes_removes_every_marker(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="PD", history=10))
        await kv.put("deleted", b"1")
        await kv.delete("deleted")
        await kv.put("purged", b"1")
        await kv.purge("purged")
        live = [await kv.put("live", b"1"), await kv.put("live", b"2")]
        assert await kv.purge_deletes(older_than=0) == 2
        assert await kv.history("deleted") == []
        assert await kv.history("purged") == []
        assert [e.revision for e in await kv.history("live")] == live
        assert (await kv.status()).values == 2


@pytest.mark.slow
async def test_purge_deletes_keeps_young_markers(nats_server):
    """A marker younger than ``older_than`` stays (its key's older entries go); an older one
    goes with its key. The two markers are two seconds apart: the wait is a key created with
    a 2 s TTL in another bucket, whose MaxAge marker is the event."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = await create_key_value(js, KeyValueConfig(bucket="PDY", history=10))
        clock = await marker_bucket(js, "CLOCK")
        await kv.put("old", b"1")
        await kv.delete("old")
        async with clock.watch("tick") as watcher:
            await clock.create("tick", b"", ttl=2)
            await next_entry(watcher)
            await next_entry(watcher)  # its MaxAge marker: two seconds have passed
        await kv.put("young", b"1")
        young = await kv.delete("young")
        # "old" is over 2 s old, "young" well under 1 s.
        assert await kv.purge_deletes(older_than=1) == 2
        assert await kv.history("old") == []
        assert [(e.operation, e.revision) for e in await kv.history("young")] == [
            (Operation.DEL, young)
        ]
        # The default threshold (30 minutes) keeps the marker.
        assert await kv.purge_deletes() == 1
        assert len(await kv.history("young")) == 1


# -- an old server --------------------------------------------------------------------------------


async def test_limit_markers_need_api_level_1(core_server):
    """A server before 2.11 (JetStream API level 0) would ignore limit_marker_ttl. No real
    server here can be that old, so this test answers the JetStream API itself, on a prefix of
    its own over a real (core) server, with an account info of level 0; the bucket must not
    be created, nor updated."""
    async with connect(core_server.url) as nc:
        api = await nc.subscribe("OLD.API.>")
        asked: list[str] = []

        async def old_server() -> None:
            async for msg in api:
                asked.append(msg.subject)
                answer = b'{"type": "io.nats.jetstream.api.v1.account_info_response"}'
                if msg.subject.endswith(".INFO"):
                    answer = b'{"memory": 0, "storage": 0, "streams": 0, "api": {"level": 0}}'
                assert msg.reply is not None
                await nc.publish(msg.reply, answer)

        js = JetStream(nc, api_prefix="OLD.API", timeout=2)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(old_server)
            config = KeyValueConfig(bucket="OLD", limit_marker_ttl=5)
            with pytest.raises(LimitMarkersNotSupported, match="level is 0"):
                await create_key_value(js, config)
            with pytest.raises(LimitMarkersNotSupported):
                await update_key_value(js, config)
            nursery.cancel_scope.cancel()
        assert asked == ["OLD.API.INFO", "OLD.API.INFO"]
