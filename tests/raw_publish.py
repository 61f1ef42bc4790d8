"""Publishing bytes no client library would send (a malformed header block, say) to a real
nats-server over a plain socket: the server relays and stores header blocks unchecked, so this
is how a subscriber comes to receive, and a stream to hold, such a message."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import trio

_CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"protocol":1}\r\n'
_ACK_INBOX = b"_INBOX.raw_publish"


async def raw_hpub(
    port: int, subject: str, block: bytes, payload: bytes, *, stored: bool = True
) -> dict[str, Any] | None:
    """``HPUB`` ``block`` + ``payload`` to ``subject`` as is. With ``stored``, ask for the
    stream's PubAck and return it; otherwise return once the server has read the publish (its
    PONG)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await _read_until(stream, lambda b: b"\r\n" in b)  # INFO
        total = len(block) + len(payload)
        if stored:
            head = b"SUB %b 1\r\n" % _ACK_INBOX
            head += b"HPUB %b %b %d %d\r\n" % (subject.encode(), _ACK_INBOX, len(block), total)
        else:
            head = b"HPUB %b %d %d\r\n" % (subject.encode(), len(block), total)
        await stream.send_all(_CONNECT + head + block + payload + b"\r\nPING\r\n")
        if not stored:
            await _read_until(stream, lambda b: b"PONG\r\n" in b)
            return None
        return _pub_ack(await _read_until(stream, lambda b: _pub_ack(b) is not None))


def _pub_ack(buf: bytes) -> dict[str, Any] | None:
    start = buf.find(b"MSG " + _ACK_INBOX)
    if start < 0:
        return None
    eol = buf.find(b"\r\n", start)
    if eol < 0:
        return None
    size = int(buf[start:eol].split()[-1])
    body = buf[eol + 2 : eol + 2 + size]
    if len(body) < size:
        return None
    answer: dict[str, Any] = json.loads(body)
    return answer


async def _read_until(stream: trio.SocketStream, done: Callable[[bytes], bool]) -> bytes:
    buf = b""
    with trio.fail_after(10):
        while not done(buf):
            chunk = await stream.receive_some(65536)
            if not chunk:
                raise ConnectionError(f"the server closed the connection; read {buf!r}")
            buf += chunk
    return buf
