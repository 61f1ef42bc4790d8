"""Consumers are created through the subject nats.go sends, which accounts scope permissions
by (issue 24: ephemerals used the legacy ``CONSUMER.CREATE.<stream>``, and no create named its
filter): ``$JS.API.CONSUMER.CREATE.<stream>.<name>[.<filter>]``, an ephemeral with a generated
name. Real nats-server; nats-py watches the API subjects as an independent peer."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from headrace.errors import PermissionViolation
from headrace.jetstream import ConsumerConfig, JetStream, StreamConfig
from headrace.nats import connect


async def _created_through(natspy: Any, url: str, make: Any) -> tuple[list[str], Any]:
    """The create subjects seen while ``make(js)`` runs, and what it returned."""
    seen: list[str] = []

    async def note(msg: Any) -> None:
        seen.append(msg.subject)

    await natspy.connect(url)
    sub = await natspy.call(natspy.nc.subscribe, "$JS.API.CONSUMER.CREATE.>", cb=note)
    await natspy.call(natspy.nc.flush)
    async with connect(url) as nc:
        js = JetStream(nc)
        result = await make(js)
    await natspy.call(natspy.nc.flush)
    await natspy.call(sub.unsubscribe)
    return seen, result


async def test_create_subjects_name_the_consumer_and_its_filter(nats_server: Any, natspy: Any):
    async def make(js: JetStream) -> Any:
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        durable = await js.create_consumer(
            "S", ConsumerConfig(durable_name="D", filter_subject="s.a")
        )
        wild = await js.create_consumer("S", ConsumerConfig(name="W", filter_subject="s.>"))
        many = await js.create_consumer(
            "S", ConsumerConfig(durable_name="M", filter_subjects=["s.a", "s.b"])
        )
        ephemeral = await js.create_consumer("S", ConsumerConfig(filter_subject="s.b"))
        return durable, wild, many, ephemeral

    with trio.fail_after(20):
        seen, (durable, wild, many, ephemeral) = await _created_through(
            natspy, nats_server.url, make
        )
    assert seen == [
        "$JS.API.CONSUMER.CREATE.S.D.s.a",
        "$JS.API.CONSUMER.CREATE.S.W.s.>",
        "$JS.API.CONSUMER.CREATE.S.M",  # several filters: none in the subject
        f"$JS.API.CONSUMER.CREATE.S.{ephemeral.name}.s.b",
    ]
    assert (durable.name, wild.name, many.name) == ("D", "W", "M")
    # The generated name keeps it ephemeral: no durable name, removed when inactive.
    assert len(ephemeral.name) == 22 and ephemeral.config.durable_name is None
    assert ephemeral.config.inactive_threshold is not None


AUTH = """\
authorization {
  users: [
    { user: "admin", password: "admin-pw" }
    { user: "scoped", password: "scoped-pw", permissions: {
        publish: { allow: ["$JS.API.CONSUMER.CREATE.S.*.s.a", "$JS.API.CONSUMER.INFO.S.*"] }
        subscribe: { allow: ["_INBOX.>"] }
    } }
  ]
}
"""


async def test_permissions_scoped_by_filter_allow_the_creates(nats_server_factory: Any):
    server = nats_server_factory(auth=AUTH)
    async with connect(f"nats://admin:admin-pw@127.0.0.1:{server.port}") as nc:
        await JetStream(nc).add_stream(StreamConfig(name="S", subjects=["s.>"]))
    async with connect(f"nats://scoped:scoped-pw@127.0.0.1:{server.port}") as nc:
        js = JetStream(nc)
        with trio.fail_after(10):
            made = await js.create_consumer(
                "S", ConsumerConfig(durable_name="D", filter_subject="s.a")
            )
            assert made.name == "D"
            ephemeral = await js.create_consumer("S", ConsumerConfig(filter_subject="s.a"))
            assert ephemeral.config.durable_name is None
            # Another filter is another subject, which this user may not publish to.
            with pytest.raises(PermissionViolation):
                await js.create_consumer(
                    "S", ConsumerConfig(durable_name="E", filter_subject="s.b")
                )
