"""JsMsg acknowledgements (ADR-15 "Ack Handling") against a real nats-server with pull
consumers: what each ack does to the consumer, the rule that only the first terminal ack is
sent, ack policy none, the double ack, and the errors.

What was published on ``$JS.ACK.>`` is watched from a second connection: after the acking
connection's flush and then the observer's, every ack the server received has been delivered
to the observer, so counting is exact without waiting for time to pass. Redelivery timing is
observed through pull requests that expire (the server's own clock), never through sleeps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
from headrace.errors import ConnectionClosedError
from headrace.jetstream import (
    AckPolicy,
    ConsumerConfig,
    InvalidAckReply,
    JetStream,
    JsMsg,
    NotAJetStreamMessage,
    PullConsumer,
    StorageType,
    StreamConfig,
)
from headrace.nats import Connection, Subscription, connect
from headrace.protocol import Msg


async def _consumer(
    js: JetStream,
    *,
    messages: int = 1,
    ack_policy: AckPolicy = AckPolicy.EXPLICIT,
    ack_wait: float | None = None,
    name: str = "c",
) -> PullConsumer:
    await js.add_stream(StreamConfig(name="S", subjects=["s.>"], storage=StorageType.MEMORY))
    for i in range(messages):
        await js.publish(f"s.{i}", b"m%d" % i)
    await js.create_consumer(
        "S", ConsumerConfig(durable_name=name, ack_policy=ack_policy, ack_wait=ack_wait)
    )
    return await js.pull_consumer("S", name)


class AckWatch:
    """A second connection subscribed to ``$JS.ACK.>``."""

    def __init__(self, nc: Connection, observer: Connection, sub: Subscription) -> None:
        self.nc = nc
        self.observer = observer
        self.sub = sub

    async def seen(self) -> list[Msg]:
        """Every ack published so far (and not returned before)."""
        await self.nc.flush(timeout=5)
        await self.observer.flush(timeout=5)
        return await self.sub.next_batch() if self.sub.pending_msgs else []


@asynccontextmanager
async def ack_watch(url: str, nc: Connection) -> AsyncIterator[AckWatch]:
    async with connect(url) as observer:
        sub = await observer.subscribe("$JS.ACK.>")
        await observer.flush()
        yield AckWatch(nc, observer, sub)


async def _fetch(consumer: PullConsumer, n: int = 1, expires: float = 5) -> list[JsMsg]:
    with trio.fail_after(expires + 5):
        return await consumer.fetch(n, expires=expires)


async def test_ack_removes_from_ack_pending(nats_server, natspy):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        consumer = await _consumer(js, messages=3)
        batch = await _fetch(consumer, 3)
        assert [m.data for m in batch] == [b"m0", b"m1", b"m2"]
        info = await consumer.info()
        assert (info.num_ack_pending, info.num_pending) == (3, 0)

        await batch[0].ack()
        # Acks are processed in order: once the sync ack of message 3 is confirmed, the plain
        # ack of message 1 has been recorded too.
        await batch[2].ack_sync()
        assert [m.is_acked for m in batch] == [True, False, True]
        info = await consumer.info()
        assert info.num_ack_pending == 1
        assert info.ack_floor.stream_seq == 1
        assert info.delivered.stream_seq == 3

        await natspy.connect(nats_server.url)
        py_info = await natspy.call(natspy.nc.jetstream().consumer_info, "S", "c")
        assert py_info.num_ack_pending == 1
        assert py_info.ack_floor.stream_seq == 1

        await batch[1].ack_sync()
        info = await consumer.info()
        assert (info.num_ack_pending, info.ack_floor.stream_seq) == (0, 3)
        assert await consumer.fetch(1, no_wait=True) == []


async def test_nak_redelivers(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        consumer = await _consumer(js, messages=1)
        [msg] = await _fetch(consumer)
        assert msg.metadata.num_delivered == 1
        await msg.nak()
        assert msg.is_acked  # a NAK is terminal for this delivery
        [again] = await _fetch(consumer)
        assert again.data == b"m0"
        assert again.metadata.stream_seq == msg.metadata.stream_seq
        assert again.metadata.num_delivered == 2
        assert again.metadata.consumer_seq == 2
        info = await consumer.info()
        assert (info.num_ack_pending, info.num_redelivered) == (1, 1)
        await again.ack_sync()
        assert (await consumer.info()).num_ack_pending == 0


async def test_nak_with_delay(nats_server):
    delay = 0.5
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        consumer = await _consumer(js, messages=1)
        [msg] = await _fetch(consumer)
        await msg.nak(delay=delay)
        naked_at = trio.current_time()
        # Not redelivered at once...
        assert await consumer.fetch(1, no_wait=True) == []
        # ...but by a request that waits past the delay.
        [again] = await _fetch(consumer, expires=delay + 3)
        waited = trio.current_time() - naked_at
        assert waited >= delay * 0.9
        assert waited < delay + 2.5
        assert (again.metadata.stream_seq, again.metadata.num_delivered) == (1, 2)


@pytest.mark.slow
async def test_term_never_redelivers(nats_server):
    """Two unacked messages, ack wait 0.5 s: the terminated one is never redelivered, the other
    one is, so the second fetch proves the ack wait did pass."""
    async with connect(nats_server.url) as nc, ack_watch(nats_server.url, nc) as watch:
        js = JetStream(nc)
        consumer = await _consumer(js, messages=2, ack_wait=0.5)
        first, second = await _fetch(consumer, 2)
        await first.term("poison")
        assert first.is_acked and not second.is_acked
        # Over 1.2 s (two ack waits) the unacked message comes back, the terminated one never.
        redelivered = await _fetch(consumer, 3, expires=1.2)
        assert redelivered
        assert {m.metadata.stream_seq for m in redelivered} == {2}
        assert redelivered[0].metadata.num_delivered == 2
        seen = await watch.seen()
        assert [m.data for m in seen] == [b"+TERM poison"]
        assert seen[0].subject == first.reply
        await redelivered[-1].ack_sync()
        info = await consumer.info()
        assert (info.num_ack_pending, info.ack_floor.stream_seq) == (0, 2)


@pytest.mark.slow
async def test_in_progress_extends_ack_wait(nats_server):
    """Ack wait 1 s; +WPI at about 0.5 s and 1 s keeps the message from being redelivered at
    1 s and 1.5 s (a pull request waits through both), then it is redelivered about 1 s after
    the last +WPI. The waiting pull requests are the clock: no sleeping."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        consumer = await _consumer(js, messages=1, ack_wait=1.0)
        [msg] = await _fetch(consumer)
        assert await _fetch(consumer, expires=0.5) == []
        await msg.in_progress()
        assert await _fetch(consumer, expires=0.5) == []
        await msg.in_progress()
        last_wpi = trio.current_time()
        assert not msg.is_acked  # +WPI is not terminal
        # Past the original deadline (1 s) and the first +WPI's (1.5 s): nothing.
        assert await _fetch(consumer, expires=0.7) == []
        [again] = await _fetch(consumer, expires=3)
        assert trio.current_time() - last_wpi >= 0.9
        assert (again.metadata.stream_seq, again.metadata.num_delivered) == (1, 2)
        # The original delivery can still be acked after +WPI.
        await again.ack_sync()
        assert (await consumer.info()).num_ack_pending == 0


async def test_in_progress_then_ack(nats_server):
    async with connect(nats_server.url) as nc, ack_watch(nats_server.url, nc) as watch:
        js = JetStream(nc)
        consumer = await _consumer(js, messages=1)
        [msg] = await _fetch(consumer)
        await msg.in_progress()
        await msg.in_progress()
        assert not msg.is_acked
        await msg.ack()
        assert [m.data for m in await watch.seen()] == [b"+WPI", b"+WPI", b"+ACK"]


async def test_ack_payloads_on_the_wire(nats_server):
    async with connect(nats_server.url) as nc, ack_watch(nats_server.url, nc) as watch:
        js = JetStream(nc)
        consumer = await _consumer(js, messages=5)
        batch = await _fetch(consumer, 5)
        assert batch[0].ack_nowait() is True
        await batch[1].nak()
        await batch[2].nak(delay=0.25)
        await batch[3].term()
        await batch[4].in_progress()
        seen = await watch.seen()
        assert [(m.subject, m.data) for m in seen] == [
            (batch[0].reply, b"+ACK"),
            (batch[1].reply, b"-NAK"),
            (batch[2].reply, b'-NAK {"delay": 250000000}'),
            (batch[3].reply, b"+TERM"),
            (batch[4].reply, b"+WPI"),
        ]
        assert all(m.reply is None for m in seen)  # plain acks expect no answer
        with pytest.raises(ValueError, match="negative"):
            await batch[4].nak(delay=-1)
        assert await watch.seen() == []


@pytest.mark.parametrize("terminal", ["ack", "nak", "term", "ack_nowait", "ack_sync"])
async def test_acks_after_a_terminal_one_are_ignored(nats_server, terminal):
    async with connect(nats_server.url) as nc, ack_watch(nats_server.url, nc) as watch:
        js = JetStream(nc)
        consumer = await _consumer(js, messages=1)
        [msg] = await _fetch(consumer)
        first = getattr(msg, terminal)()
        if first is not True:
            await first
        assert msg.is_acked
        expected = {
            "ack": b"+ACK",
            "nak": b"-NAK",
            "term": b"+TERM",
            "ack_nowait": b"+ACK",
            "ack_sync": b"+ACK",
        }[terminal]
        assert [m.data for m in await watch.seen()] == [expected]

        await msg.ack()
        await msg.nak()
        await msg.nak(delay=1)
        await msg.term("again")
        await msg.in_progress()
        assert msg.ack_nowait() is False
        with trio.fail_after(1):
            await msg.ack_sync()  # returns at once, without a request
        assert await watch.seen() == []
        assert msg.is_acked


async def test_ack_policy_none_publishes_nothing(nats_server):
    async with connect(nats_server.url) as nc, ack_watch(nats_server.url, nc) as watch:
        js = JetStream(nc)
        consumer = await _consumer(js, messages=2, ack_policy=AckPolicy.NONE)
        assert consumer.ack_none
        batch = await _fetch(consumer, 2)
        assert [m.metadata.stream_seq for m in batch] == [1, 2]  # metadata still works
        for msg in batch:
            assert msg.ack_nowait() is False
            await msg.ack()
            await msg.nak()
            await msg.term()
            await msg.in_progress()
            with trio.fail_after(1):
                await msg.ack_sync()
            assert not msg.is_acked
        assert await watch.seen() == []
        info = await consumer.info()
        assert (info.num_ack_pending, info.ack_floor.stream_seq) == (0, 2)


async def test_ack_sync_waits_for_confirmation(nats_server, natspy):
    async with connect(nats_server.url) as nc, ack_watch(nats_server.url, nc) as watch:
        js = JetStream(nc)
        consumer = await _consumer(js, messages=1)
        [msg] = await _fetch(consumer)
        with trio.fail_after(5):
            await msg.ack_sync(timeout=5)
        assert msg.is_acked
        # Confirmed means recorded: the very next info call shows it, here and in nats-py.
        info = await consumer.info()
        assert (info.num_ack_pending, info.ack_floor.stream_seq) == (0, 1)
        await natspy.connect(nats_server.url)
        py_info = await natspy.call(natspy.nc.jetstream().consumer_info, "S", "c")
        assert (py_info.num_ack_pending, py_info.ack_floor.stream_seq) == (0, 1)
        # On the wire it is a request: +ACK with a reply subject for the confirmation.
        [seen] = await watch.seen()
        assert (seen.subject, seen.data) == (msg.reply, b"+ACK")
        assert seen.reply is not None


async def test_message_without_reply(core_server):
    async with connect(core_server.url) as nc:
        sub = await nc.subscribe("plain")
        await nc.flush()
        await nc.publish("plain", b"core")
        core = await sub.next_msg(timeout=5)
        assert core.reply is None
        msg = JsMsg(core, nc)
        assert (msg.subject, msg.data, msg.reply) == ("plain", b"core", None)
        with pytest.raises(NotAJetStreamMessage):
            msg.metadata  # noqa: B018
        with pytest.raises(NotAJetStreamMessage):
            await msg.ack()
        with pytest.raises(NotAJetStreamMessage):
            await msg.nak()
        with pytest.raises(NotAJetStreamMessage):
            await msg.term()
        with pytest.raises(NotAJetStreamMessage):
            await msg.in_progress()
        with pytest.raises(NotAJetStreamMessage):
            msg.ack_nowait()
        with pytest.raises(NotAJetStreamMessage):
            await msg.ack_sync()
        assert not msg.is_acked

        # A reply that is not a $JS.ACK subject has no metadata.
        other = JsMsg(Msg("plain", 1, "_INBOX.abc", b""), nc)
        with pytest.raises(InvalidAckReply):
            other.metadata  # noqa: B018


async def test_ack_after_close(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        consumer = await _consumer(js, messages=1)
        [msg] = await _fetch(consumer)
    assert nc.is_closed
    with pytest.raises(ConnectionClosedError):
        await msg.ack()
    with pytest.raises(ConnectionClosedError):
        msg.ack_nowait()
    with pytest.raises(ConnectionClosedError):
        await msg.nak()
    with pytest.raises(ConnectionClosedError):
        await msg.term()
    with pytest.raises(ConnectionClosedError):
        await msg.in_progress()
    with pytest.raises(ConnectionClosedError):
        await msg.ack_sync(timeout=2)
    assert not msg.is_acked  # nothing was sent, so it may be acked again elsewhere
    async with connect(nats_server.url) as nc2:
        info = await JetStream(nc2).consumer_info("S", "c")
        assert info.num_ack_pending == 1
