"""ADR-15's subscribe workflow, one test per rule (see ``headrace.jetstream.subscribe``).

Every refusal is checked for its type and for a message that says what to do instead. A real
nats-server throughout; nats-py, as an independent peer, creates consumers "from another
process" and inspects what the server holds.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from headrace.jetstream import (
    AckPolicy,
    ConsumerConfig,
    ConsumerConfigMismatch,
    ConsumerNotFound,
    JetStream,
    StreamConfig,
    StreamLookupError,
    SubscribeError,
)
from headrace.nats import connect

from tests.servers import free_port


@pytest.fixture
async def js(nats_server) -> AsyncIterator[JetStream]:
    async with connect(nats_server.url) as nc:
        yield JetStream(nc)


async def make_stream(js: JetStream, name: str = "S", subjects: tuple[str, ...] = ("s.>",)) -> None:
    await js.add_stream(StreamConfig(name=name, subjects=list(subjects)))


def sub_subjects(js: JetStream) -> set[str]:
    """The connection's subscriptions, without the request inbox (made on the first request)."""
    return {s.subject for s in js.nc.subscriptions if not s.subject.endswith(".*")}


async def wait_push_bound(js: JetStream, stream: str, name: str, bound: bool) -> None:
    """The server updates ``push_bound`` asynchronously after a SUB or UNSUB on an existing
    consumer's deliver subject (unlike at creation); ask until it says ``bound``."""
    with trio.fail_after(5):
        while (await js.consumer_info(stream, name)).push_bound is not bound:
            pass


async def natspy_js(natspy, url: str) -> Any:
    await natspy.connect(url)
    return natspy.nc.jetstream()


async def read_shared(subs: list[Any], count: int, timeout: float = 5) -> list[bytes]:
    """Read and ack from every subscription until ``count`` messages arrived in all."""
    got: list[bytes] = []
    enough = trio.Event()

    async def reader(sub: Any) -> None:
        async for msg in sub:
            got.append(msg.data)
            await msg.ack()
            if len(got) >= count:
                enough.set()

    async with trio.open_nursery() as nursery:
        for sub in subs:
            nursery.start_soon(reader, sub)
        with trio.fail_after(timeout):
            await enough.wait()
        nursery.cancel_scope.cancel()
    return got


# -- rules 1-3: refused before asking the server ---------------------------------------------


@pytest.mark.parametrize(
    ("config", "text"),
    [
        (ConsumerConfig(idle_heartbeat=1.0), r"heartbeats are not supported over queue groups"),
        (
            ConsumerConfig(flow_control=True, idle_heartbeat=None),
            r"flow control is not supported over queue groups",
        ),
    ],
    ids=["idle_heartbeat", "flow_control"],
)
async def test_queue_with_heartbeat_or_flow_control_is_refused(js, config, text):
    await make_stream(js)
    before = sub_subjects(js)
    with pytest.raises(SubscribeError, match=text) as caught:
        async with js.subscribe("s.x", queue="workers", config=config):
            pytest.fail("subscribed")
    assert type(caught.value) is SubscribeError
    assert "queue group 'workers'" in str(caught.value)
    assert "drop one" in str(caught.value)  # what to do
    assert await js.consumer_names("S") == []
    assert sub_subjects(js) == before


async def test_queue_rules_come_before_the_stream_lookup(js):
    """Rule 1 is checked without the server: no stream captures the subject, yet the error is
    the queue rule, not a stream lookup error."""
    with pytest.raises(SubscribeError, match="heartbeats are not supported") as caught:
        async with js.subscribe("nowhere.x", queue="q", config=ConsumerConfig(idle_heartbeat=1)):
            pass
    assert not isinstance(caught.value, StreamLookupError)


async def test_neither_subject_nor_stream_is_refused(js):
    with pytest.raises(SubscribeError, match=r"give a subject .* or a stream name") as caught:
        async with js.subscribe():
            pass
    assert type(caught.value) is SubscribeError
    with pytest.raises(SubscribeError, match=r"give a subject .* or a stream name"):
        async with js.pull_subscribe(durable="D"):
            pass
    # The stream alone is enough: nothing to find, the consumer is created unfiltered.
    await make_stream(js)
    async with js.subscribe(stream="S") as sub:
        assert sub.stream == "S"
        assert sub.info.config.filter_subject is None


@pytest.mark.parametrize("policy", [AckPolicy.NONE, AckPolicy.ALL])
async def test_pull_with_ack_policy_none_or_all_is_refused(js, policy):
    await make_stream(js)
    with pytest.raises(SubscribeError, match=r"need ack policy 'explicit'") as caught:
        async with js.pull_subscribe("s.x", durable="P", config=ConsumerConfig(ack_policy=policy)):
            pass
    assert repr(policy.value) in str(caught.value)
    assert await js.consumer_names("S") == []
    # A push subscription may use them.
    async with js.subscribe("s.x", config=ConsumerConfig(ack_policy=policy)) as sub:
        assert sub.info.config.ack_policy is policy


# -- rule 4: the stream lookup ----------------------------------------------------------------


async def test_no_stream_captures_the_subject(js):
    await make_stream(js, "OTHER", ("other.>",))
    with pytest.raises(StreamLookupError, match=r"no stream captures subject 's\.x'") as caught:
        async with js.subscribe("s.x"):
            pass
    assert "create one, or name the stream" in str(caught.value)
    with pytest.raises(StreamLookupError, match="no stream captures"):
        async with js.pull_subscribe("s.x", durable="P"):
            pass


async def test_several_streams_capture_the_subject(js):
    await make_stream(js, "A", ("a.x",))
    await make_stream(js, "B", ("b.x",))
    with pytest.raises(StreamLookupError, match=r"several streams capture subject '\*\.x'") as c:
        async with js.subscribe("*.x"):
            pass
    assert "(A, B)" in str(c.value) and "name the stream to use" in str(c.value)
    with pytest.raises(StreamLookupError, match="several streams"):
        async with js.pull_subscribe("*.x", durable="P"):
            pass
    # Naming the stream, as the message says, works.
    async with js.subscribe("*.x", stream="B") as sub:
        await js.publish("b.x", b"to B")
        msg = await sub.next_msg(timeout=5)
        assert (msg.data, msg.metadata.stream) == (b"to B", "B")


# -- rule 5: a named consumer is looked up ----------------------------------------------------


async def test_push_bind_to_a_missing_consumer_is_an_error(js):
    await make_stream(js)
    before = sub_subjects(js)
    with pytest.raises(ConsumerNotFound, match=r"consumer 'ghost' not found on stream 'S'") as c:
        async with js.subscribe("s.x", bind="ghost"):
            pass
    assert "create it, or subscribe without bind=" in str(c.value)
    assert await js.consumer_names("S") == []
    assert sub_subjects(js) == before


@pytest.mark.parametrize("how", ["durable", "bind"])
async def test_pull_subscribe_creates_a_missing_named_consumer(js, natspy, nats_server, how):
    await make_stream(js)
    async with js.pull_subscribe("s.x", **{how: "worker"}) as sub:
        assert sub.created
        peer = await natspy_js(natspy, nats_server.url)
        info = await natspy.call(peer.consumer_info, "S", "worker")
        assert info.config.durable_name == "worker"
        assert info.config.deliver_subject is None
        assert info.config.filter_subject == "s.x"
        assert info.config.ack_policy == "explicit"
        await js.publish("s.x", b"pulled")
        (msg,) = await sub.fetch(1, expires=5)
        assert msg.data == b"pulled"
        await msg.ack()


async def test_push_durable_missing_is_created(js):
    await make_stream(js)
    async with js.subscribe("s.x", durable="dur") as sub:
        assert sub.created
        info = await js.consumer_info("S", "dur")
        assert info.config.durable_name == "dur"
        assert info.config.deliver_subject == sub._sub.subject


# -- rule 6: a queue names the durable ---------------------------------------------------------


async def test_queue_name_is_the_durable_when_none_given(js, natspy, nats_server):
    await make_stream(js)
    async with js.subscribe("s.x", queue="workers") as sub:
        assert sub.consumer == "workers"
        peer = await natspy_js(natspy, nats_server.url)
        assert await natspy.call(peer.consumers_info, "S") != []
        info = await natspy.call(peer.consumer_info, "S", "workers")
        assert info.name == "workers"
        assert info.config.durable_name == "workers"
        assert info.config.deliver_group == "workers"
        assert info.push_bound
        # A second member with the same call joins the same consumer (the ADR-15 pitfall of
        # two ephemeral consumers delivering everything twice does not happen).
        async with (
            connect(nats_server.url) as nc2,
            JetStream(nc2).subscribe("s.x", queue="workers") as member2,
        ):
            assert member2.consumer == "workers" and not member2.created
            assert await js.consumer_names("S") == ["workers"]
            for i in range(20):
                await js.publish("s.x", b"%d" % i)
            got = await read_shared([sub, member2], 20)
            assert sorted(got, key=int) == [b"%d" % i for i in range(20)]


async def test_durable_given_wins_over_the_queue_name(js):
    await make_stream(js)
    async with js.subscribe("s.x", queue="workers", durable="shared") as sub:
        assert sub.consumer == "shared"
        info = await js.consumer_info("S", "shared")
        assert info.config.deliver_group == "workers"
        assert await js.consumer_names("S") == ["shared"]


# -- rule 7: an existing consumer must match ---------------------------------------------------


@pytest.mark.slow
async def test_push_bound_without_group_is_a_duplicate_subscription(js, nats_server):
    await make_stream(js)
    await js.create_consumer(
        "S", ConsumerConfig(durable_name="D", deliver_subject="dlv.D", ack_policy=AckPolicy.NONE)
    )
    async with js.subscribe("s.x", bind="D") as first:
        assert not first.created
        await wait_push_bound(js, "S", "D", True)
        async with connect(nats_server.url) as nc2:
            other = JetStream(nc2)
            before = sub_subjects(other)
            with pytest.raises(ConsumerConfigMismatch, match="duplicate subscription") as c:
                async with other.subscribe("s.x", bind="D"):
                    pass
            assert "serves one subscriber" in str(c.value)
            assert sub_subjects(other) == before
            with pytest.raises(ConsumerConfigMismatch, match="duplicate subscription"):
                async with other.subscribe("s.x", durable="D"):
                    pass
    # Once the first subscriber is gone the consumer is free again: the rule is push_bound.
    await wait_push_bound(js, "S", "D", False)
    async with js.subscribe("s.x", bind="D") as again:
        await js.publish("s.x", b"free")
        assert (await again.next_msg(timeout=5)).data == b"free"


async def group_consumer(js: JetStream, name: str, group: str | None, **kw: Any) -> None:
    await js.create_consumer(
        "S",
        ConsumerConfig(
            durable_name=name,
            deliver_subject=f"dlv.{name}",
            deliver_group=group,
            ack_policy=AckPolicy.EXPLICIT,
            **kw,
        ),
    )


async def test_plain_subscription_on_a_group_consumer_is_refused(js):
    await make_stream(js)
    await group_consumer(js, "G", "workers")
    assert not (await js.consumer_info("S", "G")).push_bound  # regardless of push_bound
    with pytest.raises(
        ConsumerConfigMismatch, match="was created for queue group 'workers'"
    ) as caught:
        async with js.subscribe("s.x", bind="G"):
            pass
    assert "subscribe with queue='workers' to join it" in str(caught.value)
    async with js.subscribe("s.x", bind="G", queue="workers") as sub:  # as told: it works
        assert sub.queue == "workers"


async def test_queue_subscription_on_a_consumer_without_group_is_refused(js):
    await make_stream(js)
    await group_consumer(js, "P", None)
    with pytest.raises(ConsumerConfigMismatch, match="created without a deliver group") as c:
        async with js.subscribe("s.x", bind="P", queue="workers"):
            pass
    assert "cannot be shared as queue group 'workers'" in str(c.value)
    # The same with the queue name as the durable (rule 6).
    await group_consumer(js, "workers", None)
    with pytest.raises(ConsumerConfigMismatch, match="without a deliver group"):
        async with js.subscribe("s.x", queue="workers"):
            pass


async def test_queue_subscription_on_another_groups_consumer_is_refused(js):
    await make_stream(js)
    await group_consumer(js, "G", "workers")
    with pytest.raises(
        ConsumerConfigMismatch, match="created for queue group 'workers', not 'others'"
    ):
        async with js.subscribe("s.x", bind="G", queue="others"):
            pass


async def test_filter_subject_mismatch_is_refused(js):
    await make_stream(js)
    await group_consumer(js, "F", None, filter_subject="s.a")
    with pytest.raises(ConsumerConfigMismatch, match=r"filters 's\.a', not 's\.b'") as caught:
        async with js.subscribe("s.b", bind="F"):
            pass
    assert "subscribe with its filter subject or use another consumer" in str(caught.value)
    await js.create_consumer(
        "S",
        ConsumerConfig(durable_name="PF", filter_subject="s.a", ack_policy=AckPolicy.EXPLICIT),
    )
    with pytest.raises(ConsumerConfigMismatch, match=r"filters 's\.a', not 's\.b'"):
        async with js.pull_subscribe("s.b", bind="PF"):
            pass
    # The matching subject, or none at all with the stream named, binds.
    async with js.subscribe("s.a", bind="F"), js.pull_subscribe(stream="S", bind="PF"):
        pass


async def test_pull_subscribe_on_a_push_consumer_is_refused(js):
    await make_stream(js)
    await group_consumer(js, "PUSH", None)
    with pytest.raises(ConsumerConfigMismatch, match="is push based") as caught:
        async with js.pull_subscribe("s.x", bind="PUSH"):
            pass
    assert "use subscribe() for it" in str(caught.value)
    with pytest.raises(ConsumerConfigMismatch, match="is push based"):
        async with js.pull_subscribe("s.x", durable="PUSH"):
            pass


async def test_subscribe_on_a_pull_consumer_is_refused(js):
    await make_stream(js)
    await js.create_consumer(
        "S", ConsumerConfig(durable_name="PULL", ack_policy=AckPolicy.EXPLICIT)
    )
    before = sub_subjects(js)
    with pytest.raises(ConsumerConfigMismatch, match="is a pull consumer") as caught:
        async with js.subscribe("s.x", bind="PULL"):
            pass
    assert "use pull_subscribe() for it" in str(caught.value)
    with pytest.raises(ConsumerConfigMismatch, match="is a pull consumer"):
        async with js.subscribe("s.x", durable="PULL"):
            pass
    assert sub_subjects(js) == before
    assert (await js.consumer_info("S", "PULL")).config.deliver_subject is None


async def test_config_drift_is_refused_and_the_deliver_subject_is_not_drift(js):
    await make_stream(js)
    await group_consumer(js, "D", None, max_ack_pending=10)
    with pytest.raises(
        ConsumerConfigMismatch, match=r"exists with max_ack_pending=10, not 20"
    ) as caught:
        async with js.subscribe("s.x", durable="D", config=ConsumerConfig(max_ack_pending=20)):
            pass
    assert "update it, or use another consumer" in str(caught.value)
    assert (await js.consumer_info("S", "D")).config.max_ack_pending == 10  # not changed
    # The same value is no drift.
    async with js.subscribe("s.x", durable="D", config=ConsumerConfig(max_ack_pending=10)):
        pass
    # Nor is another deliver subject: the subscription uses the consumer's.
    cfg = ConsumerConfig(max_ack_pending=10, deliver_subject="somewhere.else")
    async with js.subscribe("s.x", durable="D", config=cfg) as sub:
        assert sub._sub is not None and sub._sub.subject == "dlv.D"
        await js.publish("s.x", b"arrives")
        assert (await sub.next_msg(timeout=5)).data == b"arrives"
    # Pull consumers are checked the same way.
    await js.create_consumer(
        "S", ConsumerConfig(durable_name="P", ack_policy=AckPolicy.EXPLICIT, max_deliver=3)
    )
    with pytest.raises(ConsumerConfigMismatch, match="max_deliver=3, not 5"):
        async with js.pull_subscribe("s.x", durable="P", config=ConsumerConfig(max_deliver=5)):
            pass


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"metadata": {"team": "x"}}, id="metadata"),
        pytest.param({"mem_storage": False}, id="mem_storage=False"),
        pytest.param({"flow_control": False}, id="flow_control=False"),
        pytest.param({"headers_only": False}, id="headers_only=False"),
    ],
)
async def test_same_values_are_not_drift(js, extra):
    await make_stream(js)
    await group_consumer(js, "D", None, **extra)
    async with js.subscribe("s.x", durable="D", config=ConsumerConfig(**extra)) as sub:
        assert not sub.created


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        ({"idle_heartbeat": 1.0}, "has idle heartbeats, which are not supported over queue"),
        (
            {"idle_heartbeat": 1.0, "flow_control": True},
            "has flow control, which is not supported over queue groups",
        ),
    ],
    ids=["heartbeat", "flow_control"],
)
async def test_existing_group_consumer_with_heartbeat_or_flow_control(js, extra, text):
    """The server accepts these on a deliver group consumer; joining it as a queue is refused."""
    await make_stream(js)
    await group_consumer(js, "G", "workers", **extra)
    with pytest.raises(ConsumerConfigMismatch, match=text):
        async with js.subscribe("s.x", bind="G", queue="workers"):
            pass
    with pytest.raises(ConsumerConfigMismatch, match=text):
        async with js.subscribe("s.x", queue="workers", durable="G"):
            pass


# -- rule 8: the NATS subscription comes first ----------------------------------------------


async def test_durable_push_subscribes_before_creating_the_consumer(
    nats_server_factory, monkeypatch
):
    """When the create request is made, the server already has our interest on the deliver
    subject (read from its monitoring endpoint); right after subscribe returns the consumer is
    push bound, and nothing published before is lost."""
    http = free_port()
    server = nats_server_factory(extra_config=f"http: 127.0.0.1:{http}\n")

    def server_subjects() -> set[str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/subsz?subs=1&limit=10000") as r:
            body = json.loads(r.read())
        return {s["subject"] for s in body.get("subscriptions_list", [])}

    async with connect(server.url) as nc:
        js = JetStream(nc)
        await make_stream(js)
        for i in range(10):
            await js.publish("s.x", b"%d" % i)
        seen_at_create: list[bool] = []
        real_create = js.create_consumer

        async def spying_create(stream: str, config: ConsumerConfig):
            await nc.flush()  # everything written before this call has been processed
            subjects = await trio.to_thread.run_sync(server_subjects)
            seen_at_create.append(config.deliver_subject in subjects)
            return await real_create(stream, config)

        monkeypatch.setattr(js, "create_consumer", spying_create)
        async with js.subscribe("s.x", durable="dur") as sub:
            info = await js.consumer_info("S", "dur")
            assert info.push_bound
            assert seen_at_create == [True]
            got = []
            with trio.fail_after(5):
                while len(got) < 10:
                    for m in await sub.next_batch():
                        got.append(m.data)
                        await m.ack()
            assert got == [b"%d" % i for i in range(10)]


# -- rule 9: the already-exists race -----------------------------------------------------------


def lose_the_race(js: JetStream, monkeypatch, create_elsewhere) -> list[str]:
    """Make the first lookup say "not found" and let another process create the consumer right
    then, between our lookup and our create (the server itself stays real)."""
    real_info = js.consumer_info
    calls: list[str] = []

    async def racing_info(stream: str, name: str):
        calls.append(name)
        if len(calls) == 1:
            await create_elsewhere()
            raise ConsumerNotFound(404, 10014, "consumer not found")
        return await real_info(stream, name)

    monkeypatch.setattr(js, "consumer_info", racing_info)
    return calls


async def test_already_exists_race_moves_to_the_winners_deliver_subject(
    js, natspy, nats_server, monkeypatch
):
    await make_stream(js)
    peer = await natspy_js(natspy, nats_server.url)
    from nats.js.api import AckPolicy as PyAckPolicy
    from nats.js.api import ConsumerConfig as PyConsumerConfig

    async def create_elsewhere() -> None:
        cfg = PyConsumerConfig(
            durable_name="workers",
            deliver_subject="winner.deliver",
            deliver_group="workers",
            ack_policy=PyAckPolicy.EXPLICIT,
            filter_subject="s.x",
        )
        await natspy.call(peer.add_consumer, "S", cfg)

    calls = lose_the_race(js, monkeypatch, create_elsewhere)
    subs_before = sub_subjects(js)
    async with js.subscribe("s.x", queue="workers") as sub:
        assert calls == ["workers", "workers"]  # looked up again after "already exists"
        assert not sub.created
        assert sub._sub is not None and sub._sub.subject == "winner.deliver"
        assert sub._sub.queue == "workers"
        # The inbox made before the create is gone: only the winner's subject was added.
        assert sub_subjects(js) - subs_before == {"winner.deliver"}
        info = await js.consumer_info("S", "workers")
        assert info.config.deliver_subject == "winner.deliver"
        for i in range(5):
            await js.publish("s.x", b"%d" % i)
        got = []
        with trio.fail_after(5):
            while len(got) < 5:
                for m in await sub.next_batch():
                    got.append(m.data)
                    await m.ack()
        assert got == [b"%d" % i for i in range(5)]
    # We did not create it, so we leave it.
    assert await js.consumer_names("S") == ["workers"]


async def test_already_exists_race_still_checks_the_winner(js, natspy, nats_server, monkeypatch):
    """The consumer found after losing the race goes through rule 7: a winner with another
    deliver group is refused, and our early subscription is cleaned up."""
    await make_stream(js)
    peer = await natspy_js(natspy, nats_server.url)
    from nats.js.api import ConsumerConfig as PyConsumerConfig

    async def create_elsewhere() -> None:
        cfg = PyConsumerConfig(
            durable_name="workers", deliver_subject="winner.deliver", deliver_group="others"
        )
        await natspy.call(peer.add_consumer, "S", cfg)

    lose_the_race(js, monkeypatch, create_elsewhere)
    before = sub_subjects(js)
    with pytest.raises(ConsumerConfigMismatch, match="queue group 'others', not 'workers'"):
        async with js.subscribe("s.x", queue="workers"):
            pass
    assert sub_subjects(js) == before


async def test_already_exists_race_for_pull(js, natspy, nats_server, monkeypatch):
    await make_stream(js)
    peer = await natspy_js(natspy, nats_server.url)
    from nats.js.api import AckPolicy as PyAckPolicy
    from nats.js.api import ConsumerConfig as PyConsumerConfig

    async def create_elsewhere() -> None:
        cfg = PyConsumerConfig(durable_name="P", ack_policy=PyAckPolicy.EXPLICIT, max_ack_pending=7)
        await natspy.call(peer.add_consumer, "S", cfg)

    lose_the_race(js, monkeypatch, create_elsewhere)
    async with js.pull_subscribe("s.x", durable="P") as sub:
        assert not sub.created
        assert sub.consumer.name == "P"
    assert await js.consumer_names("S") == ["P"]
