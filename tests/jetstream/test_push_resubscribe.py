"""Re-subscribing to a push durable right after unsubscribing (issue 11).

The server clears a push consumer's ``push_bound`` a moment after it processes the UNSUB, not
with it. A subscribe made in that moment saw the consumer still bound and failed as a
duplicate subscription, about once in thirty. The workflow now checks a "bound" answer again
before believing it, as the consumer lifecycle does before deleting a queue group's durable.
"""

from __future__ import annotations

import pytest
import trio
from headrace.jetstream import (
    AckPolicy,
    ConsumerConfig,
    ConsumerConfigMismatch,
    JetStream,
    StreamConfig,
)
from headrace.nats import connect

from tests.waiting import FAST


async def test_unsubscribe_then_subscribe_again_never_fails(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        config = ConsumerConfig(
            durable_name="D", deliver_subject="deliver.D", ack_policy=AckPolicy.EXPLICIT
        )
        await js.create_consumer("S", config)
        with trio.fail_after(60):
            for _ in range(100):
                async with js.subscribe(stream="S", durable="D") as sub:
                    assert sub.consumer == "D"
        # It still reads, and the existing durable was kept (it was bound, not created).
        async with js.subscribe(stream="S", durable="D") as sub:
            await js.publish("s.x", b"one")
            with trio.fail_after(5):
                msg = await sub.next_msg()
            assert msg.data == b"one"
        info = await js.consumer_info("S", "D")  # raises ConsumerNotFound if it was deleted
        assert info.delivered.stream_seq == 1


async def test_a_second_live_subscription_is_still_a_duplicate(nats_server):
    """Waiting for ``push_bound`` to settle must not let a real duplicate through."""
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        config = ConsumerConfig(
            durable_name="D", deliver_subject="deliver.D", ack_policy=AckPolicy.EXPLICIT
        )
        await js.create_consumer("S", config)
        async with js.subscribe(stream="S", durable="D"):
            await nc.flush()
            with trio.fail_after(5), pytest.raises(ConsumerConfigMismatch, match="duplicate"):
                async with js.subscribe(stream="S", durable="D"):
                    pass
