"""Other JetStream API answers: the publish acknowledgement and the account's usage."""

from __future__ import annotations

from typing import Any

import attrs

from headrace.jetstream.codec import jfield


@attrs.define(kw_only=True)
class PubAck:
    """The stream's answer to a JetStream publish.

    The answer to the commit of an atomic batch (ADR-50) also has ``batch`` (the batch id) and
    ``count`` (how many messages the batch stored); ``seq`` is then the last one's sequence,
    the others are the ``count - 1`` just before it."""

    stream: str = jfield()
    seq: int = jfield()
    duplicate: bool = jfield(default=False)
    domain: str | None = jfield()
    batch: str | None = jfield()
    count: int | None = jfield()
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class AccountLimits:
    max_memory: int = jfield(default=-1)
    max_storage: int = jfield(default=-1)
    max_streams: int = jfield(default=-1)
    max_consumers: int = jfield(default=-1)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class AccountInfo:
    """``$JS.API.INFO``: what this account uses and may use."""

    memory: int = jfield(default=0)
    storage: int = jfield(default=0)
    streams: int = jfield(default=0)
    consumers: int = jfield(default=0)
    domain: str | None = jfield()
    limits: AccountLimits = jfield(kind=AccountLimits, factory=AccountLimits)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)
