"""Stream configuration and state, as the JetStream API carries them.

Durations are seconds, times aware datetimes, unset fields ``None`` (the server applies its
defaults). Only ``name`` is required.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import attrs

from headrace.jetstream.codec import DURATION, TIME, jfield
from headrace.jetstream.names import check_stream


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


def _check_stream_name(_inst: object, attr: attrs.Attribute[Any], value: str) -> None:
    check_stream(attr.name, value)


@attrs.define(kw_only=True)
class Placement:
    cluster: str | None = jfield()
    tags: list[str] | None = jfield()
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class StreamSource:
    """A stream to mirror or source from."""

    name: str = jfield()
    opt_start_seq: int | None = jfield()
    opt_start_time: dt.datetime | None = jfield(kind=TIME)
    filter_subject: str | None = jfield()
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class RePublish:
    src: str | None = jfield()
    dest: str = jfield()
    headers_only: bool | None = jfield()
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.define(kw_only=True)
class StreamConfig:
    """A stream's configuration (``$JS.API.STREAM.CREATE`` and friends)."""

    name: str = jfield(validator=_check_stream_name)
    description: str | None = jfield()
    subjects: list[str] | None = jfield()
    retention: RetentionPolicy | None = jfield(kind=RetentionPolicy)
    max_consumers: int | None = jfield()
    max_msgs: int | None = jfield()
    max_bytes: int | None = jfield()
    max_age: float | None = jfield(kind=DURATION)
    max_msgs_per_subject: int | None = jfield()
    max_msg_size: int | None = jfield()
    discard: DiscardPolicy | None = jfield(kind=DiscardPolicy)
    storage: StorageType | None = jfield(kind=StorageType)
    num_replicas: int | None = jfield()
    no_ack: bool | None = jfield()
    duplicate_window: float | None = jfield(kind=DURATION)
    placement: Placement | None = jfield(kind=Placement)
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
    first_seq: int | None = jfield()
    allow_msg_ttl: bool | None = jfield()
    subject_delete_marker_ttl: float | None = jfield(kind=DURATION)
    metadata: dict[str, str] | None = jfield()
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
