"""Pull consumer ``fetch`` and ``next`` against a real nats-server (ADR-37, ADR-13).

nats-py is the independent peer that inspects consumer state. Status sequences a real server
will not produce on demand are in ``test_pull_statuses.py``.
"""

from __future__ import annotations

import pytest
import trio
from headrace.errors import NoRespondersError
from headrace.jetstream import (
    ConsumerConfig,
    ConsumerConfigMismatch,
    ConsumerDeleted,
    ConsumerInfo,
    ConsumerIsPushBased,
    ConsumerNotFound,
    JetStream,
    JsMsg,
    PullConsumer,
)
from headrace.jetstream.consume import ConsumeOptions
from headrace.jetstream.pull_consumer import CLIENT_MARGIN
from headrace.nats import connect

from tests.jetstream.js_pull_support import (
    consumer_state,
    poll_consumer,
    publish_n,
    seq_of,
    setup_pull,
)
from tests.waiting import FAST


def assert_user_msgs(batch: list[JsMsg]) -> None:
    """Only JetStream messages: no status (404, 408, 100 ...) ever reaches the user."""
    for msg in batch:
        assert isinstance(msg, JsMsg)
        assert msg.reply is not None and msg.reply.startswith("$JS.ACK."), msg
        assert msg.msg.status is None, msg


def wire_size(msg: JsMsg) -> int:
    """ADR-37 message size, computed in bytes as the server does (consumer.go)."""
    raw = msg.msg.raw_headers
    return (
        len(msg.subject.encode())
        + len((msg.reply or "").encode())
        + (len(raw) if raw is not None else 0)
        + len(msg.data)
    )


async def test_fetch_returns_exactly_the_batch_when_available(nats_server, natspy):
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        await publish_n(js, 10)
        start = trio.current_time()
        first = await consumer.fetch(4, expires=5)
        second = await consumer.fetch(4, expires=5)
        # A full batch ends the request at once, long before it expires.
        assert trio.current_time() - start < 3  # expires is 5 s
        assert [seq_of(m) for m in first] == [1, 2, 3, 4]
        assert [seq_of(m) for m in second] == [5, 6, 7, 8]
        assert [m.data for m in first] == [b"0", b"1", b"2", b"3"]
        assert_user_msgs(first + second)
        for msg in first[:-1]:
            await msg.ack()
        await first[-1].ack_sync(timeout=5)  # confirmed: every earlier ack was recorded too
        info = await consumer_state(natspy)
        assert info.ack_floor.stream_seq == 4
        assert info.num_ack_pending == 4  # the second batch, delivered and not acked
        assert info.num_pending == 2
        assert info.num_waiting == 0  # no request left behind on the server


async def test_fetch_returns_fewer_when_the_request_expires(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        await publish_n(js, 3)
        start = trio.current_time()
        batch = await consumer.fetch(10, expires=0.5)
        elapsed = trio.current_time() - start
        assert [seq_of(m) for m in batch] == [1, 2, 3]
        assert_user_msgs(batch)
        # Ended by the server's 408 after ``expires``, not by the client-side limit.
        assert 0.45 <= elapsed < 0.5 + CLIENT_MARGIN * 0.7, elapsed


async def test_fetch_no_wait(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        start = trio.current_time()
        assert await consumer.fetch(5, no_wait=True) == []  # the 404 is not surfaced
        assert trio.current_time() - start < 2  # no wait for an expiry
        await publish_n(js, 3)
        start = trio.current_time()
        batch = await consumer.fetch(5, no_wait=True)
        assert trio.current_time() - start < 2  # no wait for an expiry
        assert [seq_of(m) for m in batch] == [1, 2, 3]
        assert_user_msgs(batch)


async def _exact_byte_budget(nats_server, subject: str) -> None:
    """Three identical consumers see identical messages (their names have the same length, so
    the ack reply subjects do too). The sizes the client computes on C1 must be the server's:
    a budget of exactly three messages gets three on C2, one byte less gets two on C3."""
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        ref = await setup_pull(js, subjects=(subject.split(".")[0] + ".>",), consumer="C1")
        budget2 = await setup_pull(js, consumer="C2")
        budget3 = await setup_pull(js, consumer="C3")
        for i in range(6):
            await js.publish(subject, b"%d" % i + b"." * 100, headers={"Trace": f"t-{i}"})
        sizes = [m.size for m in await ref.fetch(6, expires=2)]
        assert len(sizes) == 6
        budget = sum(sizes[:3])
        start = trio.current_time()
        got = await budget2.fetch(max_bytes=budget, expires=5)
        # The server ends the request (409 Message Size Exceeds MaxBytes) at once.
        assert trio.current_time() - start < 3  # expires is 5 s
        assert [seq_of(m) for m in got] == [1, 2, 3]
        assert [m.size for m in got] == sizes[:3]
        assert_user_msgs(got)
        fewer = await budget3.fetch(max_bytes=budget - 1, expires=5)
        assert [seq_of(m) for m in fewer] == [1, 2]


async def test_fetch_max_bytes_stops_at_the_byte_budget(nats_server):
    await _exact_byte_budget(nats_server, "s.bytes")


async def test_message_size_is_subject_reply_headers_payload(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        await js.publish("s.sized", b"p" * 37, headers={"A": "1", "Bb": "two"})
        await js.publish("s.plain", b"q" * 5)
        with_headers, plain = await consumer.fetch(2, expires=2)
        assert with_headers.msg.raw_headers is not None
        for msg in (with_headers, plain):
            assert msg.size == wire_size(msg)
        assert plain.size == len("s.plain") + len(plain.reply or "") + 5


async def test_message_size_counts_utf8_bytes_like_the_server(nats_server):
    await _exact_byte_budget(nats_server, "s.gr\u00fc\u00dfe.z\u00fcrich")


async def test_fetch_kept_alive_by_idle_heartbeats(nats_server):
    """With idle_heartbeat 0.25 s a fetch gives up after 0.5 s of silence; the server's
    heartbeats keep it waiting, so a message published after 0.7 s still arrives."""
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        got: list[JsMsg] = []
        start = trio.current_time()
        async with trio.open_nursery() as nursery:

            async def fetch() -> None:
                got.extend(await consumer.fetch(1, expires=3, idle_heartbeat=0.25))

            nursery.start_soon(fetch)
            await trio.sleep(0.7)  # idle: heartbeats only, longer than the 0.5 s alarm
            await publish_n(js, 1)
        elapsed = trio.current_time() - start
        assert [seq_of(m) for m in got] == [1]
        assert 0.7 <= elapsed < 2.5


async def test_fetch_from_a_consumer_deleted_while_waiting_raises_consumer_deleted(
    nats_server, natspy
):
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        outcome: list[BaseException] = []
        async with trio.open_nursery() as nursery:

            async def fetch() -> None:
                try:
                    await consumer.fetch(10, expires=10)
                except ConsumerDeleted as exc:
                    outcome.append(exc)

            nursery.start_soon(fetch)
            await poll_consumer(natspy, lambda i: i.num_waiting == 1)
            start = trio.current_time()
            await js.delete_consumer("S", "C")
        assert trio.current_time() - start < 3  # the 409 ended it, not the expiry
        assert len(outcome) == 1
        error = outcome[0]
        assert error.status == 409 and error.description == "Consumer Deleted"
        assert "deleted" in str(error)


async def test_fetch_from_a_missing_consumer(nats_server):
    """A handle on a consumer that is gone: nothing serves its MSG.NEXT subject and the server
    answers 503. fetch then asks for the consumer and raises ConsumerNotFound, with the
    no-responders error naming the pull subject as its cause."""
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        await js.delete_consumer("S", "C")
        with pytest.raises(ConsumerNotFound):
            await js.pull_consumer("S", "C")
        start = trio.current_time()
        with pytest.raises(ConsumerNotFound) as caught:
            await consumer.fetch(5, expires=5)
        assert trio.current_time() - start < 3  # expires is 5 s
        cause = caught.value.__cause__
        assert isinstance(cause, NoRespondersError)
        assert cause.subject == "$JS.API.CONSUMER.MSG.NEXT.S.C"
        with pytest.raises(ConsumerNotFound):
            await consumer.next(expires=5)


async def test_pull_handle_on_a_push_consumer_is_refused(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await setup_pull(js, consumer="PULL")
        await js.create_consumer("S", ConsumerConfig(durable_name="P", deliver_subject="dlv.p"))
        with pytest.raises(ConsumerConfigMismatch, match="push based"):
            await js.pull_consumer("S", "P")
        # A stale handle that believes it is a pull consumer: the server's 409 is typed.
        stale = ConsumerInfo(stream_name="S", name="P", config=ConsumerConfig(durable_name="P"))
        handle = PullConsumer(js, "S", "P", stale)
        start = trio.current_time()
        with pytest.raises(ConsumerIsPushBased) as caught:
            await handle.fetch(1, expires=5)
        assert trio.current_time() - start < 3  # expires is 5 s
        assert caught.value.status == 409


async def test_next_returns_one_message_or_none(nats_server, natspy):
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        await publish_n(js, 2)
        first = await consumer.next(expires=2)
        assert first is not None and seq_of(first) == 1
        await first.ack_sync(timeout=5)
        # Exactly one message was taken from the server per call.
        info = await consumer_state(natspy)
        assert info.delivered.stream_seq == 1 and info.num_pending == 1
        second = await consumer.next(expires=2)
        assert second is not None and seq_of(second) == 2
        start = trio.current_time()
        assert await consumer.next(expires=0.5) is None  # the 408 is not surfaced
        assert 0.45 <= trio.current_time() - start < 0.5 + CLIENT_MARGIN * 0.7


async def test_fetch_rejects_both_limits(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        consumer = await setup_pull(JetStream(nc))
        with pytest.raises(ValueError, match="not both"):
            await consumer.fetch(5, max_bytes=100)


async def test_consume_stop_after(nats_server, natspy):
    """``stop_after`` (nats.go's StopAfter, issue 24): iteration ends after that many
    messages, and the server was never asked for more."""
    from tests.natspy_peer import consumer_info

    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        for i in range(50):
            await js.publish("s.x", b"%d" % i)
        got = []
        with trio.fail_after(10):
            async with consumer.consume(stop_after=20, max_messages=8) as messages:
                async for msg in messages:
                    await msg.ack()
                    got.append(int(msg.data))
        assert got == list(range(20))
        await natspy.connect(nats_server.url)
        info = await consumer_info(natspy)
        assert info.delivered.stream_seq == 20 and info.num_pending == 30
        with pytest.raises(ValueError, match="stop_after counts messages"):
            ConsumeOptions(stop_after=5, max_bytes=1000)
