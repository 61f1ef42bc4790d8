"""A malformed answer of the JetStream API is a :class:`JetStreamError` (issue 25).

``DecodeError`` (an answer that is not JSON, or not the shape of the model it should fill) was
a ``HeadraceError`` only, so every handler that catches JetStream failures had to list it
beside ``JetStreamError``, and those that did not let a malformed answer through where any
other JetStream failure was handled: a subscription's block that raised had its own error
replaced by the ``DecodeError`` of the consumer's delete, and a publish loop counting refusals
(``except JetStreamError``, as ``bench publish`` does) failed on the first garbled PubAck.

A real nats-server. A real server never answers with invalid JSON, but a proxy, a mirror of the
API or a broken server in front of it can: the JetStream context is given an API prefix of its
own, served by a subscriber on the same server that forwards each request to ``$JS.API`` (the
server answers the client directly) until it is told to answer with garbage instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest
import trio
from headrace.errors import HeadraceError
from headrace.jetstream import JetStream, JetStreamError, StreamConfig
from headrace.jetstream.codec import DecodeError
from headrace.nats import Connection, connect

PREFIX = "proxy.API"
GARBAGE = b"<html>502 Bad Gateway</html>"


@attrs.define
class Proxy:
    """The API as a proxy in front of the server serves it; ``garble`` turns it bad."""

    js: JetStream
    direct: JetStream
    garble: bool = False


@pytest.fixture
async def proxy(nats_server) -> AsyncIterator[Proxy]:
    async with connect(nats_server.url) as nc, trio.open_nursery() as nursery:
        sub = await nc.subscribe(f"{PREFIX}.>")
        await nc.flush()
        direct = JetStream(nc)
        await direct.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        state = Proxy(JetStream(nc, api_prefix=PREFIX, timeout=2), direct)

        async def serve(nc: Connection) -> None:
            async for msg in sub:
                assert msg.reply is not None
                if state.garble:
                    await nc.publish(msg.reply, GARBAGE)
                else:
                    api = "$JS.API" + msg.subject.removeprefix(PREFIX)
                    await nc.publish(api, msg.data, reply=msg.reply, headers=msg.headers)

        nursery.start_soon(serve, nc)
        yield state
        nursery.cancel_scope.cancel()


def test_a_decode_error_is_a_jetstream_error():
    import headrace.jetstream

    assert issubclass(DecodeError, JetStreamError)
    assert issubclass(DecodeError, HeadraceError)
    assert headrace.jetstream.DecodeError is DecodeError
    assert "DecodeError" in headrace.jetstream.__all__


async def test_the_proxy_forwards_until_it_garbles(proxy):
    assert (await proxy.js.stream_info("S")).config.name == "S"
    proxy.garble = True
    with trio.fail_after(10), pytest.raises(DecodeError):
        await proxy.js.stream_info("S")


@pytest.mark.parametrize("kind", ["push", "pull"])
async def test_a_garbled_delete_does_not_hide_the_blocks_own_error(proxy, kind):
    """The block raised; ending the subscription then deletes its ephemeral consumer, and the
    API answers that with garbage. The block's error is what comes out, as it is when the
    delete fails any other JetStream way (``context._running``)."""

    class BlockFailed(Exception):
        pass

    subscribe = proxy.js.subscribe if kind == "push" else proxy.js.pull_subscribe
    with trio.fail_after(20), pytest.raises(BlockFailed):
        async with subscribe("s.x") as sub:
            consumer = sub.lifecycle.consumer
            proxy.garble = True
            raise BlockFailed
    # The delete got garbage, not the server: the consumer is still there.
    assert consumer in await proxy.direct.consumer_names("S")


async def test_a_garbled_pub_ack_is_caught_as_a_jetstream_error(nats_server):
    """A publish whose answer is no PubAck: ``except JetStreamError`` (a publish loop that
    counts refusals) sees it as one more JetStream failure."""
    async with connect(nats_server.url) as nc, trio.open_nursery() as nursery:
        sub = await nc.subscribe("garbled.>")
        await nc.flush()

        async def answer() -> None:
            async for msg in sub:
                assert msg.reply is not None
                await nc.publish(msg.reply, GARBAGE)

        nursery.start_soon(answer)
        js = JetStream(nc, timeout=2)
        refused = 0
        with trio.fail_after(10):
            for _ in range(3):
                try:
                    await js.publish("garbled.x", b"data")
                except JetStreamError as exc:
                    assert isinstance(exc, DecodeError)
                    refused += 1
        assert refused == 3
        nursery.cancel_scope.cancel()
