"""What the statuses of a pull response mean (ADR-37 "Status handling", ADR-13).

A pull response is a user message (it has a ``$JS.ACK`` reply) or a status message (no reply,
an inline status). :func:`classify` sorts statuses into what a fetch or a consume does next.
"""

from __future__ import annotations

import enum

from headrace.jetstream.errors import ConsumerDeleted, ConsumerIsPushBased, PullStatusError
from headrace.jetstream.priority import refusal_error
from headrace.protocol.events import Msg


class StatusKind(enum.Enum):
    HEARTBEAT = "heartbeat"  # 100: alive, nothing else
    # The request ended quietly (404, 408, 409 Batch Completed; 423: the pin id it carried is
    # not, or no longer, the group's pin, ADR-42, which the pull flow forgets).
    FINISHED = "finished"
    TOO_LARGE = "too large"  # 409 Message Size Exceeds MaxBytes: the next message did not fit
    WARNING = "warning"  # the request ended; tell the user (409 Exceeded Max*, Server Shutdown)
    NO_RESPONDERS = "no responders"  # 503: nothing serves the pull API right now
    RESET = "reset"  # 409 Leadership Change: waiting requests were lost; ask the new leader
    ERROR = "error"  # terminal: 400, 409 Consumer Deleted / is push based, any unknown status


#: The 409s a pull may recover from (ADR-37's warnings and not-telegraphed statuses, plus what
#: nats-server 2.10-2.15 also sends), by what comes next. Any other 409 is an error: ADR-15
#: "Unknown Error Statuses" says a status the client does not know is raised, not passed over.
_RECOVERABLE_409 = (
    ("message size exceeds maxbytes", StatusKind.TOO_LARGE),
    ("leadership change", StatusKind.RESET),
    # Every "Exceeded Max*" limit (MaxRequestBatch, MaxRequestExpires, MaxRequestMaxBytes,
    # MaxWaiting, and MaxAckPending, which servers before 2.10 sent for a pull whose batch
    # went past the consumer's max_ack_pending: an unknown status ended the consume, issue
    # 24): the request was refused, the consumer is fine.
    ("exceeded max", StatusKind.WARNING),
    # The server is going down with the request; the reconnect pulls again as well.
    ("server shutdown", StatusKind.WARNING),
    # Informational (nats-server 2.11+): the server considers the request complete.
    ("batch completed", StatusKind.FINISHED),
)


def classify(status: int, description: str) -> StatusKind:
    if status == 100:
        return StatusKind.HEARTBEAT
    if status in (404, 408, 423):
        return StatusKind.FINISHED
    if status == 409:
        lower = description.lower()
        for phrase, kind in _RECOVERABLE_409:
            if lower.startswith(phrase):
                return kind
        return StatusKind.ERROR  # Consumer Deleted, Consumer is push based, or unknown
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
        # A pull that does not fit the consumer's priority groups has its own classes.
        refused = refusal_error(status, description)
        if refused is not None:
            return refused
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
