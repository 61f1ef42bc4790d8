"""Events the parser returns: one class per server operation.

``Msg`` is the hot-path object, one per delivered message. It keeps the raw header block and
parses it only when ``headers`` or ``status`` is first read, so a consumer that never looks at
headers pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from headrace.errors import InvalidHeaderError, ProtocolError
from headrace.protocol.headers import (
    VERSION_LINE,
    Headers,
    parse_status_line,
    read_header_block,
    warn_malformed,
)

_UNPARSED: Any = object()


@attrs.define(slots=True, eq=False, repr=False)
class Msg:
    """A message delivered by ``MSG`` or ``HMSG``.

    ``raw_headers`` is the header block as received (``None`` for ``MSG``). ``headers``,
    ``status`` and ``description`` are derived from it on first access. Whatever of a malformed
    block cannot be read is left out and reported there, once per message, as a
    :class:`~headrace.errors.MalformedHeaderWarning` (a publisher's bad header must not make
    its message, or the subscription, unreadable).
    """

    subject: str
    sid: int
    reply: str | None
    data: bytes
    raw_headers: bytes | None = None
    _headers: Any = attrs.field(default=_UNPARSED, init=False)
    _status: Any = attrs.field(default=_UNPARSED, init=False)
    _description: str = attrs.field(default="", init=False)

    def _parse(self) -> None:
        raw = self.raw_headers
        if raw is None:
            self._headers, self._status = None, None
            return
        headers, status, description, problems = read_header_block(raw)
        self._headers, self._status, self._description = headers, status, description
        if problems:
            warn_malformed(f"a message on {self.subject!r}", problems)

    @property
    def headers(self) -> Headers | None:
        """The message headers, or ``None`` when the message has no header block."""
        if self._headers is _UNPARSED:
            self._parse()
        return self._headers  # type: ignore[no-any-return]

    @property
    def status(self) -> int | None:
        """The inline status code (``100``, ``404``, ``408``, ``409``, ``503`` ...), if any.

        Only the version line is read, so checking the status of every message is cheap.
        """
        if self._status is _UNPARSED:
            raw = self.raw_headers
            if raw is None:
                self._status = None
            else:
                end = raw.find(b"\r\n")
                line = raw[:end] if end >= 0 else raw
                if line == VERSION_LINE:
                    self._status = None
                else:
                    try:
                        self._status, self._description = parse_status_line(line)
                    except InvalidHeaderError:
                        self._parse()  # reads what it can, and reports the block once
        return self._status  # type: ignore[no-any-return]

    @property
    def description(self) -> str:
        """The status description (``"Idle Heartbeat"``, ``"No Messages"`` ...) or ``""``."""
        self.status  # noqa: B018 - parses the version line
        return self._description

    @property
    def size(self) -> int:
        """Bytes of payload plus header block, as the server counts them for limits and for
        a subscription's pending bytes (the one definition; :func:`messages_size` sums it)."""
        raw = self.raw_headers
        return len(self.data) if raw is None else len(self.data) + len(raw)

    def __repr__(self) -> str:
        data = self.data if len(self.data) <= 40 else self.data[:40] + b"..."
        extra = f", raw_headers={len(self.raw_headers)}B" if self.raw_headers is not None else ""
        return (
            f"Msg(subject={self.subject!r}, sid={self.sid}, reply={self.reply!r}, "
            f"data={data!r}{extra})"
        )


def messages_size(msgs: Iterable[Msg]) -> int:
    """The sum of :attr:`Msg.size` over ``msgs``.

    The reader counts every batch it reads; the sum is written out here rather than calling
    the property per message, which costs twice as much (about 30 ns a message more), on the
    hottest path there is. Keep the two in step.
    """
    size = 0
    for msg in msgs:
        raw = msg.raw_headers
        size += len(msg.data) if raw is None else len(msg.data) + len(raw)
    return size


def _int(obj: dict[str, Any], name: str, default: int) -> int:
    value = obj.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"INFO field {name!r} must be an integer, not {value!r}")
    return value


def _bool(obj: dict[str, Any], name: str) -> bool:
    value = obj.get(name, False)
    if not isinstance(value, bool):
        raise ProtocolError(f"INFO field {name!r} must be true or false, not {value!r}")
    return value


def _str(obj: dict[str, Any], name: str) -> str | None:
    value = obj.get(name)
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"INFO field {name!r} must be a string, not {value!r}")
    return value


@attrs.frozen(slots=True)
class ServerInfo:
    """The fields of the server's ``INFO`` that the client acts on.

    ``raw`` keeps the whole JSON object for everything else.
    """

    server_id: str = ""
    server_name: str = ""
    version: str = ""
    proto: int = 0
    host: str = ""
    port: int = 0
    headers: bool = False
    max_payload: int = 1024 * 1024
    jetstream: bool = False
    auth_required: bool = False
    tls_required: bool = False
    tls_available: bool = False
    tls_verify: bool = False
    nonce: str | None = None
    connect_urls: tuple[str, ...] = ()
    lame_duck_mode: bool = False
    client_id: int | None = None
    client_ip: str | None = None
    cluster: str | None = None
    domain: str | None = None
    raw: dict[str, Any] = attrs.field(factory=dict, eq=False, repr=False)

    @classmethod
    def from_json(cls, obj: Any) -> ServerInfo:
        """Build from the decoded INFO object, checking the types of the fields we use."""
        if not isinstance(obj, dict):
            raise ProtocolError(f"INFO must carry a JSON object, not {type(obj).__name__}")
        urls = obj.get("connect_urls")
        if urls is None:
            urls = []
        if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
            raise ProtocolError(f"INFO connect_urls must be a list of strings: {urls!r}")
        max_payload = _int(obj, "max_payload", 1024 * 1024)
        if max_payload <= 0:
            raise ProtocolError(f"INFO max_payload must be positive, not {max_payload}")
        client_id = obj.get("client_id")
        return cls(
            server_id=_str(obj, "server_id") or "",
            server_name=_str(obj, "server_name") or "",
            version=_str(obj, "version") or "",
            proto=_int(obj, "proto", 0),
            host=_str(obj, "host") or "",
            port=_int(obj, "port", 0),
            headers=_bool(obj, "headers"),
            max_payload=max_payload,
            jetstream=_bool(obj, "jetstream"),
            auth_required=_bool(obj, "auth_required"),
            tls_required=_bool(obj, "tls_required"),
            tls_available=_bool(obj, "tls_available"),
            tls_verify=_bool(obj, "tls_verify"),
            nonce=_str(obj, "nonce"),
            connect_urls=tuple(urls),
            lame_duck_mode=_bool(obj, "ldm"),
            client_id=_int(obj, "client_id", 0) if client_id is not None else None,
            client_ip=_str(obj, "client_ip"),
            cluster=_str(obj, "cluster"),
            domain=_str(obj, "domain"),
            raw=obj,
        )


@attrs.frozen(slots=True)
class Info:
    """``INFO {...}``: server information, sent first and again when the cluster changes."""

    info: ServerInfo


@attrs.frozen(slots=True)
class Ping:
    """``PING``: the server checks that we are alive; answer with ``PONG``."""


@attrs.frozen(slots=True)
class Pong:
    """``PONG``: the answer to our oldest outstanding ``PING``."""


@attrs.frozen(slots=True)
class Ok:
    """``+OK``: acknowledgement in verbose mode (we never ask for it, but accept it)."""


@attrs.frozen(slots=True)
class Err:
    """``-ERR 'message'``: the server's error text, without the quotes."""

    message: str


Event = Msg | Info | Ping | Pong | Ok | Err

# The parser hands out these shared instances (the events carry no data). They are named
# *_EVENT so that ``PING`` and ``PONG`` mean one thing in the protocol package: the command
# bytes of :mod:`headrace.protocol.commands`.
PING_EVENT = Ping()
PONG_EVENT = Pong()
OK_EVENT = Ok()
