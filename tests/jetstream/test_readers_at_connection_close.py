"""Every reader of a JetStream subscription raises ``ConnectionClosedError`` when the
connection closes, whether the application closed it or it closed for good after the
reconnect attempts ran out (issue 24: ``async for`` over a push subscription, an ordered
consumer or a KV watch just ended, ``next_msg`` raised a bare ``SubscriptionClosedError``,
and only a pull consume raised ``ConnectionClosedError``). A subscription ended on purpose
(its block left, a drain) ends as before. Real nats-server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from headrace.errors import ConnectionClosedError
from headrace.jetstream import JetStream, KeyValueConfig, StreamConfig, create_key_value
from headrace.nats import connect


@asynccontextmanager
async def _reader(js: JetStream, kind: str) -> AsyncIterator[Any]:
    """Something to iterate, of ``kind``."""
    if kind == "push":
        async with js.subscribe("s.>") as sub:
            yield sub
    elif kind == "ordered":
        async with js.subscribe("s.>", ordered=True) as sub:
            yield sub
    elif kind == "watch":
        kv = await create_key_value(js, KeyValueConfig(bucket="B"))
        async with kv.watch() as watcher:
            yield watcher
    else:
        async with js.pull_subscribe("s.>", durable="D") as sub, sub.consume() as messages:
            yield messages


KINDS = ["push", "ordered", "watch", "pull"]


async def _read_until_closed(reader: Any, close: Callable[[], Awaitable[None]]) -> BaseException:
    """Iterate ``reader`` while ``close()`` runs; the error iteration ended with."""
    caught: list[BaseException] = []

    async def iterate() -> None:
        try:
            async for _ in reader:
                pass
        except BaseException as exc:  # what iteration ends with is the point
            caught.append(exc)
            if isinstance(exc, trio.Cancelled):
                raise
        else:
            caught.append(AssertionError("iteration ended without an error"))

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(iterate)
            await trio.testing.wait_all_tasks_blocked()
            await close()
    return caught[0]


@pytest.mark.parametrize("kind", KINDS)
async def test_closed_by_the_application(nats_server: Any, kind: str) -> None:
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        await js.publish("s.a", b"1")
        try:
            async with _reader(js, kind) as reader:
                error = await _read_until_closed(reader, nc.close)
        except ConnectionClosedError:
            pass  # (leaving the block cannot delete an ephemeral consumer any more)
    assert isinstance(error, ConnectionClosedError), repr(error)
    assert str(error) == "the connection is closed"


@pytest.mark.parametrize("kind", KINDS)
async def test_closed_for_good(nats_server_factory: Any, kind: str) -> None:
    server = nats_server_factory()
    async with connect(server.url, max_reconnect_attempts=1, reconnect_wait=0.05) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        try:
            async with _reader(js, kind) as reader:
                error = await _read_until_closed(
                    reader, lambda: trio.to_thread.run_sync(server.stop)
                )
        except ConnectionClosedError:
            pass
    assert isinstance(error, ConnectionClosedError), repr(error)
    assert error.__cause__ is not None  # why it closed


async def test_next_msg_raises_it_too(nats_server: Any) -> None:
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        async with js.subscribe("s.>") as sub:
            await nc.close()
            with trio.fail_after(10), pytest.raises(ConnectionClosedError):
                await sub.next_msg()
