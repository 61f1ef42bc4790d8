"""The NATS connection as ``headrace run`` shows it: its events in words, and two figures.

The connection rides out a server going away by itself (reconnect, subscriptions sent again),
so the pipeline never sees it; the operator should. :class:`ConnectionEvents` watches the
connection's event stream (:meth:`headrace.nats.connection.Connection.events`) and emits:

- ``disconnected`` (``server``, ``error``: why, when known),
- ``reconnected`` (``server``, ``after``: seconds without a connection),
- ``lame_duck`` (``server``: it will close our connection soon; we move before it does),
- ``server_error`` (``error``: a ``-ERR`` the server sent, such as a permissions violation; at
  most one a second, with ``suppressed`` as for failures, :mod:`headrace.cli.failures`),
- ``slow_consumer`` (``subject``, ``dropped``), ``servers_discovered`` (``servers``),
  ``connection_closed`` (``error``).

Servers are shown as ``nats://host:port``, never with the credentials their URL may carry. The
figures (:meth:`ConnectionEvents.figures`) join the progress stats and the metrics:
``connected`` (1 while connected, else 0) and ``reconnects`` (times connected again after a
loss).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headrace._trio import EventWatcher
from headrace.cli.failures import PER_KEY_INTERVAL, EventLimiter
from headrace.nats.connection import Connection
from headrace.nats.events import (
    Closed,
    ConnectionEvent,
    Disconnected,
    LameDuck,
    Reconnected,
    ServerErrorEvent,
    ServersDiscovered,
    SlowConsumer,
)


def _error_text(error: BaseException | None) -> str | None:
    if error is None:
        return None
    text = " ".join(str(error).split())
    name = type(error).__name__
    return f"{name}: {text}" if text else name


class ConnectionEvents:
    """Says what happens to the connection; keeps ``connected`` and ``reconnects``."""

    def __init__(self, emit: Callable[..., None], clock: Callable[[], float]) -> None:
        self._emit = emit
        self._clock = clock
        self.nc: Connection | None = None
        self._lost_at: float | None = None
        self._server_errors = EventLimiter(emit, clock, per=PER_KEY_INTERVAL)

    def figures(self) -> dict[str, int]:
        """``connected`` (0 or 1) and ``reconnects``, for the progress stats and metrics."""
        nc = self.nc
        if nc is None:
            return {"connected": 0, "reconnects": 0}
        return {"connected": int(nc.is_connected), "reconnects": nc.stats.reconnects}

    async def watch(self, watcher: EventWatcher[ConnectionEvent]) -> None:
        """Say each event of ``watcher`` until it ends (the connection closed) or is cancelled."""
        with watcher:
            async for event in watcher:
                self.handle(event)

    def flush(self, *, final: bool = False) -> None:
        """Server errors held back (see :class:`~headrace.cli.failures.EventLimiter`)."""
        self._server_errors.flush(final=final)

    def handle(self, event: ConnectionEvent) -> None:
        if isinstance(event, Disconnected):
            self._lost_at = self._clock()
            self._emit("disconnected", server=str(event.server), error=_error_text(event.error))
        elif isinstance(event, Reconnected):
            fields: dict[str, Any] = {"server": str(event.server)}
            if self._lost_at is not None:
                fields["after"] = round(self._clock() - self._lost_at, 3)
                self._lost_at = None
            self._emit("reconnected", **fields)
        elif isinstance(event, LameDuck):
            self._emit("lame_duck", server=str(event.server))
        elif isinstance(event, ServerErrorEvent):
            self._server_errors.offer(
                "server_error", "server_error", {"error": _error_text(event.error)}
            )
        elif isinstance(event, SlowConsumer):
            self._emit("slow_consumer", subject=event.subject, dropped=event.dropped)
        elif isinstance(event, ServersDiscovered):
            self._emit("servers_discovered", servers=[str(s) for s in event.servers])
        elif isinstance(event, Closed):
            self._emit("connection_closed", error=_error_text(event.error))
