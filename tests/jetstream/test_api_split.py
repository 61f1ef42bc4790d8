"""The JetStream API client and the subscription factory are two layers (issue 12).

``JetStreamAPI`` (``jetstream/api.py``) makes the API requests; ``JetStream``
(``jetstream/context.py``) is that plus the subscriptions. The modules that run a
subscription need only the requests, so they name the client and the imports of ``jetstream/``
go one way, type-only imports included (``tests/test_import_contract.py`` checks that). A real
nats-server checks that the client alone is enough to manage, publish and pull, and that
``JetStream`` is still what users had.
"""

from __future__ import annotations

import headrace
import headrace.jetstream
import trio
from headrace.jetstream import (
    ConsumerConfig,
    JetStream,
    JetStreamAPI,
    PullConsumer,
    StorageType,
    StreamConfig,
)
from headrace.nats import connect


def test_jetstream_is_the_api_client_with_the_same_names() -> None:
    assert issubclass(JetStream, JetStreamAPI)
    assert headrace.JetStream is JetStream
    assert "JetStreamAPI" in headrace.jetstream.__all__
    factory = {"pull_consumer", "subscribe", "pull_subscribe"}
    assert factory <= set(vars(JetStream))
    assert not factory & set(dir(JetStreamAPI))


async def test_the_api_client_alone_manages_publishes_and_pulls(nats_server) -> None:
    async with connect(nats_server.url) as nc:
        api = JetStreamAPI(nc, timeout=5)
        assert repr(api) == "<JetStreamAPI prefix='$JS.API'>"
        assert repr(JetStream(nc)) == "<JetStream prefix='$JS.API'>"
        await api.add_stream(
            StreamConfig(name="SPLIT", subjects=["split.>"], storage=StorageType.MEMORY)
        )
        ack = await api.publish("split.a", b"one")
        info = await api.create_consumer("SPLIT", ConsumerConfig(durable_name="d"))
        # A pull consumer runs on the client alone: fetch and the consume buffer.
        consumer = PullConsumer(api, "SPLIT", "d", info)
        [first] = await consumer.fetch(1, expires=2)
        assert (first.data, first.metadata.stream_seq) == (b"one", ack.seq)
        await first.ack_sync()
        await api.publish("split.b", b"two")
        with trio.fail_after(10):
            async with consumer.consume(max_messages=10) as messages:
                second = await messages.__anext__()
        assert second.data == b"two"
