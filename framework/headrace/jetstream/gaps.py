"""The gap detector actor of a push subscription (ADR-15 "Messages Gaps").

Each delivery to a consumer gets the next consumer sequence (redeliveries included), so the
consumer sequences a subscriber sees must follow one another. The subscription tells this actor,
once per batch handed to the user, the (consumer, stream) sequences of those messages, and the
``Nats-Last-Consumer`` / ``Nats-Last-Stream`` of each heartbeat reached. A jump, or a heartbeat
saying more was delivered than we saw, is a gap, reported as a :class:`GapDetected` event. The
sequences come from the ack reply, so domains (v2 replies) work the same. Queue subscriptions
see only their share of the deliveries, so gap detection is off for them.
"""

from __future__ import annotations

import attrs

from headrace._trio import EventHub
from headrace.actors.actor import Actor
from headrace.jetstream.events import GapDetected, JetStreamEvent


@attrs.frozen(slots=True)
class Observed:
    """(consumer seq, stream seq) of messages handed to the user, in order."""

    sequences: list[tuple[int, int]]


@attrs.frozen(slots=True)
class HeartbeatSeen:
    last_consumer: int
    last_stream: int


class GapDetector(Actor[Observed | HeartbeatSeen]):
    def __init__(
        self, consumer: str, hub: EventHub[JetStreamEvent], *, last_consumer: int = 0
    ) -> None:
        super().__init__(f"gap-detector:{consumer}", inbox_size=4096)
        self.consumer = consumer
        self._hub = hub
        #: The last consumer and stream sequence seen.
        self.last_consumer = last_consumer
        self.last_stream = 0
        self.gaps = 0

    async def run(self) -> None:
        async for observation in self.inbox:
            self.observe(observation)

    def observe(self, observation: Observed | HeartbeatSeen) -> None:
        if isinstance(observation, HeartbeatSeen):
            if observation.last_consumer > self.last_consumer:
                self._gap(observation.last_consumer)
                self.last_consumer = observation.last_consumer
            return
        for consumer_seq, stream_seq in observation.sequences:
            if consumer_seq != self.last_consumer + 1 and consumer_seq > self.last_consumer:
                self._gap(consumer_seq)
            if consumer_seq > self.last_consumer:
                self.last_consumer = consumer_seq
                self.last_stream = stream_seq

    def _gap(self, received: int) -> None:
        self.gaps += 1
        self._hub.emit(GapDetected(self.consumer, self.last_consumer, received, self.last_stream))
