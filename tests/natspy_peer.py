"""nats-py as the independent peer of trio tests.

nats-py is asyncio-only, so the peer runs its own asyncio loop in a thread; trio tests call it
through ``trio.to_thread.run_sync`` (the :meth:`NatsPyPeer.call` helper), so the trio loop keeps
running while the peer works and a test checks headrace against a client it did not write.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import nats
import nats.js.errors
import trio

from tests.waiting import NO_SUITABLE_PEERS

T = TypeVar("T")


async def once_placed_natspy(create: Callable[[], Awaitable[T]], timeout: float = 15) -> T:
    """The nats-py twin of ``waiting.once_placed``: retry ``create()`` (asyncio) while a fresh
    cluster cannot place a replicated asset yet (no answer, no leader, a peer counted offline)."""

    def retryable(error: Exception) -> bool:
        if isinstance(error, (nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            return True
        if isinstance(error, nats.js.errors.ServiceUnavailableError):
            return True
        return isinstance(error, nats.js.errors.APIError) and error.err_code == NO_SUITABLE_PEERS

    async def attempt() -> T:
        while True:
            try:
                return await create()
            except Exception as error:
                if not retryable(error):
                    raise
            await asyncio.sleep(0.1)  # pacing the retries, not waiting for a condition

    return await asyncio.wait_for(attempt(), timeout)


class NatsPyPeer:
    """A nats-py connection on a private asyncio loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.nc: Any = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 20) -> T:
        """Run ``coro`` on the peer's loop from a plain thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """From trio: run ``fn(*args, **kwargs)`` on the peer's loop and wait for the result."""

        async def wrapper() -> T:
            return await fn(*args, **kwargs)

        return await trio.to_thread.run_sync(lambda: self.run(wrapper()))

    async def connect(self, url: str, **kwargs: Any) -> Any:
        async def go() -> Any:
            return await nats.connect(url, allow_reconnect=False, **kwargs)

        self.nc = await self.call(go)
        return self.nc

    def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            try:
                self.run(self.nc.close(), timeout=5)
            except Exception:
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


async def consumer_info(natspy: NatsPyPeer, stream: str = "S", durable: str = "C") -> Any:
    """Consumer info as nats-py (the independent peer) reads it."""

    async def go() -> Any:
        return await natspy.nc.jetstream().consumer_info(stream, durable)

    return await natspy.call(go)


async def wait_consumer(
    natspy: NatsPyPeer,
    predicate: Callable[[Any], bool],
    stream: str = "S",
    durable: str = "C",
    timeout: float = 10.0,
) -> Any:
    """Consumer info once ``predicate(info)`` holds (a consumer not created yet counts as not
    matching). Polls, briefly and under a time limit: the server's consumer state has no event
    a client can wait for."""
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import NotFoundError, ServiceUnavailableError

    info = None
    try:
        with trio.fail_after(timeout):
            while True:
                try:
                    info = await consumer_info(natspy, stream, durable)
                except (NotFoundError, NatsTimeout, ServiceUnavailableError):
                    # Not there yet; or, in a cluster, its leader being elected again.
                    pass
                else:
                    if predicate(info):
                        return info
                await trio.sleep(0.02)
    except trio.TooSlowError:
        raise AssertionError(f"consumer state never matched; last seen: {info}") from None
