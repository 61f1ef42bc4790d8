"""JetStream Key-Value buckets (ADR-8): a bucket is a stream, a key a subject, a revision a
stream sequence.

Bucket ``B`` is the stream ``KV_B`` capturing ``$KV.B.>``; key ``a.b`` is the subject
``$KV.B.a.b``. Every write is a JetStream publish whose stream sequence is the entry's
*revision*. The stream keeps ``history`` messages per subject (``max_msgs_per_subject``), so the
last message of a subject is the key's current state: a value, or a delete / purge marker (a
message with the header ``KV-Operation: DEL`` or ``PURGE``, or a server-placed
``Nats-Marker-Reason``).

Compare-and-set is the server's, never the client's: :meth:`KeyValue.create`,
:meth:`KeyValue.update` and the conditional :meth:`KeyValue.delete` / :meth:`KeyValue.purge`
publish with ``Nats-Expected-Last-Subject-Sequence``, and the stream accepts the write only if
the subject's last sequence is that revision (0: no message). A refusal comes back as
err_code 10071 (``JSStreamWrongLastSequenceErrF``, "wrong last sequence: N", from a single
server or the leader's store check) or 10164 (``JSStreamWrongLastSequenceConstantErr``, from a
replicated stream while another conditional write on the subject is in flight); both become
:class:`WrongRevision` (:class:`KeyExists` for a create). Reads go through Direct Get (ADR-31),
which may answer from a lagging replica: a stale read can make a compare-and-set fail, never
succeed wrongly, so the usual loop (read, compute, update, on :class:`WrongRevision` read again)
is safe.

Limit markers and per-key TTLs (ADR-48) ride on ADR-43's per-message TTL: a bucket with
``limit_marker_ttl`` is a stream with ``allow_msg_ttl`` and that ``subject_delete_marker_ttl``.
:meth:`KeyValue.create` and :meth:`KeyValue.purge` (only those, as ADR-48 says: a TTL on a
put could let older revisions outlive the newer one) take a ``ttl``; when the server removes a
key's last entry for its age it places a ``Nats-Marker-Reason: MaxAge`` marker, kept
``limit_marker_ttl``, which reads as a PURGE.

Through a JetStream domain or an account import's API prefix, writes go to
``<prefix>.$KV.<bucket>.<key>`` (ADR-19); reads and watches go through the API prefix like
every other request.

A mirror bucket (``KeyValueConfig.mirror``) is read through the mirror and written to the
origin, through the mirror's ``external.api`` when the origin is in another domain or account.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs

from headrace.errors import InvalidSubjectError
from headrace.jetstream.api import DEFAULT_API_PREFIX
from headrace.jetstream.codec import DecodeError
from headrace.jetstream.consumer_config import ConsumerConfig, DeliverPolicy
from headrace.jetstream.context import JetStream
from headrace.jetstream.direct_batch import MAX_MULTI_SUBJECTS, MultiLastGet
from headrace.jetstream.errors import (
    InvalidConfigValue,
    JetStreamAPIError,
    JetStreamError,
    JetStreamUnavailable,
    MessageNotFound,
    MessageTTLDisabled,
    NoStreamForSubject,
    StreamAlreadyExists,
    StreamNotFound,
)
from headrace.jetstream.message import JsMsg
from headrace.jetstream.msg_ttl import MIN_TTL, MessageTTL
from headrace.jetstream.names import check_stream
from headrace.jetstream.push import PushSubscription
from headrace.jetstream.stored_message import StoredMessage
from headrace.jetstream.stream_config import (
    Compression,
    DiscardPolicy,
    Placement,
    RePublish,
    StorageType,
    StreamConfig,
    StreamInfo,
    StreamSource,
    SubjectTransformConfig,
)
from headrace.protocol.commands import check_subject
from headrace.protocol.headers import Headers

STREAM_PREFIX = "KV_"
SUBJECT_PREFIX = "$KV"
MAX_HISTORY = 64
#: ADR-8: with a TTL, the duplicate window is the TTL, capped at two minutes.
MAX_DUPLICATE_WINDOW = 120.0
#: How many conditional writes a create makes at most, each on a newer delete marker.
CREATE_ATTEMPTS = 8
#: ADR-8 and nats.go: the markers :meth:`KeyValue.purge_deletes` keeps by default (seconds).
PURGE_DELETES_OLDER_THAN = 30 * 60.0
#: The JetStream API level (``$JS.API.INFO``) from which servers have limit markers (2.11).
LIMIT_MARKERS_API_LEVEL = 1

KV_OPERATION = "KV-Operation"
MARKER_REASON = "Nats-Marker-Reason"
ROLLUP = "Nats-Rollup"

#: err_codes of a refused ``Nats-Expected-Last-Subject-Sequence`` (see the module docs).
WRONG_LAST_SEQUENCE_CODES = (10071, 10164)

_BUCKET_RE = re.compile(r"[a-zA-Z0-9_-]+")
_KEY_TOKEN_RE = re.compile(r"[-/_=a-zA-Z0-9]+")
_CURRENT_SEQ_RE = re.compile(r"wrong last sequence: (\d+)")


# -- errors ---------------------------------------------------------------------------------------


class KeyValueError(JetStreamError):
    """Base of the Key-Value errors."""


class InvalidBucketName(KeyValueError, ValueError):
    """A bucket name outside ADR-8's ``[a-zA-Z0-9_-]+``."""


class InvalidKey(KeyValueError, ValueError):
    """A key (or key pattern) that breaks ADR-8's rules; the message says which."""


class BucketNotFound(KeyValueError):
    """No stream ``KV_<bucket>`` (or one that is not a Key-Value bucket)."""


class BucketExists(KeyValueError):
    """Creating a bucket that exists with another configuration (the server's 10058)."""


class KeyNotFound(KeyValueError):
    """The key has no value: never written, removed by history or TTL limits, or its last
    entry is a delete or purge marker (then ``entry`` is that marker)."""

    def __init__(self, bucket: str, key: str, entry: Entry | None = None, *, why: str = "") -> None:
        if why:
            reason = why
        elif entry is not None:
            reason = f"deleted ({entry.operation.value} at revision {entry.revision})"
        else:
            reason = "no such key"
        super().__init__(f"key {key!r} not found in bucket {bucket!r}: {reason}")
        self.bucket = bucket
        self.key = key
        self.entry = entry


class WrongRevision(KeyValueError):
    """A conditional write was refused: the key's last revision is not ``expected``.

    Raised when the server answers ``Nats-Expected-Last-Subject-Sequence`` with err_code 10071
    or 10164. ``current`` is the key's last revision when the server said it (10071's "wrong
    last sequence: N"; 0 means the key has no message), else ``None``. Nothing was written:
    read the key again and retry with its revision.
    """

    def __init__(
        self,
        bucket: str,
        key: str,
        expected: int,
        current: int | None,
        message: str | None = None,
    ) -> None:
        now = f"it is at revision {current}" if current is not None else "it has moved on"
        super().__init__(
            message
            or f"key {key!r} in bucket {bucket!r} is not at revision {expected} ({now}): read "
            "it again and retry with its current revision"
        )
        self.bucket = bucket
        self.key = key
        self.expected = expected
        self.current = current


class KeyTTLDisabled(KeyValueError, MessageTTLDisabled):
    """A ``ttl`` on :meth:`KeyValue.create` or :meth:`KeyValue.purge` in a bucket without
    limit markers: its stream refuses per-message TTLs (the server's 10166). Nothing was
    written. Give the bucket a ``limit_marker_ttl`` (``update_key_value`` can turn it on, never
    off), or write without ``ttl``."""

    def __init__(self, bucket: str, code: int, err_code: int) -> None:
        MessageTTLDisabled.__init__(
            self,
            code,
            err_code,
            f"bucket {bucket!r} has no per-key TTLs (its stream refuses Nats-TTL): set its "
            "limit_marker_ttl to turn them on, or write without ttl",
        )
        self.bucket = bucket


class LimitMarkersNotSupported(KeyValueError):
    """A ``limit_marker_ttl`` asked of a server whose JetStream API level is below 1 (before
    nats-server 2.11): it would ignore the setting and make a bucket whose keys never expire
    and whose watchers never hear of removals. Nothing was created or changed."""


class KeyExists(WrongRevision):
    """:meth:`KeyValue.create` found a value (not a delete or purge marker) for the key.

    A :class:`WrongRevision` with ``expected`` 0, so a compare-and-set loop that catches
    :class:`WrongRevision` covers creates too.
    """

    def __init__(self, bucket: str, key: str, current: int | None) -> None:
        at = f" at revision {current}" if current is not None else ""
        super().__init__(
            bucket,
            key,
            0,
            current,
            f"key {key!r} already exists in bucket {bucket!r}{at}: update() it with its "
            "revision, or delete it first",
        )


# -- names and keys -------------------------------------------------------------------------------


def check_bucket_name(bucket: str) -> str:
    """``bucket`` if it is a valid bucket name, else :class:`InvalidBucketName`."""
    if not isinstance(bucket, str) or not _BUCKET_RE.fullmatch(bucket):
        raise InvalidBucketName(
            f"invalid bucket name {bucket!r}: use letters, digits, '_' and '-' only"
        )
    return bucket


def check_key(key: str) -> str:
    """``key`` if it may be written or read: tokens of ``[-/_=a-zA-Z0-9]`` separated by
    single dots (so no leading, trailing or double dot, and no wildcard); else
    :class:`InvalidKey`."""
    if not isinstance(key, str) or not key:
        raise InvalidKey(f"invalid key {key!r}: a key must be a non-empty string")
    for token in key.split("."):
        if not token:
            raise InvalidKey(
                f"invalid key {key!r}: it must not start or end with '.', nor contain '..'"
            )
        if not _KEY_TOKEN_RE.fullmatch(token):
            what = "wildcards are only for watch()" if token in ("*", ">") else "characters"
            raise InvalidKey(
                f"invalid key {key!r}: use letters, digits and '-/_=' in dot-separated "
                f"tokens ({what})"
            )
    return key


def check_subject_key(key: str) -> str:
    """``key`` if it can be a key's subject at all (``validate_keys=False``): non-empty
    tokens without whitespace, control characters or wildcards; else :class:`InvalidKey`."""
    try:
        check_subject(key, what="key")
    except InvalidSubjectError as exc:
        raise InvalidKey(str(exc)) from None
    return key


def check_subject_key_pattern(pattern: str) -> str:
    """A watch pattern of such keys: ``*`` and a last ``>`` allowed."""
    try:
        check_subject(pattern, wildcards=True, what="key pattern")
    except InvalidSubjectError as exc:
        raise InvalidKey(str(exc)) from None
    return pattern


def check_key_pattern(pattern: str) -> str:
    """``pattern`` if it may filter a watch: a key whose tokens may also be ``*`` (one token)
    or, last, ``>`` (the rest); else :class:`InvalidKey`."""
    if not isinstance(pattern, str) or not pattern:
        raise InvalidKey(f"invalid key pattern {pattern!r}: it must be a non-empty string")
    tokens = pattern.split(".")
    for i, token in enumerate(tokens):
        if token == "*" or (token == ">" and i == len(tokens) - 1):
            continue
        if not token:
            raise InvalidKey(
                f"invalid key pattern {pattern!r}: it must not start or end with '.', nor "
                "contain '..'"
            )
        if not _KEY_TOKEN_RE.fullmatch(token):
            raise InvalidKey(
                f"invalid key pattern {pattern!r}: tokens are letters, digits and '-/_=', "
                "or a whole-token '*', or a final '>'"
            )
    return pattern


# -- values ---------------------------------------------------------------------------------------


class Operation(enum.StrEnum):
    """What an entry records: a value, a delete marker or a purge marker."""

    PUT = "PUT"
    DEL = "DEL"
    PURGE = "PURGE"


def operation_of(headers: Headers | None) -> Operation:
    """The operation a stored message stands for (ADR-8 "Retrieving Values").

    Any ``KV-Operation`` value means the key was removed (``PURGE`` a purge, anything else a
    delete); without one, a server-placed ``Nats-Marker-Reason`` does the same (``MaxAge`` and
    ``Purge`` a purge, ``Remove`` or an unknown reason a delete).
    """
    if not headers:
        return Operation.PUT
    op = headers.get(KV_OPERATION)
    if op:
        return Operation.PURGE if op == Operation.PURGE.value else Operation.DEL
    reason = headers.get(MARKER_REASON)
    if reason:
        return Operation.PURGE if reason in ("MaxAge", "Purge") else Operation.DEL
    return Operation.PUT


@attrs.frozen(kw_only=True)
class Entry:
    """One revision of a key: its value (empty for markers), when it was stored, and what it
    records. ``delta`` is how many messages the watch still had to deliver after this one
    (0 for the latest; 0 from ``get``)."""

    bucket: str
    key: str
    value: bytes = attrs.field(repr=False)
    revision: int
    created: dt.datetime
    delta: int = 0
    operation: Operation = Operation.PUT


@attrs.frozen(kw_only=True)
class KeyValueConfig:
    """A bucket's configuration; ``create_key_value`` turns it into the stream of ADR-8.

    ``history`` is how many revisions each key keeps (1 to 64); ``ttl`` (seconds, the stream's
    ``max_age``) how long any revision is kept; ``max_value_size`` and ``max_bytes`` cap one
    value and the whole bucket; ``None`` leaves a limit unset.

    ``limit_marker_ttl`` (seconds, at least 1; ADR-48) turns on per-key TTLs and limit
    markers: when a key's last entry is removed for its age (the bucket's ``ttl`` or the key's
    own), the server leaves a marker that watchers see as a PURGE, kept this long. Once on, it
    cannot be turned off. With ``history`` above 1 the server also raises any shorter per-key
    TTL to this value.
    """

    bucket: str = attrs.field(validator=lambda _i, _a, v: check_bucket_name(v))
    description: str | None = None
    history: int = attrs.field(default=1)
    ttl: float | None = attrs.field(default=None)
    max_value_size: int | None = None
    max_bytes: int | None = None
    storage: StorageType = StorageType.FILE
    replicas: int = 1
    compression: bool = False
    metadata: dict[str, str] | None = attrs.field(default=None, hash=False)
    limit_marker_ttl: float | None = attrs.field(default=None)
    #: Where the bucket's replicas go, and what the server republishes after each write.
    placement: Placement | None = None
    republish: RePublish | None = None
    #: What flows into this bucket. A source without ``subject_transforms`` or
    #: ``filter_subject`` names a bucket (``"A"``, or its stream ``"KV_A"``): its stream is
    #: sourced with the transform that stores that bucket's keys under this one's subjects
    #: (ADR-8 "sources"). A source with either names a stream and is used as given (its
    #: transforms must map to ``$KV.<this bucket>.``). ``create_key_value`` refuses a
    #: source (of this account and domain) that names no stream.
    sources: list[StreamSource] | None = attrs.field(default=None, hash=False)
    #: The bucket this one mirrors (``name``: a bucket name): a read-only copy with the
    #: origin's keys, read here, written through to the origin (see docs/kv.md).
    mirror: StreamSource | None = attrs.field(default=None)

    @sources.validator
    def _check_sources(self, _attr: attrs.Attribute[Any], value: list[StreamSource] | None) -> None:
        for source in value or ():
            if _as_given(source):
                check_stream("sources", source.name)
            else:
                check_bucket_name(source.name.removeprefix(STREAM_PREFIX))

    @mirror.validator
    def _check_mirror(self, _attr: attrs.Attribute[Any], value: StreamSource | None) -> None:
        if value is not None:
            check_bucket_name(value.name)
            if self.sources:
                raise InvalidConfigValue("mirror", "a bucket mirrors one bucket or has sources")

    @limit_marker_ttl.validator
    def _check_limit_marker_ttl(self, _attr: attrs.Attribute[Any], value: float | None) -> None:
        if value is not None and not value >= MIN_TTL:
            raise ValueError(
                f"limit_marker_ttl must be at least {MIN_TTL:g} second (or None: no limit "
                f"markers), not {value!r}"
            )

    @history.validator
    def _check_history(self, _attr: attrs.Attribute[Any], value: int) -> None:
        if not 1 <= value <= MAX_HISTORY:
            raise ValueError(f"history must be 1 to {MAX_HISTORY} revisions per key, not {value}")

    @ttl.validator
    def _check_ttl(self, _attr: attrs.Attribute[Any], value: float | None) -> None:
        if value is not None and value < 0:
            raise ValueError(
                f"ttl must not be negative (seconds; None or 0: no limit), not {value}"
            )

    def stream_config(self) -> StreamConfig:
        """The stream of this bucket, per ADR-8 "Buckets"."""
        ttl = self.ttl or None
        return StreamConfig(
            name=STREAM_PREFIX + self.bucket,
            description=self.description,
            subjects=None if self.mirror else [f"{SUBJECT_PREFIX}.{self.bucket}.>"],
            max_msgs_per_subject=self.history,
            max_age=ttl,
            duplicate_window=min(ttl, MAX_DUPLICATE_WINDOW) if ttl else None,
            max_msg_size=self.max_value_size,
            max_bytes=self.max_bytes,
            storage=self.storage,
            num_replicas=self.replicas,
            discard=DiscardPolicy.NEW,
            allow_rollup_hdrs=True,
            deny_delete=True,
            allow_direct=True,
            compression=Compression.S2 if self.compression else None,
            metadata=dict(self.metadata) if self.metadata else None,
            allow_msg_ttl=True if self.limit_marker_ttl else None,
            subject_delete_marker_ttl=self.limit_marker_ttl,
            placement=self.placement,
            republish=self.republish,
            sources=[self._stream_source(s) for s in self.sources] if self.sources else None,
            mirror=(
                attrs.evolve(self.mirror, name=STREAM_PREFIX + self.mirror.name)
                if self.mirror
                else None
            ),
            mirror_direct=True if self.mirror else None,
        )

    def _stream_source(self, source: StreamSource) -> StreamSource:
        """A stream source as given (it has transforms or a filter: issue 24, a plain
        stream's name was rewritten to ``KV_<name>`` and nothing arrived), else that of
        bucket ``source.name``: its stream, its keys moved to ours."""
        if _as_given(source):
            return source
        bucket = source.name.removeprefix(STREAM_PREFIX)
        transforms = [
            SubjectTransformConfig(
                src=f"{SUBJECT_PREFIX}.{bucket}.>", dest=f"{SUBJECT_PREFIX}.{self.bucket}.>"
            )
        ]
        return attrs.evolve(source, name=STREAM_PREFIX + bucket, subject_transforms=transforms)


@attrs.frozen(kw_only=True)
class KeyValueStatus:
    """A bucket's state (ADR-8 ``Status``); ``stream_info`` has the rest."""

    bucket: str
    values: int
    history: int
    ttl: float | None
    bytes: int
    is_compressed: bool
    metadata: dict[str, str] = attrs.field(hash=False)
    stream_info: StreamInfo = attrs.field(repr=False, eq=False, hash=False)
    backing_store: str = "JetStream"
    #: How long limit markers are kept (seconds); ``None``: the bucket has none (ADR-48).
    limit_marker_ttl: float | None = None
    #: The bucket's configuration as read back from its stream (nats.go's ``Config()``):
    #: what ``create_key_value`` would be given to make it again.
    config: KeyValueConfig | None = attrs.field(default=None, eq=False, hash=False)


def bucket_status(bucket: str, info: StreamInfo) -> KeyValueStatus:
    """The status of ``bucket`` from its stream's info."""
    cfg = info.config
    return KeyValueStatus(
        bucket=bucket,
        values=info.state.messages,
        history=cfg.max_msgs_per_subject or 0,
        ttl=cfg.max_age or None,
        bytes=info.state.bytes,
        is_compressed=cfg.compression is Compression.S2,
        metadata=dict(cfg.metadata or {}),
        stream_info=info,
        limit_marker_ttl=cfg.subject_delete_marker_ttl or None,
        config=bucket_config(bucket, info.config),
    )


def bucket_config(bucket: str, cfg: StreamConfig) -> KeyValueConfig:
    """The :class:`KeyValueConfig` of bucket ``bucket`` whose stream has ``cfg``: the reverse
    of :meth:`KeyValueConfig.stream_config` (a source's key transform taken off again)."""
    prefix = f"{SUBJECT_PREFIX}.{bucket}.>"
    sources = None
    if cfg.sources:
        sources = []
        for source in cfg.sources:
            transforms = source.subject_transforms or []
            origin = source.name.removeprefix(STREAM_PREFIX)
            made = (
                source.name.startswith(STREAM_PREFIX)
                and len(transforms) == 1
                and transforms[0].src == f"{SUBJECT_PREFIX}.{origin}.>"
                and transforms[0].dest == prefix
            )
            sources.append(
                attrs.evolve(source, name=origin, subject_transforms=None) if made else source
            )
    mirror = cfg.mirror
    return KeyValueConfig(
        bucket=bucket,
        description=cfg.description,
        history=cfg.max_msgs_per_subject or 1,
        ttl=cfg.max_age or None,
        max_value_size=cfg.max_msg_size if (cfg.max_msg_size or 0) > 0 else None,
        max_bytes=cfg.max_bytes if (cfg.max_bytes or 0) > 0 else None,
        storage=cfg.storage or StorageType.FILE,
        replicas=cfg.num_replicas or 1,
        compression=cfg.compression is Compression.S2,
        metadata={k: v for k, v in (cfg.metadata or {}).items() if not k.startswith("_nats.")}
        or None,
        limit_marker_ttl=cfg.subject_delete_marker_ttl or None,
        placement=cfg.placement,
        republish=cfg.republish,
        sources=sources,
        mirror=(
            attrs.evolve(mirror, name=mirror.name.removeprefix(STREAM_PREFIX))
            if mirror is not None
            else None
        ),
    )


# -- bucket management ----------------------------------------------------------------------------


async def create_key_value(
    js: JetStream, config: KeyValueConfig, *, validate_keys: bool = True
) -> KeyValue:
    """Create the bucket (idempotent for the same configuration) and return its handle.

    :class:`BucketExists` if it exists with another configuration;
    :class:`LimitMarkersNotSupported` for a ``limit_marker_ttl`` on a server without them.
    """
    await check_limit_markers(js, config)
    stream = config.stream_config()
    await _check_sources_exist(js, config, stream)
    try:
        info = await js.add_stream(stream)
    except StreamAlreadyExists as exc:
        raise BucketExists(
            f"bucket {config.bucket!r} exists with another configuration: bind to it with "
            "key_value(), or delete it first"
        ) from exc
    return KeyValue(
        js,
        config.bucket,
        direct=bool(info.config.allow_direct),
        origin=_origin(info),
        origin_api=_origin_api(info),
        validate_keys=validate_keys,
    )


def _as_given(source: StreamSource) -> bool:
    """A source with its own transforms or filter: a stream, used as given."""
    return source.subject_transforms is not None or source.filter_subject is not None


async def _check_sources_exist(js: JetStream, config: KeyValueConfig, stream: StreamConfig) -> None:
    """:class:`BucketNotFound` for a source of this account and domain that names no stream:
    the server would accept it and source nothing, without a word (issue 24). Sources in
    another domain or account (``external``) cannot be looked at from here."""
    for given, source in zip(config.sources or (), stream.sources or (), strict=True):
        if source.external is not None:
            continue
        try:
            await js.stream_info(source.name)
        except StreamNotFound as exc:
            what = (
                f"stream {source.name!r}"
                if _as_given(given)
                else (
                    f"bucket {source.name.removeprefix(STREAM_PREFIX)!r} (stream {source.name!r})"
                )
            )
            raise BucketNotFound(
                f"bucket {config.bucket!r}: its source names {what}, which does not exist; "
                "create it first (a source with subject_transforms or filter_subject names a "
                "stream, one without names a bucket)"
            ) from exc


def _origin(info: StreamInfo) -> str | None:
    """The bucket a mirror bucket mirrors (its keys keep that bucket's subjects), else None."""
    mirror = info.config.mirror
    return mirror.name.removeprefix(STREAM_PREFIX) if mirror else None


def _origin_api(info: StreamInfo) -> str | None:
    """The API prefix of a mirrored bucket in another domain or account (the mirror's
    ``external.api``, e.g. ``$JS.hub.API``), where writes through the mirror go; else None."""
    mirror = info.config.mirror
    external = mirror.external if mirror else None
    return external.api if external is not None else None


async def check_limit_markers(js: JetStream, config: KeyValueConfig) -> None:
    """:class:`LimitMarkersNotSupported` if ``config`` asks for limit markers and the server's
    JetStream API level is below 1 (ADR-48 asks clients to check, as older servers ignore
    the fields); no request when it does not ask for them."""
    if config.limit_marker_ttl is None:
        return
    api = (await js.account_info()).extra.get("api")
    level = api.get("level", 0) if isinstance(api, dict) else 0
    if not isinstance(level, int) or level < LIMIT_MARKERS_API_LEVEL:
        raise LimitMarkersNotSupported(
            f"bucket {config.bucket!r}: this server's JetStream API level is {level!r}, limit "
            f"markers (limit_marker_ttl) need {LIMIT_MARKERS_API_LEVEL} (nats-server 2.11 "
            "or later)"
        )


async def key_value(js: JetStream, bucket: str, *, validate_keys: bool = True) -> KeyValue:
    """A handle on the existing bucket ``bucket``; :class:`BucketNotFound` if there is none.
    ``validate_keys``: see :attr:`KeyValue.validate_keys`."""
    check_bucket_name(bucket)
    stream = STREAM_PREFIX + bucket
    try:
        info = await js.stream_info(stream)
    except StreamNotFound as exc:
        raise BucketNotFound(
            f"bucket {bucket!r} not found (no stream {stream!r}): create it with create_key_value()"
        ) from exc
    if (info.config.max_msgs_per_subject or 0) < 1:
        raise BucketNotFound(
            f"stream {stream!r} is not a Key-Value bucket (it has no max_msgs_per_subject); "
            "use another bucket name"
        )
    return KeyValue(
        js,
        bucket,
        direct=bool(info.config.allow_direct),
        origin=_origin(info),
        origin_api=_origin_api(info),
        validate_keys=validate_keys,
    )


async def leader_bucket(js: JetStream, config: KeyValueConfig, *, create: bool) -> KeyValue:
    """The bucket ``config.bucket``, made from ``config`` if it is missing and ``create``
    (another process making it meanwhile is fine), else :class:`BucketNotFound`; a handle
    that reads from the stream leader. For state changed by compare-and-set (the commit state,
    operator snapshots): a replica's stale answer would only make a compare-and-set fail, but
    in a loop of them a lagging replica could hold a change up."""
    try:
        found = await key_value(js, config.bucket)
    except BucketNotFound:
        if not create:
            raise
        try:
            found = await create_key_value(js, config)
        except BucketExists:
            found = await key_value(js, config.bucket)
    return KeyValue(js, found.bucket, direct=False)


async def delete_key_value(js: JetStream, bucket: str) -> None:
    """Delete the bucket and everything in it; :class:`BucketNotFound` if there is none."""
    check_bucket_name(bucket)
    try:
        await js.delete_stream(STREAM_PREFIX + bucket)
    except StreamNotFound as exc:
        raise BucketNotFound(f"bucket {bucket!r} not found: nothing to delete") from exc


# -- the bucket -----------------------------------------------------------------------------------


def _server_error(refused: WrongRevision | None) -> BaseException | None:
    """The server's error behind a refused conditional write (its ``__cause__``)."""
    return None if refused is None else refused.__cause__


class KeyValue:
    """A handle on one bucket; made by :func:`create_key_value` or :func:`key_value`.

    ``direct`` says whether reads use Direct Get (every bucket made here has it; legacy
    buckets without ``allow_direct`` are read through the stream leader).
    """

    def __init__(
        self,
        js: JetStream,
        bucket: str,
        *,
        direct: bool = True,
        origin: str | None = None,
        origin_api: str | None = None,
        validate_keys: bool = True,
    ) -> None:
        self.js = js
        #: Keys checked against ADR-8's rules (``[-/_=.a-zA-Z0-9]``, no leading, trailing or
        #: double dot); with ``validate_keys=False`` (nats.go's option) any key that is a
        #: valid subject is taken, for buckets written by clients that allow more
        #: (``user@example.com``). Wildcards and empty tokens stay refused.
        self.validate_keys = validate_keys
        self._key = check_key if validate_keys else check_subject_key
        self._pattern = check_key_pattern if validate_keys else check_subject_key_pattern
        self.bucket = check_bucket_name(bucket)
        self.stream = STREAM_PREFIX + bucket
        #: A mirror bucket (``origin``: the bucket it mirrors) stores the origin's subjects:
        #: it is read here under those, and written to the origin through them.
        self.prefix = f"{SUBJECT_PREFIX}.{origin or bucket}."
        #: Where writes go (ADR-19): through a domain or an account import the ``$KV`` subject
        #: is put behind the JetStream API prefix, which the server (the domain's mapping) or
        #: the import maps back to ``$KV.<bucket>.<key>`` in the stream's account. Reads and
        #: watches name the stream's own subjects, so they keep :attr:`prefix`.
        self.write_prefix = (
            self.prefix if js.prefix == DEFAULT_API_PREFIX else f"{js.prefix}.{self.prefix}"
        )
        if origin_api is not None:
            # A mirror of a bucket in another domain or account (its mirror's ``external``):
            # writes go to the origin through that API prefix, whatever this context's is.
            self.write_prefix = f"{origin_api}.{self.prefix}"
        self.direct = direct

    def __repr__(self) -> str:
        return f"<KeyValue {self.bucket}>"

    # -- reading ----------------------------------------------------------------------------------

    async def get(self, key: str, revision: int | None = None) -> Entry:
        """The key's current value, or the value at ``revision``.

        :class:`KeyNotFound` when there is none: never written, gone (history, TTL), or the
        entry is a delete or purge marker (``KeyNotFound.entry``), or ``revision`` belongs to
        another key.
        """
        entry = await self._load(self._key(key), revision)
        if entry.operation is not Operation.PUT:
            raise KeyNotFound(self.bucket, key, entry)
        return entry

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        """The current value of each of ``keys`` that has one (a key never written, or whose
        last entry is a delete or purge marker, is left out), by key.

        One batched Direct Get (ADR-31 multi-last) per 1024 keys instead of one request per
        key; every request after the first reads the bucket as the first found it (its
        up-to sequence), so the values are of one moment. A bucket without Direct Get is read
        key by key through the stream leader.
        """
        wanted = list(dict.fromkeys(self._key(k) for k in keys))
        found: dict[str, Entry] = {}
        try:
            await self._get_many_direct(wanted, found)
        except StreamNotFound as exc:
            raise BucketNotFound(
                f"bucket {self.bucket!r} does not exist (any more): create it again with "
                "create_key_value()"
            ) from exc
        except JetStreamUnavailable:  # no Direct Get responder: a legacy or a fresh bucket
            for key in wanted:
                if key not in found:
                    with contextlib.suppress(KeyNotFound):
                        found[key] = await self.get(key)
        return found

    async def _get_many_direct(self, keys: list[str], found: dict[str, Entry]) -> None:
        if not self.direct:
            raise JetStreamUnavailable(f"bucket {self.bucket!r} has no Direct Get")
        up_to: int | None = None
        for start in range(0, len(keys), MAX_MULTI_SUBJECTS):
            chunk = keys[start : start + MAX_MULTI_SUBJECTS]
            request = MultiLastGet(subjects=[self.prefix + k for k in chunk], up_to_seq=up_to)
            while True:
                page = await self.js.direct_get_many(self.stream, request)
                up_to = up_to or page.up_to_seq
                for msg in page.messages:
                    entry = self._stored_entry(msg.subject[len(self.prefix) :], msg)
                    if entry.operation is Operation.PUT:
                        found[entry.key] = entry
                if page.complete:
                    break
                request = request.next_page(page)

    async def _load(self, key: str, revision: int | None = None) -> Entry:
        """The last entry of ``key`` (or the one at ``revision``), markers included."""
        subject = self.prefix + key
        if revision is not None and revision < 1:
            raise ValueError(f"revisions start at 1, not {revision}")
        last_by = subject if revision is None else None
        try:
            msg = await self._read(revision, last_by)
        except MessageNotFound:
            why = f"no revision {revision}" if revision is not None else ""
            raise KeyNotFound(self.bucket, key, why=why) from None
        if msg.subject != subject:
            raise KeyNotFound(self.bucket, key, why=f"revision {revision} belongs to another key")
        return self._stored_entry(key, msg)

    async def _read(self, seq: int | None, last_by_subject: str | None) -> StoredMessage:
        """Direct Get, or the leader's message get when there is no Direct Get responder: a
        legacy bucket, or one just created whose replicas' responders have not reached this
        connection's server yet (they follow the stream's creation asynchronously)."""
        if self.direct:
            try:
                return await self.js.direct_get(self.stream, seq, last_by_subject=last_by_subject)
            except JetStreamUnavailable:
                pass
        try:
            return await self.js.get_msg(self.stream, seq, last_by_subject=last_by_subject)
        except StreamNotFound as exc:
            raise BucketNotFound(
                f"bucket {self.bucket!r} does not exist (any more): create it again with "
                "create_key_value()"
            ) from exc

    def _stored_entry(self, key: str, msg: StoredMessage) -> Entry:
        if msg.time is None:
            raise DecodeError(f"the stored message {msg.seq} of {self.stream} has no time")
        return Entry(
            bucket=self.bucket,
            key=key,
            value=msg.data,
            revision=msg.seq,
            created=msg.time,
            operation=operation_of(msg.headers),
        )

    async def history(self, key: str) -> list[Entry]:
        """Every revision the bucket still has of ``key``, oldest first, markers included
        (empty if it has none)."""
        self._key(key)
        async with self.watch(key, include_history=True) as watcher:
            return [entry async for entry in watcher.initial()]

    async def keys(self, keys: str | Sequence[str] = ">") -> list[str]:
        """The keys that have a value (not a delete or purge marker), matching ``keys``."""
        async with self.watch(keys, ignore_deletes=True, meta_only=True) as watcher:
            found = [entry.key async for entry in watcher.initial()]
        # A key written while the list is built can come twice: once, in first-seen order.
        return list(dict.fromkeys(found))

    async def status(self) -> KeyValueStatus:
        return bucket_status(self.bucket, await self.js.stream_info(self.stream))

    # -- writing ----------------------------------------------------------------------------------

    async def _publish(
        self,
        key: str,
        value: bytes,
        *,
        expected: int | None = None,
        headers: dict[str, str] | None = None,
        ttl: MessageTTL | None = None,
    ) -> int:
        try:
            ack = await self.js.publish(
                self.write_prefix + key,
                value,
                headers=headers,
                expected_last_subject_seq=expected,
                ttl=ttl,
            )
        except MessageTTLDisabled as exc:
            raise KeyTTLDisabled(self.bucket, exc.code, exc.err_code) from exc
        except NoStreamForSubject as exc:
            raise BucketNotFound(
                f"no stream captures the subjects of bucket {self.bucket!r}: it does not exist "
                "(any more), or, just created in a cluster, is not known to this server yet"
            ) from exc
        except JetStreamAPIError as exc:
            if expected is None or exc.err_code not in WRONG_LAST_SEQUENCE_CODES:
                raise
            found = _CURRENT_SEQ_RE.search(exc.description)
            current = int(found.group(1)) if found else None
            raise WrongRevision(self.bucket, key, expected, current) from exc
        return ack.seq

    async def put(self, key: str, value: bytes) -> int:
        """Set ``key`` to ``value`` whatever it was; its new revision."""
        return await self._publish(self._key(key), value)

    async def update(self, key: str, value: bytes, last_revision: int) -> int:
        """Set ``key`` only if its last revision is ``last_revision``; its new revision.

        :class:`WrongRevision` if the key moved on (or was deleted) since that revision.
        ``last_revision`` 0 means "the key has no message at all"; to write a key that may
        have a delete marker, use :meth:`create`.
        """
        if last_revision < 0:
            raise ValueError(f"a revision is 0 or more, not {last_revision}")
        return await self._publish(self._key(key), value, expected=last_revision)

    async def create(self, key: str, value: bytes, *, ttl: MessageTTL | None = None) -> int:
        """Set ``key`` only if it has no value; its new revision.

        ``ttl`` (seconds, a timedelta, a duration string or ``"never"``; ADR-48) is how long
        this value lives, in a bucket with limit markers (:class:`KeyTTLDisabled` otherwise);
        when it runs out the key reads as purged (a ``MaxAge`` marker).

        First conditional on the key having no message. If it has one and the last is a delete
        or purge marker, the key has no value: the write is retried conditional on that
        marker's revision (ADR-8), and again on a newer marker if the key was deleted once more
        meanwhile. Of several racing creates exactly one succeeds; the others get
        :class:`KeyExists` (a :class:`WrongRevision`). ``KeyExists`` can also mean that another
        conditional write on the key was in flight, or that a lagging replica answered the
        read; never that a value was overwritten.
        """
        self._key(key)
        expected = 0
        refused: WrongRevision | None = None
        for _ in range(CREATE_ATTEMPTS):
            try:
                return await self._publish(key, value, expected=expected, ttl=ttl)
            except WrongRevision as exc:
                refused = exc
            try:
                last: Entry | None = await self._load(key)
            except KeyNotFound:
                last = None  # no message any more: the stream was purged meanwhile
            if last is not None and last.operation is Operation.PUT:
                # The server's refusal chained, as update() does (issue 24: it was not).
                raise KeyExists(self.bucket, key, last.revision) from _server_error(refused)
            marker = last.revision if last is not None else 0
            if marker == expected:
                break  # the state we were just refused on: a write in flight, or a stale read
            expected = marker
        raise KeyExists(self.bucket, key, refused.current if refused else None) from _server_error(
            refused
        )

    async def delete(self, key: str, last_revision: int | None = None) -> int:
        """Mark ``key`` deleted, keeping its history (a ``KV-Operation: DEL`` entry); the
        marker's revision. With ``last_revision``, only if that is the key's last revision
        (:class:`WrongRevision` otherwise)."""
        return await self._publish(
            self._key(key), b"", expected=last_revision, headers={KV_OPERATION: "DEL"}
        )

    async def purge(
        self, key: str, last_revision: int | None = None, *, ttl: MessageTTL | None = None
    ) -> int:
        """Remove ``key`` and its history, leaving one ``KV-Operation: PURGE`` entry (rolled up
        with ``Nats-Rollup: sub``); the marker's revision. ``last_revision`` as for
        :meth:`delete`. With ``ttl`` (a bucket with limit markers, ADR-48) the marker itself
        goes after that long, and the key leaves no trace (the server places no marker for a
        removed marker)."""
        return await self._publish(
            self._key(key),
            b"",
            expected=last_revision,
            headers={KV_OPERATION: "PURGE", ROLLUP: "sub"},
            ttl=ttl,
        )

    async def purge_deletes(self, older_than: float = PURGE_DELETES_OLDER_THAN) -> int:
        """Remove the delete and purge markers of the keys whose last entry is one; how many
        such keys there were (each one purged, its young marker kept or not).

        A marker younger than ``older_than`` seconds (30 minutes by default, as ADR-8's
        clients do) stays, so that watchers that are behind still see the removal; only the
        key's older entries go. An older marker goes with everything before it. ``0`` (or
        less) removes every marker. Each key is purged up to its marker's revision, never past
        it: a value written after the marker was read is kept.
        """
        if not older_than == older_than:
            raise ValueError("older_than must be a number of seconds, not NaN")
        async with self.watch() as watcher:
            markers = [e async for e in watcher.initial() if e.operation is not Operation.PUT]
        limit = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=max(older_than, 0.0))
        for marker in markers:
            keep_marker = older_than > 0 and marker.created > limit
            await self.js.purge_stream(
                self.stream,
                subject=self.prefix + marker.key,
                seq=marker.revision if keep_marker else marker.revision + 1,
            )
        return len(markers)

    # -- watching ---------------------------------------------------------------------------------

    @asynccontextmanager
    async def watch(
        self,
        keys: str | Sequence[str] = ">",
        *,
        include_history: bool = False,
        ignore_deletes: bool = False,
        updates_only: bool = False,
        meta_only: bool = False,
        resume_from_revision: int | None = None,
    ) -> AsyncIterator[KeyWatcher]:
        """Watch the keys matching ``keys`` (a key, a pattern with ``*`` / ``>``, or several;
        ``">"`` or ``[]`` is the whole bucket, as in nats.go; ``""`` is refused) for the
        block's duration.

        The watcher first delivers the initial data: the last entry of each matching key
        (every entry the bucket keeps with ``include_history``; nothing with
        ``updates_only``), then every later change, markers included unless
        ``ignore_deletes``. ``meta_only`` leaves the values out. See :class:`KeyWatcher` for
        how the end of the initial data is signalled. An ordered consumer (ADR-17) carries it,
        so a lost consumer is replaced without a gap or a repeat.

        ``resume_from_revision`` picks a watch up where an earlier one left off: no pass over
        the keys' last values; every entry from that revision on, in order, markers included.
        The initial data is then those the bucket already holds (so ``initial()`` ends where
        the watch has caught up). Revisions the bucket no longer holds are skipped without a
        word: on a key, an older revision goes when a newer one (which the watch delivers)
        pushes it out of the history, or when it expires or a purge or ``purge_deletes``
        removes it. A revision past the bucket's last gives the writes from there on.
        """
        if include_history and updates_only:
            raise ValueError("include_history and updates_only exclude each other")
        if resume_from_revision is not None:
            if include_history or updates_only:
                raise ValueError(
                    "resume_from_revision excludes include_history and updates_only: it "
                    "delivers every entry from that revision on"
                )
            if isinstance(resume_from_revision, bool) or resume_from_revision < 1:
                raise ValueError(f"revisions start at 1, not {resume_from_revision!r}")
        # nats.go's meanings (issue 24: here they were the other way round, so code ported
        # from it watched the opposite of what it meant): no keys is the whole bucket, and
        # an empty key is an error.
        patterns = [keys] if isinstance(keys, str) else list(keys)
        if "" in patterns:
            raise InvalidKey(
                "an empty key cannot be watched: give '>' (or no keys, []) for the whole bucket"
            )
        subjects = [self.prefix + self._pattern(p) for p in patterns or [">"]]
        if resume_from_revision is not None:
            policy = DeliverPolicy.BY_START_SEQUENCE
        elif include_history:
            policy = DeliverPolicy.ALL
        elif updates_only:
            policy = DeliverPolicy.NEW
        else:
            policy = DeliverPolicy.LAST_PER_SUBJECT
        config = ConsumerConfig(
            deliver_policy=policy,
            opt_start_seq=resume_from_revision,
            headers_only=True if meta_only else None,
            filter_subjects=subjects if len(subjects) > 1 else None,
        )
        async with self.js.subscribe(
            subjects[0] if len(subjects) == 1 else None,
            stream=self.stream,
            ordered=True,
            config=config,
        ) as sub:
            # What the consumer had to deliver when it was made; none (or updates only)
            # means the initial data is complete before anything arrives (ADR-8).
            empty = updates_only or sub.info.num_pending == 0
            yield KeyWatcher(self, sub, ignore_deletes=ignore_deletes, initial_done=empty)


class KeyWatcher:
    """The entries of a watch; made by :meth:`KeyValue.watch`.

    ``async for entry in watcher`` gives every entry, initial data then updates, until the
    watch block ends. The end of the initial data (ADR-8's "End Of Initial Data" signal) is
    not an item in that iteration; it is observable two ways:

    - ``async for entry in watcher.initial()`` gives the initial entries and then stops (at
      once if there are none); iterating the watcher afterwards gives the updates;
    - :attr:`initial_done` turns true once the initial data is complete: after the last
      initial entry is returned, or from the start if there is none. (With ``ignore_deletes``
      the last initial message may be a skipped marker, so only ``initial()`` is sure to stop
      there.)
    """

    def __init__(
        self,
        kv: KeyValue,
        sub: PushSubscription,
        *,
        ignore_deletes: bool,
        initial_done: bool,
    ) -> None:
        self.kv = kv
        self._sub = sub
        self._ignore_deletes = ignore_deletes
        self._initial_done = initial_done
        self._marker_given = False

    def __repr__(self) -> str:
        return f"<KeyWatcher {self.kv.bucket} initial_done={self._initial_done}>"

    @property
    def initial_done(self) -> bool:
        return self._initial_done

    def initial(self) -> _InitialEntries:
        """The initial entries; the iteration ends where the initial data ends."""
        return _InitialEntries(self)

    def __aiter__(self) -> KeyWatcher:
        return self

    async def __anext__(self) -> Entry:
        while True:
            item = await self._next()
            if item is not None:
                return item

    async def _next(self) -> Entry | None:
        """The next entry, or ``None`` once, in order, where the initial data ends."""
        if self._initial_done and not self._marker_given:
            self._marker_given = True
            return None
        while True:
            msg: JsMsg = await anext(self._sub)
            meta = msg.metadata
            if meta.num_pending == 0:
                self._initial_done = True
            entry = Entry(
                bucket=self.kv.bucket,
                key=msg.subject[len(self.kv.prefix) :],
                value=msg.data,
                revision=meta.stream_seq,
                created=meta.timestamp,
                delta=meta.num_pending,
                operation=operation_of(msg.headers),
            )
            if self._ignore_deletes and entry.operation is not Operation.PUT:
                if self._initial_done and not self._marker_given:
                    self._marker_given = True
                    return None
                continue
            return entry


class _InitialEntries:
    """Iterates a watcher up to the end of its initial data."""

    def __init__(self, watcher: KeyWatcher) -> None:
        self._watcher = watcher

    def __aiter__(self) -> _InitialEntries:
        return self

    async def __anext__(self) -> Entry:
        watcher = self._watcher
        if watcher._marker_given:
            raise StopAsyncIteration
        item = await watcher._next()
        if item is None:
            raise StopAsyncIteration
        return item
