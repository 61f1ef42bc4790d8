"""Consumer configuration and info, as the JetStream API carries them.

Every field of ADR-15's ``ConsumerConfig`` plus what current servers accept. All are optional:
``None`` means "not set", which matters twice. The server applies its own defaults to unset
fields, and when binding to an existing consumer only the fields the user set are compared with
the server's configuration (ADR-15 drift check), so defaults never read as drift.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import attrs

from headrace.jetstream.codec import DURATION, DURATIONS, TIME, jfield
from headrace.jetstream.names import check_consumer
from headrace.jetstream.stream_config import ClusterInfo


class AckPolicy(enum.StrEnum):
    NONE = "none"
    ALL = "all"
    EXPLICIT = "explicit"


class DeliverPolicy(enum.StrEnum):
    ALL = "all"
    LAST = "last"
    NEW = "new"
    BY_START_SEQUENCE = "by_start_sequence"
    BY_START_TIME = "by_start_time"
    LAST_PER_SUBJECT = "last_per_subject"


class ReplayPolicy(enum.StrEnum):
    INSTANT = "instant"
    ORIGINAL = "original"


def _check_consumer_name(_inst: object, attr: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None:
        check_consumer(attr.name, value)


@attrs.define(kw_only=True)
class ConsumerConfig:
    """A consumer's configuration. ``deliver_subject`` set means push, unset means pull."""

    name: str | None = jfield(validator=_check_consumer_name)
    durable_name: str | None = jfield(validator=_check_consumer_name)
    description: str | None = jfield()
    deliver_policy: DeliverPolicy | None = jfield(kind=DeliverPolicy)
    opt_start_seq: int | None = jfield()
    opt_start_time: dt.datetime | None = jfield(kind=TIME)
    ack_policy: AckPolicy | None = jfield(kind=AckPolicy)
    ack_wait: float | None = jfield(kind=DURATION)
    max_deliver: int | None = jfield()
    backoff: list[float] | None = jfield(kind=DURATIONS)
    filter_subject: str | None = jfield()
    filter_subjects: list[str] | None = jfield()
    replay_policy: ReplayPolicy | None = jfield(kind=ReplayPolicy)
    rate_limit_bps: int | None = jfield()
    sample_freq: str | None = jfield()
    max_waiting: int | None = jfield()
    max_ack_pending: int | None = jfield()
    flow_control: bool | None = jfield()
    idle_heartbeat: float | None = jfield(kind=DURATION)
    headers_only: bool | None = jfield()
    max_batch: int | None = jfield()
    max_expires: float | None = jfield(kind=DURATION)
    max_bytes: int | None = jfield()
    deliver_subject: str | None = jfield()
    deliver_group: str | None = jfield()
    inactive_threshold: float | None = jfield(kind=DURATION)
    num_replicas: int | None = jfield()
    mem_storage: bool | None = jfield()
    metadata: dict[str, str] | None = jfield()
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)

    @property
    def is_push(self) -> bool:
        return bool(self.deliver_subject)

    @property
    def consumer_name(self) -> str | None:
        """The name the consumer is (or will be) known by."""
        return self.durable_name or self.name

    def set_fields(self) -> dict[str, Any]:
        """The fields the user set (not ``None``), by attribute name."""
        return {
            f.name: getattr(self, f.name)
            for f in attrs.fields(type(self))
            if f.name != "extra" and getattr(self, f.name) is not None
        }


@attrs.define(kw_only=True)
class SequenceInfo:
    consumer_seq: int = jfield(default=0)
    stream_seq: int = jfield(default=0)
    last_active: dt.datetime | None = jfield(kind=TIME)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class ConsumerInfo:
    """``$JS.API.CONSUMER.INFO``: configuration and delivery state of a consumer."""

    stream_name: str = jfield()
    name: str = jfield()
    config: ConsumerConfig = jfield(kind=ConsumerConfig)
    created: dt.datetime | None = jfield(kind=TIME)
    delivered: SequenceInfo = jfield(kind=SequenceInfo, factory=SequenceInfo)
    ack_floor: SequenceInfo = jfield(kind=SequenceInfo, factory=SequenceInfo)
    num_ack_pending: int = jfield(default=0)
    num_redelivered: int = jfield(default=0)
    num_waiting: int = jfield(default=0)
    num_pending: int = jfield(default=0)
    cluster: ClusterInfo | None = jfield(kind=ClusterInfo)
    #: The server has interest registered on the push consumer's deliver subject.
    push_bound: bool = jfield(default=False)
    paused: bool | None = jfield()
    ts: dt.datetime | None = jfield(kind=TIME)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)
