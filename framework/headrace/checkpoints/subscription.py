"""Subscriptions and subscription groups: which messages make work for which handler.

A subscription matches messages by subject (NATS wildcards: ``orders.*.>``) and/or by message
type (the value of a header, ``Headrace-Type`` by default); for a matching message it names the
*entity stream*: the first ``entity_tokens`` tokens of the subject (``orders.42`` of
``orders.42.created``), whose messages it handles in order. A subject needs at least one
token past the entity's (workers read an entity's messages back as ``<entity>.>``). A group is
a named set of subscriptions that one host (or several sharing the work) runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import attrs

from headrace.checkpoints.checkpoint import CheckpointId

DEFAULT_TYPE_HEADER = "Headrace-Type"

#: ``async def handler(msg)``, or ``async def handler(msg, ctx)`` to get the
#: :class:`~headrace.checkpoints.fencing.HandlerContext` (reservation held? fencing token).
Handler = Callable[..., Awaitable[None]]


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` one or more at the end."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def _names(_inst: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if not value or "/" in value:
        raise ValueError(f"{attribute.name} must be a non-empty name without '/', not {value!r}")


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)  # subjects="orders.>": one pattern, not its letters
    return tuple(value)


def _string_set(value: Iterable[str]) -> frozenset[str]:
    return frozenset(_strings(value))


@attrs.frozen(slots=True, kw_only=True)
class Subscription:
    """A handler of the messages that match it (by subject and type), run in order per entity
    (the leading ``entity_tokens`` of the subject), each entity's place kept in a checkpoint."""

    name: str = attrs.field(validator=_names)
    #: Subject patterns; a message matches if its subject matches one (none: any subject).
    subjects: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    #: Message types; a message matches if its type header holds one (none: any type).
    types: frozenset[str] = attrs.field(default=frozenset(), converter=_string_set)
    #: Leading subject tokens that name the entity stream.
    entity_tokens: int = 2
    handler: Handler | None = attrs.field(default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.subjects and not self.types:
            raise ValueError(f"subscription {self.name!r} matches nothing: give subjects or types")
        if self.entity_tokens < 1:
            raise ValueError(f"entity_tokens must be at least 1, not {self.entity_tokens}")

    def entity(self, subject: str, message_type: str | None) -> str | None:
        """The entity stream this message belongs to for this subscription, or None when the
        subscription does not match it (or the subject is too short to name an entity)."""
        if self.types and message_type not in self.types:
            return None
        if self.subjects and not any(subject_matches(p, subject) for p in self.subjects):
            return None
        tokens = subject.split(".")
        if len(tokens) <= self.entity_tokens:
            return None  # an entity's messages are <entity>.<more>: read back as <entity>.>
        return ".".join(tokens[: self.entity_tokens])


def _subscriptions(value: Iterable[Subscription]) -> tuple[Subscription, ...]:
    return tuple(value)


@attrs.frozen(slots=True, kw_only=True)
class SubscriptionGroup:
    """Subscriptions that share one global consumer of a stream and one set of workers: each
    message goes to every subscription of the group that matches it."""

    name: str = attrs.field(validator=_names)
    subscriptions: tuple[Subscription, ...] = attrs.field(converter=_subscriptions)
    #: The header that carries a message's type.
    type_header: str = DEFAULT_TYPE_HEADER

    def __attrs_post_init__(self) -> None:
        names = [s.name for s in self.subscriptions]
        if not names:
            raise ValueError(f"subscription group {self.name!r} has no subscriptions")
        if len(set(names)) != len(names):
            raise ValueError(f"subscription group {self.name!r} names a subscription twice")

    def checkpoints_for(self, subject: str, message_type: str | None) -> list[CheckpointId]:
        """The checkpoints a message makes work for."""
        ids = []
        for sub in self.subscriptions:
            entity = sub.entity(subject, message_type)
            if entity is not None:
                ids.append(CheckpointId(self.name, sub.name, entity))
        return ids

    def subscription(self, name: str) -> Subscription:
        for sub in self.subscriptions:
            if sub.name == name:
                return sub
        raise KeyError(f"no subscription {name!r} in group {self.name!r}")


def versions(
    group: SubscriptionGroup, messages: Iterable[tuple[str, str | None, int]]
) -> dict[CheckpointId, int]:
    """For (subject, type, stream sequence) triples, the highest sequence per checkpoint: the
    version each checkpoint is raised to for a batch (one write per checkpoint, not per
    message)."""
    return {cid: max(seqs) for cid, seqs in events_by_checkpoint(group, messages).items()}


def events_by_checkpoint(
    group: SubscriptionGroup, messages: Iterable[tuple[str, str | None, int]]
) -> dict[CheckpointId, list[int]]:
    """For (subject, type, stream sequence) triples, the sequences each checkpoint gets: the
    global consumer raises each version to the highest and counts the events (one write per
    checkpoint per batch, not per message)."""
    out: dict[CheckpointId, list[int]] = {}
    for subject, message_type, seq in messages:
        for cid in group.checkpoints_for(subject, message_type):
            out.setdefault(cid, []).append(seq)
    return out
