"""JetStream Key-Value buckets (ADR-8) against a real nats-server, with nats-py's KV as the
independent peer."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import trio
from headrace.errors import MalformedHeaderWarning
from headrace.jetstream import (
    DiscardPolicy,
    JetStream,
    JetStreamAPIError,
    JetStreamUnavailable,
    StorageType,
    StreamConfig,
)
from headrace.jetstream.kv import (
    BucketExists,
    BucketNotFound,
    Entry,
    InvalidBucketName,
    InvalidKey,
    KeyExists,
    KeyNotFound,
    KeyValue,
    KeyValueConfig,
    KeyWatcher,
    Operation,
    WrongRevision,
    check_key,
    check_key_pattern,
    create_key_value,
    delete_key_value,
    key_value,
)
from headrace.nats import connect
from headrace.protocol import Headers

from tests.raw_publish import raw_hpub
from tests.waiting import once_placed

TIMEOUT = 10


async def next_entry(watcher: KeyWatcher) -> Entry:
    with trio.fail_after(TIMEOUT):
        return await anext(watcher)


async def initial(watcher: KeyWatcher) -> list[tuple[str, bytes, Operation]]:
    with trio.fail_after(TIMEOUT):
        return [(e.key, e.value, e.operation) async for e in watcher.initial()]


# -- buckets --------------------------------------------------------------------------------------


async def test_create_bind_delete_bucket(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        config = KeyValueConfig(
            bucket="CFG", description="settings", history=5, max_value_size=1024
        )
        kv = await create_key_value(js, config)
        assert (kv.bucket, kv.stream) == ("CFG", "KV_CFG")

        info = await js.stream_info("KV_CFG")
        cfg = info.config
        assert cfg.subjects == ["$KV.CFG.>"]
        assert cfg.max_msgs_per_subject == 5
        assert cfg.discard is DiscardPolicy.NEW
        assert cfg.allow_rollup_hdrs and cfg.deny_delete and cfg.allow_direct
        assert cfg.max_msg_size == 1024
        assert cfg.storage is StorageType.FILE
        assert cfg.description == "settings"

        # The same configuration again is fine; another one is refused.
        await create_key_value(js, config)
        with pytest.raises(BucketExists, match="another configuration"):
            await create_key_value(js, KeyValueConfig(bucket="CFG", history=2))

        bound = await key_value(js, "CFG")
        await kv.put("a", b"1")
        assert (await bound.get("a")).value == b"1"

        await delete_key_value(js, "CFG")
        with pytest.raises(BucketNotFound, match="create_key_value"):
            await key_value(js, "CFG")
        # A handle outliving its bucket says so.
        with pytest.raises(BucketNotFound):
            await kv.get("a")
        with pytest.raises(BucketNotFound):
            await kv.put("a", b"2")
        with pytest.raises(BucketNotFound):
            await delete_key_value(js, "CFG")

        # A stream with the bucket's name that is not a bucket.
        await js.add_stream(StreamConfig(name="KV_PLAIN", subjects=["plain.>"]))
        with pytest.raises(BucketNotFound, match="not a Key-Value bucket"):
            await key_value(js, "PLAIN")


@pytest.mark.parametrize(("ttl", "window"), [(30.0, 30.0), (3600.0, 120.0)])
async def test_ttl_sets_max_age_and_duplicate_window(nats_server, ttl, window):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        config = KeyValueConfig(
            bucket="T",
            ttl=ttl,
            storage=StorageType.MEMORY,
            compression=True,
            metadata={"owner": "tests"},
        )
        kv = await create_key_value(js, config)
        await create_key_value(js, config)  # idempotent with metadata too
        cfg = (await js.stream_info("KV_T")).config
        assert (cfg.max_age, cfg.duplicate_window) == (ttl, window)
        assert cfg.storage is StorageType.MEMORY
        status = await kv.status()
        assert (status.bucket, status.ttl, status.history) == ("T", ttl, 1)
        assert status.is_compressed and status.metadata["owner"] == "tests"


def test_config_validation():
    with pytest.raises(InvalidBucketName):
        KeyValueConfig(bucket="no.dots")
    with pytest.raises(InvalidBucketName):
        KeyValueConfig(bucket="")
    with pytest.raises(ValueError, match="history"):
        KeyValueConfig(bucket="B", history=0)
    with pytest.raises(ValueError, match="history"):
        KeyValueConfig(bucket="B", history=65)
    with pytest.raises(ValueError, match="ttl"):
        KeyValueConfig(bucket="B", ttl=-1)
    assert KeyValueConfig(bucket="ok_Name-1", history=64).history == 64
    cfg = KeyValueConfig(bucket="B").stream_config()
    assert cfg.duplicate_window is None and cfg.max_age is None


async def test_bad_bucket_names_are_refused_before_asking(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        for name in ("a.b", "a b", "a*", ">", ""):
            with pytest.raises(InvalidBucketName):
                await key_value(js, name)
            with pytest.raises(InvalidBucketName):
                await delete_key_value(js, name)


# -- keys -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["", ".a", "a.", "a..b", "a b", "a*", "*", ">", "a.>", "a.*.b", "é", "a\tb", "a:b"]
)
def test_invalid_keys(key):
    with pytest.raises(InvalidKey):
        check_key(key)


@pytest.mark.parametrize("key", ["a", "a.b.c", "A-b_c/d=e", "0", "a/b.c=d", "-", "_x"])
def test_valid_keys(key):
    assert check_key(key) == key
    assert check_key_pattern(key) == key


@pytest.mark.parametrize("pattern", [">", "*", "a.>", "a.*", "*.b", "a.*.c", "*.*.>"])
def test_valid_patterns(pattern):
    assert check_key_pattern(pattern) == pattern


@pytest.mark.parametrize("pattern", ["", ">.a", "a>", "a*", "a.**", ".>", "a..>", "a.>."])
def test_invalid_patterns(pattern):
    with pytest.raises(InvalidKey):
        check_key_pattern(pattern)


async def test_invalid_keys_are_refused_by_every_operation(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="K"))
        for call in (
            kv.get("a.*"),
            kv.put("a.>", b""),
            kv.create(".a", b""),
            kv.update("a.", b"", 1),
            kv.delete("a..b"),
            kv.purge("*"),
            kv.history(">"),
        ):
            with pytest.raises(InvalidKey):
                await call
        with pytest.raises(InvalidKey):
            async with kv.watch("a.>.b"):
                pass  # pragma: no cover


# -- reading and writing --------------------------------------------------------------------------


async def test_put_get_revisions(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="B", history=10))
        before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
        r1 = await kv.put("user.name", b"ann")
        r2 = await kv.put("other", b"x")
        r3 = await kv.put("user.name", b"bob")
        assert (r1, r2, r3) == (1, 2, 3)

        entry = await kv.get("user.name")
        assert (entry.bucket, entry.key, entry.value, entry.revision) == (
            "B",
            "user.name",
            b"bob",
            3,
        )
        assert entry.operation is Operation.PUT and entry.delta == 0
        assert before < entry.created < dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5)

        assert (await kv.get("user.name", revision=1)).value == b"ann"
        with pytest.raises(KeyNotFound, match="another key"):
            await kv.get("user.name", revision=2)
        with pytest.raises(KeyNotFound, match="no revision 99"):
            await kv.get("user.name", revision=99)
        with pytest.raises(ValueError):
            await kv.get("user.name", revision=0)

        assert (await kv.put("empty", b"")) == 4
        assert (await kv.get("empty")).value == b""


async def test_get_missing_key(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="B"))
        with pytest.raises(KeyNotFound, match="no such key") as caught:
            await kv.get("nope")
        assert caught.value.entry is None and caught.value.key == "nope"


async def test_create_twice_and_after_delete_or_purge(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="B", history=5))
        assert await kv.create("k", b"1") == 1
        with pytest.raises(KeyExists) as caught:
            await kv.create("k", b"2")
        assert (caught.value.expected, caught.value.current) == (0, 1)
        assert isinstance(caught.value, WrongRevision)
        # The server's refusal chained, as for update() (issue 24).
        cause = caught.value.__cause__
        assert isinstance(cause, JetStreamAPIError) and cause.err_code == 10071, cause

        deleted_at = await kv.delete("k")
        assert deleted_at == 2
        assert await kv.create("k", b"3") == 3
        assert (await kv.get("k")).value == b"3"

        await kv.purge("k")
        assert await kv.create("k", b"5") == 5
        with pytest.raises(KeyExists):
            await kv.create("k", b"6")


class _StaleFirstRead(KeyValue):
    """Answers the first read of the latest entry with an older revision, as a lagging
    replica would."""

    stale_revision = 0

    async def _load(self, key: str, revision: int | None = None) -> Entry:
        if revision is None and self.stale_revision:
            revision, self.stale_revision = self.stale_revision, 0
        return await super()._load(key, revision)


async def test_create_follows_a_newer_delete_marker(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = await create_key_value(js, KeyValueConfig(bucket="B", history=5))
        await kv.put("k", b"1")
        old_marker = await kv.delete("k")
        await kv.put("k", b"2")
        await kv.delete("k")
        stale = _StaleFirstRead(js, "B")
        stale.stale_revision = old_marker
        assert (await stale.create("k", b"3")) == 5  # refused on 2, then done on 4
        # A stale read of a value is reported as it was seen: the key exists.
        stale.stale_revision = 3
        await kv.delete("k")
        with pytest.raises(KeyExists):
            await stale.create("k", b"4")


async def test_update_right_and_wrong_revision(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="B"))
        r1 = await kv.put("k", b"1")
        await kv.put("other", b"x")  # moves the stream on, not the key
        r2 = await kv.update("k", b"2", r1)
        assert r2 == 3
        with pytest.raises(WrongRevision) as caught:
            await kv.update("k", b"3", r1)
        err = caught.value
        assert (err.key, err.expected, err.current) == ("k", r1, r2)
        assert not isinstance(err, KeyExists)
        assert "read it again" in str(err)
        assert (await kv.get("k")).value == b"2"

        # 0: only if the key has no message at all.
        assert await kv.update("fresh", b"a", 0) == 4
        with pytest.raises(WrongRevision):
            await kv.update("fresh", b"b", 0)
        with pytest.raises(WrongRevision) as caught:
            await kv.update("absent", b"b", 7)
        assert caught.value.current == 0


async def test_conditional_delete_and_purge(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="B", history=5))
        r1 = await kv.put("k", b"1")
        r2 = await kv.put("k", b"2")
        with pytest.raises(WrongRevision):
            await kv.delete("k", last_revision=r1)
        with pytest.raises(WrongRevision):
            await kv.purge("k", last_revision=r1)
        assert (await kv.get("k")).value == b"2"
        assert await kv.delete("k", last_revision=r2) == 3


async def _counter_worker(kv: KeyValue, key: str, conflicts: list[int]) -> None:
    while True:
        entry = await kv.get(key)
        value = int(entry.value) + 1
        try:
            await kv.update(key, str(value).encode(), entry.revision)
            return
        except WrongRevision:
            conflicts.append(1)
            await trio.lowlevel.checkpoint()


async def test_racing_updates_lose_nothing(nats_server):
    """Compare-and-set under contention: every increment lands exactly once."""
    n = 24
    async with (
        connect(nats_server.url) as nc1,
        connect(nats_server.url) as nc2,
        connect(nats_server.url) as nc3,
    ):
        handles = [
            await create_key_value(JetStream(nc), KeyValueConfig(bucket="C"))
            for nc in (nc1, nc2, nc3)
        ]
        await handles[0].create("counter", b"0")
        conflicts: list[int] = []
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(_counter_worker, handles[i % 3], "counter", conflicts)
        final = await handles[0].get("counter")
        assert int(final.value) == n
        assert final.revision == n + 1  # one create, then exactly one write per worker
        assert conflicts, "the workers never raced; the test proves nothing"


async def _until_ready(kv: KeyValue, key: str) -> None:
    """Until a replicated bucket just created is usable from ``kv``'s server: the stream's
    interest and its Direct Get responders reach the other servers asynchronously."""
    with trio.fail_after(TIMEOUT):
        while True:
            try:
                await kv.put(key, b"")
                await kv.js.direct_get(kv.stream, last_by_subject=kv.prefix + key)
                return
            except (BucketNotFound, JetStreamUnavailable):
                await trio.lowlevel.checkpoint()


@pytest.mark.slow
async def test_racing_updates_on_a_replicated_bucket(nats_cluster):
    """The same on an R3 bucket, clients spread over the nodes: reads may come from lagging
    replicas and refusals may be 10164 (a conditional write in flight), still no lost write."""
    n = 30
    urls = nats_cluster.urls
    async with (
        connect(urls[0]) as nc0,
        connect(urls[1]) as nc1,
        connect(urls[2]) as nc2,
    ):
        first = await once_placed(
            lambda: create_key_value(JetStream(nc0), KeyValueConfig(bucket="C", replicas=3))
        )
        # Handles without key_value(): its STREAM.INFO may go unanswered by a server whose
        # metadata has not caught up with the creation yet.
        handles = [first] + [KeyValue(JetStream(nc), "C") for nc in (nc1, nc2)]
        for i, kv in enumerate(handles):
            await _until_ready(kv, f"ready.{i}")
        created = await first.create("counter", b"0")
        conflicts: list[int] = []
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(_counter_worker, handles[i % 3], "counter", conflicts)
        with trio.fail_after(10):
            while (final := await first.get("counter")).revision != created + n:
                await trio.lowlevel.checkpoint()  # a lagging replica answered the read
        assert int(final.value) == n
        assert conflicts


async def test_racing_creates_have_one_winner(nats_server):
    """Of racing creates exactly one succeeds, both on a fresh key and over a delete marker
    (the ADR-8 retry on the marker's revision)."""
    async with connect(nats_server.url) as nc1, connect(nats_server.url) as nc2:
        kv1 = await create_key_value(JetStream(nc1), KeyValueConfig(bucket="R", history=3))
        kv2 = await key_value(JetStream(nc2), "R")
        for round_ in range(3):
            won: list[int] = []
            lost: list[KeyExists] = []

            async def attempt(kv: KeyValue, i: int, won=won, lost=lost) -> None:
                try:
                    won.append(await kv.create("lock", str(i).encode()))
                except KeyExists as exc:
                    lost.append(exc)

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for i in range(16):
                        nursery.start_soon(attempt, (kv1, kv2)[i % 2], i)
            assert len(won) == 1, round_
            assert len(lost) == 15
            assert (await kv1.get("lock")).revision == won[0]
            if round_ == 0:
                await kv1.delete("lock")
            else:
                await kv1.purge("lock")


# -- markers and history --------------------------------------------------------------------------


async def test_delete_and_purge_markers(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="B", history=10))
        await kv.put("k", b"1")
        await kv.put("k", b"2")
        del_rev = await kv.delete("k")
        with pytest.raises(KeyNotFound, match="deleted") as caught:
            await kv.get("k")
        marker = caught.value.entry
        assert marker is not None
        assert (marker.operation, marker.revision, marker.value) == (Operation.DEL, del_rev, b"")
        # A revision that is a marker is not a value either; the older ones still are.
        with pytest.raises(KeyNotFound):
            await kv.get("k", revision=del_rev)
        assert (await kv.get("k", revision=2)).value == b"2"

        hist = await kv.history("k")
        assert [(e.value, e.operation) for e in hist] == [
            (b"1", Operation.PUT),
            (b"2", Operation.PUT),
            (b"", Operation.DEL),
        ]
        assert [e.revision for e in hist] == [1, 2, 3]
        assert hist[-1].delta == 0

        await kv.put("k", b"4")
        purge_rev = await kv.purge("k")
        hist = await kv.history("k")
        assert [(e.revision, e.operation) for e in hist] == [(purge_rev, Operation.PURGE)]
        with pytest.raises(KeyNotFound) as caught:
            await kv.get("k")
        assert caught.value.entry is not None
        assert caught.value.entry.operation is Operation.PURGE
        assert await kv.history("never") == []


async def test_history_limit(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="B", history=3))
        for i in range(6):
            await kv.put("k", str(i).encode())
        await kv.put("j", b"x")
        hist = await kv.history("k")
        assert [e.value for e in hist] == [b"3", b"4", b"5"]
        assert [e.delta for e in hist] == [2, 1, 0]
        with pytest.raises(KeyNotFound):
            await kv.get("k", revision=1)  # rolled out of the history
        status = await kv.status()
        assert (status.values, status.history, status.backing_store) == (4, 3, "JetStream")
        assert status.bytes > 0 and not status.is_compressed


async def test_keys(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="B", history=4))
        assert await kv.keys() == []
        for key in ("a.1", "a.2", "b.1", "gone", "purged"):
            await kv.put(key, b"v")
            await kv.put(key, b"w")
        await kv.delete("gone")
        await kv.purge("purged")
        assert sorted(await kv.keys()) == ["a.1", "a.2", "b.1"]
        assert sorted(await kv.keys("a.*")) == ["a.1", "a.2"]
        assert sorted(await kv.keys(["a.1", "b.>"])) == ["a.1", "b.1"]


# -- a malformed header line (issue 11) ------------------------------------------------------------


async def test_a_malformed_header_line_leaves_the_bucket_usable(nats_server):
    """The server stores header blocks unchecked: a raw publish left a message whose block has
    a line with a non-UTF-8 name. Reading its headers used to raise, and with it get, keys and
    watch, for the whole bucket. Now the bad line is left out, the rest is kept (a DEL marker
    stays a marker), and each message's bad lines are reported once, as a warning."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = await create_key_value(js, KeyValueConfig(bucket="B"))
        await kv.put("good", b"1")
        bad = await raw_hpub(
            nats_server.port, "$KV.B.bad", b"NATS/1.0\r\n\xff\xfe: x\r\nTrace: kept\r\n\r\n", b"2"
        )
        assert bad is not None and "seq" in bad, bad
        await raw_hpub(
            nats_server.port, "$KV.B.gone", b"NATS/1.0\r\n\xc3: x\r\nKV-Operation: DEL\r\n\r\n", b""
        )

        with pytest.warns(MalformedHeaderWarning, match="bad") as warned:
            entry = await kv.get("bad")
        assert (entry.value, entry.revision, entry.operation) == (b"2", bad["seq"], Operation.PUT)
        assert len(warned) == 1
        with pytest.warns(MalformedHeaderWarning), pytest.raises(KeyNotFound) as missing:
            await kv.get("gone")
        assert missing.value.entry is not None
        assert missing.value.entry.operation is Operation.DEL

        with pytest.warns(MalformedHeaderWarning):
            assert sorted(await kv.keys()) == ["bad", "good"]
        with pytest.warns(MalformedHeaderWarning):
            async with kv.watch() as watcher:
                assert sorted(await initial(watcher)) == [
                    ("bad", b"2", Operation.PUT),
                    ("gone", b"", Operation.DEL),
                    ("good", b"1", Operation.PUT),
                ]
        stored = await js.get_msg("KV_B", last_by_subject="$KV.B.bad")
        with pytest.warns(MalformedHeaderWarning):
            assert stored.headers == Headers([("Trace", "kept")])


async def test_a_block_that_is_not_nats_1_0_leaves_the_bucket_usable(nats_server):
    """A stored header block that does not even start with ``NATS/1.0`` (the server keeps it
    as is) used to be a protocol error when delivered: the connection dropped, the watch's
    consumer was made again, delivered it again, and so on. It is delivered like any other."""
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="B"))
        await kv.put("good", b"1")
        await raw_hpub(nats_server.port, "$KV.B.odd", b"XATS/1.0\r\nTrace: 1\r\n\r\n", b"2")
        with pytest.warns(MalformedHeaderWarning, match="odd"):
            async with kv.watch() as watcher:
                assert sorted(await initial(watcher)) == [
                    ("good", b"1", Operation.PUT),
                    ("odd", b"2", Operation.PUT),
                ]
        assert nc.stats.reconnects == 0


# -- watch ----------------------------------------------------------------------------------------


async def test_watch_initial_values_then_updates(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="W", history=5))
        await kv.put("a", b"1")
        await kv.put("a", b"2")
        await kv.put("b", b"1")
        await kv.put("c", b"1")
        await kv.delete("c")
        async with kv.watch() as watcher:
            assert not watcher.initial_done
            got = await initial(watcher)
            assert watcher.initial_done
            # Last per key, markers included, in stream order.
            assert got == [
                ("a", b"2", Operation.PUT),
                ("b", b"1", Operation.PUT),
                ("c", b"", Operation.DEL),
            ]
            # The initial data is over: initial() has nothing more.
            assert await initial(watcher) == []

            r = await kv.put("b", b"2")
            entry = await next_entry(watcher)
            assert (entry.key, entry.value, entry.revision, entry.delta) == ("b", b"2", r, 0)
            await kv.delete("a")
            entry = await next_entry(watcher)
            assert (entry.key, entry.operation) == ("a", Operation.DEL)
            await kv.purge("b")
            entry = await next_entry(watcher)
            assert (entry.key, entry.operation) == ("b", Operation.PURGE)


async def test_watch_with_history_and_plain_iteration(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="W", history=5))
        await kv.put("a", b"1")
        await kv.put("a", b"2")
        await kv.put("b", b"1")
        async with kv.watch(include_history=True) as watcher:
            seen = []
            while not watcher.initial_done:
                entry = await next_entry(watcher)
                seen.append((entry.key, entry.value, entry.delta))
            assert seen == [("a", b"1", 2), ("a", b"2", 1), ("b", b"1", 0)]
            await kv.put("a", b"3")
            assert (await next_entry(watcher)).value == b"3"


async def test_watch_empty_bucket_ends_initial_data_at_once(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="W"))
        async with kv.watch() as watcher:
            assert watcher.initial_done
            assert await initial(watcher) == []
            await kv.put("x", b"1")
            assert (await next_entry(watcher)).key == "x"


async def test_watch_ignore_deletes(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="W"))
        await kv.put("a", b"1")
        await kv.put("b", b"1")
        await kv.delete("b")  # the last initial message is a marker: still ends the initial data
        async with kv.watch(ignore_deletes=True) as watcher:
            assert await initial(watcher) == [("a", b"1", Operation.PUT)]
            await kv.delete("a")
            await kv.purge("a")
            await kv.put("c", b"1")
            entry = await next_entry(watcher)
            assert (entry.key, entry.operation) == ("c", Operation.PUT)


async def test_watch_updates_only(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="W"))
        await kv.put("a", b"old")
        async with kv.watch(updates_only=True) as watcher:
            assert watcher.initial_done
            assert await initial(watcher) == []
            await kv.put("a", b"new")
            entry = await next_entry(watcher)
            assert (entry.key, entry.value) == ("a", b"new")
        with pytest.raises(ValueError, match="exclude"):
            async with kv.watch(updates_only=True, include_history=True):
                pass  # pragma: no cover


async def test_watch_key_wildcards(nats_server):
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="W"))
        for key in ("cfg.a", "cfg.b.c", "other.a", "cfg"):
            await kv.put(key, b"v")
        async with kv.watch("cfg.*") as watcher:
            assert [k for k, _, _ in await initial(watcher)] == ["cfg.a"]
            await kv.put("other.a", b"w")
            await kv.put("cfg.b.c", b"w")
            await kv.put("cfg.z", b"w")
            assert (await next_entry(watcher)).key == "cfg.z"
        async with kv.watch("cfg.>") as watcher:
            assert [k for k, _, _ in await initial(watcher)] == ["cfg.a", "cfg.b.c", "cfg.z"]
        async with kv.watch(["cfg", "other.>"]) as watcher:
            assert sorted(k for k, _, _ in await initial(watcher)) == ["cfg", "other.a"]
        async with kv.watch("none.>") as watcher:
            assert watcher.initial_done
            assert await initial(watcher) == []
        async with kv.watch("cfg.a", meta_only=True) as watcher:
            assert await initial(watcher) == [("cfg.a", b"", Operation.PUT)]
        # As in nats.go (issue 24: the reverse here before): no keys is the whole bucket,
        # an empty key is refused.
        async with kv.watch([]) as watcher:
            assert len(await initial(watcher)) == 5
        for empty in ("", ["cfg", ""]):
            with pytest.raises(InvalidKey, match="for the whole bucket"):
                async with kv.watch(empty):
                    pass


async def test_watch_ends_its_consumer(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = await create_key_value(js, KeyValueConfig(bucket="W"))
        async with kv.watch():
            assert len(await js.consumer_names("KV_W")) == 1
        assert await js.consumer_names("KV_W") == []


# -- nats-py as the peer --------------------------------------------------------------------------


async def test_natspy_reads_what_headrace_wrote(nats_server, natspy):
    # Not nats-py's keys() or history(): its watcher can signal the end of the initial data
    # before the messages already delivered (it compares a consumer info with its callback
    # count), so they flakily answer "no keys".
    nc_py = await natspy.connect(nats_server.url)
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="HR", history=5, ttl=600))
        await kv.put("x.y", b"1")
        await kv.put("x.y", b"2")
        await kv.put("gone", b"1")
        await kv.delete("gone")
        await kv.put("purged", b"1")
        await kv.purge("purged")

        async def read() -> dict[str, Any]:
            pkv = await nc_py.jetstream().key_value("HR")
            out: dict[str, Any] = {}
            e = await pkv.get("x.y")
            out["get"] = (e.value, e.revision)
            e = await pkv.get("x.y", revision=1)
            out["revision 1"] = (e.value, e.revision)
            for key in ("gone", "purged"):
                try:
                    await pkv.get(key)
                    out[key] = "found"
                except Exception as exc:
                    out[key] = type(exc).__name__
            out["status"] = (await pkv.status()).history
            return out

        got = await natspy.call(read)
    assert got["get"] == (b"2", 2)
    assert got["revision 1"] == (b"1", 1)
    assert got["gone"] == got["purged"] == "KeyNotFoundError"
    assert got["status"] == 5


async def test_headrace_reads_what_natspy_wrote(nats_server, natspy):
    nc_py = await natspy.connect(nats_server.url)

    async def write() -> list[int]:
        from nats.js.api import KeyValueConfig as PyConfig

        pkv = await nc_py.jetstream().create_key_value(PyConfig(bucket="PY", history=4))
        revs = [await pkv.put("a", b"1"), await pkv.put("a", b"2"), await pkv.put("b", b"1")]
        await pkv.delete("b")
        await pkv.put("c", b"1")
        await pkv.purge("c")
        return revs

    revs = await natspy.call(write)
    async with connect(nats_server.url) as nc:
        kv = await key_value(JetStream(nc), "PY")
        entry = await kv.get("a")
        assert (entry.value, entry.revision) == (b"2", revs[1])
        assert (await kv.get("a", revision=revs[0])).value == b"1"
        for key, op in (("b", Operation.DEL), ("c", Operation.PURGE)):
            with pytest.raises(KeyNotFound) as caught:
                await kv.get(key)
            assert caught.value.entry is not None and caught.value.entry.operation is op
        async with kv.watch() as watcher:
            got = await initial(watcher)
        assert got == [
            ("a", b"2", Operation.PUT),
            ("b", b"", Operation.DEL),
            ("c", b"", Operation.PURGE),
        ]
        # headrace's create over nats-py's delete marker, then nats-py sees it.
        rev = await kv.create("b", b"again")
        with pytest.raises(KeyExists):
            await kv.create("b", b"twice")

    async def read() -> tuple[bytes, int]:
        e = await (await nc_py.jetstream().key_value("PY")).get("b")
        return e.value, e.revision

    assert await natspy.call(read) == (b"again", rev)


async def test_compare_and_set_against_natspy(nats_server, natspy):
    """Both clients update the same key from the same revision: exactly one wins."""
    nc_py = await natspy.connect(nats_server.url)
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="CAS"))
        base = await kv.put("k", b"0")

        async def py_update() -> str:
            import nats.js.errors

            pkv = await nc_py.jetstream().key_value("CAS")
            try:
                await pkv.update("k", b"py", last=base)
                return "won"
            except nats.js.errors.KeyWrongLastSequenceError:
                return "lost"

        py_result = await natspy.call(py_update)
        try:
            await kv.update("k", b"hr", base)
            hr_result = "won"
        except WrongRevision as exc:
            hr_result = "lost"
            assert exc.current == base + 1
        assert sorted([py_result, hr_result]) == ["lost", "won"]
        assert (await kv.get("k")).value == b"py"


async def test_keys_unvalidated_on_request(nats_server):
    """``validate_keys=False`` (issue 24, as nats.go's option): a key another client wrote
    that ADR-8's rules refuse (``user@example.com``) can be read, written and watched; what
    can be no subject at all stays refused."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        strict = await create_key_value(js, KeyValueConfig(bucket="U"))
        with pytest.raises(InvalidKey):
            await strict.put("user@example.com", b"x")
        loose = await key_value(js, "U", validate_keys=False)
        assert not loose.validate_keys and strict.validate_keys
        await loose.put("user@example.com", b"1")
        assert (await loose.get("user@example.com")).value == b"1"
        async with loose.watch("*.com") as watcher:
            assert [k for k, _, _ in await initial(watcher)] == ["user@example.com"]
        for bad in ("a b", "a.*", "", "a..b"):
            with pytest.raises(InvalidKey):
                await loose.put(bad, b"x")
