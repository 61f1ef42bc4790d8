"""Events JetStream subscriptions report to whoever watches them (``sub.events()``).

None of them is an error that ends a subscription: those are raised from iteration. These say
what the automatic status management saw and did.
"""

from __future__ import annotations

import attrs


@attrs.frozen(slots=True)
class HeartbeatsMissed:
    """No message, status or heartbeat for ``silence`` seconds while the server owed us some
    (pull: 2x idle_heartbeat, ADR-37; push: 3x, ADR-15). Pull consumes reset their pending
    counts and pull again; ordered consumers recreate their consumer."""

    consumer: str
    silence: float


@attrs.frozen(slots=True)
class PullWarning:
    """A pull request ended with a warning status (e.g. 409 Exceeded MaxWaiting) or got no
    responder (503; the pull is retried)."""

    consumer: str
    status: int
    description: str


@attrs.frozen(slots=True)
class GapDetected:
    """Deliveries are missing: the consumer sequence jumped from ``last`` to ``received``
    (from a message's ack reply, or a heartbeat's ``Nats-Last-Consumer``)."""

    consumer: str
    last: int
    received: int
    last_stream_seq: int


@attrs.frozen(slots=True)
class FlowControlAnswered:
    """A flow control request (or a stalled consumer's heartbeat) was answered."""

    consumer: str
    subject: str
    stalled: bool


@attrs.frozen(slots=True)
class MessagesDropped:
    """A push subscription's buffer was full and dropped ``dropped`` messages (the reader fell
    behind; without an ack they are redelivered after ack_wait). Once per episode."""

    consumer: str
    dropped: int


@attrs.frozen(slots=True)
class ConsumerRecreated:
    """An ordered consumer replaced its consumer, resuming at ``start_seq``."""

    old: str
    new: str
    start_seq: int
    reason: str


@attrs.frozen(slots=True)
class ConsumerDeleteFailed:
    """Draining ended, but deleting the consumer this subscription created failed."""

    stream: str
    consumer: str
    error: BaseException


@attrs.frozen(slots=True)
class PinGained:
    """This client became the pinned one of a ``pinned_client`` priority group (ADR-42): a
    delivered message carried ``pin_id`` in its ``Nats-Pin-Id`` header, which every later pull
    sends back. From now on the group's messages come here, while its pulls keep the pin."""

    consumer: str
    group: str
    pin_id: str


@attrs.frozen(slots=True)
class PinLost:
    """The pin this client held (``pin_id``) moved to another client: the server answered a
    pull carrying it with 423 (``description``), after the pin timed out or was unpinned. The
    consume forgot it and pulls on without an id, as a standby. Messages handed out before may
    still be acked."""

    consumer: str
    group: str
    pin_id: str
    description: str


JetStreamEvent = (
    HeartbeatsMissed
    | PullWarning
    | GapDetected
    | FlowControlAnswered
    | MessagesDropped
    | ConsumerRecreated
    | ConsumerDeleteFailed
    | PinGained
    | PinLost
)
