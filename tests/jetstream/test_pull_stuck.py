"""Pull states that used to stick, against a real nats-server (issue 11).

- A message larger than a consume's ``max_bytes``: the server answers every request with 409
  Message Size Exceeds MaxBytes, and re-pulling at once made a busy loop (78,442 requests in
  20 s, no message, no error). Now the consume asks again only for more than was refused, and
  ends with :class:`MessageTooLarge` when even the whole budget is too small.
- Acks the server refuses (no permission for ``$JS.ACK``): the consume ends with
  :class:`AckRefused` instead of handing out messages that come back after ack_wait for ever.
- An ended pull subscription took messages from its durable consumer, which then sat unacked
  until ack_wait.

The pull requests are counted by a second connection subscribed to the API subject: the
server copies each request to it, so the count is the server's, not the client's own.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from headrace.errors import PermissionViolation, SubscriptionClosedError
from headrace.jetstream import (
    AckPolicy,
    AckRefused,
    ConsumerConfig,
    JetStream,
    MessageTooLarge,
    StreamConfig,
)
from headrace.nats import Connection, connect
from headrace.protocol.events import Msg

from tests.jetstream.js_pull_support import (
    consumer_state,
    probed_consume,
    publish_n,
    settle,
    setup_pull,
)
from tests.servers import permissions_auth
from tests.waiting import FAST

NEXT = "$JS.API.CONSUMER.MSG.NEXT.S.C"


def count_requests(spy: Connection) -> list[Msg]:
    """Every pull request the server routes for consumer S/C, as it routes them."""
    seen: list[Msg] = []
    spy.subscribe_nowait(NEXT, handler=seen.extend)
    return seen


async def all_routed(nc: Connection, spy: Connection) -> None:
    """Once this returns, the spy holds every request ``nc`` sent before the call: the server
    handled them before the PONG of ``nc``'s flush, and queued their copies to the spy before
    the PONG of its own."""
    await nc.flush()
    await spy.flush()


# -- a message larger than max_bytes -------------------------------------------------------


async def test_a_message_larger_than_max_bytes_ends_the_consume_without_spinning(nats_server):
    async with connect(nats_server.url, **FAST) as nc, connect(nats_server.url) as spy:
        requests = count_requests(spy)
        await spy.flush()
        js = JetStream(nc)
        consumer = await setup_pull(js)
        await js.publish("s.x", b"x" * 2000)
        async with consumer.consume(max_bytes=1000, expires=5, idle_heartbeat=1) as messages:
            with trio.fail_after(5), pytest.raises(MessageTooLarge) as caught:
                await messages.next_batch()
            await all_routed(nc, spy)
            assert len(requests) == 1  # refused for the whole budget: no second request
        error = caught.value
        assert (error.stream, error.consumer, error.max_bytes) == ("S", "C", 1000)
        assert (error.status, error.description) == (409, "Message Size Exceeds MaxBytes")
        assert "'C'" in str(error) and "'S'" in str(error) and "1000 bytes" in str(error)
        # Nothing was delivered: the message waits in the stream for a larger budget.
        async with consumer.consume(max_bytes=4000, expires=5) as messages:
            with trio.fail_after(5):
                (big,) = await messages.next_batch()
        assert len(big.data) == 2000


async def test_a_message_too_large_for_what_is_left_waits_for_room(nats_server):
    """Two small messages take part of the budget and wait unread; the third does not fit
    what is left of the request (409), though it fits the whole budget. Asking again for
    that remainder would be refused at once, in a loop while the reader is busy: the consume
    waits until the reader makes room, then gets it."""
    async with connect(nats_server.url, **FAST) as nc, connect(nats_server.url) as spy:
        requests = count_requests(spy)
        await spy.flush()
        js = JetStream(nc)
        consumer = await setup_pull(js)
        await publish_n(js, 2, payload=b"s" * 50)
        await js.publish("s.x", b"L" * 850)
        opts = {"max_bytes": 1000, "expires": 5, "idle_heartbeat": 1}
        async with probed_consume(consumer, **opts) as (messages, probe):
            refused = (409, "Message Size Exceeds MaxBytes")
            await probe.wait_until(lambda: messages.buffered == 2 and refused in probe.statuses)
            for _ in range(3):  # a spinning consume would pull on every one of these rounds
                await all_routed(nc, spy)
            assert len(requests) == 1
            assert probe.statuses.count(refused) == 1
            with trio.fail_after(5):
                small = await messages.next_batch()
                large = await messages.next_batch()
            assert [len(m.data) for m in small] == [51, 51]
            assert [m.data for m in large] == [b"L" * 850]
            await all_routed(nc, spy)
            assert len(requests) <= 3  # the first, the one after the reader made room, a refill


@pytest.mark.slow
async def test_fetch_of_a_message_larger_than_max_bytes_raises(nats_server):
    """fetch used to return nothing, so a fetch loop asked again and again."""
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        await js.publish("s.x", b"x" * 2000)
        with trio.fail_after(3), pytest.raises(MessageTooLarge) as caught:
            await consumer.fetch(max_bytes=1000, expires=2)
        assert caught.value.max_bytes == 1000
        (msg,) = await consumer.fetch(max_bytes=4000, expires=2)
        assert len(msg.data) == 2000


# -- acks the server refuses ---------------------------------------------------------------


def no_acks_auth() -> Any:
    """A worker that may use the JetStream API but not publish acks; and an admin."""
    return permissions_auth(
        "worker",
        publish=["$JS.API.>", "_INBOX.>", "s.>"],
        subscribe=[">"],
        admin_password="admin-secret",
    )


async def test_a_consume_whose_acks_are_refused_ends_with_ack_refused(nats_server_factory):
    auth = no_acks_auth()
    server = nats_server_factory(auth=auth.config)
    worker = {"user": auth.user, "password": auth.password}
    async with connect(server.url, **FAST, **worker) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js, ack_wait=30)
        await publish_n(js, 200)
        taken = []
        with trio.fail_after(5), pytest.raises(AckRefused) as caught:
            async with consumer.consume(max_messages=2, expires=5) as messages:
                async for msg in messages:
                    taken.append(msg)
                    await msg.ack()
        error = caught.value
        assert (error.stream, error.consumer) == ("S", "C")
        assert error.subject.startswith("$JS.ACK.S.C.")
        assert error.subject in str(error)
        assert isinstance(error.__cause__, PermissionViolation)
        # It stopped soon after the first refusal (the server's -ERR takes a round trip, in
        # which a loaded machine may take a few more): not every message was taken.
        assert 1 <= len(taken) < 200
        # The server never recorded an ack.
        admin = {"user": "admin", "password": "admin-secret"}
        async with connect(server.url, **admin) as admin_nc:
            info = await JetStream(admin_nc).consumer_info("S", "C")
        assert info.ack_floor.stream_seq == 0


async def test_a_push_subscription_whose_acks_are_refused_ends_with_ack_refused(
    nats_server_factory,
):
    auth = no_acks_auth()
    server = nats_server_factory(auth=auth.config)
    async with connect(server.url, **FAST, user=auth.user, password=auth.password) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        await publish_n(js, 5)
        taken = []
        with trio.fail_after(5), pytest.raises(AckRefused) as caught:
            async with js.subscribe("s.x", durable="P") as sub:
                async for msg in sub:
                    taken.append(msg)
                    await msg.ack()
        assert (caught.value.stream, caught.value.consumer) == ("S", "P")
        assert 1 <= len(taken) <= 5


# -- an ended pull subscription ------------------------------------------------------------


@pytest.mark.parametrize("how", ["unsubscribe", "block"])
async def test_an_ended_pull_subscription_takes_nothing(nats_server, natspy, how):
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        await publish_n(js, 3)
        config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=30)
        async with js.pull_subscribe("s.x", durable="C", config=config) as sub:
            if how == "unsubscribe":
                await sub.unsubscribe()
                calls = await _pulls_after_the_end(sub)
        if how == "block":
            calls = await _pulls_after_the_end(sub)
        for name, error in calls.items():
            assert isinstance(error, SubscriptionClosedError), (name, error)
            assert "has ended" in str(error) and "'C'" in str(error)
        await nc.flush()
    info = await consumer_state(natspy)
    assert info.delivered.stream_seq == 0  # nothing was handed out ...
    assert info.num_ack_pending == 0  # ... so nothing waits for ack_wait
    assert info.num_waiting == 0  # and no pull request waits on the server
    assert info.num_pending == 3


async def _pulls_after_the_end(sub: Any) -> dict[str, BaseException | None]:
    calls: dict[str, BaseException | None] = {}

    async def consume() -> None:
        async with sub.consume(max_messages=10, expires=2) as messages:
            await messages.next_batch()

    attempts = {
        "fetch": lambda: sub.fetch(1, expires=1),
        "next": lambda: sub.next(expires=1),
        "consume": consume,
    }
    for name, attempt in attempts.items():
        calls[name] = None
        with trio.fail_after(3):
            try:
                await attempt()
            except Exception as exc:
                calls[name] = exc
    await settle()
    return calls
