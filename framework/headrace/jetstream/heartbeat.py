"""The heartbeat monitor actor of a push subscription (ADR-15 "Heartbeats", ADR-9).

A consumer with ``idle_heartbeat`` makes the server send a 100 status after that long without
messages. The subscription stamps :attr:`HeartbeatMonitor.last_activity` on every arrival; this
actor raises an alarm after ``factor`` intervals of silence (ADR-15: 3, configurable), reported
as a :class:`HeartbeatsMissed` event and to an optional callback (the ordered consumer recreates
its consumer there). It pauses while the connection is down and starts afresh on reconnect:
silence during an outage says nothing about the consumer. Its inbox receives those connection
events.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from headrace._trio import EventHub
from headrace.actors.actor import Actor
from headrace.jetstream.events import HeartbeatsMissed, JetStreamEvent
from headrace.nats.connection import Connection
from headrace.nats.events import (
    Connected,
    Disconnected,
    Reconnected,
    forward_until_closed,
)

ALARM_FACTOR = 3.0


class HeartbeatMonitor(Actor[Connected | Disconnected | Reconnected]):
    def __init__(
        self,
        nc: Connection,
        consumer: str,
        interval: float,
        hub: EventHub[JetStreamEvent],
        *,
        factor: float = ALARM_FACTOR,
        on_alarm: Callable[[HeartbeatsMissed], None] | None = None,
    ) -> None:
        if interval <= 0 or factor < 1:
            raise ValueError("heartbeat interval must be positive and the factor at least 1")
        super().__init__(f"heartbeat-monitor:{consumer}", inbox_size=64)
        self._nc = nc
        self.consumer = consumer
        self.interval = interval
        self.factor = factor
        self._hub = hub
        self._on_alarm = on_alarm
        self.last_activity = trio.current_time()
        self.paused = not nc.is_connected
        self.alarms = 0

    def activity(self) -> None:
        """Something arrived from the server (called by the subscription, per batch)."""
        self.last_activity = trio.current_time()

    async def run(self) -> None:
        with self._nc.events() as events:
            async with trio.open_nursery() as nursery:

                async def forward() -> None:
                    await forward_until_closed(events, self.send)
                    # The connection closed for good: nothing more will arrive, and silence
                    # is no alarm.
                    nursery.cancel_scope.cancel()

                nursery.start_soon(forward)
                await self._watch()

    async def _watch(self) -> None:
        limit = self.interval * self.factor
        while True:
            deadline = math.inf if self.paused else self.last_activity + limit
            with trio.move_on_at(deadline):
                event = await self.inbox.receive()
                if isinstance(event, Disconnected):
                    self.paused = True
                else:
                    self.paused = False
                    self.last_activity = trio.current_time()
                continue
            silence = trio.current_time() - self.last_activity
            if silence < limit:
                continue  # activity was stamped while we slept
            self.alarms += 1
            alarm = HeartbeatsMissed(self.consumer, silence)
            self._hub.emit(alarm)
            if self._on_alarm is not None:
                self._on_alarm(alarm)
            self.last_activity = trio.current_time()  # one alarm per silent period
