"""The client-to-server half of the NATS protocol: pure encoders and the checks they need.

Each encoder returns the exact bytes of one command. They validate what the server would reject
or, worse, misread: a space in a subject would turn it into a queue group on SUB; a CRLF in a
header value would end the header block early. Validation can be skipped (``check=False``) only
for subjects that came from the server itself, such as ``$JS.ACK`` reply subjects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from headrace.errors import InvalidSubjectError, MaxPayloadExceeded
from headrace.protocol.headers import Headers, encode_header_block

#: The commands as sent. (What the server sends is parsed into the events ``Ping`` and
#: ``Pong`` of :mod:`headrace.protocol.events`.)
PING = b"PING\r\n"
PONG = b"PONG\r\n"

# No whitespace, control characters or lone surrogates (which cannot be encoded as UTF-8).
_TOKEN = r"[^\s.\x00-\x1f\x7f\ud800-\udfff]+"
_SUBJECT_RE = re.compile(rf"{_TOKEN}(?:\.{_TOKEN})*")
_QUEUE_RE = re.compile(r"[^\s\x00-\x1f\x7f\ud800-\udfff]+")


def check_subject(subject: str, *, wildcards: bool = False, what: str = "subject") -> None:
    """Raise :class:`InvalidSubjectError` unless ``subject`` can be sent.

    A subject is dot-separated non-empty tokens without whitespace or control characters.
    With ``wildcards``, ``*`` may stand for a token and ``>`` for the rest (last token only);
    without, those tokens are refused, since publishing to them is never what was meant.
    """
    if not isinstance(subject, str):
        raise InvalidSubjectError(f"{what} must be str, not {type(subject).__name__}")
    if not _SUBJECT_RE.fullmatch(subject):
        if not subject:
            raise InvalidSubjectError(f"{what} must not be empty")
        raise InvalidSubjectError(
            f"invalid {what} {subject!r}: tokens must be non-empty and contain no whitespace "
            "or control characters"
        )
    if "*" in subject or ">" in subject:
        tokens = subject.split(".")
        for i, token in enumerate(tokens):
            if token == "*" or token == ">":
                if not wildcards:
                    raise InvalidSubjectError(
                        f"{what} {subject!r} contains the wildcard {token!r}; publish to a "
                        "concrete subject"
                    )
                if token == ">" and i != len(tokens) - 1:
                    raise InvalidSubjectError(
                        f"invalid {what} {subject!r}: '>' may only be the last token"
                    )


def check_queue(queue: str) -> None:
    """Raise :class:`InvalidSubjectError` unless ``queue`` is a usable queue group name."""
    if not isinstance(queue, str) or not _QUEUE_RE.fullmatch(queue):
        raise InvalidSubjectError(
            f"invalid queue group {queue!r}: it must be non-empty, without whitespace or "
            "control characters"
        )


def _check_size(size: int, max_payload: int | None, subject: str) -> None:
    if max_payload is not None and size > max_payload:
        raise MaxPayloadExceeded(
            f"message of {size} bytes to {subject!r} exceeds the server's max_payload of "
            f"{max_payload} bytes"
        )


def encode_connect(fields: Mapping[str, Any]) -> bytes:
    """``CONNECT {json}``. ``fields`` are the CONNECT options (see the connection layer)."""
    return b"CONNECT " + json.dumps(fields, separators=(",", ":")).encode() + b"\r\n"


def encode_pub(
    subject: str,
    payload: bytes,
    reply: str | None = None,
    *,
    max_payload: int | None = None,
    check: bool = True,
    wildcards: bool = False,
) -> bytes:
    """``PUB <subject> [reply] <size>``, then the payload. ``wildcards``: ``*`` and ``>``
    tokens are let through (an API subject that carries a filter); otherwise refused."""
    if check:
        check_subject(subject, wildcards=wildcards)
        if reply is not None:
            check_subject(reply, what="reply subject")
        _check_size(len(payload), max_payload, subject)
    if reply is None:
        return b"PUB %b %d\r\n%b\r\n" % (subject.encode(), len(payload), payload)
    return b"PUB %b %b %d\r\n%b\r\n" % (subject.encode(), reply.encode(), len(payload), payload)


def encode_hpub(
    subject: str,
    headers: Headers | bytes,
    payload: bytes,
    reply: str | None = None,
    *,
    max_payload: int | None = None,
    check: bool = True,
    wildcards: bool = False,
) -> bytes:
    """``HPUB <subject> [reply] <header size> <total size>``, then headers and payload.

    ``headers`` is a :class:`Headers` or an already encoded header block; ``wildcards`` as
    for :func:`encode_pub`.
    """
    block = headers if isinstance(headers, bytes) else encode_header_block(headers)
    total = len(block) + len(payload)
    if check:
        check_subject(subject, wildcards=wildcards)
        if reply is not None:
            check_subject(reply, what="reply subject")
        _check_size(total, max_payload, subject)
    if reply is None:
        head = b"HPUB %b %d %d\r\n" % (subject.encode(), len(block), total)
    else:
        head = b"HPUB %b %b %d %d\r\n" % (subject.encode(), reply.encode(), len(block), total)
    return head + block + payload + b"\r\n"


def encode_sub(subject: str, sid: int, queue: str | None = None, *, check: bool = True) -> bytes:
    """``SUB <subject> [queue] <sid>``."""
    if check:
        check_subject(subject, wildcards=True)
        if queue is not None:
            check_queue(queue)
    if queue is None:
        return b"SUB %b %d\r\n" % (subject.encode(), sid)
    return b"SUB %b %b %d\r\n" % (subject.encode(), queue.encode(), sid)


def encode_unsub(sid: int, max_msgs: int | None = None) -> bytes:
    """``UNSUB <sid> [max]``: stop now, or after ``max_msgs`` messages in total."""
    if max_msgs is None:
        return b"UNSUB %d\r\n" % sid
    if max_msgs < 0:
        raise ValueError(f"max_msgs must not be negative, not {max_msgs}")
    return b"UNSUB %d %d\r\n" % (sid, max_msgs)
