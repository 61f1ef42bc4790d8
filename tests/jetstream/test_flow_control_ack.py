"""The ``flow_control`` ack policy (nats-server 2.14+): a durable push consumer that a stream
sources through (issue 24). Real nats-server; nats-py reads the consumer's state."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from headrace.jetstream import AckPolicy, ConsumerConfig, JetStream, StreamConfig, StreamSource
from headrace.jetstream.stream_config import StreamConsumerSource
from headrace.nats import connect

from tests.natspy_peer import wait_consumer

FEED = ConsumerConfig(
    durable_name="FEED",
    ack_policy=AckPolicy.FLOW_CONTROL,
    deliver_subject="feed.copy",
    flow_control=True,
    idle_heartbeat=1.0,
    max_ack_pending=1000,
)


@pytest.mark.slow
async def test_a_stream_sources_through_a_flow_control_consumer(
    nats_server: Any, natspy: Any
) -> None:
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="ORIGIN", subjects=["o.>"]))
        for i in range(20):
            await js.publish("o.a", b"%d" % i)
        made = await js.create_consumer("ORIGIN", FEED)
        assert made.config.ack_policy is AckPolicy.FLOW_CONTROL
        feed = StreamConsumerSource(name="FEED", deliver_subject="feed.copy")
        await js.add_stream(
            StreamConfig(name="COPY", sources=[StreamSource(name="ORIGIN", consumer=feed)])
        )
        # Acked by the copy's answers to flow control: the feed's ack floor reaches the end.
        await wait_consumer(
            natspy,
            lambda i: i.ack_floor.stream_seq == 20 and i.num_ack_pending == 0,
            stream="ORIGIN",
            durable="FEED",
            timeout=20,
        )
        copy = await js.stream_info("COPY")
        assert copy.state.messages == 20
        last = await js.get_msg("COPY", 20)
        assert last.data == b"19"
        # Read back as the same policy.
        assert (await js.consumer_info("ORIGIN", "FEED")).config.ack_policy == "flow_control"
        with trio.fail_after(5):
            assert await natspy.call(natspy.nc.jetstream().consumer_info, "ORIGIN", "FEED")


@pytest.mark.parametrize(
    ("change", "missing"),
    [
        ({"deliver_subject": None}, "a deliver_subject"),
        ({"flow_control": None}, "flow_control=True"),
        ({"idle_heartbeat": 5.0}, "idle_heartbeat=1.0"),
        ({"max_ack_pending": None}, "a max_ack_pending"),
    ],
)
def test_what_the_policy_needs_is_said_before_sending(change: dict[str, Any], missing: str) -> None:
    import attrs

    with pytest.raises(ValueError, match=missing):
        attrs.evolve(FEED, **change)
