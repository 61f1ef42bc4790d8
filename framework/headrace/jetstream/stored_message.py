"""A message read back from a stream by sequence or subject (message get, ADR-31 direct get)."""

from __future__ import annotations

import datetime as dt

import attrs

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
