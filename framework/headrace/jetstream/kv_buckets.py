"""Listing the Key-Value buckets of an account (ADR-8 "bucket listing").

A bucket is a stream named ``KV_<bucket>``; listing is listing streams and keeping those. The
list is not filtered by subject (``$KV.*.>``), as some clients do, because a mirror bucket's
stream has no subjects of its own and such a filter would leave it out. A stream with the
prefix that is no bucket (no per-key history) is skipped, as :func:`key_value` refuses it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from headrace.jetstream.context import JetStream
from headrace.jetstream.kv import STREAM_PREFIX, KeyValueStatus, bucket_status


async def key_value_bucket_names(js: JetStream) -> list[str]:
    """The names of every bucket, sorted: the buckets :func:`key_value_buckets` lists (the
    stream list carries the configs that tell a bucket from a stream that only has the
    prefix, so this reads it rather than the shorter names list)."""
    return sorted([status.bucket async for status in key_value_buckets(js)])


async def key_value_buckets(js: JetStream) -> AsyncIterator[KeyValueStatus]:
    """The status of every bucket, one stream-list page at a time."""
    async for info in js.streams():
        name = info.config.name
        if name.startswith(STREAM_PREFIX) and (info.config.max_msgs_per_subject or 0) >= 1:
            yield bucket_status(name.removeprefix(STREAM_PREFIX), info)
