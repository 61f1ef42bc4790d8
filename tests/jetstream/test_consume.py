"""``consume()`` against a real nats-server (ADR-37 "Consume specification").

Where a test waits for a buffer state, the consume is watched from outside
(``probed_consume``: the server's copies of what it sends the consume's inbox, the buffer's
counts after every task step), so it waits for an event, not a time. nats-py publishes and
reads consumer state as the independent peer.
"""

from __future__ import annotations

import pytest
import trio
from headrace.errors import SubscriptionClosedError
from headrace.jetstream import ConsumerDeleted, HeartbeatsMissed, JetStream, PullWarning
from headrace.nats import connect

from tests.jetstream.js_pull_support import (
    consumer_state,
    natspy_publish,
    poll_consumer,
    probed_consume,
    publish_n,
    seq_of,
    setup_pull,
)
from tests.waiting import FAST, EventLog

HEARTBEAT = (100, "Idle Heartbeat")

#: The memory bound tests run twice: as a user would (the heartbeat alarm on, which the bug
#: above breaks), and with the alarm out of the way (heartbeat_alarm_factor 10^6), so the
#: request arithmetic and backpressure are checked on their own today.
ALARM = pytest.mark.parametrize(
    "alarm",
    [
        {},
        pytest.param({"heartbeat_alarm_factor": 1e6}),
    ],
    ids=["alarm-on", "alarm-off"],
)


async def test_consume_receives_everything_in_order_and_acks(nats_server, natspy):
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        consumer = await setup_pull(JetStream(nc))
        await natspy_publish(natspy, 300)
        seqs: list[int] = []
        data: list[bytes] = []
        with trio.fail_after(10):
            async with consumer.consume(max_messages=50) as messages:
                async for msg in messages:
                    seqs.append(seq_of(msg))
                    data.append(msg.data)
                    if len(seqs) == 300:
                        await msg.ack_sync(timeout=5)  # confirms every earlier ack as well
                        break
                    await msg.ack()
                assert messages.requests_sent >= 300 // 50
        assert seqs == list(range(1, 301))
        assert data == [b"%d" % i for i in range(300)]
        info = await consumer_state(natspy)
        assert info.ack_floor.stream_seq == 300
        assert info.num_ack_pending == 0
        assert info.num_pending == 0
        assert info.num_redelivered == 0


async def test_consume_with_max_messages_1_does_not_get_stuck(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        await publish_n(js, 20)
        seqs: list[int] = []
        with trio.fail_after(5):
            async with consumer.consume(max_messages=1, expires=2) as messages:
                async for msg in messages:
                    seqs.append(seq_of(msg))
                    await msg.ack()
                    if len(seqs) == 20:
                        await publish_n(js, 5, start=20)  # arrives on the waiting request
                    if len(seqs) == 25:
                        break
                assert messages.requests_sent >= 25
        assert seqs == list(range(1, 26))


async def test_consume_bytes_mode_receives_everything(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        await publish_n(js, 40, payload=b"." * 200)  # about 250 bytes each, as the server counts
        seqs: list[int] = []
        with trio.fail_after(10):
            async with consumer.consume(max_bytes=1000, expires=2) as messages:
                async for msg in messages:
                    seqs.append(seq_of(msg))
                    await msg.ack()
                    if len(seqs) == 40:
                        break
                assert messages.requests_sent >= 10  # at most 4 messages fit in one request
        assert seqs == list(range(1, 41))


async def test_drain_delivers_what_was_sent_then_ends(nats_server, natspy):
    """drain(): no request after it, the buffered messages are still delivered, then the
    iteration ends. All 30 messages fill one request: none is in flight at the drain."""
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        await publish_n(js, 30)
        seqs: list[int] = []
        with trio.fail_after(10):
            async with probed_consume(consumer, max_messages=30, expires=2) as (messages, probe):
                await probe.wait_until(lambda: messages.buffered == 30)
                for msg in await messages.next_batch(5):
                    seqs.append(seq_of(msg))
                    await msg.ack()
                sent = messages.requests_sent
                await messages.drain(timeout=5)
                rest = [msg async for msg in messages]  # ends by itself after the buffered 25
                seqs += [seq_of(msg) for msg in rest]
                for msg in rest[:-1]:
                    await msg.ack()
                await rest[-1].ack_sync(timeout=5)  # confirms the earlier acks too
                assert messages.requests_sent == sent
                with pytest.raises(SubscriptionClosedError):
                    await messages.next_batch()
        assert seqs == list(range(1, 31))
        info = await consumer_state(natspy)
        assert info.delivered.stream_seq == 30
        assert info.ack_floor.stream_seq == 30 and info.num_ack_pending == 0


async def test_consumer_deleted_mid_consume_ends_after_buffered_messages(nats_server, natspy):
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        await publish_n(js, 5)
        seqs: list[int] = []
        with trio.fail_after(10):
            async with probed_consume(consumer, max_messages=10, expires=5) as (messages, probe):
                # 5 of the 10 requested arrived; the request waits on the server for the rest.
                await probe.wait_until(lambda: messages.buffered == 5)

                async def delete() -> None:
                    await natspy.nc.jetstream().delete_consumer("S", "C")

                await natspy.call(delete)
                deleted = (409, "Consumer Deleted")
                await probe.wait_until(lambda: deleted in probe.statuses)
                sent = messages.requests_sent
                with pytest.raises(ConsumerDeleted) as caught:
                    async for msg in messages:
                        seqs.append(seq_of(msg))
                assert caught.value.status == 409
                # The terminal status triggered no new request, taking messages neither.
                assert messages.requests_sent == sent
                with pytest.raises(ConsumerDeleted):
                    await messages.next_batch()
        assert seqs == [1, 2, 3, 4, 5]


# -- memory bounds and request pacing (an empty stream at the start, then messages) -----------


@pytest.mark.slow
@ALARM
async def test_slow_reader_stops_requests_and_resumes(nats_server, natspy, alarm):
    """Backpressure: with a reader that stops, the buffer holds at most max_messages, no more
    requests go out, and the rest stays on the server (num_pending), undelivered."""
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        seqs: list[int] = []
        opts = {"max_messages": 20, "expires": 1, "idle_heartbeat": 0.25, **alarm}
        with trio.fail_after(15):
            async with (
                probed_consume(consumer, **opts) as (messages, probe),
                trio.open_nursery() as nursery,
            ):
                log = EventLog(messages.events())
                nursery.start_soon(log.run)
                await probe.wait_until(lambda: HEARTBEAT in probe.statuses)
                await natspy_publish(natspy, 500)
                await probe.wait_until(lambda: messages.buffered >= 20)
                assert messages.buffered == 20
                for msg in await messages.next_batch(5):
                    seqs.append(seq_of(msg))
                    await msg.ack()
                # 15 pending is above the threshold (10): the reader is slow, nothing is asked.
                sent = messages.requests_sent
                # Observe for longer than the heartbeat alarm (0.5 s): the control loop wakes
                # every 0.25 s and finds nothing to ask for.
                await trio.sleep(0.7)
                assert messages.requests_sent == sent == 1
                assert messages.buffered == 15 and messages.pending_msgs == 15
                assert log.of(HeartbeatsMissed) == [] and log.of(PullWarning) == []
                info = await consumer_state(natspy)
                assert info.delivered.stream_seq == 20
                assert info.num_pending == 480  # still on the server, not delivered
                assert info.num_waiting == 0  # no request parked there either
                # The reader continues: everything arrives, never more than 20 held.
                async for msg in messages:
                    seqs.append(seq_of(msg))
                    # At most max_messages in the buffer. Not fewer than 20 while one is in
                    # hand: a take that sends a request yields, so the refill may be in.
                    assert messages.buffered <= 20
                    if len(seqs) == 500:
                        # Not acked before: an acked message's ack_sync returns at once.
                        await msg.ack_sync(timeout=5)  # confirms every earlier ack as well
                        break
                    await msg.ack()
                assert probe.max_buffered <= 20
                assert probe.max_pending_msgs <= 20
                nursery.cancel_scope.cancel()
        assert seqs == list(range(1, 501))
        info = await consumer_state(natspy)
        assert info.ack_floor.stream_seq == 500 and info.num_pending == 0


@ALARM
async def test_consume_bytes_mode_bounds_pending_bytes(nats_server, natspy, alarm):
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        budget = 1000
        seqs: list[int] = []
        opts = {"max_bytes": budget, "expires": 1, "idle_heartbeat": 0.25, **alarm}
        with trio.fail_after(10):
            async with probed_consume(consumer, **opts) as (messages, probe):
                await probe.wait_until(lambda: HEARTBEAT in probe.statuses)
                # About 250 bytes each as the server counts them: 4 fit in the budget.
                await publish_n(js, 40, payload=b"." * 200)
                # Not reading: the first request fills the byte budget and the server ends it.
                size_status = (409, "Message Size Exceeds MaxBytes")
                await probe.wait_until(lambda: size_status in probe.statuses, timeout=0.5)
                assert messages.buffered == 4
                assert 0 < messages._buffered_bytes <= budget
                assert messages.pending_bytes <= budget
                info = await consumer_state(natspy)
                assert info.delivered.stream_seq == 4 and info.num_waiting == 0
                async for msg in messages:
                    seqs.append(seq_of(msg))
                    await msg.ack()
                    if len(seqs) == 40:
                        break
                assert probe.max_pending_bytes <= budget
                assert probe.max_buffered_bytes <= budget
                assert probe.max_buffered <= 4
        assert seqs == list(range(1, 41))


async def test_drain_reads_exactly_what_one_request_brought(nats_server, natspy):
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        opts = {"max_messages": 30, "expires": 1, "idle_heartbeat": 0.25}
        with trio.fail_after(10):
            async with probed_consume(consumer, **opts) as (messages, probe):
                await probe.wait_until(lambda: HEARTBEAT in probe.statuses)
                await publish_n(js, 100)
                await probe.wait_until(lambda: messages.buffered >= 30)
                await messages.drain(timeout=5)
                seqs = [seq_of(msg) async for msg in messages]
        assert seqs == list(range(1, 31))
        info = await consumer_state(natspy)
        assert info.delivered.stream_seq == 30 and info.num_pending == 70


@pytest.mark.slow
async def test_idle_consume_renews_expired_requests_silently(nats_server):
    """Requests expire (408) and heartbeats arrive (100) on an idle consumer: neither reaches
    the user nor raises an event; a fresh request is in place when messages come. (Heartbeats
    every 0.5 s, alarm at 1 s: a loaded machine's stall must not look like missed ones.)"""
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        with trio.fail_after(15):
            opts = {"max_messages": 10, "expires": 2, "idle_heartbeat": 0.5}
            async with (
                probed_consume(consumer, **opts) as (messages, probe),
                trio.open_nursery() as nursery,
            ):
                log = EventLog(messages.events())
                nursery.start_soon(log.run)
                await probe.wait_until(lambda: (408, "Request Timeout") in probe.statuses)
                await probe.wait_until(lambda: messages.requests_sent >= 2)
                assert messages.buffered == 0
                assert HEARTBEAT in probe.statuses
                await publish_n(js, 3)
                got: list[int] = []
                while len(got) < 3:
                    got += [seq_of(m) for m in await messages.next_batch()]
                assert got == [1, 2, 3]
                assert log.events == []
                assert messages.requests_sent == 2  # the first, and one after its 408
                nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_consume_waits_out_a_full_max_waiting_without_a_tight_loop(nats_server, natspy):
    """max_waiting=1 and another client holds the only waiting slot. nats-server 2.15 drops a
    pull request with idle_heartbeat silently then (no 409 Exceeded MaxWaiting; that status is
    covered with the fake server), so the consume learns of it by missing heartbeats: one
    alarm and one new request per 2 x idle_heartbeat, and messages once the slot is free."""
    await natspy.connect(nats_server.url)
    async with (
        connect(nats_server.url, **FAST) as nc,
        connect(nats_server.url, **FAST) as holder,
    ):
        js = JetStream(nc)
        consumer = await setup_pull(js, max_waiting=1)
        inbox = holder.new_inbox()
        held = await holder.subscribe(inbox)
        await holder.publish(
            # 2 s: the consume's first request must reach the server while the slot is held.
            "$JS.API.CONSUMER.MSG.NEXT.S.C",
            b'{"batch":1,"expires":2000000000}',
            reply=inbox,
        )
        await poll_consumer(natspy, lambda i: i.num_waiting == 1)
        opts = {"max_messages": 5, "expires": 1, "idle_heartbeat": 0.2}
        with trio.fail_after(10):
            async with consumer.consume(**opts) as messages, trio.open_nursery() as nursery:
                log = EventLog(messages.events())
                nursery.start_soon(log.run)
                start = trio.current_time()
                # The holder's request expires; its 408 frees the slot.
                expired = await held.next_msg(timeout=5)
                assert expired.status == 408
                await publish_n(js, 3)
                got: list[int] = []
                while len(got) < 3:
                    got += [seq_of(m) for m in await messages.next_batch()]
                elapsed = trio.current_time() - start
                assert got == [1, 2, 3]
                missed = log.of(HeartbeatsMissed)
                assert 1 <= len(missed) <= elapsed / 0.4 + 1, f"{len(missed)} alarms"
                assert all(0.4 <= m.silence < 1 for m in missed)
                assert messages.requests_sent <= len(missed) + 2
                for warning in log.of(PullWarning):
                    assert (warning.status, warning.description) == (409, "Exceeded MaxWaiting")
                nursery.cancel_scope.cancel()
