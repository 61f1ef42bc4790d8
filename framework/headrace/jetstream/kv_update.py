"""Changing a bucket's configuration (ADR-8 ``UpdateKeyValue`` and ``CreateOrUpdateKeyValue``).

A bucket is its stream, so an update is a stream update with the stream ADR-8 derives from the
new :class:`~headrace.jetstream.kv.KeyValueConfig`: the whole configuration, not a patch. The
server decides what may change. On nats-server 2.15 the description, history, ``ttl`` (with
its duplicate window), the size limits, compression, metadata and turning limit markers on are
accepted; it refuses (err_code 10052 unless noted) a change of storage type, a replica count a
single server cannot have (10074), and turning limit markers off ("message TTL status can not
be disabled": ADR-48 keeps them once on). Every refusal is a :class:`BucketConfigRefused`
with the server's code and words; the bucket is then unchanged.
"""

from __future__ import annotations

from headrace.jetstream.context import JetStream
from headrace.jetstream.errors import JetStreamAPIError, StreamNotFound
from headrace.jetstream.kv import (
    BucketExists,
    BucketNotFound,
    KeyValue,
    KeyValueConfig,
    KeyValueError,
    check_limit_markers,
    create_key_value,
)


class BucketConfigRefused(KeyValueError):
    """The server refused a bucket's new configuration; the bucket is unchanged.

    ``code``, ``err_code`` and ``description`` are the server's (10052 for a change it does not
    allow, such as another storage type or turning limit markers off; 10074 for replicas a
    single server cannot have); the :class:`~headrace.jetstream.JetStreamAPIError` is the
    ``__cause__``.
    """

    def __init__(self, bucket: str, error: JetStreamAPIError) -> None:
        super().__init__(
            f"bucket {bucket!r} cannot take this configuration: {error.description} "
            f"(err_code {error.err_code}); the bucket is unchanged"
        )
        self.bucket = bucket
        self.code = error.code
        self.err_code = error.err_code
        self.description = error.description


async def update_key_value(js: JetStream, config: KeyValueConfig) -> KeyValue:
    """Give the existing bucket ``config.bucket`` the configuration ``config``; its handle.

    :class:`BucketNotFound` if there is no such bucket, :class:`BucketConfigRefused` if the
    server refuses the change, :class:`~headrace.jetstream.kv.LimitMarkersNotSupported` for
    limit markers on a server without them.
    """
    await check_limit_markers(js, config)
    try:
        info = await js.update_stream(config.stream_config())
    except StreamNotFound as exc:
        raise BucketNotFound(
            f"bucket {config.bucket!r} not found: nothing to update; create it with "
            "create_key_value() or create_or_update_key_value()"
        ) from exc
    except JetStreamAPIError as exc:
        raise BucketConfigRefused(config.bucket, exc) from exc
    return KeyValue(js, config.bucket, direct=bool(info.config.allow_direct))


async def create_or_update_key_value(js: JetStream, config: KeyValueConfig) -> KeyValue:
    """Create the bucket with ``config``, or update it to ``config`` if it exists; its handle.

    Errors as for :func:`update_key_value`. When another client creates the bucket between
    this one's update and create, the update is made again, once.
    """
    try:
        return await update_key_value(js, config)
    except BucketNotFound:
        pass
    try:
        return await create_key_value(js, config)
    except BucketExists:
        pass  # made meanwhile, with another configuration: update that one
    return await update_key_value(js, config)
