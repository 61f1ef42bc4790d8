"""The body of a pull request, ``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`` (ADR-13).

``batch`` messages at most, ``max_bytes`` bytes at most, the server gives up after ``expires``
seconds (sending 408), answers at once (404 when empty) with ``no_wait``, and sends a
heartbeat (100) after ``idle_heartbeat`` seconds without messages.

On a consumer with priority groups (ADR-42) it also names its ``group``, and per the policy
``min_pending``/``min_ack_pending`` (overflow), ``priority`` (prioritized) or the pin ``id``
the server handed out (pinned_client).
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from headrace._validators import positive_or_none
from headrace.jetstream.codec import seconds_to_ns
from headrace.jetstream.priority import PriorityPull


def msg_next_api(stream: str, consumer: str) -> str:
    """The API subject a pull request is published to, without the JetStream API prefix (the
    context's ``api_subject`` adds it: ``$JS.API.`` or a domain's)."""
    return f"CONSUMER.MSG.NEXT.{stream}.{consumer}"


#: Bytes mode asks for this many messages, so only max_bytes limits the batch (ADR-37).
BYTES_MODE_BATCH = 1_000_000


def _pin_id(_inst: object, _attr: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"a pin id is a non-empty string, not {value!r}")


@attrs.frozen(slots=True, kw_only=True)
class PullRequest:
    """One pull request's body (ADR-13), with the priority group fields of ADR-42."""

    batch: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    max_bytes: int | None = attrs.field(default=None, validator=positive_or_none)
    expires: float | None = attrs.field(default=None, validator=positive_or_none)
    no_wait: bool = False
    idle_heartbeat: float | None = attrs.field(default=None, validator=positive_or_none)
    #: The priority group, its thresholds or priority (ADR-42); ``None``: no group.
    priority: PriorityPull | None = None
    #: The pin id of a ``pinned_client`` group, as the server last sent it (``Nats-Pin-Id``).
    id: str | None = attrs.field(default=None, validator=_pin_id)

    def __attrs_post_init__(self) -> None:
        if self.idle_heartbeat is not None:
            if self.expires is None:
                raise ValueError("idle_heartbeat needs expires")
            if self.idle_heartbeat > self.expires / 2:
                raise ValueError(
                    f"idle_heartbeat ({self.idle_heartbeat}s) must be at most half of expires "
                    f"({self.expires}s), or the request ends before a heartbeat can be missed"
                )
        if self.id is not None and self.priority is None:
            raise ValueError("a pin id goes with the group it pins (priority=PriorityPull(...))")

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"batch": self.batch}
        if self.max_bytes is not None:
            body["max_bytes"] = self.max_bytes
        if self.expires is not None:
            body["expires"] = seconds_to_ns(self.expires)
        if self.no_wait:
            body["no_wait"] = True
        if self.idle_heartbeat is not None:
            body["idle_heartbeat"] = seconds_to_ns(self.idle_heartbeat)
        priority = self.priority
        if priority is not None:
            body["group"] = priority.group
            if priority.min_pending is not None:
                body["min_pending"] = priority.min_pending
            if priority.min_ack_pending is not None:
                body["min_ack_pending"] = priority.min_ack_pending
            if priority.priority is not None:
                body["priority"] = priority.priority
            if self.id is not None:
                body["id"] = self.id
        return body

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()
