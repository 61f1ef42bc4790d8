"""A message read back from a stream by sequence or subject (message get, ADR-31 direct get)."""

from __future__ import annotations

import datetime as dt

import attrs

from headrace.jetstream.codec import DecodeError, parse_time
from headrace.protocol.headers import Headers, read_header_block, warn_malformed


@attrs.frozen(slots=True)
class StoredMessage:
    """One stored message: where it is, what it says, and when it was stored.

    ``headers`` is read from ``raw_headers`` on first access, as a delivered message's are: a
    stored block is whatever its publisher sent, so unreadable lines are left out and reported
    once as a :class:`~headrace.errors.MalformedHeaderWarning`.
    """

    stream: str
    subject: str
    seq: int
    data: bytes
    raw_headers: bytes | None = attrs.field(default=None, repr=False)
    time: dt.datetime | None = None
    _headers: Headers | None = attrs.field(default=None, init=False, repr=False, eq=False)

    @property
    def headers(self) -> Headers | None:
        if not self.raw_headers:
            return None
        if self._headers is None:
            headers, _, _, problems = read_header_block(self.raw_headers)
            object.__setattr__(self, "_headers", headers)  # a cache, not a change of value
            if problems:
                warn_malformed(
                    f"message {self.seq} of stream {self.stream!r} on {self.subject!r}", problems
                )
        return self._headers


def from_direct_reply(
    raw_headers: bytes | None, data: bytes, stream: str, headers: Headers | None = None
) -> StoredMessage:
    """The stored message a Direct Get answer (ADR-31) carries, single or one of a batch.

    The answer's header block is the stored message's own with the server's appended, and the
    stored part is whatever its publisher sent, so the block is read leniently (``headers``:
    the block already read) and what could not be read is left to the
    :class:`StoredMessage` to report, naming the stored message. The server's values are the
    last of their names: a stored message may carry the same names (a republished one does).
    """
    if raw_headers is None:
        raise DecodeError("a Direct Get answer had no Nats-Sequence header")
    if headers is None:
        headers = read_header_block(raw_headers)[0]

    def last(name: str, default: str) -> str:
        values = headers.get_all(name)
        return values[-1] if values else default

    if "Nats-Sequence" not in headers:
        raise DecodeError("a Direct Get answer had no Nats-Sequence header")
    try:
        seq = int(last("Nats-Sequence", ""))
    except ValueError as exc:
        raise DecodeError("a Direct Get answer had a malformed Nats-Sequence") from exc
    return StoredMessage(
        stream=last("Nats-Stream", stream),
        subject=last("Nats-Subject", ""),
        seq=seq,
        data=data,
        raw_headers=raw_headers,
        time=direct_time(last("Nats-Time-Stamp", "")),
    )


def direct_time(text: str | None) -> dt.datetime | None:
    """Direct Get's ``Nats-Time-Stamp``: RFC 3339 on current servers, Go's ``2022-08-06
    00:29:27.5878 +0000 UTC`` on older ones; anything else is left out rather than guessed."""
    if not text:
        return None
    try:
        return parse_time(text)
    except DecodeError:
        pass
    parts = text.split(" ")
    if len(parts) < 3:
        return None
    day, clock, zone = parts[0], parts[1], parts[2]
    zone = zone[:3] + ":" + zone[3:] if len(zone) == 5 else zone
    try:
        return parse_time(f"{day}T{clock}{zone}")
    except DecodeError:
        return None
