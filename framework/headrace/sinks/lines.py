"""The JSON line a record becomes, shared by the ``jsonl`` and ``stdout`` sinks.

One JSON object per record, on one line, keys in this order::

    {"stream": "ORDERS", "stream_seq": 42, "subject": "orders.new", "consumer": "c",
     "num_delivered": 1, "timestamp": "2023-11-14T22:13:20.000000000Z",
     "headers": {"Trace": ["a", "b"]}, "value": {"id": 7}}

- ``value`` is the record's value: a JSON-serialisable value as is (dict, list, str, number,
  bool, None); ``bytes`` (or ``bytearray``, ``memoryview``) as a string when they are valid
  UTF-8, otherwise base64 with ``"value_encoding": "base64"`` added after it. Anything else
  (and NaN or infinite floats, which JSON cannot hold) raises
  :class:`~headrace.sinks.errors.UnserialisableValue`.
- ``timestamp`` is when the stream stored the message, RFC 3339 in UTC with nanoseconds.
- ``headers`` maps each header name to the list of its values (``{}`` when there are none).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import TYPE_CHECKING, Any

from headrace.sinks.errors import UnserialisableValue

if TYPE_CHECKING:
    from headrace.pipeline.record import Record

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
# For the rare string that is not valid Unicode (a lone surrogate): escaped, it still is JSON.
_ascii_encoder = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def rfc3339_ns(timestamp_ns: int) -> str:
    """``timestamp_ns`` (nanoseconds since the epoch) as RFC 3339 UTC with 9 fraction digits."""
    seconds, nanos = divmod(timestamp_ns, 1_000_000_000)
    when = _EPOCH + dt.timedelta(seconds=seconds)
    return f"{when:%Y-%m-%dT%H:%M:%S}.{nanos:09d}Z"


def record_to_dict(record: Record) -> dict[str, Any]:
    """The JSON object of ``record`` (see the module docs), before encoding."""
    msg = record.delivery.msg
    meta = msg.metadata
    headers = msg.headers
    obj: dict[str, Any] = {
        "stream": meta.stream,
        "stream_seq": meta.stream_seq,
        "subject": msg.subject,
        "consumer": meta.consumer,
        "num_delivered": meta.num_delivered,
        "timestamp": rfc3339_ns(meta.timestamp_ns),
        "headers": {name: headers.get_all(name) for name in headers} if headers else {},
    }
    value = record.value
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            obj["value"] = raw.decode("utf-8")
        except UnicodeDecodeError:
            obj["value"] = base64.b64encode(raw).decode("ascii")
            obj["value_encoding"] = "base64"
    else:
        obj["value"] = value
    return obj


def record_to_line(record: Record) -> str:
    """``record`` as one line of JSON, newline included; always encodable as UTF-8."""
    obj = record_to_dict(record)
    try:
        text = _encoder.encode(obj)
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                text = _ascii_encoder.encode(obj)
        return text + "\n"
    except (TypeError, ValueError) as exc:
        raise UnserialisableValue(
            f"the value of {obj['stream']}#{obj['stream_seq']} ({type(record.value).__name__}) "
            f"cannot be written as JSON: {exc}"
        ) from exc


def decode_value(obj: dict[str, Any]) -> Any:
    """The value of a line read back: bytes for a base64 value, otherwise as stored."""
    value = obj.get("value")
    if obj.get("value_encoding") == "base64" and isinstance(value, str):
        return base64.b64decode(value)
    return value
