"""Pull consumer priority groups (ADR-42; nats-server 2.11+, ``prioritized`` 2.12+).

A pull consumer may name priority groups and a policy. Every pull then names its group, and
the policy decides which of the waiting pulls the server serves:

- ``overflow``: a pull with ``min_pending`` (or ``min_ack_pending``) is served only while the
  consumer has at least that many messages pending (or unacknowledged), so standby workers
  take part only when the others fall behind;
- ``pinned_client``: one client gets every message. The server names it with a pin id, sent in
  the ``Nats-Pin-Id`` header of the messages it delivers; the client sends that id back in each
  later pull (``id``). A pin that no pull renewed for ``priority_timeout`` seconds, or that an
  operator cleared (``$JS.API.CONSUMER.UNPIN``), passes to another waiting pull; the old
  holder's pulls carrying the old id are then answered with status 423, and it forgets the id
  and pulls again without one, as a standby;
- ``prioritized``: pulls with a lower ``priority`` (0 to 9) are served first.

This module holds the pieces that belong to the feature rather than to one request or one
consume: the policy, the group name rule, what a pull asks of a group (:class:`PriorityPull`)
and whether it fits a consumer, the pin id header, and the group state of consumer info.
It imports nothing of the consumer configuration (which imports it), so the fit check takes
the consumer's groups and policy as values.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
from typing import Any

import attrs

from headrace.jetstream.codec import TIME, jfield
from headrace.jetstream.errors import (
    PriorityGroupConfigError,
    PriorityGroupError,
    PriorityGroupMissing,
    PriorityPolicyMismatch,
    PriorityPullRefused,
    UnknownPriorityGroup,
)

#: The header of a delivered message that names the pin of a ``pinned_client`` group.
PIN_ID_HEADER = "Nats-Pin-Id"
_PIN_ID_BYTES = PIN_ID_HEADER.encode()
#: A group name is at most this long (ADR-42).
MAX_GROUP_NAME = 16
#: ADR-6's ``limited-term``: what a group name may be made of.
_LIMITED_TERM = re.compile(r"[A-Za-z0-9_\-/=]+")
#: The bounds of a pull's ``priority`` under the ``prioritized`` policy.
MIN_PRIORITY, MAX_PRIORITY = 0, 9
#: The server's ``priority_timeout`` of a ``pinned_client`` consumer that sets none.
DEFAULT_PRIORITY_TIMEOUT = 120.0


class PriorityPolicy(enum.StrEnum):
    """How the server picks among the waiting pulls of a consumer's priority groups."""

    NONE = "none"
    OVERFLOW = "overflow"
    PINNED_CLIENT = "pinned_client"
    PRIORITIZED = "prioritized"


def check_group_name(name: object) -> str:
    """``name`` if it can name a priority group, else :class:`PriorityGroupConfigError` (with
    the ``err_code`` the server answers: 10161 empty, 10162 otherwise)."""
    if not isinstance(name, str) or not name:
        raise PriorityGroupConfigError(
            400, 10161, f"a priority group name cannot be empty, got {name!r}"
        )
    if len(name) > MAX_GROUP_NAME or not _LIMITED_TERM.fullmatch(name):
        raise PriorityGroupConfigError(
            400,
            10162,
            f"invalid priority group name {name!r}: use A-Z, a-z, 0-9, '-', '_', '/' or '=', "
            f"at most {MAX_GROUP_NAME} characters",
        )
    return name


def unpin_api(stream: str, consumer: str) -> str:
    """The API subject that clears a group's pin, without the JetStream API prefix."""
    return f"CONSUMER.UNPIN.{stream}.{consumer}"


def _group(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    check_group_name(value)


def _at_least_one(_inst: object, attr: attrs.Attribute[Any], value: int | None) -> None:
    # Not _validators.at_least_one_or_none: the server reads 0 (or less) as "no threshold",
    # which is never what a pull that names one means.
    if value is not None and (isinstance(value, bool) or not value >= 1):
        raise ValueError(f"{attr.name} must be at least 1, not {value!r}")


def _priority(_inst: object, attr: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not MIN_PRIORITY <= value <= MAX_PRIORITY):
        raise ValueError(
            f"{attr.name} must be between {MIN_PRIORITY} and {MAX_PRIORITY}, not {value!r}"
        )


@attrs.frozen(slots=True, kw_only=True)
class PriorityPull:
    """What a pull asks of a consumer's priority group (ADR-42), in the request's words.

    ``group`` is required; ``min_pending`` and ``min_ack_pending`` go with ``overflow`` (served
    when either threshold is reached), ``priority`` with ``prioritized`` (0 first, 9 last).
    The pin id of ``pinned_client`` is not here: the server hands it out and the pull flow
    remembers it.
    """

    group: str = attrs.field(validator=_group)
    min_pending: int | None = attrs.field(default=None, validator=_at_least_one)
    min_ack_pending: int | None = attrs.field(default=None, validator=_at_least_one)
    priority: int | None = attrs.field(default=None, validator=_priority)

    @property
    def overflow(self) -> bool:
        """Whether this pull sets an ``overflow`` threshold."""
        return self.min_pending is not None or self.min_ack_pending is not None


def priority_pull(
    group: str | None,
    min_pending: int | None = None,
    min_ack_pending: int | None = None,
    priority: int | None = None,
) -> PriorityPull | None:
    """The :class:`PriorityPull` of a fetch's or consume's settings, ``None`` without a group;
    :class:`PriorityGroupError` for settings that need a group and were given none."""
    if group is None:
        if (min_pending, min_ack_pending, priority) != (None, None, None):
            raise PriorityGroupError(
                "min_pending, min_ack_pending and priority need group (the consumer's priority "
                "group to pull from)"
            )
        return None
    return PriorityPull(
        group=group, min_pending=min_pending, min_ack_pending=min_ack_pending, priority=priority
    )


def check_pull_fits(
    pull: PriorityPull | None,
    groups: list[str] | None,
    policy: PriorityPolicy | None,
    *,
    stream: str,
    consumer: str,
) -> None:
    """Raise the typed :class:`PriorityPullRefused` the server would answer (or worse, would
    not: a group on a consumer without groups is ignored) if ``pull`` does not fit a consumer
    with these ``groups`` and ``policy``. Checked before a fetch or consume sends anything."""
    where = f"consumer {consumer!r} on stream {stream!r}"
    active = bool(groups) and policy not in (None, PriorityPolicy.NONE)
    if pull is None:
        if active:
            raise PriorityGroupMissing(
                400,
                "Bad Request - Priority Group missing",
                f"{where} has priority groups {groups} (policy {policy}): pull with one of "
                "them (group=...)",
            )
        return
    if not active or pull.group not in (groups or ()):
        raise UnknownPriorityGroup(
            400,
            "Bad Request - Invalid Priority Group",
            f"{where} has no priority group {pull.group!r}"
            + (f" (its groups: {groups})" if active else " (it has no priority groups)"),
        )
    if pull.overflow and policy != PriorityPolicy.OVERFLOW:
        raise PriorityPolicyMismatch(
            400,
            "Bad Request - Not a Overflow Priority consumer",
            f"min_pending and min_ack_pending need policy 'overflow'; {where} is {policy}",
        )
    if pull.priority is not None and policy != PriorityPolicy.PRIORITIZED:
        raise PriorityPolicyMismatch(
            400,
            "Bad Request - Not a Prioritized consumer",
            f"priority needs policy 'prioritized'; {where} is {policy} (the server would "
            "ignore it)",
        )


#: What the 400 statuses of a pull that does not fit its consumer's groups say (nats-server
#: 2.11-2.15), by the class that stands for them.
_REFUSALS = (
    ("priority group missing", PriorityGroupMissing),
    ("invalid priority group", UnknownPriorityGroup),
    ("not a ", PriorityPolicyMismatch),  # "Not a Overflow/Pinned Client Priority consumer"
)


def refusal_error(status: int, description: str) -> PriorityPullRefused | None:
    """The typed error of a 400 that refuses a pull for its priority group, else ``None``."""
    lower = description.lower().removeprefix("bad request - ")
    if status != 400:
        return None
    for phrase, cls in _REFUSALS:
        if lower.startswith(phrase):
            return cls(status, description, f"the server refused the pull: {description}")
    if "priority" in lower:  # "Priority must be between 0 and 9", and any future one
        return PriorityPolicyMismatch(
            status, description, f"the server refused the pull: {description}"
        )
    return None


def pin_id(raw_headers: bytes | None, headers: Any) -> str | None:
    """The ``Nats-Pin-Id`` of a delivered message, if any (the raw block is searched first,
    so that messages without it cost one substring test)."""
    if raw_headers is None or _PIN_ID_BYTES not in raw_headers or headers is None:
        return None
    value = headers.get(PIN_ID_HEADER)
    return str(value) if value else None


def _no_zero_time(value: dt.datetime | None) -> dt.datetime | None:
    # The server sends Go's zero time (year 1) for "never pinned".
    return None if value is None or value.year <= 1 else value


@attrs.define(kw_only=True)
class PriorityGroupState:
    """One priority group in consumer info: which client holds its pin, since when.

    ``pinned_client_id`` and ``pinned_ts`` are ``None`` while nobody is pinned (and for
    policies other than ``pinned_client``).
    """

    group: str = jfield(default="")
    pinned_client_id: str | None = jfield()
    pinned_ts: dt.datetime | None = jfield(kind=TIME, converter=_no_zero_time)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)
