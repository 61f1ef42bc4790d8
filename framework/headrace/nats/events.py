"""Connection events, and the hub that hands them to every watcher.

ADR-40 asks clients to tell the user about connection state changes. Here any actor can watch:
``nc.events()`` returns its own bounded receive channel. Heartbeat monitors pause on
:class:`Disconnected` and resume on :class:`Reconnected`; consume buffers re-pull on
:class:`Reconnected`.

A watcher that does not keep up loses events rather than slowing the connection down: the
hub never waits. Its ``dropped`` counter says how many, so a watcher can tell it missed some.
The hub itself is generic (:mod:`headrace._trio`); JetStream subscriptions use it too.

Actors that follow the link's state (the consume buffer, the heartbeat monitor, a push
subscription's end) take the events through one helper, :func:`forward_until_closed`.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable

import attrs

from headrace._trio import EventWatcher
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


async def forward_until_closed(
    watcher: EventWatcher[ConnectionEvent],
    send: Callable[[Connected | Disconnected | Reconnected], Awaitable[None]] | None = None,
) -> None:
    """Hand the link's changes (connected, disconnected, reconnected) to ``send``, typically an
    actor's inbox, until the connection is closed for good; then return.

    The end is the :class:`Closed` event, or the watcher's end should that event have been
    dropped (the hub closes every watcher right after it). The other events are not for the
    actors that use this. Without ``send`` it only waits for the end.
    """
    async for event in watcher:
        if isinstance(event, Connected | Disconnected | Reconnected):
            if send is not None:
                await send(event)
        elif isinstance(event, Closed):
            return
