"""The consumer lifecycle's ``_end`` never raises, even when the JetStream API answers with
something that is not JSON (``DecodeError``): a drain reports the failed delete as an event and
an unsubscribe raises it from ``end()``, as for any other failed delete.

A real nats-server. The JetStream context is given an API prefix of its own, served by a
subscriber on the same server that answers every API request with garbage: a real server never
sends invalid JSON, but a proxy, a mirror of the API or a broken server in front of it can, and
this is the only way to make the answer reach the client unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
from headrace._trio import EventHub
from headrace.jetstream import ConsumerDeleteFailed, JetStream
from headrace.jetstream.codec import DecodeError
from headrace.jetstream.lifecycle import ConsumerLifecycle, DeletePolicy
from headrace.nats import Connection, connect

from tests.waiting import next_event

PREFIX = "garbled.API"


@pytest.fixture
async def garbled(nats_server) -> AsyncIterator[JetStream]:
    """A JetStream context whose API answers every request with bytes that are not JSON."""
    async with connect(nats_server.url) as nc, trio.open_nursery() as nursery:
        sub = await nc.subscribe(f"{PREFIX}.>")
        await nc.flush()

        async def answer(nc: Connection) -> None:
            async for msg in sub:
                assert msg.reply is not None
                await nc.publish(msg.reply, b"<html>502 Bad Gateway</html>")

        nursery.start_soon(answer, nc)
        yield JetStream(nc, api_prefix=PREFIX, timeout=2)
        nursery.cancel_scope.cancel()


def lifecycle(js: JetStream, hub: EventHub[object]) -> ConsumerLifecycle:
    async def stop_delivery(drain: bool, deadline: float) -> None:
        pass

    return ConsumerLifecycle(
        js,
        "S",
        "C",
        created=True,
        durable=False,
        queue=None,
        pull=True,
        policy=DeletePolicy.ALWAYS,
        hub=hub,  # type: ignore[arg-type]
        stop_delivery=stop_delivery,
        acks=None,
    )


async def test_garbled_delete_answer_during_a_drain_is_an_event(garbled):
    hub: EventHub[object] = EventHub()
    watcher = hub.watch()
    actor = lifecycle(garbled, hub)
    async with trio.open_nursery() as nursery:
        await actor.start(nursery)
        with trio.fail_after(10):
            await actor.end(drain=True)  # the actor does not fail, so neither does the nursery
    event = await next_event(watcher, ConsumerDeleteFailed, timeout=5)
    assert isinstance(event.error, DecodeError)
    assert not actor.deleted


async def test_garbled_delete_answer_during_an_unsubscribe_is_raised_by_end(garbled):
    actor = lifecycle(garbled, EventHub())
    async with trio.open_nursery() as nursery:
        await actor.start(nursery)
        with trio.fail_after(10), pytest.raises(DecodeError):
            await actor.end(drain=False)
    assert not actor.deleted
