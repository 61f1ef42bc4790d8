"""Helpers of the tests of the ``jetstream`` Spark format (test_jetstream_source.py,
test_jetstream_sink.py): nats-py, the independent peer, used from plain (sync) tests, a raw
NATS publisher for what nats-py cannot send (a header with several values), and what a stream
holds, read with plain ``STREAM.MSG.GET`` requests and parsed here (nats-py's own header parsing
keeps one value per name)."""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import nats

from tests.natspy_peer import NatsPyPeer

#: How long a Spark query of these tests may take (a loaded 2-core CI machine, one JVM).
QUERY_TIMEOUT = 180


def connect_peer(natspy: NatsPyPeer, url: str, **kwargs: Any) -> Any:
    """Connect nats-py (from a sync test) and return its JetStream context."""
    natspy.nc = natspy.run(nats.connect(url, allow_reconnect=False, **kwargs))
    return natspy.nc.jetstream()


def add_stream(natspy: NatsPyPeer, name: str, subjects: Sequence[str], **config: Any) -> Any:
    """A file stream made by nats-py, with Direct Get allowed (the source reads with it)."""
    config.setdefault("allow_direct", True)
    js = natspy.nc.jetstream()
    return natspy.run(js.add_stream(name=name, subjects=list(subjects), **config))


def delete_stream(natspy: NatsPyPeer, name: str) -> None:
    natspy.run(natspy.nc.jetstream().delete_stream(name))


def stream_state(natspy: NatsPyPeer, name: str) -> Any:
    return natspy.run(natspy.nc.jetstream().stream_info(name)).state


def publish(
    natspy: NatsPyPeer, subject: str, data: bytes, headers: dict[str, str] | None = None
) -> int:
    """Publish one message through nats-py; its stream sequence."""
    ack = natspy.run(natspy.nc.jetstream().publish(subject, data, headers=headers))
    return int(ack.seq)


def publish_many(natspy: NatsPyPeer, items: Iterable[tuple[str, bytes]]) -> list[int]:
    """Publish ``(subject, data)`` pairs in order, each acked before the next; the sequences."""

    async def go() -> list[int]:
        js = natspy.nc.jetstream()
        return [int((await js.publish(subject, data)).seq) for subject, data in items]

    return natspy.run(go(), timeout=60)


def raw_publish(
    url: str, subject: str, headers: Sequence[tuple[str, str]], payload: bytes
) -> dict[str, Any]:
    """Publish one message with headers as given (a name may come more than once) over a plain
    socket speaking the NATS protocol, and return the stream's PubAck (as JSON)."""
    where = urlsplit(url)
    block = b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers) + b"\r\n"
    connect = json.dumps(
        {"verbose": False, "pedantic": False, "headers": True, "no_responders": True}
    )
    inbox = "_INBOX.rawpub"
    command = (
        f"CONNECT {connect}\r\nSUB {inbox} 1\r\n"
        f"HPUB {subject} {inbox} {len(block)} {len(block) + len(payload)}\r\n"
    ).encode()
    with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
        reader = sock.makefile("rb")
        assert reader.readline().startswith(b"INFO ")
        sock.sendall(command + block + payload + b"\r\n")
        while True:
            line = reader.readline()
            if not line:
                raise AssertionError("the server closed the raw connection")
            if line.startswith(b"PING"):
                sock.sendall(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                raise AssertionError(line.decode())
            elif line.startswith((b"MSG ", b"HMSG ")):
                parts = line.split()
                size = int(parts[-1])
                body = reader.read(size + 2)[:size]
                if line.startswith(b"HMSG "):
                    body = body[int(parts[-2]) :]
                answer: dict[str, Any] = json.loads(body)
                assert "error" not in answer, answer
                return answer


@dataclass(frozen=True)
class Stored:
    """One message as the stream stores it."""

    seq: int
    subject: str
    data: bytes
    #: The header lines in order, each ``(name, value)``; a name may repeat.
    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]


def parse_header_block(block: bytes) -> tuple[tuple[str, str], ...]:
    lines = block.decode().split("\r\n")
    assert lines[0].startswith("NATS/1.0"), lines[0]
    pairs = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            pairs.append((name.strip(), value.strip()))
    return tuple(pairs)


def stored_messages(natspy: NatsPyPeer, stream: str) -> list[Stored]:
    """Every message ``stream`` holds, in sequence order, read one by one with the plain
    ``$JS.API.STREAM.MSG.GET`` request (not Direct Get, which the source under test uses)."""

    async def go() -> list[Stored]:
        nc = natspy.nc
        info = await nc.jetstream().stream_info(stream)
        state = info.state
        found = []
        if not state.messages:
            return found
        for seq in range(state.first_seq, state.last_seq + 1):
            reply = await nc.request(
                f"$JS.API.STREAM.MSG.GET.{stream}", json.dumps({"seq": seq}).encode(), timeout=5
            )
            answer = json.loads(reply.data)
            if "error" in answer:
                assert answer["error"]["err_code"] == 10037, answer  # deleted: not there
                continue
            msg = answer["message"]
            hdrs = msg.get("hdrs")
            found.append(
                Stored(
                    seq=msg["seq"],
                    subject=msg["subject"],
                    data=base64.b64decode(msg.get("data") or ""),
                    headers=parse_header_block(base64.b64decode(hdrs)) if hdrs else (),
                )
            )
        return found

    return natspy.run(go(), timeout=60)


def error_text(error: BaseException) -> str:
    """All the text of an error Spark raised (its message, its description and its Java
    stack, when it has them), for assertions on what the user reads."""
    parts = [str(error)]
    for attr in ("desc", "stackTrace", "_desc", "_stackTrace"):
        value = getattr(error, attr, None)
        if isinstance(value, str):
            parts.append(value)
    cause = error.__cause__ or error.__context__
    if cause is not None and cause is not error:
        parts.append(str(cause))
    return "\n".join(parts)
