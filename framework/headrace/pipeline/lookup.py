"""``node.lookup(bucket, key=..., into=...)``: enrich each record from a KV bucket.

The lookup join users reach for first: a stream of events, a bucket of reference data (a
user's plan, a product's price), each event joined with the current value of its key. The
stage reads a whole batch's keys with one batched Direct Get (``KeyValue.get_many``: one
request per 1024 keys, all read at one moment of the bucket) instead of a request per record.

It keeps no state, so exactly once needs nothing more than the rest of the pipeline: a
message redelivered after a crash is looked up again (and may meet a newer value), and the
sinks keep the record they committed first.

The node's settings are here (the graph imports them); the stage that runs it is
``lookup_stage.py``.

``missing`` says what a record whose key has no value becomes: ``"keep"`` (``into`` gets
``None``), ``"drop"`` (the record ends there; its message is acked), or ``"fail"`` (the record
fails with :class:`LookupMissing`: naked, then dead-lettered as poison).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import attrs

from headrace.errors import HeadraceError
from headrace.jetstream.kv import check_bucket_name

Missing = Literal["keep", "drop", "fail"]


class LookupMissing(HeadraceError, LookupError):
    """A lookup with ``missing="fail"`` found no value for a record's key."""


@attrs.frozen(slots=True, kw_only=True)
class LookupSpec:
    """What a lookup node reads: ``bucket``; ``key(value) -> str`` (a KV key); ``into(value,
    found) -> new value`` with ``found`` the entry's bytes decoded by ``decode`` (None when the
    key has none and ``missing="keep"``)."""

    bucket: str = attrs.field(validator=lambda _i, _a, v: check_bucket_name(v))
    key: Callable[[Any], str]
    into: Callable[[Any, Any], Any]
    decode: Callable[[bytes], Any] | None = None
    missing: Missing = attrs.field(
        default="keep", validator=attrs.validators.in_(("keep", "drop", "fail"))
    )
