"""What the statuses of a pull response mean (ADR-37 "Status handling", ADR-13).

A pull response is a user message (it has a ``$JS.ACK`` reply) or a status message (no reply,
an inline status). :func:`classify` sorts statuses into what a fetch or a consume does next.
"""

from __future__ import annotations

import enum

from headrace.jetstream.errors import ConsumerDeleted, ConsumerIsPushBased, PullStatusError
from headrace.protocol.events import Msg


class StatusKind(enum.Enum):
    HEARTBEAT = "heartbeat"  # 100: alive, nothing else
    FINISHED = "finished"  # the request ended quietly (404, 408, 409 size, 423): not telegraphed
    WARNING = "warning"  # the request ended; tell the user (409 Exceeded Max*, unknown 409s)
    NO_RESPONDERS = "no responders"  # 503: nothing serves the pull API right now
    RESET = "reset"  # 409 Leadership Change: waiting requests were lost; ask the new leader
    ERROR = "error"  # terminal: 400, 409 Consumer Deleted, 409 Consumer is push based, unknown


def classify(status: int, description: str) -> StatusKind:
    lower = description.lower()
    if status == 100:
        return StatusKind.HEARTBEAT
    if status in (404, 408, 423):
        return StatusKind.FINISHED
    if status == 409:
        if "consumer deleted" in lower or "consumer is push based" in lower:
            return StatusKind.ERROR
        if "message size exceeds maxbytes" in lower:
            return StatusKind.FINISHED
        if "leadership change" in lower:
            return StatusKind.RESET
        return StatusKind.WARNING
    if status == 503:
        return StatusKind.NO_RESPONDERS
    return StatusKind.ERROR


def status_error(status: int, description: str) -> PullStatusError:
    """The typed error of a terminal status."""
    lower = description.lower()
    if status == 409 and "consumer deleted" in lower:
        return ConsumerDeleted(
            status, description, "the consumer was deleted while pulling from it (409)"
        )
    if status == 409 and "consumer is push based" in lower:
        return ConsumerIsPushBased(
            status,
            description,
            "the consumer is push based: subscribe to it instead of pulling (409)",
        )
    if status == 400:
        return PullStatusError(status, description, f"the server refused the pull: {description}")
    return PullStatusError(status, description, f"unknown pull status {status} {description!r}")


def pending_counts(msg: Msg) -> tuple[int, int]:
    """(``Nats-Pending-Messages``, ``Nats-Pending-Bytes``) of a terminating status; zeros when
    absent or malformed (older servers do not send them)."""
    headers = msg.headers
    if headers is None:
        return 0, 0
    try:
        return (
            int(headers.get("Nats-Pending-Messages", "0")),
            int(headers.get("Nats-Pending-Bytes", "0")),
        )
    except ValueError:
        return 0, 0
