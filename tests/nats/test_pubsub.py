"""Publish, subscribe, request/reply, flush, drain and close against a real nats-server,
with nats-py as the independent peer on the other end."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing
from headrace.errors import (
    ConnectionClosedError,
    DrainTimeout,
    InvalidHeaderError,
    InvalidSubjectError,
    MalformedHeaderWarning,
    MaxPayloadExceeded,
    NatsError,
    NoRespondersError,
    RequestTimeout,
    SubscriptionClosedError,
)
from headrace.nats import Reconnected, SlowConsumer, SlowConsumerPolicy, Status, connect
from headrace.protocol import Headers

from tests.raw_publish import raw_hpub


async def test_publish_subscribe_with_headers(core_server):
    async with connect(core_server.url) as nc:
        sub = await nc.subscribe("orders.*")
        await nc.flush()
        headers = Headers([("Trace", "a"), ("Trace", "b"), ("Region", "eu")])
        await nc.publish("orders.1", b"first", headers=headers)
        await nc.publish("orders.2", b"second")
        await nc.publish("other", b"not for us")
        m1 = await sub.next_msg(timeout=5)
        m2 = await sub.next_msg(timeout=5)
    assert (m1.subject, m1.data) == ("orders.1", b"first")
    assert m1.headers is not None
    assert m1.headers.get_all("Trace") == ["a", "b"]
    assert m1.headers["Region"] == "eu"
    assert m1.status is None
    assert (m2.subject, m2.data, m2.headers) == ("orders.2", b"second", None)


async def test_queue_group_shares_messages(core_server):
    async with connect(core_server.url) as nc:
        a = await nc.subscribe("work", queue="workers")
        b = await nc.subscribe("work", queue="workers")
        await nc.flush()
        for i in range(200):
            await nc.publish("work", str(i).encode())
        # After the flush every message has been routed to one of the two buffers.
        await nc.flush()
        got_a = [int(m.data) for m in await a.next_batch()] if a.pending_msgs else []
        got_b = [int(m.data) for m in await b.next_batch()] if b.pending_msgs else []
        # Each message went to exactly one member of the group, and both got a share.
        assert sorted(got_a + got_b) == list(range(200))
        assert got_a and got_b


async def test_next_batch_returns_everything_buffered(core_server):
    async with connect(core_server.url) as nc:
        sub = await nc.subscribe("batch")
        await nc.flush()
        for i in range(1000):
            await nc.publish("batch", b"%d" % i)
        await nc.flush()
        # The flush's PONG came after every message, so all of them are buffered now.
        batch = await sub.next_batch()
        assert [m.data for m in batch] == [b"%d" % i for i in range(1000)]
        assert sub.pending_msgs == 0


async def test_writes_are_coalesced(core_server):
    async with connect(core_server.url) as nc:
        await nc.flush()
        writes_before = nc.stats.writes
        for _ in range(5000):
            await nc.publish("coalesce", b"x" * 16)
        await nc.flush()
        # 5000 publishes queued without a checkpoint between them leave in a handful of
        # send_all calls (plus the flush's PING), not one per message.
        assert nc.stats.writes - writes_before <= 5
        assert nc.stats.out_msgs >= 5000


async def test_publish_nowait_for_server_given_subjects(core_server):
    async with connect(core_server.url, write_buffer_size=64) as nc:
        sub = await nc.subscribe("$JS.ACK.S.c.>")
        await nc.flush()
        # Far beyond write_buffer_size, with no checkpoint in between: all are queued.
        for i in range(300):
            nc.publish_nowait(f"$JS.ACK.S.c.1.{i}.{i}.0.0", b"+ACK")
        await nc.flush()
        got = await sub.next_batch()
        assert [m.subject for m in got] == [f"$JS.ACK.S.c.1.{i}.{i}.0.0" for i in range(300)]
        assert {m.data for m in got} == {b"+ACK"}


async def test_request_reply_over_one_muxed_inbox(core_server):
    async with connect(core_server.url) as nc, trio.open_nursery() as nursery:
        service = await nc.subscribe("svc.echo")
        await nc.flush()

        async def serve() -> None:
            async for msg in service:
                assert msg.reply is not None
                await nc.publish(msg.reply, msg.data.upper(), headers={"Served": "yes"})

        nursery.start_soon(serve)
        results: dict[int, bytes] = {}

        async def ask(i: int) -> None:
            reply = await nc.request("svc.echo", b"hello-%d" % i, timeout=5)
            assert reply.headers is not None and reply.headers["Served"] == "yes"
            results[i] = reply.data

        async with trio.open_nursery() as askers:
            for i in range(50):
                askers.start_soon(ask, i)
        assert results == {i: b"HELLO-%d" % i for i in range(50)}
        # One inbox subscription carried all 50 replies, next to the service's own.
        assert len(nc.subscriptions) == 2
        nursery.cancel_scope.cancel()


async def test_request_no_responders(core_server):
    async with connect(core_server.url) as nc:
        with pytest.raises(NoRespondersError, match=r"nobody\.home"):
            await nc.request("nobody.home", b"?", timeout=5)


async def test_request_timeout(core_server):
    async with connect(core_server.url) as nc:
        await nc.subscribe("silent")  # a responder that never answers
        await nc.flush()
        with pytest.raises(RequestTimeout):
            await nc.request("silent", b"?", timeout=0.2)


async def test_payload_at_and_over_max_payload(nats_server_factory):
    server = nats_server_factory(jetstream=False, max_payload=4096)
    async with connect(server.url) as nc:
        assert nc.max_payload == 4096
        sub = await nc.subscribe("big")
        await nc.flush()
        exact = bytes(range(256)) * 16
        await nc.publish("big", exact)
        assert (await sub.next_msg(timeout=5)).data == exact
        with pytest.raises(MaxPayloadExceeded, match="4097 bytes"):
            await nc.publish("big", exact + b"!")
        # Headers count towards the limit too.
        with pytest.raises(MaxPayloadExceeded):
            await nc.publish("big", exact[:4090], headers={"K": "v"})
        # Nothing was sent for the refused publishes and the connection is still fine.
        await nc.publish("big", b"after")
        assert (await sub.next_msg(timeout=5)).data == b"after"
        assert nc.stats.reconnects == 0


async def test_bad_subjects_and_headers_are_refused_before_sending(core_server):
    async with connect(core_server.url) as nc:
        with pytest.raises(InvalidSubjectError):
            await nc.publish("has space", b"")
        with pytest.raises(InvalidSubjectError):
            await nc.publish("wild.*", b"")
        with pytest.raises(InvalidSubjectError):
            await nc.subscribe("a..b")
        with pytest.raises(InvalidSubjectError):
            await nc.subscribe("ok", queue="bad queue")
        with pytest.raises(InvalidHeaderError):
            await nc.publish("ok", b"", headers={"Bad Name": "v"})
        with pytest.raises(InvalidHeaderError):
            await nc.publish("ok", b"", headers={"K": "line\r\nbreak"})
        assert nc.stats.out_msgs == 0
        await nc.flush()


async def test_unsubscribe_with_max(core_server):
    async with connect(core_server.url) as nc:
        sub = await nc.subscribe("limited")
        await sub.unsubscribe(3)
        await nc.flush()
        for i in range(10):
            await nc.publish("limited", b"%d" % i)
        await nc.flush()
        got = [m.data async for m in sub]  # ends by itself after the third message
        assert got == [b"0", b"1", b"2"]
        assert await sub.wait_closed() is None


async def test_unsubscribe_stops_delivery(core_server):
    async with connect(core_server.url) as nc:
        sub = await nc.subscribe("stop")
        await nc.flush()
        await nc.publish("stop", b"before")
        await nc.flush()
        await sub.unsubscribe()
        await nc.publish("stop", b"after")
        await nc.flush()
        assert [m.data async for m in sub] == [b"before"]
        with pytest.raises(SubscriptionClosedError):
            await sub.next_msg(timeout=1)


async def test_slow_consumer_drop_policy_reports_and_bounds(core_server):
    async with connect(core_server.url) as nc:
        with nc.events() as events:
            sub = await nc.subscribe("flood", max_pending_msgs=100)
            await nc.flush()
            for i in range(1000):
                await nc.publish("flood", b"%d" % i)
            await nc.flush()
            assert sub.pending_msgs == 100
            assert sub.dropped == 900
            with trio.fail_after(5):
                event = await events.receive()
                while not isinstance(event, SlowConsumer):
                    event = await events.receive()
            assert event.sid == sub.sid and event.subject == "flood"
            # The first 100 were kept, in order.
            assert [m.data for m in await sub.next_batch()] == [b"%d" % i for i in range(100)]


async def test_slow_consumer_backpressure_loses_nothing(core_server):
    n = 20_000
    async with connect(core_server.url) as nc, trio.open_nursery() as nursery:
        sub = await nc.subscribe(
            "steady", max_pending_msgs=50, slow_consumer=SlowConsumerPolicy.BACKPRESSURE
        )
        await nc.flush()
        high_water = 0

        async def produce() -> None:
            for i in range(n):
                await nc.publish("steady", b"%d" % i)

        nursery.start_soon(produce)
        got = []
        with trio.fail_after(30):
            while len(got) < n:
                high_water = max(high_water, sub.pending_msgs)
                got.extend(int(m.data) for m in await sub.next_batch(max_msgs=10))
                await trio.lowlevel.checkpoint()  # a deliberately slow consumer
        assert got == list(range(n))
        assert sub.dropped == 0
        # Bounded: at most the limit plus one socket read's worth of messages.
        assert high_water < 50 + 256 * 1024 // 10


async def test_flush_waits_for_the_server(core_server):
    async with connect(core_server.url) as nc:
        sub = await nc.subscribe("f")
        for i in range(100):
            await nc.publish("f", b"%d" % i)
        await nc.flush(timeout=5)
        # The PONG follows everything the server sent before it, so all are here.
        assert sub.pending_msgs == 100


async def test_drain_delivers_buffered_then_closes(core_server):
    async with connect(core_server.url) as nc:
        sub = await nc.subscribe("d")
        await nc.flush()
        for i in range(500):
            await nc.publish("d", b"%d" % i)
        got: list[bytes] = []

        async def consume() -> None:
            async for msg in sub:
                got.append(msg.data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await nc.drain(timeout=10)
        assert got == [b"%d" % i for i in range(500)]
        assert nc.is_closed
        with pytest.raises(ConnectionClosedError):
            await nc.publish("d", b"late")


async def test_drain_timeout_reports_unread_messages(core_server):
    async with connect(core_server.url) as nc:
        sub = await nc.subscribe("unread")
        for i in range(5):
            await nc.publish("unread", b"%d" % i)
        await nc.flush()
        # Nobody reads: drain gives up after its timeout, says how many were left, and closes.
        with pytest.raises(DrainTimeout) as info:
            await nc.drain(timeout=0.3)
        assert info.value.unread == 5
        assert nc.is_closed and sub.is_closed


async def test_drain_survives_a_reconnect(core_server):
    async with connect(core_server.url, reconnect_wait=0.05) as nc:
        sub = await nc.subscribe("dr")
        await nc.publish("dr", b"kept")
        await nc.flush()
        with nc.events() as events:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(nc.drain, 10)
                await trio.testing.wait_all_tasks_blocked()  # drain waits for our reader
                assert nc.status is Status.DRAINING
                await nc.reconnect()
                with trio.fail_after(5):
                    while not isinstance(await events.receive(), Reconnected):
                        pass
                # Still draining: no new subscriptions, and the drained one was not re-sent.
                assert nc.status is Status.DRAINING
                with pytest.raises(NatsError, match="draining"):
                    await nc.subscribe("new")
                assert [m.data async for m in sub] == [b"kept"]
        assert nc.is_closed


async def test_requests_work_while_draining(core_server):
    async with (
        connect(core_server.url) as service_nc,
        connect(core_server.url) as nc,
        trio.open_nursery() as nursery,
    ):
        service = await service_nc.subscribe("svc.d")
        await service_nc.flush()

        async def serve() -> None:
            async for msg in service:
                assert msg.reply is not None
                await service_nc.publish(msg.reply, b"ok")

        nursery.start_soon(serve)
        held = await nc.subscribe("held")  # keeps the drain waiting for our reader
        await nc.publish("held", b"x")
        await nc.flush()
        async with trio.open_nursery() as draining:
            draining.start_soon(nc.drain, 5)
            await trio.testing.wait_all_tasks_blocked()
            assert nc.status is Status.DRAINING
            # The connection's first request makes the shared inbox while draining.
            reply = await nc.request("svc.d", b"?", timeout=5)
            assert reply.data == b"ok"
            assert [m.data async for m in held] == [b"x"]
        assert nc.is_closed
        nursery.cancel_scope.cancel()


async def test_events_after_close_end_at_once(core_server):
    async with connect(core_server.url) as nc:
        pass
    with trio.fail_after(1):
        assert [e async for e in nc.events()] == []


async def test_subscription_drain_only(core_server):
    async with connect(core_server.url) as nc:
        sub = await nc.subscribe("sd")
        other = await nc.subscribe("other")
        await nc.flush()
        await nc.publish("sd", b"1")
        await nc.publish("other", b"x")
        got: list[bytes] = []

        async def consume() -> None:
            async for msg in sub:
                got.append(msg.data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await sub.drain(timeout=5)
        assert got == [b"1"]
        assert sub.is_closed and not other.is_closed
        await nc.publish("sd", b"ignored")
        await nc.publish("other", b"y")
        assert [m.data for m in [await other.next_msg(5), await other.next_msg(5)]] == [
            b"x",
            b"y",
        ]
        with pytest.raises(SubscriptionClosedError):
            await sub.next_msg(timeout=1)


async def test_close_ends_iteration_and_fails_waiters(core_server):
    async with connect(core_server.url) as nc:
        sub = await nc.subscribe("c")
        await nc.flush()
        ended = trio.Event()

        async def consume() -> None:
            async for _ in sub:
                pass
            ended.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await nc.close()
            with trio.fail_after(5):
                await ended.wait()
        assert await sub.wait_closed() is None
        with pytest.raises(ConnectionClosedError):
            await nc.flush()


async def test_body_exception_is_not_wrapped(core_server):
    with pytest.raises(KeyError, match="mine"):
        async with connect(core_server.url):
            raise KeyError("mine")


# -- header blocks that are not well formed (issue 11) ----------------------------------------


@pytest.mark.parametrize(
    ("block", "headers"),
    [
        (b"NATS/1.0\r\n\xff\xfe: x\r\nA: 1\r\n\r\n", {"A": "1"}),  # a non-UTF-8 name
        (b"NATS/1.0\r\nno colon\r\nA: 1\r\nB C: 2\r\n\r\n", {"A": "1"}),
        (b"XATS/1.0\r\nA: 1\r\n\r\n", {"A": "1"}),  # not a NATS/1.0 block
        (b"NATS/1.0 abc\r\nA: 1\r\n\r\n", {"A": "1"}),  # a malformed status
        (b"NATS/1.0\r\nA: 1\r\n", {"A": "1"}),  # no blank line at the end
        (b"X", {}),
    ],
)
async def test_a_malformed_header_block_is_delivered_with_what_can_be_read(
    core_server, block, headers
):
    """A header block with lines that cannot be read made ``msg.headers`` raise; one that is
    not a ``NATS/1.0`` block at all was a protocol error that dropped the connection (and
    lost the message). The message is delivered, its readable lines kept, the rest reported
    once as a :class:`MalformedHeaderWarning`."""
    async with connect(core_server.url) as nc:
        sub = await nc.subscribe("odd.*")
        await nc.flush()
        await raw_hpub(core_server.port, "odd.1", block, b"payload", stored=False)
        await nc.publish("odd.2", b"after")
        msg = await sub.next_msg(timeout=5)
        assert (msg.subject, msg.data) == ("odd.1", b"payload")
        with pytest.warns(MalformedHeaderWarning, match="odd.1") as warned:
            assert msg.headers == Headers(headers)
        assert len(warned) == 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # read once, reported once
            assert msg.headers == Headers(headers)
            assert msg.status is None
        after = await sub.next_msg(timeout=5)
        assert after.data == b"after"
        assert nc.stats.reconnects == 0


# -- interop with nats-py ---------------------------------------------------------------------


async def test_natspy_publishes_headrace_receives(core_server, natspy):
    nc_py = await natspy.connect(core_server.url)
    async with connect(core_server.url) as nc:
        sub = await nc.subscribe("interop.>")
        await nc.flush()

        async def send() -> None:
            await nc_py.publish("interop.a", b"plain")
            await nc_py.publish("interop.b", b"with", headers={"X-One": "1", "X-Two": "2"})
            await nc_py.flush()

        await natspy.call(send)
        a = await sub.next_msg(timeout=5)
        b = await sub.next_msg(timeout=5)
    assert (a.subject, a.data, a.headers) == ("interop.a", b"plain", None)
    assert b.data == b"with"
    assert b.headers is not None and dict(b.headers) == {"X-One": "1", "X-Two": "2"}


async def test_headrace_publishes_natspy_receives(core_server, natspy):
    nc_py = await natspy.connect(core_server.url)

    async def subscribe() -> Any:
        return await nc_py.subscribe("to.py")

    py_sub = await natspy.call(subscribe)
    await natspy.call(nc_py.flush)
    async with connect(core_server.url) as nc:
        await nc.publish("to.py", b"one", headers={"K": "a", "Other": "b c"})
        await nc.publish("to.py", b"two", reply="reply.here")
        await nc.flush()

    async def take(n: int) -> list[Any]:
        return [await py_sub.next_msg(timeout=5) for _ in range(n)]

    received = await natspy.call(take, 2)
    assert received[0].data == b"one"
    assert received[0].headers == {"K": "a", "Other": "b c"}
    assert received[1].data == b"two" and received[1].reply == "reply.here"


async def test_request_to_natspy_responder_and_back(core_server, natspy):
    nc_py = await natspy.connect(core_server.url)

    async def respond() -> Any:
        async def handler(msg: Any) -> None:
            await msg.respond(b"py:" + msg.data)

        return await nc_py.subscribe("py.svc", cb=handler)

    await natspy.call(respond)
    await natspy.call(nc_py.flush)
    async with connect(core_server.url) as nc:
        reply = await nc.request("py.svc", b"ping", timeout=5)
        assert reply.data == b"py:ping"

        service = await nc.subscribe("hr.svc")
        await nc.flush()
        async with trio.open_nursery() as nursery:

            async def serve() -> None:
                msg = await service.next_msg(timeout=5)
                assert msg.reply is not None
                await nc.publish(msg.reply, b"hr:" + msg.data)

            nursery.start_soon(serve)

            async def ask() -> bytes:
                return (await nc_py.request("hr.svc", b"pong", timeout=5)).data

            assert await natspy.call(ask) == b"hr:pong"


async def test_a_request_sent_now_and_awaited_later(core_server):
    """``request_soon`` queues the request at once (no checkpoint); its reply is taken when
    awaited, an answer already in is taken without waiting, and its timeout counts from the
    send. No responders and a timeout are the errors ``request`` raises."""
    async with connect(core_server.url) as nc, trio.open_nursery() as nursery:
        service = await nc.subscribe("svc.soon")
        await nc.subscribe("silent.soon")
        await nc.flush()

        async def serve() -> None:
            async for msg in service:
                await nc.publish(msg.reply, msg.data[::-1])

        nursery.start_soon(serve)
        first = nc.request_soon("svc.soon", b"abc", timeout=5)
        second = nc.request_soon("svc.soon", b"xyz", timeout=5)
        assert (await second.reply()).data == b"zyx"
        assert (await first.reply()).data == b"cba"
        with pytest.raises(NoRespondersError):
            await nc.request_soon("nobody.soon", b"?", timeout=5).reply()
        slow = nc.request_soon("silent.soon", b"?", timeout=0.2)
        with trio.fail_after(5), pytest.raises(RequestTimeout):
            await slow.reply()
        assert nc._mux is not None and nc._mux._pending == {}
        nursery.cancel_scope.cancel()
