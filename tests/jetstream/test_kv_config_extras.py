"""Key-Value bucket configuration beyond ADR-8's basics, against a real nats-server: buckets
sourced from other buckets, republish, placement in the stream, and bucket listing; nats-py is
the independent peer that receives the republished entries and lists the streams.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio
from headrace.jetstream import (
    Base64KeyCodec,
    BucketNotFound,
    CodecKeyValue,
    InvalidBucketName,
    InvalidConfigValue,
    InvalidKey,
    JetStream,
    KeyValueConfig,
    PathKeyCodec,
    Placement,
    RePublish,
    StreamConfig,
    StreamSource,
    SubjectTransformConfig,
    create_key_value,
    key_value,
    key_value_bucket_names,
    key_value_buckets,
)
from headrace.jetstream.kv import check_key
from headrace.nats import connect
from hypothesis import given
from hypothesis import strategies as st

TIMEOUT = 10


def test_sources_become_transformed_stream_sources() -> None:
    """A source bucket's keys are moved to this bucket's subjects unless the source says
    otherwise (its own transforms, or a filter): such a source names a stream, used as given
    (issue 24: it was renamed KV_<name>)."""
    config = KeyValueConfig(
        bucket="ALL",
        sources=[
            StreamSource(name="A"),
            StreamSource(
                name="KV_B",
                subject_transforms=[SubjectTransformConfig(src="$KV.B.x", dest="$KV.ALL.y")],
            ),
            StreamSource(name="ORDERS", filter_subject="orders.>"),
            StreamSource(name="KV_D"),  # bucket D, named by its stream
        ],
    )
    sources = config.stream_config().sources
    assert sources is not None
    assert [s.name for s in sources] == ["KV_A", "KV_B", "ORDERS", "KV_D"]
    assert sources[0].subject_transforms == [
        SubjectTransformConfig(src="$KV.A.>", dest="$KV.ALL.>")
    ]
    assert sources[1].subject_transforms == [
        SubjectTransformConfig(src="$KV.B.x", dest="$KV.ALL.y")
    ]
    assert sources[2].subject_transforms is None
    assert sources[3].subject_transforms == [
        SubjectTransformConfig(src="$KV.D.>", dest="$KV.ALL.>")
    ]
    with pytest.raises(InvalidBucketName):
        KeyValueConfig(bucket="ALL", sources=[StreamSource(name="KV.A")])


async def test_bucket_sourced_from_buckets(nats_server):
    """Entries put in two buckets appear, under the same keys, in a bucket sourcing both."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        a = await create_key_value(js, KeyValueConfig(bucket="A"))
        b = await create_key_value(js, KeyValueConfig(bucket="B"))
        await a.put("from.a", b"1")
        await b.put("from.b", b"2")
        both = await create_key_value(
            js,
            KeyValueConfig(bucket="BOTH", sources=[StreamSource(name="A"), StreamSource(name="B")]),
        )
        seen: dict[str, bytes] = {}
        async with both.watch() as watcher:
            with trio.fail_after(TIMEOUT):
                async for entry in watcher:
                    seen[entry.key] = entry.value
                    if len(seen) == 2:
                        break
        assert seen == {"from.a": b"1", "from.b": b"2"}
        assert (await both.get("from.a")).value == b"1"


async def test_republish_and_placement(nats_server, natspy):
    """A put is republished where the bucket says (nats-py receives it, value and all); the
    placement reaches the stream's config."""
    await natspy.connect(nats_server.url)

    async def subscribe() -> Any:
        sub = await natspy.nc.subscribe("repub.>")
        await natspy.nc.flush()
        return sub

    sub = await natspy.call(subscribe)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = await create_key_value(
            js,
            KeyValueConfig(
                bucket="R",
                republish=RePublish(src="$KV.R.>", dest="repub.>"),
                placement=Placement(tags=["any"]),
            ),
        )
        status = await kv.status()
        assert status.stream_info.config.republish == RePublish(src="$KV.R.>", dest="repub.>")
        assert status.stream_info.config.placement == Placement(tags=["any"])
        await kv.put("k", b"value")
        msg = await natspy.call(sub.next_msg, timeout=TIMEOUT)
        assert (msg.subject, msg.data) == ("repub.k", b"value")  # src ">" -> dest ">"


async def test_bucket_listing(nats_server, natspy):
    """Listing finds every bucket and only buckets: not a plain stream, nor a stream that has
    the prefix without per-key history."""
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        assert await key_value_bucket_names(js) == []
        await create_key_value(js, KeyValueConfig(bucket="B2", history=5))
        await create_key_value(js, KeyValueConfig(bucket="B1"))
        await js.add_stream(StreamConfig(name="PLAIN", subjects=["plain.>"]))
        await js.add_stream(StreamConfig(name="KV_fake", subjects=["fake.>"]))
        assert await key_value_bucket_names(js) == ["B1", "B2"]
        statuses = {s.bucket: s async for s in key_value_buckets(js)}
        assert statuses["B2"].history == 5
        assert statuses["B1"].history == 1

        infos = await natspy.call(natspy.nc.jetstream().streams_info)
        assert sorted(i.config.name for i in infos) == ["KV_B1", "KV_B2", "KV_fake", "PLAIN"]


# -- codecs (ADR-54) ------------------------------------------------------------------------------


class _Reversed:
    """A value codec a test can see through: the stored bytes are the value reversed."""

    def encode_value(self, value: bytes) -> bytes:
        return value[::-1]

    def decode_value(self, value: bytes) -> bytes:
        return value[::-1]


@given(st.lists(st.text(min_size=1, max_size=8).filter(lambda t: "." not in t), min_size=1))
def test_base64_key_codec_round_trip(tokens: list[str]) -> None:
    """Any dot-free tokens encode to a valid key and decode back."""
    ckv = CodecKeyValue(kv=None, keys_codec=Base64KeyCodec())  # type: ignore[arg-type]
    key = ".".join(tokens)
    encoded = ckv.encode_key(key)
    assert check_key(encoded) == encoded
    assert ckv.decode_key(encoded) == key


def test_patterns_keep_wildcards() -> None:
    ckv = CodecKeyValue(kv=None, keys_codec=Base64KeyCodec())  # type: ignore[arg-type]
    assert ckv.encode_pattern("a b.*.>") == f"{ckv.encode_key('a b')}.*.>"
    with pytest.raises(InvalidKey):
        ckv.decode_key("not base64!")


async def test_codec_bucket(nats_server, natspy):
    """Keys with spaces and a value codec: what is stored is encoded (nats-py reads the raw
    message), what headrace reads back, lists and watches is decoded."""
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = CodecKeyValue(
            kv=await create_key_value(js, KeyValueConfig(bucket="CODEC", history=3)),
            keys_codec=Base64KeyCodec(),
            values_codec=_Reversed(),
        )
        async with kv.watch("users.*") as watch:
            revision = await kv.put("users.ann smith", b"hello")
            with trio.fail_after(TIMEOUT):
                watched = await anext(watch)
        assert (watched.key, watched.value) == ("users.ann smith", b"hello")

        encoded = kv.encode_key("users.ann smith")
        raw = await natspy.call(natspy.nc.jetstream().get_msg, "KV_CODEC", revision)
        assert raw.subject == f"$KV.CODEC.{encoded}"
        assert raw.data == b"olleh"

        await kv.update("users.ann smith", b"bye", revision)
        assert (await kv.get("users.ann smith")).value == b"bye"
        assert [e.value for e in await kv.history("users.ann smith")] == [b"hello", b"bye"]
        assert await kv.keys("users.>") == ["users.ann smith"]
        await kv.delete("users.ann smith")
        assert await kv.keys() == []


async def test_path_key_codec(nats_server, natspy):
    """Path keys on a real bucket: stored as dotted keys (what nats-py lists), read, listed by
    a path pattern and watched as paths; keys that would not read back as written refused."""
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = CodecKeyValue(
            kv=await create_key_value(js, KeyValueConfig(bucket="PATHS")),
            keys_codec=PathKeyCodec(),
        )
        async with kv.watch("/orders/>") as watch:
            await kv.put("/orders/eu/1", b"a")
            await kv.put("/stock/eu", b"s")
            await kv.put("/orders/us/2/", b"b")  # a trailing '/' is dropped
            with trio.fail_after(TIMEOUT):
                seen = [await anext(watch), await anext(watch)]
        assert [(e.key, e.value) for e in seen] == [("/orders/eu/1", b"a"), ("/orders/us/2", b"b")]
        assert (await kv.get("/orders/eu/1")).value == b"a"
        assert sorted(await kv.keys("/orders/*/*")) == ["/orders/eu/1", "/orders/us/2"]
        natspy_kv = await natspy.call(natspy.nc.jetstream().key_value, "PATHS")
        assert sorted(await natspy.call(natspy_kv.keys)) == [
            "orders.eu.1",
            "orders.us.2",
            "stock.eu",
        ]
        for bad in ("orders/eu", "/a.b", "/a//b", "/", ""):
            with pytest.raises(InvalidKey):
                await kv.put(bad, b"x")
        assert len(await kv.keys()) == 3  # nothing written by a refused key


# -- mirror buckets (ADR-8) -----------------------------------------------------------------------


async def test_mirror_bucket(nats_server):
    """A mirror bucket has the origin's keys: its watch sees a put made in the origin, it
    reads them from its own stream, a put through it lands in the origin, and a handle bound
    later with key_value() knows it is a mirror."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        origin = await create_key_value(js, KeyValueConfig(bucket="ORIGIN", history=2))
        mirror = await create_key_value(
            js, KeyValueConfig(bucket="COPY", history=2, mirror=StreamSource(name="ORIGIN"))
        )
        info = (await mirror.status()).stream_info
        assert info.config.subjects is None
        assert info.config.mirror == StreamSource(name="KV_ORIGIN")
        async with mirror.watch() as watcher:
            await origin.put("a.b", b"1")
            with trio.fail_after(TIMEOUT):
                seen = await anext(watcher)
        assert (seen.bucket, seen.key, seen.value) == ("COPY", "a.b", b"1")
        assert (await mirror.get("a.b")).value == b"1"
        assert await mirror.keys() == ["a.b"]

        async with (await key_value(js, "COPY")).watch("c") as watcher:
            revision = await mirror.put("c", b"2")
            with trio.fail_after(TIMEOUT):
                assert (await anext(watcher)).value == b"2"
        assert (await origin.get("c")).revision == revision
        with pytest.raises(InvalidConfigValue):
            KeyValueConfig(
                bucket="X", mirror=StreamSource(name="A"), sources=[StreamSource(name="B")]
            )


async def test_a_source_with_transforms_names_a_stream_used_as_given(nats_server):
    """Issue 24: a plain stream sourced with its own transforms was renamed KV_<name>, and
    nothing arrived, without a word."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"]))
        await js.publish("orders.eu.1", b"10")
        source = StreamSource(
            name="ORDERS",
            subject_transforms=[SubjectTransformConfig(src="orders.>", dest="$KV.LATEST.>")],
        )
        latest = await create_key_value(js, KeyValueConfig(bucket="LATEST", sources=[source]))
        info = await js.stream_info("KV_LATEST")
        assert info.config.sources is not None and info.config.sources[0].name == "ORDERS"
        with trio.fail_after(TIMEOUT):
            async with latest.watch() as watcher:
                async for entry in watcher:
                    assert (entry.key, entry.value) == ("eu.1", b"10")
                    break


async def test_bucket_sources_name_buckets_or_their_streams_and_must_exist(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        a = await create_key_value(js, KeyValueConfig(bucket="A"))
        await a.put("k", b"v")
        # "KV_A" is bucket A, as in nats.go.
        copy = await create_key_value(
            js, KeyValueConfig(bucket="COPY", sources=[StreamSource(name="KV_A")])
        )
        with trio.fail_after(TIMEOUT):
            async with copy.watch() as watcher:
                async for entry in watcher:
                    assert (entry.key, entry.value) == ("k", b"v")
                    break
        for missing, said in (
            (StreamSource(name="NOPE"), "bucket 'NOPE' (stream 'KV_NOPE'), which does not exist"),
            (
                StreamSource(name="NOSTREAM", filter_subject="x.>"),
                "stream 'NOSTREAM', which does not exist",
            ),
        ):
            with pytest.raises(BucketNotFound, match=re.escape(said)):
                await create_key_value(js, KeyValueConfig(bucket="C", sources=[missing]))
        assert "KV_C" not in await js.stream_names()


async def test_a_buckets_config_is_read_back_from_its_status(nats_server):
    """Issue 24 (nats.go's ``Status().Config()``): the status gives the configuration back,
    and making the bucket again from it changes nothing."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await create_key_value(js, KeyValueConfig(bucket="A"))
        given = KeyValueConfig(
            bucket="CFG",
            description="settings",
            history=4,
            ttl=3600.0,
            max_value_size=1024,
            max_bytes=1 << 20,
            compression=True,
            metadata={"team": "core"},
            republish=RePublish(src="$KV.CFG.>", dest="cfg.changed.>"),
            sources=[StreamSource(name="A")],
        )
        kv = await create_key_value(js, given)
        config = (await kv.status()).config
        assert config is not None
        for name in ("bucket", "description", "history", "ttl", "max_value_size", "max_bytes",
                     "storage", "replicas", "compression", "metadata"):  # fmt: skip
            assert getattr(config, name) == getattr(given, name), name
        assert config.republish is not None and config.republish.dest == "cfg.changed.>"
        assert config.sources is not None and [s.name for s in config.sources] == ["A"]
        assert config.sources[0].subject_transforms is None  # the bucket source, as given
        again = await create_key_value(js, config)  # the same bucket: no BucketExists
        assert again.bucket == "CFG"
