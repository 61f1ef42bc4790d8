"""What a subscription does with its consumer when it ends (``headrace.jetstream.lifecycle``):
it deletes only what it created, by the documented rule (ADR-15 "Unsubscribe and Drain", with
its queue-group hazard settled); drains wait for outstanding acks; deletion failures are an event
after a drain and an error from an unsubscribe. A real nats-server; nats-py plays "another
process" that creates or removes things behind the subscription's back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing
from headrace.actors.actor import ActorState
from headrace.jetstream import (
    AckPolicy,
    ConsumerConfig,
    ConsumerDeleteFailed,
    JetStream,
    StreamConfig,
    StreamNotFound,
)
from headrace.jetstream.lifecycle import DeletePolicy
from headrace.nats import EventWatcher, connect

from tests.waiting import next_event


@pytest.fixture
async def js(nats_server) -> AsyncIterator[JetStream]:
    async with connect(nats_server.url) as nc:
        jsc = JetStream(nc)
        await jsc.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        yield jsc


async def names(js: JetStream) -> list[str]:
    return sorted(await js.consumer_names("S"))


async def read(sub: Any, count: int) -> list[Any]:
    got: list[Any] = []
    with trio.fail_after(5):
        while len(got) < count:
            got += await sub.next_batch(count - len(got))
    return got


async def peer_js(natspy, url: str) -> Any:
    await natspy.connect(url)
    return natspy.nc.jetstream()


# -- what is deleted ----------------------------------------------------------------------------


async def test_created_ephemeral_push_consumer_is_deleted(js):
    async with js.subscribe("s.x") as sub:
        assert sub.created and sub.lifecycle.created
        assert await names(js) == [sub.consumer]
    assert sub.lifecycle.deleted
    assert await names(js) == []


async def test_created_durable_for_a_plain_push_subscription_is_deleted(js):
    async with js.subscribe("s.x", durable="mine") as sub:
        assert sub.created
        assert await names(js) == ["mine"]
    assert sub.lifecycle.deleted
    assert await names(js) == []


@pytest.mark.parametrize("how", ["bind", "durable"])
async def test_bound_durable_is_kept(js, natspy, nats_server, how):
    peer = await peer_js(natspy, nats_server.url)
    from nats.js.api import ConsumerConfig as PyConsumerConfig

    await natspy.call(
        peer.add_consumer, "S", PyConsumerConfig(durable_name="theirs", deliver_subject="d.t")
    )
    async with js.subscribe("s.x", **{how: "theirs"}) as sub:
        assert not sub.created and not sub.lifecycle.created
        await js.publish("s.x", b"x")
        await (await sub.next_msg(timeout=5)).ack()
    assert not sub.lifecycle.deleted
    assert await names(js) == ["theirs"]
    # With ALWAYS too: it deletes what it created, and it created nothing.
    async with js.subscribe("s.x", bind="theirs", delete_policy=DeletePolicy.ALWAYS):
        pass
    assert await names(js) == ["theirs"]


@pytest.mark.parametrize(
    ("durable", "policy", "kept"),
    [
        ("P", DeletePolicy.AUTO, True),  # shared by design: nothing tells us we are the last
        ("P", DeletePolicy.ALWAYS, False),
        ("P", DeletePolicy.NEVER, True),
        (None, DeletePolicy.AUTO, False),  # an ephemeral is ours alone
        (None, DeletePolicy.NEVER, True),
    ],
)
async def test_created_pull_consumer(js, durable, policy, kept):
    async with js.pull_subscribe("s.x", durable=durable, delete_policy=policy) as sub:
        assert sub.created
        name = sub.consumer.name
        assert await names(js) == [name]
        await js.publish("s.x", b"x")
        (msg,) = await sub.fetch(1, expires=5)
        await msg.ack()
    assert await names(js) == ([name] if kept else [])
    assert sub.lifecycle.deleted is not kept


@pytest.mark.parametrize(
    ("policy", "kept"), [(DeletePolicy.NEVER, True), (DeletePolicy.ALWAYS, False)]
)
async def test_push_policies(js, policy, kept):
    async with js.subscribe("s.x", delete_policy=policy) as sub:
        name = sub.consumer
    assert await names(js) == ([name] if kept else [])


async def test_unsubscribe_deletes_at_once_and_the_block_end_does_nothing_more(js):
    async with js.subscribe("s.x") as sub:
        await sub.unsubscribe()
        assert sub.lifecycle.deleted and await names(js) == []
        assert not sub.lifecycle.running
        await sub.unsubscribe()  # a second call is a no-op


# -- the queue-group hazard ---------------------------------------------------------------------


async def test_queue_member_that_created_the_durable_leaves_and_others_keep_it(js, nats_server):
    """ADR-15's hazard: member 1 creates the shared durable, member 2 joins, member 1 leaves.
    The consumer stays (member 2 is still bound) and member 2 keeps receiving. Member 2 did not
    create it, so when it leaves last the consumer is kept too (the documented rule)."""
    member1: list[Any] = []
    entered, leave, left = trio.Event(), trio.Event(), trio.Event()

    async def first_member(nc: Any) -> None:
        """Member 1 in its own task, so it can leave while member 2 stays."""
        async with JetStream(nc).subscribe("s.x", queue="workers", durable="shared") as sub:
            member1.append(sub)
            entered.set()
            await leave.wait()
        left.set()

    async with (
        connect(nats_server.url) as nc1,
        connect(nats_server.url) as nc2,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(first_member, nc1)
        with trio.fail_after(5):
            await entered.wait()
        assert member1[0].created
        async with JetStream(nc2).subscribe("s.x", queue="workers", durable="shared") as member2:
            assert not member2.created
            await nc2.flush()  # member 2's interest is registered
            leave.set()
            with trio.fail_after(5):
                await left.wait()
            assert not member1[0].lifecycle.deleted
            assert await names(js) == ["shared"]
            for i in range(3):
                await js.publish("s.x", b"%d" % i)
            got = await read(member2, 3)
            assert [m.data for m in got] == [b"0", b"1", b"2"]
            for m in got:
                await m.ack()
        assert not member2.lifecycle.deleted
    assert await names(js) == ["shared"]


async def test_queue_member_alone_deletes_the_durable_it_created(js):
    left_behind = []
    for k in range(30):  # the outcome depends on timing: often enough to fail every time
        async with js.subscribe("s.x", queue=f"q{k}") as sub:
            assert sub.created
        if not sub.lifecycle.deleted:
            left_behind.append(sub.consumer)
    assert left_behind == []
    assert await names(js) == []


# -- drain --------------------------------------------------------------------------------------


async def test_drain_waits_for_outstanding_acks_then_deletes(js):
    async with js.subscribe("s.x", config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT)) as sub:
        for i in range(5):
            await js.publish("s.x", b"%d" % i)
        msgs = await read(sub, 5)  # handed out, not acked
        drained = trio.Event()
        acked_before_end: list[bool] = []

        async def drain() -> None:
            await sub.drain(timeout=30)
            drained.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            for msg in msgs:
                # Everything quiet for a while: the drain is waiting, not done.
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                acked_before_end.append(drained.is_set())
                assert sub.lifecycle.state is ActorState.DRAINING
                assert await names(js) == [sub.consumer]
                await msg.ack()
            with trio.fail_after(5):
                await drained.wait()
        assert acked_before_end == [False] * 5
        assert sub.lifecycle.deleted
        assert await names(js) == []


async def test_drain_lets_the_reader_take_what_is_buffered(js):
    cfg = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT)
    async with js.subscribe("s.x", config=cfg) as sub:
        for i in range(3):
            await js.publish("s.x", b"%d" % i)
        # Delivered says the server wrote them to us before its answer: they are buffered.
        # (A push consumer delivers after storing, on its own: ask until it has.)
        with trio.fail_after(5):
            while (await js.consumer_info("S", sub.consumer)).delivered.consumer_seq < 3:  # noqa: ASYNC110
                await trio.sleep(0.01)
        drained = trio.Event()
        got: list[bytes] = []

        async def drain() -> None:
            await sub.drain(timeout=30)
            drained.set()

        async def reader() -> None:
            async for msg in sub:  # ends once the drain closed the buffer and it is empty
                got.append(msg.data)
                await msg.ack()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert not drained.is_set()  # waiting for the buffer to be read
            nursery.start_soon(reader)
            with trio.fail_after(5):
                await drained.wait()
        assert got == [b"0", b"1", b"2"]
        assert await names(js) == []


async def test_drain_deadline_with_never_acked_messages(js):
    async with js.subscribe("s.x", config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT)) as sub:
        await js.publish("s.x", b"never acked")
        await read(sub, 1)
        start = trio.current_time()
        with trio.fail_after(5):
            await sub.drain(timeout=0.5)
        took = trio.current_time() - start
        assert 0.5 <= took < 3
        assert sub.lifecycle.deleted  # it gave up waiting, then deleted what it created
        assert await names(js) == []


async def test_delete_failure_during_drain_is_an_event(js, natspy, nats_server):
    peer = await peer_js(natspy, nats_server.url)
    async with js.subscribe("s.x") as sub:
        with sub.events() as events:
            await natspy.call(peer.delete_stream, "S")  # the consumer cannot be deleted now
            with trio.fail_after(5):
                await sub.drain(timeout=5)  # does not raise
            failed = await next_event(events, ConsumerDeleteFailed)
    assert (failed.stream, failed.consumer) == ("S", sub.consumer)
    assert isinstance(failed.error, StreamNotFound)
    assert not sub.lifecycle.deleted


async def test_delete_failure_during_unsubscribe_is_raised(js, natspy, nats_server):
    peer = await peer_js(natspy, nats_server.url)
    async with js.subscribe("s.x") as sub, trio.open_nursery() as nursery:
        seen: list[Any] = []

        async def collect(watcher: EventWatcher[Any]) -> None:
            async for event in watcher:
                seen.append(event)

        nursery.start_soon(collect, sub.events())
        await natspy.call(peer.delete_stream, "S")
        with pytest.raises(StreamNotFound):
            await sub.unsubscribe()
        assert not sub.lifecycle.deleted
        await trio.testing.wait_all_tasks_blocked()
        assert seen == []  # raised, not reported as an event
        nursery.cancel_scope.cancel()


async def test_delete_failure_at_the_end_of_the_block_is_raised(js, natspy, nats_server):
    peer = await peer_js(natspy, nats_server.url)
    with pytest.raises(StreamNotFound):
        async with js.subscribe("s.x"):
            await natspy.call(peer.delete_stream, "S")
    # The body's own error wins over the failed delete.
    await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
    with pytest.raises(KeyError):
        async with js.subscribe("s.x"):
            await natspy.call(peer.delete_stream, "S")
            raise KeyError("the body's own error")


async def test_an_end_requested_as_the_actors_are_cancelled_is_still_carried_out(js):
    """The block fails just as the scope around it is cancelled: the subscription ends from a
    shielded scope while its actors, cancelled too, have not run yet. The lifecycle actor dies
    without taking the request, so the caller carries it out (it used to wait forever: a CI run
    hung on a checkpoints test this way)."""
    with (
        trio.CancelScope() as outer,
        pytest.raises(RuntimeError, match="fails as its scope is cancelled"),
    ):
        async with js.subscribe("s.x") as sub:
            consumer = sub.consumer
            assert await names(js) == [consumer]
            outer.cancel()
            raise RuntimeError("the block fails as its scope is cancelled")
    assert sub.lifecycle.deleted
    assert await names(js) == []
