"""Consumer reset (nats-server 2.14+): back to the ack floor or to a sequence, on a real
server, with nats-py as the independent peer reading the consumer's state; the refusals
typed; a body refused before it is sent."""

from __future__ import annotations

from typing import Any

import pytest
from headrace.jetstream import (
    ConsumerConfig,
    ConsumerNotFound,
    ConsumerReset,
    DeliverPolicy,
    InvalidConsumerReset,
    JetStream,
    StreamConfig,
)
from headrace.jetstream.reset import reset_body, supports_reset
from headrace.nats import connect

from tests.jetstream.js_pull_support import consumer_state, natspy_publish


def test_servers_from_2_14_have_the_call():
    assert supports_reset("2.14.0") and supports_reset("v2.15.1") and supports_reset("3.0.0")
    assert not supports_reset("2.13.9") and not supports_reset("2.9.0-RC.1")
    assert supports_reset("") and supports_reset("unknown")


def test_a_reset_body_is_a_sequence_of_at_least_one_or_nothing():
    assert reset_body(None) is None
    assert reset_body(7) == {"seq": 7}
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="at least 1"):
            reset_body(bad)  # type: ignore[arg-type]


async def seqs(msgs: list[Any]) -> list[tuple[int, int]]:
    return [(m.metadata.stream_seq, m.metadata.num_delivered) for m in msgs]


async def test_a_reset_replays_from_the_ack_floor_in_order(nats_server, natspy):
    """Ten messages; 1-3 acked, 4-6 delivered and never acked, 8 acked out of order: a reset
    to the ack floor forgets what was pending and delivers 4, 5, ... 10 in order, each as a
    first delivery, at once (no ack wait); 8 again too (the floor is 3)."""
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        await natspy_publish(natspy, 10)
        config = ConsumerConfig(ack_wait=60.0)
        async with js.pull_subscribe(stream="S", durable="C", config=config) as sub:
            first = await sub.fetch(8, expires=5)
            assert [m.metadata.stream_seq for m in first] == list(range(1, 9))
            for m in (*first[:3], first[7]):
                await m.ack_sync()
            state = await consumer_state(natspy)
            assert (state.num_ack_pending, state.ack_floor.stream_seq) == (4, 3)
            reset = await js.reset_consumer("S", "C")
            assert isinstance(reset, ConsumerReset) and reset.reset_seq == 4
            assert reset.info.name == "C" and reset.info.num_ack_pending == 0
            again = await sub.fetch(7, expires=5)  # not after the 60 s ack wait: now
            assert await seqs(again) == [(s, 1) for s in range(4, 11)]
            state = await consumer_state(natspy)
            assert state.num_ack_pending == 7 and state.delivered.stream_seq == 10
            back = await js.reset_consumer("S", "C", seq=2)
            assert back.reset_seq == 2
            assert [m.metadata.stream_seq for m in await sub.fetch(2, expires=5)] == [2, 3]


async def test_a_reset_is_refused_in_types(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        js.timeout = 0.5  # nothing answers for a consumer that is not there: the info says
        with pytest.raises(ConsumerNotFound):
            await js.reset_consumer("S", "NOPE")
        js.timeout = 5.0
        await js.create_consumer(
            "S", ConsumerConfig(durable_name="NEW", deliver_policy=DeliverPolicy.NEW)
        )
        with pytest.raises(InvalidConsumerReset, match="invalid reset") as caught:
            await js.reset_consumer("S", "NEW", seq=1)
        assert caught.value.err_code == 10204
        assert (await js.reset_consumer("S", "NEW")).reset_seq == 1  # its ack floor: allowed


async def test_a_reset_to_the_consumers_start(nats_server, natspy):
    """``to_start`` (issue 24): from where the deliver policy starts."""
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        await natspy_publish(natspy, 10)
        await js.purge_stream("S", seq=3)  # the stream now starts at 3
        await js.create_consumer("S", ConsumerConfig(durable_name="ALL"))
        from_seq = ConsumerConfig(
            durable_name="FROM", deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=6
        )
        await js.create_consumer("S", from_seq)
        await js.create_consumer(
            "S", ConsumerConfig(durable_name="NEW", deliver_policy=DeliverPolicy.NEW)
        )
        for name, start in (("ALL", 3), ("FROM", 6)):
            consumer = await js.pull_consumer("S", name)
            # (Exactly what is there: a fetch returns when its batch is full.)
            for msg in await consumer.fetch(11 - start, expires=5):
                await msg.ack_sync()
            reset = await js.reset_consumer("S", name, to_start=True)
            assert reset.reset_seq == start, name
            again = await consumer.fetch(11 - start, expires=5)
            assert [m.metadata.stream_seq for m in again] == list(range(start, 11)), name
        with pytest.raises(InvalidConsumerReset, match="delivers by new"):
            await js.reset_consumer("S", "NEW", to_start=True)
        with pytest.raises(ValueError, match="not both"):
            await js.reset_consumer("S", "ALL", 4, to_start=True)
