"""The flow-control responder actor of a push subscription (ADR-15 "Flow Control").

With flow control the server sends a 100 ``FlowControl Request`` status with a reply subject
and waits for an empty message there before sending more. The answer goes out when the request
is reached in the subscription's order, at the point a message would have reached the user, so
the server never runs further ahead than the user reads. A heartbeat with a
``Nats-Consumer-Stalled`` header names a flow control subject whose answer was missed; it is
answered the same way. Each subject is answered once (the last one is remembered), as the
server only needs one answer.
"""

from __future__ import annotations

import attrs

from headrace._trio import EventHub
from headrace.actors.actor import Actor
from headrace.jetstream.events import FlowControlAnswered, JetStreamEvent
from headrace.nats.connection import Connection


@attrs.frozen(slots=True)
class FlowControlRequest:
    subject: str
    stalled: bool = False


class FlowControlResponder(Actor[FlowControlRequest]):
    def __init__(self, nc: Connection, consumer: str, hub: EventHub[JetStreamEvent]) -> None:
        super().__init__(f"flow-control-responder:{consumer}", inbox_size=1024)
        self._nc = nc
        self.consumer = consumer
        self._hub = hub
        self.last_answered: str | None = None
        self.answered = 0

    async def run(self) -> None:
        async for request in self.inbox:
            if request.subject == self.last_answered:
                continue
            # An empty publish to the server-given subject; it came from the server, so it
            # needs no validation and leaves with the next write.
            self._nc.publish_nowait(request.subject, b"")
            self.last_answered = request.subject
            self.answered += 1
            self._hub.emit(FlowControlAnswered(self.consumer, request.subject, request.stalled))
