"""Connection events, and the hub that hands them to every watcher.

ADR-40 asks clients to tell the user about connection state changes. Here any actor can watch:
``nc.events()`` returns its own bounded receive channel. Heartbeat monitors pause on
:class:`Disconnected` and resume on :class:`Reconnected`; consume buffers re-pull on
:class:`Reconnected`.

A watcher that does not keep up loses events rather than slowing the connection down: the
hub never waits. Its ``dropped`` counter says how many, so a watcher can tell it missed some.
"""

from __future__ import annotations

import enum
import math
from typing import Generic, TypeVar

import attrs
import trio

from headrace.nats.servers import ServerAddress


class Status(enum.Enum):
    """Where the connection is in its life."""

    CONNECTING = "connecting"
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    DRAINING = "draining"
    CLOSED = "closed"


@attrs.frozen(slots=True)
class Connected:
    """The first connection is up."""

    server: ServerAddress


@attrs.frozen(slots=True)
class Disconnected:
    """The connection to ``server`` was lost; reconnecting follows if allowed."""

    server: ServerAddress
    error: BaseException | None


@attrs.frozen(slots=True)
class Reconnected:
    """Connected again, subscriptions re-sent; buffered publishes follow."""

    server: ServerAddress


@attrs.frozen(slots=True)
class LameDuck:
    """The server announced lame duck mode: it will close our connection soon."""

    server: ServerAddress


@attrs.frozen(slots=True)
class ServersDiscovered:
    """INFO listed servers we did not know; they are now in the pool."""

    servers: tuple[ServerAddress, ...]


@attrs.frozen(slots=True)
class ServerErrorEvent:
    """The server sent ``-ERR``; ``error`` is the typed exception for it."""

    error: BaseException


@attrs.frozen(slots=True)
class SlowConsumer:
    """A subscription's pending limits were hit and messages were dropped.

    Sent once per episode: when dropping starts after the subscription had kept up.
    """

    sid: int
    subject: str
    dropped: int


@attrs.frozen(slots=True)
class Closed:
    """The connection is closed for good; ``error`` says why when it was not asked for."""

    error: BaseException | None


ConnectionEvent = (
    Connected
    | Disconnected
    | Reconnected
    | LameDuck
    | ServersDiscovered
    | ServerErrorEvent
    | SlowConsumer
    | Closed
)


E = TypeVar("E")


class EventWatcher(Generic[E]):
    """A watcher's side of the hub: iterate it, close it when done."""

    def __init__(self, hub: EventHub[E], buffer: int | float) -> None:
        self._hub = hub
        send, self._receive = trio.open_memory_channel[E](buffer)
        self._send = send
        self.dropped = 0

    async def receive(self) -> E:
        return await self._receive.receive()

    def __aiter__(self) -> EventWatcher[E]:
        return self

    async def __anext__(self) -> E:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._hub._watchers.discard(self)
        self._send.close()
        self._receive.close()

    def __enter__(self) -> EventWatcher[E]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventHub(Generic[E]):
    """Fan events out to watchers without ever blocking the one who emits them."""

    def __init__(self) -> None:
        self._watchers: set[EventWatcher[E]] = set()
        self._closed = False

    def watch(self, buffer: int | float = 256) -> EventWatcher[E]:
        """A new watcher; on a closed hub one whose iteration ends at once."""
        if buffer < 1 and buffer != math.inf:
            raise ValueError(f"buffer must be at least 1, not {buffer}")
        watcher = EventWatcher(self, buffer)
        if self._closed:
            watcher._send.close()
        else:
            self._watchers.add(watcher)
        return watcher

    def emit(self, event: E) -> None:
        for watcher in list(self._watchers):
            try:
                watcher._send.send_nowait(event)
            except trio.WouldBlock:
                watcher.dropped += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._watchers.discard(watcher)

    def close(self) -> None:
        """End every watcher's iteration (after the events already queued)."""
        self._closed = True
        for watcher in list(self._watchers):
            watcher._send.close()
        self._watchers.clear()
