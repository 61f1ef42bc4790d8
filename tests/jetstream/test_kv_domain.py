"""Key-Value through a JetStream domain (a leafnode away) and through an account import's API
prefix (ADR-19): every write and read of a bucket that lives elsewhere, with nats-py on the
bucket's own side reading what headrace wrote.

A client never reaches ``$KV.<bucket>.<key>`` across those boundaries: a leafnode denies
``$KV.>`` to and from client accounts, and an import maps only the subjects it names. Writes go
to ``<API prefix>.$KV.<bucket>.<key>``, which the domain's mapping (or the import) turns back
into ``$KV.<bucket>.<key>`` where the stream is.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from headrace.errors import NoRespondersError, RequestTimeout
from headrace.jetstream import (
    ExternalStream,
    JetStream,
    JetStreamUnavailable,
    KeyExists,
    KeyNotFound,
    KeyValue,
    KeyValueConfig,
    KeyValueOperation,
    StreamConfig,
    StreamSource,
    WrongRevision,
    create_key_value,
    key_value,
)
from headrace.nats import connect

from tests.servers import free_port


async def _until_answered(js: JetStream) -> None:
    """The leafnode is up (its log said so); its interest may still be on the way."""
    with trio.fail_after(15):
        while True:
            try:
                await js.account_info()
                return
            except JetStreamUnavailable:
                await trio.sleep(0.05)  # pacing the attempts, not waiting for a condition


async def _every_operation(kv: KeyValue) -> dict[str, Any]:
    """Each kind of write and read through ``kv``; what the bucket should hold after."""
    rev1 = await kv.put("cfg.url", b"a")
    rev2 = await kv.put("cfg.url", b"b")
    assert rev2 > rev1
    assert (await kv.get("cfg.url")).value == b"b"
    assert (await kv.get("cfg.url", revision=rev1)).value == b"a"
    created = await kv.create("cfg.new", b"n")
    with pytest.raises(KeyExists):
        await kv.create("cfg.new", b"again")
    updated = await kv.update("cfg.new", b"n2", created)
    with pytest.raises(WrongRevision) as stale:
        await kv.update("cfg.new", b"n3", created)
    assert stale.value.current == updated
    await kv.put("cfg.gone", b"g")
    await kv.delete("cfg.gone")
    with pytest.raises(KeyNotFound):
        await kv.get("cfg.gone")
    await kv.put("cfg.purged", b"p")
    await kv.purge("cfg.purged")
    assert await kv.create("cfg.gone", b"back") > 0  # create over a delete marker
    assert [e.value for e in await kv.history("cfg.url")] == [b"a", b"b"]
    assert sorted(await kv.keys()) == ["cfg.gone", "cfg.new", "cfg.url"]
    many = await kv.get_many(["cfg.url", "cfg.new", "cfg.purged", "cfg.never"])
    assert {k: e.value for k, e in many.items()} == {"cfg.url": b"b", "cfg.new": b"n2"}

    async with kv.watch("cfg.>") as watcher:
        initial = {e.key: e.operation async for e in watcher.initial()}
        assert initial["cfg.purged"] is KeyValueOperation.PURGE
        await kv.put("cfg.url", b"c")
        with trio.fail_after(10):
            change = await anext(watcher)
        assert (change.key, change.value) == ("cfg.url", b"c")
    return {"cfg.url": b"c", "cfg.new": b"n2", "cfg.gone": b"back"}


async def _natspy_reads(natspy: Any, url: str, bucket: str, expected: dict[str, Any]) -> None:
    await natspy.connect(url)
    kv = await natspy.call(natspy.nc.jetstream().key_value, bucket)
    for key, value in expected.items():
        assert (await natspy.call(kv.get, key)).value == value
    assert sorted(await natspy.call(kv.keys)) == sorted(expected)


def _hub_and_leaf(nats_server_factory: Any, tmp_path: Any) -> tuple[Any, Any]:
    """Two servers, each with a JetStream domain of its own (hub, leaf), the leaf a leafnode
    of the hub."""
    leaf_port = free_port("127.0.0.1")
    hub = nats_server_factory(
        jetstream=False,
        extra_config=(
            f"jetstream {{ domain: hub, store_dir: {json.dumps(str(tmp_path / 'hub'))} }}\n"
            f"leafnodes {{ listen: 127.0.0.1:{leaf_port} }}"
        ),
    )
    leaf = nats_server_factory(
        jetstream=False,
        extra_config=(
            f"jetstream {{ domain: leaf, store_dir: {json.dumps(str(tmp_path / 'leaf'))} }}\n"
            f'leafnodes {{ remotes: [ {{ url: "nats://127.0.0.1:{leaf_port}" }} ] }}'
        ),
    )
    hub.wait_for_log("JetStream using domains", 15)
    leaf.wait_for_log("JetStream using domains", 15)
    return hub, leaf


async def test_a_bucket_in_the_hub_domain_from_a_leafnode(
    nats_server_factory: Any, natspy: Any, tmp_path: Any
) -> None:
    hub, leaf = _hub_and_leaf(nats_server_factory, tmp_path)

    async with connect(leaf.url) as nc:
        js = JetStream(nc, domain="hub")
        await _until_answered(js)
        kv = await create_key_value(js, KeyValueConfig(bucket="remote", history=5))
        assert kv.write_prefix == "$JS.hub.API.$KV.remote."
        # The plain subject does not cross the leafnode: what every write used to hit.
        with pytest.raises(NoRespondersError):
            await nc.request("$KV.remote.cfg.url", b"x", timeout=5)
        assert (await JetStream(nc).account_info()).domain == "leaf"  # a JetStream of its own
        expected = await _every_operation(kv)
        # Bound anew, as another process would.
        again = await key_value(js, "remote")
        assert (await again.get("cfg.url")).value == b"c"

    await _natspy_reads(natspy, hub.url, "remote", expected)


async def test_a_mirror_of_a_bucket_in_another_domain_writes_to_the_origin(
    nats_server_factory: Any, natspy: Any, tmp_path: Any
) -> None:
    """The origin in the hub, its mirror in the leafnode's own domain: reads come from the
    mirror, writes go through the mirror's ``external.api`` to the origin (and come back)."""
    hub, leaf = _hub_and_leaf(nats_server_factory, tmp_path)

    async with connect(leaf.url) as nc:
        hub_js, own_js = JetStream(nc, domain="hub"), JetStream(nc)
        await _until_answered(hub_js)
        origin = await create_key_value(hub_js, KeyValueConfig(bucket="orig", history=3))
        await origin.put("cfg.a", b"1")
        source = StreamSource(name="orig", external=ExternalStream(api="$JS.hub.API"))
        copy = await create_key_value(own_js, KeyValueConfig(bucket="copy", mirror=source))
        assert copy.write_prefix == "$JS.hub.API.$KV.orig."
        with trio.fail_after(15):
            while True:  # the mirror catching up with what the origin held
                try:
                    assert (await copy.get("cfg.a")).value == b"1"
                    break
                except KeyNotFound:
                    await trio.sleep(0.05)  # pacing the reads, not waiting for a condition
        async with copy.watch("cfg.b") as watcher:
            revision = await copy.put("cfg.b", b"2")  # into the hub's origin
            with trio.fail_after(15):
                seen = await anext(watcher)  # and back through the mirror
        assert (seen.key, seen.value, seen.revision) == ("cfg.b", b"2", revision)
        assert (await origin.get("cfg.b")).revision == revision
        bound = await key_value(own_js, "copy")  # bound anew, as another process would
        assert bound.write_prefix == copy.write_prefix

    await _natspy_reads(natspy, hub.url, "orig", {"cfg.a": b"1", "cfg.b": b"2"})


async def test_a_source_named_by_its_domain(nats_server_factory: Any, tmp_path: Any) -> None:
    """``StreamSource(domain=...)``, nats.go's shorthand for the external API prefix (issue
    24): a stream in the leafnode's domain sources one in the hub's."""
    _hub, leaf = _hub_and_leaf(nats_server_factory, tmp_path)
    async with connect(leaf.url) as nc:
        hub_js, own_js = JetStream(nc, domain="hub"), JetStream(nc)
        await _until_answered(hub_js)
        await hub_js.add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"]))
        await hub_js.publish("orders.1", b"a")
        source = StreamSource(name="ORDERS", domain="hub")
        assert source.external == ExternalStream(api="$JS.hub.API")
        info = await own_js.add_stream(StreamConfig(name="LOCAL", sources=[source]))
        assert info.config.sources is not None
        external = info.config.sources[0].external
        assert external is not None and external.api == "$JS.hub.API"
        async with own_js.subscribe("orders.>", stream="LOCAL", ordered=True) as copied:
            with trio.fail_after(15):
                msg = await copied.next_msg()
        assert (msg.subject, msg.data) == ("orders.1", b"a")
    with pytest.raises(ValueError, match="not both"):
        StreamSource(name="X", domain="hub", external=ExternalStream(api="$JS.hub.API"))


def _import_config(store: str) -> str:
    # ADR-19's test set-up: account I reaches account A's JetStream as "fromA", its KV as
    # "fromA.$KV", and receives A's push deliveries to the inbox prefix "forI".
    return f"""
jetstream {{ store_dir: {json.dumps(store)} }}
accounts {{
  A: {{
    jetstream: enabled
    users: [ {{ user: a, password: a }} ]
    exports: [
      {{ service: "$JS.API.>", response_type: stream }}
      {{ service: "$KV.>" }}
      {{ stream: "forI.>" }}
    ]
  }}
  I: {{
    users: [ {{ user: i, password: i }} ]
    imports: [
      {{ service: {{ account: A, subject: "$JS.API.>" }}, to: "fromA.>" }}
      {{ service: {{ account: A, subject: "$KV.>" }}, to: "fromA.$KV.>" }}
      {{ stream: {{ account: A, subject: "forI.>" }} }}
    ]
  }}
}}
"""


async def test_a_bucket_of_another_account_through_an_import(
    nats_server_factory: Any, natspy: Any, tmp_path: Any
) -> None:
    server = nats_server_factory(jetstream=False, extra_config=_import_config(str(tmp_path)))
    async with connect(server.url, user="i", password="i", inbox_prefix="forI") as nc:
        js = JetStream(nc, api_prefix="fromA")
        kv = await create_key_value(js, KeyValueConfig(bucket="shared", history=5))
        assert kv.write_prefix == "fromA.$KV.shared."
        # Account I has no $KV of its own: the plain subject reaches nothing.
        with pytest.raises(NoRespondersError):
            await nc.request("$KV.shared.cfg.url", b"x", timeout=5)
        expected = await _every_operation(kv)

    await _natspy_reads(natspy, f"nats://a:a@127.0.0.1:{server.port}", "shared", expected)


async def test_a_batched_read_through_a_one_response_export_says_why_it_timed_out(
    nats_server_factory: Any, tmp_path: Any
) -> None:
    # The default service export lets one response through: the first message of a batch
    # crosses, the rest and the end-of-batch do not.
    config = _import_config(str(tmp_path)).replace(", response_type: stream", "")
    server = nats_server_factory(jetstream=False, extra_config=config)
    async with connect(server.url, user="i", password="i", inbox_prefix="forI") as nc:
        js = JetStream(nc, api_prefix="fromA", timeout=1)
        kv = await create_key_value(js, KeyValueConfig(bucket="one"))
        await kv.put("a", b"1")
        await kv.put("b", b"2")
        assert (await kv.get("b")).value == b"2"  # one response: enough for a get
        with trio.fail_after(10), pytest.raises(RequestTimeout, match="response_type: stream"):
            await kv.get_many(["a", "b"])
