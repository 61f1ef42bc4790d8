"""Stream configuration and state, as the JetStream API carries them.

Durations are seconds, times aware datetimes, unset fields ``None`` (the server applies its
defaults). Only ``name`` is required.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import attrs

from headrace.jetstream import config_checks as check
from headrace.jetstream.codec import DURATION, LOCAL, TIME, jfield
from headrace.jetstream.errors import InvalidConfigValue
from headrace.jetstream.names import check_stream
from headrace.protocol.commands import check_subject


class RetentionPolicy(enum.StrEnum):
    LIMITS = "limits"
    INTEREST = "interest"
    WORK_QUEUE = "workqueue"


class StorageType(enum.StrEnum):
    FILE = "file"
    MEMORY = "memory"


class DiscardPolicy(enum.StrEnum):
    OLD = "old"
    NEW = "new"


class Compression(enum.StrEnum):
    NONE = "none"
    S2 = "s2"


class PersistMode(enum.StrEnum):
    """When a stored message is flushed to disk (nats-server 2.12+). ``ASYNC`` acknowledges a
    publish before the flush: faster, and a hard kill of the server can lose what was acked."""

    DEFAULT = "default"
    ASYNC = "async"


def _check_stream_name(_inst: object, attr: attrs.Attribute[Any], value: str) -> None:
    check_stream(attr.name, value)


def _check_placement(_inst: object, attr: attrs.Attribute[Any], value: Placement | None) -> None:
    if value is not None and value.preferred:
        raise InvalidConfigValue(
            attr.name,
            "preferred is for a leader step-down request; nats-server refuses it in a stream "
            "config (10052, 'preferred server not permitted in placement')",
        )


@attrs.define(kw_only=True)
class Placement:
    """Where a stream's replicas go: a cluster and servers carrying all ``tags``.
    ``preferred`` (nats-server 2.11+) names a server to lead; the server takes it only in a
    leader step-down request and refuses it in a stream config, so ``StreamConfig`` does too."""

    cluster: str | None = jfield()
    tags: list[str] | None = jfield()
    preferred: str | None = jfield()
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class SubjectTransformConfig:
    """A subject mapping: messages on ``src`` (a filter; empty means all) are stored, or
    sourced, under ``dest``, which may use the server's mapping functions."""

    src: str = jfield(default="", validator=check.subject_filter)
    dest: str = jfield(default="", validator=check.destination)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class ExternalStream:
    """A source or mirror in another account or JetStream domain, reached through its API
    prefix (``api``, e.g. ``$JS.hub.API``) with deliveries on the ``deliver`` prefix."""

    api: str = jfield(validator=check.destination)
    deliver: str | None = jfield()
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class StreamConsumerSource:
    """nats-server 2.14+: a durable consumer the server uses (and keeps) on the origin to
    source or mirror through, delivering on ``deliver_subject`` (a literal subject)."""

    name: str | None = jfield()
    deliver_subject: str | None = jfield(validator=check.subject_filter)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class StreamConsumerLimits:
    """Defaults and ceilings for the stream's consumers: a consumer that sets none gets these,
    and the server refuses one that asks for more."""

    inactive_threshold: float | None = jfield(kind=DURATION, validator=check.duration)
    max_ack_pending: int | None = jfield(validator=check.limit)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class StreamSource:
    """A stream to mirror or source from."""

    name: str = jfield()
    opt_start_seq: int | None = jfield()
    opt_start_time: dt.datetime | None = jfield(kind=TIME)
    filter_subject: str | None = jfield()
    #: Instead of ``filter_subject``: which subjects to take, each stored under its ``dest``.
    subject_transforms: list[SubjectTransformConfig] | None = jfield(
        kind=SubjectTransformConfig, many=True
    )
    external: ExternalStream | None = jfield(kind=ExternalStream)
    consumer: StreamConsumerSource | None = jfield(kind=StreamConsumerSource)
    #: The JetStream domain the stream is in, as nats.go's ``Domain``: shorthand for
    #: ``external=ExternalStream(api="$JS.<domain>.API")`` (give one or the other). The
    #: client's alone: the server is sent the ``external`` it stands for.
    domain: str | None = attrs.field(default=None, metadata={LOCAL: True})
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)

    def __attrs_post_init__(self) -> None:
        if self.domain is not None:
            if self.external is not None:
                raise ValueError("give a source's domain or its external, not both")
            check_subject(self.domain, what="JetStream domain")
            self.external = ExternalStream(api=f"$JS.{self.domain}.API")


@attrs.define(kw_only=True)
class RePublish:
    """After a message is stored, the server publishes it again on ``dest`` (with its stream
    sequence in headers); ``headers_only`` leaves the payload out."""

    src: str | None = jfield(validator=check.subject_filter)
    dest: str = jfield(default="", validator=check.destination)
    headers_only: bool | None = jfield()
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class StreamConfig:
    """A stream's configuration (``$JS.API.STREAM.CREATE`` and friends)."""

    name: str = jfield(validator=_check_stream_name)
    description: str | None = jfield()
    subjects: list[str] | None = jfield()
    retention: RetentionPolicy | None = jfield(kind=RetentionPolicy)
    max_consumers: int | None = jfield(validator=check.limit)
    max_msgs: int | None = jfield(validator=check.limit)
    max_bytes: int | None = jfield(validator=check.limit)
    max_age: float | None = jfield(kind=DURATION, validator=check.duration)
    max_msgs_per_subject: int | None = jfield(validator=check.limit)
    max_msg_size: int | None = jfield(validator=check.limit)
    discard: DiscardPolicy | None = jfield(kind=DiscardPolicy)
    storage: StorageType | None = jfield(kind=StorageType)
    num_replicas: int | None = jfield(validator=check.replicas)
    no_ack: bool | None = jfield()
    duplicate_window: float | None = jfield(kind=DURATION, validator=check.duration)
    placement: Placement | None = jfield(kind=Placement, validator=_check_placement)
    mirror: StreamSource | None = jfield(kind=StreamSource)
    sources: list[StreamSource] | None = jfield(kind=StreamSource, many=True)
    sealed: bool | None = jfield()
    deny_delete: bool | None = jfield()
    deny_purge: bool | None = jfield()
    allow_rollup_hdrs: bool | None = jfield()
    allow_direct: bool | None = jfield()
    mirror_direct: bool | None = jfield()
    republish: RePublish | None = jfield(kind=RePublish)
    discard_new_per_subject: bool | None = jfield()
    compression: Compression | None = jfield(kind=Compression)
    first_seq: int | None = jfield(validator=check.non_negative)
    allow_msg_ttl: bool | None = jfield()
    #: ADR-50 (nats-server 2.12+): accept atomic batch publishes (:class:`AtomicBatch`). A
    #: mirror cannot have it; a stream update may turn it on and off.
    allow_atomic: bool | None = jfield()
    subject_delete_marker_ttl: float | None = jfield(kind=DURATION, validator=check.duration)
    #: nats-server 2.12+: counter streams (``Nats-Incr``), scheduled messages, the flush mode.
    allow_msg_counter: bool | None = jfield()
    allow_msg_schedules: bool | None = jfield()
    persist_mode: PersistMode | None = jfield(kind=PersistMode)
    #: nats-server 2.14+: fast (non-atomic) batch publishing.
    allow_batched: bool | None = jfield()
    #: Applied to every subject a message arrives on, before it is stored.
    subject_transform: SubjectTransformConfig | None = jfield(kind=SubjectTransformConfig)
    consumer_limits: StreamConsumerLimits | None = jfield(kind=StreamConsumerLimits)
    #: User metadata. The server adds ``_nats.*`` keys (required API level, its version) to
    #: what it answers and recomputes them on every create and update, so sending them back
    #: is harmless and changing them has no effect.
    metadata: dict[str, str] | None = jfield(validator=check.text_map)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class StreamState:
    messages: int = jfield(default=0)
    bytes: int = jfield(default=0)
    first_seq: int = jfield(default=0)
    first_ts: dt.datetime | None = jfield(kind=TIME)
    last_seq: int = jfield(default=0)
    last_ts: dt.datetime | None = jfield(kind=TIME)
    consumer_count: int = jfield(default=0)
    num_deleted: int | None = jfield()
    num_subjects: int | None = jfield()
    #: Messages per subject, when asked for (``stream_info(subjects_filter=...)``): every
    #: subject matching the filter, all pages of them.
    subjects: dict[str, int] | None = jfield()
    #: The sequences deleted between the first and the last, when asked for
    #: (``stream_info(deleted_details=True)``).
    deleted: list[int] | None = jfield()
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class PeerInfo:
    name: str = jfield(default="")
    current: bool = jfield(default=False)
    offline: bool | None = jfield()
    active: float | None = jfield(kind=DURATION)
    lag: int | None = jfield()
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class ClusterInfo:
    name: str | None = jfield()
    leader: str | None = jfield()
    replicas: list[PeerInfo] | None = jfield(kind=PeerInfo, many=True)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class StreamInfo:
    """``$JS.API.STREAM.INFO``: configuration, state and cluster placement."""

    config: StreamConfig = jfield(kind=StreamConfig)
    created: dt.datetime | None = jfield(kind=TIME)
    state: StreamState = jfield(kind=StreamState, factory=StreamState)
    cluster: ClusterInfo | None = jfield(kind=ClusterInfo)
    ts: dt.datetime | None = jfield(kind=TIME)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)
