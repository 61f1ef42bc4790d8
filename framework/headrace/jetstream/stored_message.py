"""A message read back from a stream by sequence or subject (message get, ADR-31 direct get)."""

from __future__ import annotations

import datetime as dt

import attrs

from headrace.protocol.headers import Headers, parse_header_block


@attrs.frozen(slots=True)
class StoredMessage:
    """One stored message: where it is, what it says, and when it was stored."""

    stream: str
    subject: str
    seq: int
    data: bytes
    raw_headers: bytes | None = attrs.field(default=None, repr=False)
    time: dt.datetime | None = None

    @property
    def headers(self) -> Headers | None:
        if not self.raw_headers:
            return None
        return parse_header_block(self.raw_headers)[0]
