"""The generic trio helpers of ``headrace._trio`` and the connection-event forwarder.

No server is involved: these are trio building blocks (the hub, "either", a body's error kept
out of a nursery) and the one forwarder the consume buffer, the heartbeat monitor and a push
subscription share, fed here by a real hub.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
from headrace._trio import BodyError, EventHub, either
from headrace.actors import open_actor_nursery
from headrace.nats import events as nats_events
from headrace.nats.events import (
    Closed,
    Connected,
    ConnectionEvent,
    Disconnected,
    LameDuck,
    Reconnected,
    forward_until_closed,
)
from headrace.nats.servers import ServerAddress


class Boom(Exception):
    pass


@asynccontextmanager
async def serving(cleaned: list[str]) -> AsyncIterator[trio.Nursery]:
    """A context manager running tasks beside its body, with clean-up after the body."""
    body = BodyError()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep_forever)
        with body:
            yield nursery
        cleaned.append("after body")
        nursery.cancel_scope.cancel()
    body.reraise()


async def test_body_error_comes_out_as_raised_after_the_clean_up() -> None:
    cleaned: list[str] = []
    with pytest.raises(Boom) as info:  # not an ExceptionGroup
        async with serving(cleaned):
            raise Boom("body")
    assert str(info.value) == "body"
    assert cleaned == ["after body"]


async def test_body_that_succeeds_raises_nothing() -> None:
    cleaned: list[str] = []
    async with serving(cleaned):
        pass
    assert cleaned == ["after body"]


async def test_a_task_failure_still_propagates_as_trio_reports_it() -> None:
    async def fail() -> None:
        raise Boom("task")

    with pytest.raises(BaseExceptionGroup) as info:
        async with open_actor_nursery() as nursery:
            nursery.start_soon(fail)
            await trio.sleep_forever()
    assert [str(e) for e in info.value.exceptions] == ["task"]


async def test_actor_nursery_raises_the_body_error_unwrapped() -> None:
    with pytest.raises(Boom):
        async with open_actor_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            raise Boom("body")


async def test_either_returns_when_the_second_event_is_set() -> None:
    first, second = trio.Event(), trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(either, first, second)
        await trio.testing.wait_all_tasks_blocked()
        second.set()
    assert not first.is_set()


def test_the_hub_has_one_home() -> None:
    # (Its old path, headrace.nats.events, is gone: nothing is deprecated before a release.)
    assert not hasattr(nats_events, "EventHub")


async def test_a_slow_watcher_loses_events_and_the_hub_never_waits() -> None:
    hub: EventHub[int] = EventHub()
    with hub.watch(buffer=2) as watcher:
        for n in range(5):
            hub.emit(n)  # synchronous: it cannot wait
        assert watcher.dropped == 3
        hub.close()
        assert [n async for n in watcher] == [0, 1]


async def test_forwarder_hands_on_link_changes_and_stops_at_closed() -> None:
    server = ServerAddress("localhost")
    hub: EventHub[ConnectionEvent] = EventHub()
    received: list[object] = []

    async def send(event: Connected | Disconnected | Reconnected) -> None:
        received.append(event)

    events: list[ConnectionEvent] = [
        Connected(server),
        LameDuck(server),
        Disconnected(server, None),
        Reconnected(server),
        Closed(None),
        Connected(server),  # never comes in practice: the hub closes after Closed
    ]
    with hub.watch() as watcher:
        for event in events:
            hub.emit(event)
        with trio.fail_after(5):
            await forward_until_closed(watcher, send)
    assert received == [events[0], events[2], events[3]]


async def test_forwarder_ends_with_the_watcher_when_closed_was_dropped() -> None:
    hub: EventHub[ConnectionEvent] = EventHub()
    with hub.watch(buffer=1) as watcher:
        hub.emit(Disconnected(ServerAddress("localhost"), None))
        hub.emit(Closed(None))  # dropped: the watcher is full
        hub.close()
        received: list[object] = []

        async def send(event: Connected | Disconnected | Reconnected) -> None:
            received.append(event)

        with trio.fail_after(5):
            await forward_until_closed(watcher, send)
    assert watcher.dropped == 1
    assert len(received) == 1
