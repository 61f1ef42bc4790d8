"""The client side of a NATS session without I/O: every decision the connection makes about
what the server said, and what to say back.

:class:`ClientSession` is to :mod:`headrace.nats.connection` what h11's connection object is
to an HTTP server: it owns the state and every transition; the driver owns the socket, the
clock and the tasks. Events go in (the parser's events, "a transport was opened", "the PING
timer fired at ``now``"); bytes to send and notices come out. Nothing here waits, reads a clock
or touches trio, so the state machine is tested on its own (tests/protocol/test_session.py)
with no server.

One object lives as long as the connection, across reconnects. What belongs to one transport
(the phase, the server's INFO, the PINGs outstanding) is reset by :meth:`connection_made`;
the SUB table outlives transports, and :meth:`established` returns it to replay.

The phases of one transport (ADR-40 "Establishing the connection")::

    IDLE --connection_made--> AWAIT_INFO --receive_info--> INFO_RECEIVED
    INFO_RECEIVED --connect_command--> AWAIT_PONG --receive_handshake (PONG)--> READY
    READY --established--> CONNECTED --connection_lost--> IDLE
    any --close--> CLOSED (for good)

TLS is the driver's (it wraps the socket), but whether to upgrade is decided here from the
INFO and the client's wishes (:meth:`upgrade_tls`). PINGs are the driver's outbound buffer's
to write, because a flush's PING must go out behind the data it vouches for; the session only
says when one is due and counts the unanswered ones.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar

import attrs

from headrace.errors import (
    AuthorizationError,
    PermissionViolation,
    ProtocolError,
    ServerError,
    StaleConnectionError,
    TLSError,
)
from headrace.protocol.commands import PING, PONG, encode_connect, encode_sub, encode_unsub
from headrace.protocol.events import Err, Event, Info, Ping, Pong, ServerInfo
from headrace.protocol.server_errors import classify, is_terminal


class Phase(enum.Enum):
    """Where one transport is in its life (see the module docs)."""

    IDLE = "idle"
    AWAIT_INFO = "await-info"
    INFO_RECEIVED = "info-received"
    AWAIT_PONG = "await-pong"
    READY = "ready"
    CONNECTED = "connected"
    CLOSED = "closed"


class Interest(Protocol):
    """What the session needs of a subscription to (re)send its SUB: the connection's
    :class:`~headrace.nats.subscription.Subscription` is one."""

    @property
    def sid(self) -> int: ...

    @property
    def subject(self) -> str: ...

    @property
    def queue(self) -> str | None: ...

    @property
    def max_msgs(self) -> int | None: ...

    @property
    def delivered(self) -> int: ...


S = TypeVar("S", bound=Interest)


@attrs.frozen
class SessionConfig:
    """The options of :class:`~headrace.nats.options.ConnectOptions` the session decides on."""

    version: str
    ping_interval: float = 120.0
    max_pings_out: int = 2
    pedantic: bool = False
    echo: bool = True
    name: str | None = None
    lang: str = "python3-headrace"


# -- notices: what the driver must act on --------------------------------------------------


@attrs.frozen
class SendNow:
    """Queue ``data`` for the socket (a PONG answering the server's PING)."""

    data: bytes


@attrs.frozen
class PongReceived:
    """A PONG arrived: it answers the oldest PING the driver wrote."""


@attrs.frozen
class InfoChanged:
    """The server's INFO, merged with what came before; ``connect_urls`` may have grown and
    ``lame_duck_mode`` may be set."""

    info: ServerInfo


@attrs.frozen
class ServerErrorReport(Generic[S]):
    """The server sent ``-ERR``.

    ``error`` is the typed exception. ``ended`` is the subscription the server cancelled (a
    subscription permissions violation), already removed from the SUB table. When
    ``terminal`` is true the server is closing the connection: the driver ends the transport
    with ``error``, so the reconnect logic sees the real reason.
    """

    error: ServerError | StaleConnectionError
    ended: S | None
    terminal: bool


Notice = SendNow | PongReceived | InfoChanged | ServerErrorReport[Any]


class ClientSession(Generic[S]):
    """The sans-IO client session; see the module docs for its phases."""

    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self.phase = Phase.IDLE
        #: Who we talk to, for error messages (the driver's server address).
        self.peer = "the server"
        #: The server's INFO on the current transport, merged across updates.
        self.info: ServerInfo | None = None
        #: PINGs sent by the timer and not answered yet.
        self.pings_out = 0
        #: When the timer last asked for a PING, in the driver's clock.
        self.last_ping_at: float | None = None
        #: The SUB table: every subscription by sid. The driver may read it (it routes
        #: messages with it) but changes it only through the methods below.
        self.subs: dict[int, S] = {}
        self._next_sid = 1
        self._not_replayed: set[int] = set()
        self._after_info: list[Event] = []
        self._handshake_out: list[bytes] = []

    def _expect(self, *phases: Phase) -> None:
        if self.phase not in phases:
            names = " or ".join(p.value for p in phases)
            raise RuntimeError(f"session is {self.phase.value}, not {names}")

    # -- the handshake ----------------------------------------------------------------------

    def connection_made(self, peer: str) -> None:
        """A transport to ``peer`` is open: forget the previous transport's state."""
        self._expect(
            Phase.IDLE, Phase.AWAIT_INFO, Phase.INFO_RECEIVED, Phase.AWAIT_PONG, Phase.READY
        )
        self.phase = Phase.AWAIT_INFO
        self.peer = peer
        self.info = None
        self.pings_out = 0
        self.last_ping_at = None
        self._after_info = []
        self._handshake_out = []

    def receive_info(self, events: list[Event]) -> ServerInfo | None:
        """The events of the transport's first reads: its INFO once it came, else ``None``.

        The server speaks first, with INFO; ``-ERR`` instead (too many connections, say) is
        raised typed, anything else is a :class:`~headrace.errors.ProtocolError`.
        """
        self._expect(Phase.AWAIT_INFO)
        if not events:
            return None
        first = events[0]
        if isinstance(first, Err):
            raise classify(first.message)
        if not isinstance(first, Info):
            raise ProtocolError(f"{self.peer} did not start with INFO but {first!r}")
        self.info = first.info
        # A server says nothing more before our CONNECT; what it did say is only checked
        # before a TLS upgrade (it would be read outside TLS).
        self._after_info = events[1:]
        self.phase = Phase.INFO_RECEIVED
        return first.info

    def upgrade_tls(self, *, want_tls: bool, tls_first: bool, buffered: bool) -> bool:
        """Whether the driver must upgrade the transport to TLS now, after INFO.

        ``want_tls``: the client requires TLS (options or a ``tls://`` URL); ``tls_first``: it
        already did (ADR-40 implicit TLS); ``buffered``: the parser holds bytes read past INFO.
        """
        self._expect(Phase.INFO_RECEIVED)
        info = self.info
        assert info is not None
        if tls_first:
            return False
        if want_tls and not (info.tls_required or info.tls_available):
            raise TLSError(f"{self.peer} does not offer TLS, and this client requires it")
        if want_tls or info.tls_required:
            if self._after_info or buffered:
                raise ProtocolError(f"{self.peer} sent data after INFO before the TLS upgrade")
            return True
        return False

    def connect_command(self, *, tls: bool, auth: Mapping[str, Any]) -> bytes:
        """CONNECT and the first PING, to send as one write; ``auth`` holds the credential
        fields (the driver's: reading a creds file or signing the nonce is its business)."""
        self._expect(Phase.INFO_RECEIVED)
        config = self.config
        fields: dict[str, Any] = {
            "verbose": False,
            "pedantic": config.pedantic,
            "tls_required": tls,
            "lang": config.lang,
            "version": config.version,
            "protocol": 1,
            "echo": config.echo,
            "headers": True,
            "no_responders": True,
        }
        if config.name is not None:
            fields["name"] = config.name
        fields.update(auth)
        hello = encode_connect(fields) + PING
        self.phase = Phase.AWAIT_PONG
        return hello

    def receive_handshake(self, events: list[Event]) -> list[Event] | None:
        """Events read after CONNECT: ``None`` while the PONG is awaited, then the events that
        followed it in the same read (the driver handles them as connected).

        An INFO meanwhile is merged; a PING is answered (:meth:`data_to_send`); ``-ERR`` is
        raised typed, a plain server error as the server refusing the connection.
        """
        self._expect(Phase.AWAIT_PONG)
        for i, event in enumerate(events):
            if isinstance(event, Pong):
                self.phase = Phase.READY
                return events[i + 1 :]
            if isinstance(event, Info):
                self._merge(event.info)
            elif isinstance(event, Err):
                error = classify(event.message)
                if isinstance(error, ServerError) and not isinstance(error, AuthorizationError):
                    error = ServerError(f"{self.peer} refused the connection: {event.message}")
                raise error
            elif isinstance(event, Ping):
                self._handshake_out.append(PONG)
        return None

    def data_to_send(self) -> bytes:
        """What the handshake owes the server (PONGs), to send before reading again."""
        data = b"".join(self._handshake_out)
        self._handshake_out = []
        return data

    def _merge(self, info: ServerInfo) -> ServerInfo:
        # An INFO sent later carries what changed (cluster URLs, lame duck); per-client fields
        # such as the nonce appear only in the first. Merge rather than replace.
        if self.info is not None:
            info = ServerInfo.from_json({**self.info.raw, **info.raw})
        self.info = info
        return info

    # -- connected --------------------------------------------------------------------------

    def established(self) -> bytes:
        """The handshake is over and the driver takes the transport into use: returns the
        SUB table to replay, to send before anything queued while we were away (ADR-40).

        Every subscription once, in the order made, except those being drained; one with an
        auto-unsubscribe limit gets its UNSUB with what is left of the limit.
        """
        self._expect(Phase.READY)
        self.phase = Phase.CONNECTED
        self.pings_out = 0
        resubs: list[bytes] = []
        for sub in self.subs.values():
            sid = sub.sid
            if sid in self._not_replayed:
                continue
            resubs.append(encode_sub(sub.subject, sid, sub.queue, check=False))
            if sub.max_msgs is not None:
                resubs.append(encode_unsub(sid, sub.max_msgs - sub.delivered))
        return b"".join(resubs)

    def receive(self, event: Event) -> Notice | None:
        """A control event (not ``MSG``) read on the connected transport."""
        if isinstance(event, Pong):
            self.pings_out = 0
            return _PONG_RECEIVED
        if isinstance(event, Ping):
            return _SEND_PONG
        if isinstance(event, Info):
            return InfoChanged(self._merge(event.info))
        if isinstance(event, Err):
            return self._server_error(event.message)
        return None  # +OK (only sent in verbose mode, which we never ask for)

    def _server_error(self, message: str) -> ServerErrorReport[S]:
        error = classify(message)
        ended: S | None = None
        if isinstance(error, PermissionViolation) and error.operation == "subscription":
            # The server dropped our interest: the first matching subscription ends.
            for sub in self.subs.values():
                if sub.subject == error.subject and sub.queue == error.queue:
                    ended = sub
                    self.forget(sub.sid)
                    break
        return ServerErrorReport(error, ended, is_terminal(error))

    def ping_due(self, now: float) -> None:
        """The PING timer fired at ``now``: the driver sends a PING, unless
        ``max_pings_out`` are unanswered already (ADR-40: then the connection is stale and
        :class:`~headrace.errors.StaleConnectionError` is raised)."""
        self._expect(Phase.CONNECTED)
        config = self.config
        if self.pings_out >= config.max_pings_out:
            raise StaleConnectionError(
                f"{self.pings_out} PINGs unanswered over {config.ping_interval}s intervals"
            )
        self.pings_out += 1
        self.last_ping_at = now

    def connection_lost(self) -> None:
        """The transport is gone (or the handshake failed); the SUB table stays."""
        if self.phase is not Phase.CLOSED:
            self.phase = Phase.IDLE

    def close(self) -> list[S]:
        """Closed for good: returns the subscriptions that were open; nothing is sent again."""
        self.phase = Phase.CLOSED
        subs = list(self.subs.values())
        self.subs.clear()
        self._not_replayed.clear()
        return subs

    # -- the SUB table ----------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self.phase is Phase.CONNECTED

    def next_sid(self, subject: str, queue: str | None) -> int:
        """The sid the next subscription gets; raises for a subject or queue we may not send,
        before anything changes."""
        encode_sub(subject, self._next_sid, queue)
        return self._next_sid

    def add(self, sub: S) -> bytes | None:
        """Record ``sub`` (made with :meth:`next_sid`); returns its SUB to send now, or
        ``None`` while not connected (it is replayed by :meth:`established`)."""
        if sub.sid != self._next_sid:
            raise ValueError(f"sid {sub.sid} was not given out by next_sid()")
        self._next_sid += 1
        self.subs[sub.sid] = sub
        if self.phase is Phase.CONNECTED:
            return encode_sub(sub.subject, sub.sid, sub.queue, check=False)
        return None

    def limit(self, sid: int, max_msgs: int) -> bytes | None:
        """An auto-unsubscribe limit of ``max_msgs`` in total for ``sid`` (kept on the
        subscription by the driver): the UNSUB to send now, if connected and still known."""
        if self.phase is Phase.CONNECTED and sid in self.subs:
            return encode_unsub(sid, max_msgs)
        return None

    def unsubscribe(self, sid: int) -> bytes | None:
        """Forget ``sid``; the UNSUB to send now, if connected."""
        self.forget(sid)
        if self.phase is Phase.CONNECTED:
            return encode_unsub(sid)
        return None

    def stop_replay(self, sid: int) -> bytes | None:
        """``sid`` is draining: it stays in the table (its last messages are still routed) but
        is not sent again after a reconnect. The UNSUB to send now, if connected."""
        if sid not in self.subs or self.phase is Phase.CLOSED:
            return None
        self._not_replayed.add(sid)
        if self.phase is Phase.CONNECTED:
            return encode_unsub(sid)
        return None

    def forget(self, sid: int) -> None:
        """Drop ``sid`` from the table, sending nothing (it ended on its own)."""
        self.subs.pop(sid, None)
        self._not_replayed.discard(sid)

    def __iter__(self) -> Iterator[S]:
        return iter(list(self.subs.values()))


_SEND_PONG = SendNow(PONG)
_PONG_RECEIVED = PongReceived()

__all__ = [
    "ClientSession",
    "InfoChanged",
    "Interest",
    "Notice",
    "Phase",
    "PongReceived",
    "SendNow",
    "ServerErrorReport",
    "SessionConfig",
]
