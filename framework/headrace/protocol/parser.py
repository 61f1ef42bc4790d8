"""The server-to-client half of the NATS protocol as a sans-IO parser.

Feed it whatever the socket gave you; it returns every event that is complete so far and keeps
the remainder. The result does not depend on how the bytes were split::

    parser = ProtocolParser()
    for event in parser.feed(data):
        ...

Work is per batch, not per byte: a control line is found with one ``bytes.find``, split with one
``bytes.split``, and the payload is a single slice. While a large payload is still arriving, the
chunks are kept in a list and joined once, so a message spread over many reads costs one copy,
not a copy per read.

A run of ``MSG``/``HMSG`` frames (what a consume receives) is parsed by an optional C fast path,
``_speedups.c``: 0.3 us per message instead of 1.1 (bench/README.md). It takes only complete,
well-formed frames and leaves every other frame to the Python code below, which decides on it,
so events and errors do not depend on whether it is built (tests/protocol/test_speedups.py
compares the two on arbitrary bytes). ``HEADRACE_PURE_PYTHON=1`` turns it off.

A malformed frame raises :class:`~headrace.errors.ProtocolError`. The events that were
complete before the bad frame are attached to the exception as ``events`` so that nothing valid
is lost; after an error the parser stays failed (the connection must be re-established anyway).

What a header block holds is not framing (its size is): the server relays whatever a publisher
sent, and a stream stores it, so the block is kept as received and read leniently when the
message's headers are (see :class:`~headrace.protocol.events.Msg`). Refusing it here would drop
the connection and lose the message, and a consumer would get it again after the reconnect.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from headrace.errors import ControlLineTooLong, ProtocolError
from headrace.protocol.events import (
    OK_EVENT,
    PING_EVENT,
    PONG_EVENT,
    Err,
    Event,
    Info,
    Msg,
    ServerInfo,
    messages_size,
)

_scan_messages: Callable[..., tuple[int, int]] | None
try:
    from headrace.protocol._speedups import scan_messages as _scan_messages
except ImportError:  # built without a C compiler: the pure-Python path does everything
    _scan_messages = None

#: Whether the C fast path for runs of ``MSG``/``HMSG`` frames is built (it is optional: see
#: ``_speedups.c``). ``HEADRACE_PURE_PYTHON=1`` in the environment turns it off.
SPEEDUPS = _scan_messages is not None and not os.environ.get("HEADRACE_PURE_PYTHON")

#: nats-server's default ``max_control_line``; the client uses the same bound for lines it reads.
DEFAULT_MAX_CONTROL_LINE = 4096
#: The largest payload nats-server can be configured to allow (64 MiB).
DEFAULT_MAX_INBOUND_PAYLOAD = 64 * 1024 * 1024

_MSG, _HMSG, _PING, _PONG, _OK, _ERR, _INFO = range(7)


def _classify(line: bytes) -> int:
    """The operation of ``line`` in the general case (any case, tab separators)."""
    head = line[:5].upper()
    if head.startswith((b"MSG ", b"MSG\t")):
        return _MSG
    if head in (b"HMSG ", b"HMSG\t"):
        return _HMSG
    stripped = line.strip(b" \t").upper()
    if stripped == b"PING":
        return _PING
    if stripped == b"PONG":
        return _PONG
    if stripped == b"+OK":
        return _OK
    if head in (b"-ERR", b"-ERR ", b"-ERR\t"):
        return _ERR
    if head in (b"INFO ", b"INFO\t"):
        return _INFO
    raise ProtocolError(f"unknown protocol operation: {line[:64]!r}")


#: Entries each memo of the MSG fast path holds at most before it starts over.
_MEMO_LIMIT = 4096


def _size(token: bytes, what: str) -> int:
    if not token.isdigit():
        raise ProtocolError(f"{what} must be a non-negative decimal integer, not {token[:20]!r}")
    return int(token)


class ProtocolParser:
    """Incremental parser of what a NATS server sends to a client.

    ``speedups``: whether to use the C fast path (``None``: when it is built and not turned
    off by ``HEADRACE_PURE_PYTHON``). The events are the same either way.
    """

    __slots__ = (
        "_chunks",
        "_error",
        "_have",
        "_need",
        "_rest",
        "_scan",
        "_sids",
        "_sizes",
        "_subjects",
        "max_control_line",
        "max_payload",
        "message_bytes",
    )

    def __init__(
        self,
        max_control_line: int = DEFAULT_MAX_CONTROL_LINE,
        max_payload: int = DEFAULT_MAX_INBOUND_PAYLOAD,
        *,
        speedups: bool | None = None,
    ) -> None:
        if max_control_line < 16:
            raise ValueError(f"max_control_line must be at least 16, not {max_control_line}")
        if max_payload < 0:
            raise ValueError(f"max_payload must not be negative, not {max_payload}")
        self.max_control_line = max_control_line
        self.max_payload = max_payload
        self._rest = b""
        self._chunks: list[bytes] = []
        self._have = 0
        self._need = 0
        self._error: ProtocolError | None = None
        #: Bytes of every message parsed so far, payload and header block, as the server
        #: counts them (the connection's ``stats.in_bytes``: counted here, where each size is
        #: known anyway, instead of summed again per batch).
        self.message_bytes = 0
        # The MSG fast path's memos (see _parse), from the bytes as received.
        self._sizes: dict[bytes, int] = {}
        self._sids: dict[bytes, int] = {}
        self._subjects: dict[bytes, str] = {}
        # The C fast path for runs of MSG/HMSG frames (None: the Python path alone). It takes
        # only complete, well-formed frames and stops at the first other one, which the
        # Python loop below then decides on: the events are the same either way.
        if speedups is None:
            speedups = SPEEDUPS
        self._scan = _scan_messages if speedups else None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as events."""
        return len(self._rest) + sum(len(c) for c in self._chunks)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Add ``data`` and return every event that is now complete, in order."""
        if self._error is not None:
            raise ProtocolError("parser already failed") from self._error
        if type(data) is not bytes:
            data = bytes(data)  # a memoryview's length may count items, not bytes
        if self._need:
            self._chunks.append(data)
            self._have += len(data)
            if self._have < self._need:
                return []
            buf = self._rest + b"".join(self._chunks)
            self._chunks.clear()
            self._need = 0
        elif self._rest:
            buf = self._rest + data
        else:
            buf = data
        events: list[Event] = []
        try:
            pos = self._parse(buf, events)
        except ProtocolError as exc:
            self.message_bytes += messages_size(e for e in events if type(e) is Msg)
            exc.events = events
            self._error = exc
            self._rest = b""
            raise
        except (ValueError, UnicodeDecodeError) as exc:
            self.message_bytes += messages_size(e for e in events if type(e) is Msg)
            err = ProtocolError(f"malformed protocol data: {exc}")
            err.events = events
            self._error = err
            self._rest = b""
            raise err from exc
        self._rest = buf[pos:]
        self._have = len(self._rest)
        return events

    def _parse(self, buf: bytes, events: list[Event]) -> int:
        """Parse complete frames of ``buf`` into ``events``; return where the remainder starts."""
        append = events.append
        find = buf.find
        n = len(buf)
        pos = 0
        max_line = self.max_control_line
        max_payload = self.max_payload
        sizes, sids, subjects = self._sizes, self._sids, self._subjects
        if len(subjects) > _MEMO_LIMIT or len(sizes) > _MEMO_LIMIT or len(sids) > _MEMO_LIMIT:
            # Bounded, whatever subjects arrive: start over.
            sizes.clear()
            sids.clear()
            subjects.clear()
        sizes_get, sids_get, subjects_get = sizes.get, sids.get, subjects.get
        scan = self._scan
        total = 0  # message bytes (payload and header block), for the statistics
        while pos < n:
            if scan is not None:
                after, taken = scan(buf, pos, max_line, max_payload, subjects, Msg, events)
                if after != pos:
                    total += taken
                    pos = after
                    continue
            eol = find(b"\r\n", pos)
            if eol < 0:
                if n - pos > max_line + 1:
                    raise ControlLineTooLong(
                        f"protocol line longer than {max_line} bytes: {buf[pos : pos + 64]!r}..."
                    )
                self.message_bytes += total
                return pos
            if eol - pos > max_line:
                raise ControlLineTooLong(
                    f"protocol line of {eol - pos} bytes exceeds {max_line}: "
                    f"{buf[pos : pos + 64]!r}"
                )
            if buf.startswith(b"MSG ", pos):
                # The fast path: a well-formed MSG, all checks in one condition. Anything else
                # (a short buffer, a bad number, no reply) takes the general path below, which
                # decides what it is and raises the precise error. Subjects, sids and sizes
                # repeat from message to message (a consume: one sid, a few subjects, equal
                # sizes), so their decoded forms are looked up, checked once when first seen.
                args = buf[pos + 4 : eol].split()
                if len(args) == 4:
                    subject, sid_b, reply_b, size_b = args
                    msg_size = sizes_get(size_b)
                    if msg_size is None and size_b.isdigit():
                        msg_size = sizes[size_b] = int(size_b)
                    msg_sid = sids_get(sid_b)
                    if msg_sid is None and sid_b.isdigit():
                        msg_sid = sids[sid_b] = int(sid_b)
                    if msg_size is not None and msg_sid is not None:
                        end = eol + 2 + msg_size
                        # startswith is False past the end: this checks the length too.
                        if msg_size <= max_payload and buf.startswith(b"\r\n", end):
                            text = subjects_get(subject)
                            if text is None:
                                text = subjects[subject] = subject.decode()
                            append(Msg(text, msg_sid, reply_b.decode(), buf[eol + 2 : end]))
                            total += msg_size
                            pos = end + 2
                            continue
                kind = _MSG
            elif buf.startswith(b"HMSG", pos):
                # The same fast path for a well-formed HMSG with a reply (every JetStream
                # message with headers); anything else goes on to the general path.
                args = buf[pos + 5 : eol].split()
                if len(args) == 5 and buf[pos + 4] == 32:  # "HMSG "
                    subject, sid, reply_b, hdr_b, size_b = args
                    if size_b.isdigit() and sid.isdigit() and hdr_b.isdigit():
                        size = int(size_b)
                        hdr = int(hdr_b)
                        start = eol + 2
                        end = start + size
                        hend = start + hdr
                        if size <= max_payload and 0 < hdr <= size and buf.startswith(b"\r\n", end):
                            append(
                                Msg(
                                    subject.decode(),
                                    int(sid),
                                    reply_b.decode(),
                                    buf[hend:end],
                                    buf[start:hend],
                                )
                            )
                            total += size
                            pos = end + 2
                            continue
                kind = _HMSG if buf[pos + 4 : pos + 5] in (b" ", b"\t") else _classify(buf[pos:eol])
            else:
                kind = _classify(buf[pos:eol])

            if kind in (_MSG, _HMSG):
                if kind == _MSG:
                    args = buf[pos + 4 : eol].split()
                    nargs = len(args)
                    if nargs == 3:
                        subject, sid, size_b = args
                        reply = None
                    elif nargs == 4:
                        subject, sid, reply_b, size_b = args
                        reply = reply_b.decode()
                    else:
                        raise ProtocolError(f"MSG needs 3 or 4 arguments: {buf[pos:eol][:128]!r}")
                    hdr = 0
                else:
                    args = buf[pos + 5 : eol].split()
                    nargs = len(args)
                    if nargs == 4:
                        subject, sid, hdr_b, size_b = args
                        reply = None
                    elif nargs == 5:
                        subject, sid, reply_b, hdr_b, size_b = args
                        reply = reply_b.decode()
                    else:
                        raise ProtocolError(f"HMSG needs 4 or 5 arguments: {buf[pos:eol][:128]!r}")
                    hdr = _size(hdr_b, "HMSG header size")
                # Inline digit checks: this runs per message (int() alone accepts "+1", "1_0").
                if not size_b.isdigit():
                    _size(size_b, "MSG size")
                if not sid.isdigit():
                    _size(sid, "sid")
                size = int(size_b)
                if size > max_payload:
                    raise ProtocolError(f"message of {size} bytes exceeds the {max_payload} limit")
                if hdr > size:
                    raise ProtocolError(f"HMSG header size {hdr} exceeds the total {size}")
                start = eol + 2
                end = start + size
                if end + 2 > n:
                    self._need = end + 2 - pos
                    self.message_bytes += total
                    return pos
                if buf[end : end + 2] != b"\r\n":
                    raise ProtocolError(
                        f"payload of {size} bytes is not followed by CRLF: {buf[end : end + 16]!r}"
                    )
                if hdr:
                    hend = start + hdr
                    append(Msg(subject.decode(), int(sid), reply, buf[hend:end], buf[start:hend]))
                else:
                    append(Msg(subject.decode(), int(sid), reply, buf[start:end]))
                total += size
                pos = end + 2
            elif kind == _PING:
                append(PING_EVENT)
                pos = eol + 2
            elif kind == _PONG:
                append(PONG_EVENT)
                pos = eol + 2
            elif kind == _OK:
                append(OK_EVENT)
                pos = eol + 2
            elif kind == _ERR:
                text = buf[pos + 4 : eol].strip(b" \t").decode("utf-8", "replace")
                if len(text) >= 2 and text[0] == text[-1] == "'":
                    text = text[1:-1]
                append(Err(text))
                pos = eol + 2
            else:  # _INFO
                try:
                    obj = json.loads(buf[pos + 5 : eol])
                except (ValueError, RecursionError) as exc:
                    raise ProtocolError(f"INFO is not valid JSON: {exc}") from exc
                append(Info(ServerInfo.from_json(obj)))
                pos = eol + 2
        self.message_bytes += total
        return pos
