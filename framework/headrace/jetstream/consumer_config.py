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

from headrace.jetstream import config_checks as check
from headrace.jetstream.codec import DURATION, DURATIONS, TIME, jfield
from headrace.jetstream.errors import PriorityGroupConfigError
from headrace.jetstream.names import check_consumer
from headrace.jetstream.pause import check_config_pause
from headrace.jetstream.priority import PriorityGroupState, PriorityPolicy, check_group_name
from headrace.jetstream.stream_config import ClusterInfo


class AckPolicy(enum.StrEnum):
    NONE = "none"
    ALL = "all"
    EXPLICIT = "explicit"
    #: nats-server 2.14+: acked by the answers to flow control, as ``all`` is by an ack: the
    #: policy of a durable push consumer that a stream sources or mirrors through
    #: (``StreamSource(consumer=StreamConsumerSource(...))``). Needs ``deliver_subject``,
    #: ``flow_control``, an ``idle_heartbeat`` of 1 s and a ``max_ack_pending``.
    FLOW_CONTROL = "flow_control"


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


def _check_priority_groups(
    _inst: object, _attr: attrs.Attribute[Any], value: list[str] | None
) -> None:
    if value is not None:
        for name in value:
            check_group_name(name)


def _policy(value: PriorityPolicy | str | None) -> PriorityPolicy | None:
    if value is None or isinstance(value, PriorityPolicy):
        return value
    try:
        return PriorityPolicy(value)
    except ValueError:
        known = ", ".join(p.value for p in PriorityPolicy)
        raise PriorityGroupConfigError(
            400, 10025, f"unknown priority_policy {value!r}: one of {known}"
        ) from None


@attrs.define(kw_only=True)
class ConsumerConfig:
    """A consumer's configuration. ``deliver_subject`` set means push, unset means pull."""

    name: str | None = jfield(validator=_check_consumer_name)
    durable_name: str | None = jfield(validator=_check_consumer_name)
    description: str | None = jfield()
    deliver_policy: DeliverPolicy | None = jfield(kind=DeliverPolicy)
    opt_start_seq: int | None = jfield(validator=check.non_negative)
    opt_start_time: dt.datetime | None = jfield(kind=TIME)
    ack_policy: AckPolicy | None = jfield(kind=AckPolicy)
    ack_wait: float | None = jfield(kind=DURATION, validator=check.duration)
    max_deliver: int | None = jfield(validator=check.limit)
    backoff: list[float] | None = jfield(kind=DURATIONS, validator=check.durations)
    filter_subject: str | None = jfield()
    filter_subjects: list[str] | None = jfield()
    replay_policy: ReplayPolicy | None = jfield(kind=ReplayPolicy)
    rate_limit_bps: int | None = jfield(validator=check.non_negative)
    sample_freq: str | None = jfield(validator=check.sample_frequency)
    max_waiting: int | None = jfield(validator=check.non_negative)
    max_ack_pending: int | None = jfield(validator=check.limit)
    flow_control: bool | None = jfield()
    idle_heartbeat: float | None = jfield(kind=DURATION, validator=check.duration)
    headers_only: bool | None = jfield()
    max_batch: int | None = jfield(validator=check.non_negative)
    max_expires: float | None = jfield(kind=DURATION, validator=check.duration)
    max_bytes: int | None = jfield(validator=check.non_negative)
    deliver_subject: str | None = jfield()
    deliver_group: str | None = jfield()
    inactive_threshold: float | None = jfield(kind=DURATION, validator=check.duration)
    num_replicas: int | None = jfield(validator=check.replicas)
    mem_storage: bool | None = jfield()
    #: User metadata; the server's ``_nats.*`` keys are treated as on a stream's (see
    #: :attr:`StreamConfig.metadata`).
    metadata: dict[str, str] | None = jfield(validator=check.text_map)
    #: ADR-42 (pull consumers, nats-server 2.11+): the groups every pull must name, the
    #: policy that picks among them, and how long a ``pinned_client`` pin outlives its last
    #: pull (the server's default: 120 s).
    priority_groups: list[str] | None = jfield(validator=_check_priority_groups)
    priority_policy: PriorityPolicy | None = jfield(kind=PriorityPolicy, converter=_policy)
    priority_timeout: float | None = jfield(kind=DURATION)
    #: nats-server 2.11+: the consumer delivers nothing until then (an aware datetime; a
    #: time already past means not paused). See :mod:`headrace.jetstream.pause`.
    pause_until: dt.datetime | None = jfield(kind=TIME, validator=check_config_pause)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)

    def __attrs_post_init__(self) -> None:
        self._check_priority()
        self._check_flow_control()

    def _check_flow_control(self) -> None:
        """What the server asks of the ``flow_control`` ack policy, said before sending."""
        if self.ack_policy is not AckPolicy.FLOW_CONTROL:
            return
        missing = [
            what
            for what, ok in (
                ("a deliver_subject (a push consumer)", bool(self.deliver_subject)),
                ("flow_control=True", self.flow_control is True),
                ("idle_heartbeat=1.0", self.idle_heartbeat == 1.0),
                ("a max_ack_pending", bool(self.max_ack_pending and self.max_ack_pending > 0)),
            )
            if not ok
        ]
        if missing:
            raise ValueError(
                "ack policy flow_control (a consumer a stream sources through) needs "
                + ", ".join(missing)
            )

    def _check_priority(self) -> None:
        """Refuse what the server refuses of priority groups, with its err_code, before
        anything is sent (a create would otherwise fail with the same words later)."""
        active = self.priority_policy not in (None, PriorityPolicy.NONE)
        if active and not self.priority_groups:
            raise PriorityGroupConfigError(
                400, 10159, f"priority_policy {self.priority_policy} needs priority_groups"
            )
        if self.priority_groups and not active:
            raise PriorityGroupConfigError(
                400,
                10196,
                "priority_groups need a priority_policy: overflow, pinned_client or prioritized",
            )
        if self.priority_timeout is not None:
            if not active:
                raise PriorityGroupConfigError(
                    400, 10197, "priority_timeout needs a priority_policy (pinned_client)"
                )
            if not self.priority_timeout > 0:
                raise PriorityGroupConfigError(
                    400, 10197, f"priority_timeout must be positive, not {self.priority_timeout}"
                )
        if self.priority_groups and self.deliver_subject:
            raise PriorityGroupConfigError(
                400, 10178, "priority groups are for pull consumers: leave deliver_subject unset"
            )

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
    #: nats-server 2.11+: the consumer is paused now (until ``config.pause_until``) ...
    paused: bool | None = jfield()
    #: ... for this many more seconds, as the server counted them when it answered.
    pause_remaining: float | None = jfield(kind=DURATION)
    #: ADR-42: each priority group's state (who holds the pin, since when).
    priority_groups: list[PriorityGroupState] | None = jfield(kind=PriorityGroupState, many=True)
    ts: dt.datetime | None = jfield(kind=TIME)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)
