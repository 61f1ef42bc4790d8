"""The dial: TCP to one server, TLS where wanted, and the handshake's bytes (ADR-40).

What to send and what the server's answers mean is the sans-IO
:class:`~headrace.protocol.session.ClientSession`'s; this module moves the bytes between it and
a socket until the session says the connection is established, and hands the connection
supervisor a :class:`Transport`: the stream, the parser with whatever arrived behind the PONG,
and the INFO. The supervisor (``headrace.nats.connection``) decides which server to dial and
when (``headrace.nats.redial``) and runs the session's tasks on the transport.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from headrace.errors import ConnectTimeout, NatsError, ProtocolError, TLSError
from headrace.nats.auth import auth_fields
from headrace.nats.options import ConnectOptions
from headrace.nats.servers import PoolEntry, ServerAddress
from headrace.nats.statistics import Statistics
from headrace.nats.tls import TLSConfig
from headrace.protocol.events import Event, ServerInfo
from headrace.protocol.parser import ProtocolParser
from headrace.protocol.session import ClientSession

#: What a failed dial of one server can raise; the next server is tried. ValueError covers
#: host names the resolver refuses (an IDNA UnicodeError for "a..b").
DIAL_ERRORS = (OSError, ValueError, NatsError, ProtocolError, trio.BrokenResourceError)


@attrs.define(slots=True, eq=False)
class Transport:
    """One established, handshaken connection to one server."""

    stream: trio.abc.Stream
    entry: PoolEntry
    info: ServerInfo
    parser: ProtocolParser
    #: Events parsed in the read that carried the PONG, after it: the reader handles them first.
    leftover: list[Event]


async def dial(
    entry: PoolEntry, options: ConnectOptions, session: ClientSession[Any], stats: Statistics
) -> Transport:
    """TCP connect, INFO, TLS as needed, CONNECT + PING, and wait for the PONG, all within
    ``connect_timeout`` (:class:`~headrace.errors.ConnectTimeout` past it). A failure closes
    the socket; the caller marks the dial's start and outcome."""
    address = entry.address
    try:
        with trio.fail_after(options.connect_timeout):
            tcp = await trio.open_tcp_stream(address.host, address.port)
            try:
                return await _handshake(entry, tcp, options, session, stats)
            except BaseException:
                await trio.aclose_forcefully(tcp)
                raise
    except trio.TooSlowError:
        raise ConnectTimeout(
            f"{address} did not complete the handshake within {options.connect_timeout}s"
        ) from None


async def _handshake(
    entry: PoolEntry,
    tcp: trio.SocketStream,
    options: ConnectOptions,
    session: ClientSession[Any],
    stats: Statistics,
) -> Transport:
    """Drive the session through INFO, TLS, CONNECT + PING and the PONG."""
    address = entry.address
    tls = options.tls
    tls_first = tls is not None and tls.handshake_first
    parser = ProtocolParser(options.max_control_line)
    read_size = options.read_size
    stream: trio.abc.Stream = tcp
    if tls_first:
        assert tls is not None
        stream = await _start_tls(tcp, entry, tls)
    session.connection_made(str(address))
    try:
        info = None
        while info is None:
            data = await _receive(stream, address, read_size, stats)
            info = session.receive_info(parser.feed(data))
        want_tls = tls is not None or address.tls
        if session.upgrade_tls(
            want_tls=want_tls, tls_first=tls_first, buffered=bool(parser.buffered)
        ):
            stream = await _start_tls(tcp, entry, tls or TLSConfig())
        auth = auth_fields(options.credentials, address, info.nonce)
        hello = session.connect_command(tls=stream is not tcp, auth=auth)
        try:
            await stream.send_all(hello)
            stats.out_wire_bytes += len(hello)
        except trio.BrokenResourceError as exc:
            raise ConnectionResetError(f"{address} closed the connection: {exc}") from exc
        leftover = None
        while leftover is None:
            events = parser.feed(await _receive(stream, address, read_size, stats))
            leftover = session.receive_handshake(events)
            owed = session.data_to_send()
            if owed:
                await stream.send_all(owed)
                stats.out_wire_bytes += len(owed)
    except BaseException:
        session.connection_lost()
        raise
    assert session.info is not None
    return Transport(stream, entry, session.info, parser, leftover)


async def _start_tls(
    tcp: trio.SocketStream, entry: PoolEntry, tls: TLSConfig
) -> trio.SSLStream[trio.SocketStream]:
    address = entry.address
    # A discovered server is often an IP; its certificate names the cluster's host name,
    # which is the name of the server that told us about it.
    hostname = tls.hostname or entry.tls_name or address.host
    ssl_stream = trio.SSLStream(tcp, tls.make_context(), server_hostname=hostname)
    try:
        await ssl_stream.do_handshake()
    except trio.BrokenResourceError as exc:
        cause = exc.__cause__ or exc
        raise TLSError(f"TLS handshake with {address} failed: {cause}") from exc
    return ssl_stream


async def _receive(
    stream: trio.abc.Stream, address: ServerAddress, read_size: int, stats: Statistics
) -> bytes:
    try:
        data = await stream.receive_some(read_size)
    except trio.BrokenResourceError as exc:
        cause = exc.__cause__ or exc
        if "SSL" in type(cause).__name__ or "ssl" in str(cause).lower():
            raise TLSError(f"TLS with {address} failed: {cause}") from exc
        raise ConnectionResetError(f"{address} closed the connection: {cause}") from exc
    if not data:
        raise ConnectionResetError(f"{address} closed the connection during the handshake")
    stats.in_wire_bytes += len(data)
    return bytes(data)


__all__ = ["DIAL_ERRORS", "Transport", "dial"]
