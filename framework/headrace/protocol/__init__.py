"""The NATS client protocol without I/O: a parser that turns bytes into events, and encoders.

Nothing here waits or touches a socket (the h11 style), so it can be tested exhaustively and
reused by any I/O layer. :mod:`headrace.nats` drives it over trio streams.
"""

from headrace.protocol.commands import (
    PING,
    PONG,
    check_queue,
    check_subject,
    encode_connect,
    encode_hpub,
    encode_pub,
    encode_sub,
    encode_unsub,
)
from headrace.protocol.events import Err, Event, Info, Msg, Ok, Ping, Pong, ServerInfo
from headrace.protocol.headers import (
    Headers,
    encode_header_block,
    parse_header_block,
    read_header_block,
)
from headrace.protocol.parser import ProtocolParser

__all__ = [
    "PING",
    "PONG",
    "Err",
    "Event",
    "Headers",
    "Info",
    "Msg",
    "Ok",
    "Ping",
    "Pong",
    "ProtocolParser",
    "ServerInfo",
    "check_queue",
    "check_subject",
    "encode_connect",
    "encode_header_block",
    "encode_hpub",
    "encode_pub",
    "encode_sub",
    "encode_unsub",
    "parse_header_block",
    "read_header_block",
]
