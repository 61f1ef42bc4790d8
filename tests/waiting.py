"""Waiting for things in tests without sleeping: events with a time limit, and event logs.

Shared by the connection and JetStream tests. ``FAST`` makes a client reconnect quickly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
from headrace.errors import RequestTimeout
from headrace.jetstream import JetStreamAPIError, JetStreamUnavailable
from headrace.nats import EventWatcher

E = TypeVar("E")
T = TypeVar("T")

#: err_code of "insufficient resources" / "no suitable peers for placement": a fresh cluster's
#: meta leader may still count a peer offline (its first statsz not in yet, or a duplicate route
#: just closed), so an R3 asset cannot be placed for a moment.
NO_SUITABLE_PEERS = 10005

#: Connection options for tests that lose and regain servers: reconnect at once, then quickly.
FAST: dict[str, Any] = {"reconnect_wait": 0.05, "reconnect_wait_max": 0.2, "connect_timeout": 2}


async def next_event(watcher: EventWatcher[Any], kind: type[E], timeout: float = 15) -> E:
    """The next event of ``kind`` (earlier events of other kinds are skipped)."""
    with trio.fail_after(timeout):
        while True:
            event = await watcher.receive()
            if isinstance(event, kind):
                return event


async def no_event(watcher: EventWatcher[Any], kind: type[Any], period: float) -> None:
    """Fail if an event of ``kind`` arrives within ``period`` seconds (an absence check)."""
    with trio.move_on_after(period):
        while True:
            event = await watcher.receive()
            assert not isinstance(event, kind), f"unexpected {event!r}"


def _not_placeable_yet(error: BaseException) -> bool:
    if isinstance(error, (RequestTimeout, JetStreamUnavailable)):
        return True
    return isinstance(error, JetStreamAPIError) and error.err_code == NO_SUITABLE_PEERS


async def once_placed(create: Callable[[], Awaitable[T]], timeout: float = 40) -> T:
    """``await create()`` (making a replicated stream, bucket or consumer) until a fresh cluster
    places it: no answer yet, no meta leader yet, or a peer still counted offline are retried;
    any other error is raised at once."""
    with trio.fail_after(timeout):
        while True:
            try:
                return await create()
            except Exception as error:
                if not _not_placeable_yet(error):
                    raise
            await trio.sleep(0.1)  # pacing the retries, not waiting for a condition


class EventLog:
    """Records every event of a watcher (run :meth:`run` in a nursery); waits are events."""

    def __init__(self, watcher: EventWatcher[Any]) -> None:
        self.watcher = watcher
        self.events: list[tuple[float, Any]] = []
        self._changed = trio.Event()

    async def run(self) -> None:
        async for event in self.watcher:
            self.events.append((trio.current_time(), event))
            self._changed.set()
            self._changed = trio.Event()

    def of(self, kind: type[E]) -> list[E]:
        return [e for _, e in self.events if isinstance(e, kind)]

    def times(self, kind: type[Any]) -> list[float]:
        return [t for t, e in self.events if isinstance(e, kind)]

    async def wait_for(self, kind: type[E], count: int = 1, timeout: float = 5) -> E:
        with trio.fail_after(timeout):
            while len(self.of(kind)) < count:
                await self._changed.wait()
        return self.of(kind)[count - 1]
