"""The sans-IO parser of server operations: unit tests, limits, round trips and fuzzing."""

from __future__ import annotations

import json
import warnings
from array import array
from typing import Any

import pytest
from headrace.errors import ControlLineTooLong, MalformedHeaderWarning, ProtocolError
from headrace.protocol import Err, Headers, Info, Msg, Ok, Ping, Pong, ProtocolParser, ServerInfo
from hypothesis import given
from hypothesis import strategies as st

from ._strategies import (
    HEAVY,
    PROPERTY,
    describe,
    describe_all,
    draw_pieces,
    feed_pieces,
    frame_lists,
    garbage,
    mutated_streams,
    parser_limits,
    rich_frame_lists,
    rich_frames,
)


def parse(data: bytes, **kwargs: Any) -> list[Any]:
    return ProtocolParser(**kwargs).feed(data)


def one(data: bytes, **kwargs: Any) -> Any:
    events = parse(data, **kwargs)
    assert len(events) == 1, events
    return events[0]


def hmsg(subject: str, sid: int, block: bytes, payload: bytes, reply: str | None = None) -> bytes:
    args = [subject, str(sid)] + ([reply] if reply else [])
    args += [str(len(block)), str(len(block) + len(payload))]
    return b"HMSG " + " ".join(args).encode() + b"\r\n" + block + payload + b"\r\n"


def fails(data: bytes, exc_type: type[ProtocolError] = ProtocolError, **kwargs: Any) -> Any:
    parser = ProtocolParser(**kwargs)
    with pytest.raises(exc_type) as info:
        parser.feed(data)
    return info.value


# -- INFO -------------------------------------------------------------------------------------

FULL_INFO = {
    "server_id": "NCXSERVER",
    "server_name": "n1",
    "version": "2.10.7",
    "proto": 1,
    "go": "go1.21.5",
    "host": "0.0.0.0",
    "port": 4222,
    "headers": True,
    "max_payload": 8 * 1024 * 1024,
    "jetstream": True,
    "auth_required": True,
    "tls_required": False,
    "tls_available": True,
    "tls_verify": False,
    "nonce": "n0nc3",
    "client_id": 17,
    "client_ip": "127.0.0.1",
    "cluster": "east",
    "domain": "hub",
    "connect_urls": ["10.0.0.1:4222", "10.0.0.2:4222"],
    "ldm": True,
}


def test_info_fields() -> None:
    event = one(b"INFO " + json.dumps(FULL_INFO).encode() + b"\r\n")
    assert isinstance(event, Info)
    info = event.info
    assert info == ServerInfo(
        server_id="NCXSERVER",
        server_name="n1",
        version="2.10.7",
        proto=1,
        host="0.0.0.0",
        port=4222,
        headers=True,
        max_payload=8 * 1024 * 1024,
        jetstream=True,
        auth_required=True,
        tls_required=False,
        tls_available=True,
        tls_verify=False,
        nonce="n0nc3",
        connect_urls=("10.0.0.1:4222", "10.0.0.2:4222"),
        lame_duck_mode=True,
        client_id=17,
        client_ip="127.0.0.1",
        cluster="east",
        domain="hub",
    )
    assert info.connect_urls == ("10.0.0.1:4222", "10.0.0.2:4222")
    assert info.lame_duck_mode is True
    assert info.max_payload == 8 * 1024 * 1024
    assert info.raw == FULL_INFO
    assert info.raw["go"] == "go1.21.5"


def test_info_defaults() -> None:
    info = one(b"INFO {}\r\n").info
    assert info.max_payload == 1024 * 1024
    assert info.connect_urls == ()
    assert info.lame_duck_mode is False
    assert info.nonce is None
    assert info.client_id is None
    assert info.headers is False
    assert info.raw == {}


@pytest.mark.parametrize("sep", [b" ", b"\t", b"  "])
@pytest.mark.parametrize("op", [b"INFO", b"info", b"Info"])
def test_info_case_and_separators(op: bytes, sep: bytes) -> None:
    info = one(op + sep + b'{"server_id":"x","ldm":true}\r\n').info
    assert info.server_id == "x"
    assert info.lame_duck_mode is True


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"{'a': 1}",
        b"",
        b"nope",
        b'{"a":1} trailing',
        b'{"server_id":"\xff"}',
    ],
)
def test_info_bad_json(body: bytes) -> None:
    exc = fails(b"PING\r\nINFO " + body + b"\r\n")
    assert describe_all(exc.events) == [("Ping",)]


@pytest.mark.parametrize("body", [b"[]", b"[1]", b"1", b'"x"', b"null", b"true"])
def test_info_not_an_object(body: bytes) -> None:
    fails(b"INFO " + body + b"\r\n")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_payload", "1048576"),
        ("max_payload", True),
        ("max_payload", 1.5),
        ("max_payload", None),
        ("max_payload", 0),
        ("max_payload", -1),
        ("proto", "1"),
        ("proto", False),
        ("port", "4222"),
        ("port", None),
        ("client_id", "7"),
        ("client_id", 7.0),
        ("connect_urls", "10.0.0.1:4222"),
        ("connect_urls", [1, 2]),
        ("connect_urls", ["a", None]),
        ("connect_urls", {"a": "b"}),
    ],
)
def test_info_wrong_types(field: str, value: object) -> None:
    fails(b"INFO " + json.dumps({field: value}).encode() + b"\r\n")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cluster", 5),
        ("domain", ["hub"]),
        ("client_ip", 127),
        ("connect_urls", ""),
        ("connect_urls", False),
        ("headers", "false"),
        ("ldm", "no"),
    ],
)
def test_info_unchecked_field_types(field: str, value: object) -> None:
    """Fields typed ``str | None`` or ``bool`` must not silently take another JSON type."""
    fails(b"INFO " + json.dumps({field: value}).encode() + b"\r\n")


def test_info_deeply_nested_json_is_a_protocol_error() -> None:
    """json.loads raises RecursionError (not ValueError) on deep nesting."""
    fails(b"INFO " + b"[" * 3000 + b"\r\n", max_control_line=8192)
    fails(b'INFO {"x":' + b"[" * 2000 + b"\r\n")


# -- MSG / HMSG -------------------------------------------------------------------------------


def assert_msg(
    event: Any,
    subject: str,
    sid: int,
    reply: str | None,
    data: bytes,
    raw: bytes | None = None,
) -> None:
    assert isinstance(event, Msg)
    assert (event.subject, event.sid, event.reply, event.data, event.raw_headers) == (
        subject,
        sid,
        reply,
        data,
        raw,
    )
    assert isinstance(event.data, bytes)


def test_msg_without_reply() -> None:
    event = one(b"MSG foo.bar 9 5\r\nhello\r\n")
    assert_msg(event, "foo.bar", 9, None, b"hello")
    assert event.headers is None
    assert event.status is None
    assert event.description == ""
    assert event.size == 5


def test_msg_with_reply() -> None:
    event = one(b"MSG foo.bar 9 _INBOX.abc.1 5\r\nhello\r\n")
    assert_msg(event, "foo.bar", 9, "_INBOX.abc.1", b"hello")


def test_hmsg_without_reply() -> None:
    block = b"NATS/1.0\r\nA: 1\r\nB: two words\r\n\r\n"
    event = one(hmsg("foo", 3, block, b"payload"))
    assert_msg(event, "foo", 3, None, b"payload", block)
    assert event.headers == Headers({"A": "1", "B": "two words"})
    assert event.status is None
    assert event.description == ""
    assert event.size == len(block) + 7


def test_hmsg_with_reply() -> None:
    block = b"NATS/1.0\r\nA: 1\r\n\r\n"
    event = one(hmsg("foo", 3, block, b"x", reply="$JS.ACK.s.c.1.2.3.4.5"))
    assert_msg(event, "foo", 3, "$JS.ACK.s.c.1.2.3.4.5", b"x", block)
    assert event.headers["A"] == "1"


def test_hmsg_repeated_keys_and_trimming() -> None:
    block = b"NATS/1.0\r\nX: 1\r\nY:\t two \t\r\nX:2\r\nx: lower\r\nZ:\r\nX: a: b\r\n\r\n"
    h = one(hmsg("s", 1, block, b"")).headers
    assert h.get_all("X") == ["1", "2", "a: b"]
    assert h["X"] == "1"
    assert h["Y"] == "two"
    assert h["x"] == "lower"
    assert h["Z"] == ""
    assert list(h.multi_items()) == [
        ("X", "1"),
        ("X", "2"),
        ("X", "a: b"),
        ("Y", "two"),
        ("x", "lower"),
        ("Z", ""),
    ]


@pytest.mark.parametrize(
    ("block", "status", "description", "headers"),
    [
        (b"NATS/1.0 503\r\n\r\n", 503, "", {}),
        (b"NATS/1.0 404 No Messages\r\n\r\n", 404, "No Messages", {}),
        (b"NATS/1.0 408 Request Timeout\r\n\r\n", 408, "Request Timeout", {}),
        (b"NATS/1.0 409 Exceeded MaxWaiting\r\n\r\n", 409, "Exceeded MaxWaiting", {}),
        (
            b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 42\r\n"
            b"Nats-Last-Stream: 97\r\n\r\n",
            100,
            "Idle Heartbeat",
            {"Nats-Last-Consumer": "42", "Nats-Last-Stream": "97"},
        ),
        (
            b"NATS/1.0 100 FlowControl Request\r\n\r\n",
            100,
            "FlowControl Request",
            {},
        ),
        (
            b"NATS/1.0 409 Message Size Exceeds MaxBytes\r\nNats-Pending-Messages: 3\r\n"
            b"Nats-Pending-Bytes: 100\r\n\r\n",
            409,
            "Message Size Exceeds MaxBytes",
            {"Nats-Pending-Messages": "3", "Nats-Pending-Bytes": "100"},
        ),
    ],
)
def test_inline_status(
    block: bytes, status: int, description: str, headers: dict[str, str]
) -> None:
    # status read first (only the version line), then via the full block
    event = one(hmsg("_INBOX.x", 4, block, b""))
    assert event.status == status
    assert event.description == description
    assert event.headers == Headers(headers)
    assert event.data == b""
    # headers read first
    event = one(hmsg("_INBOX.x", 4, block, b""))
    assert event.headers == Headers(headers)
    assert event.status == status
    assert event.description == description


def test_bad_header_lines_are_left_out_and_reported_once() -> None:
    """A block that starts and ends right is delivered; its bad lines are left out when the
    headers are read, and reported there once (they used to make ``headers`` raise, every
    time)."""
    block = b"NATS/1.0 503\r\nno colon here\r\nA: 1\r\n\xff: 2\r\n\r\n"
    event = one(hmsg("s", 1, block, b"ok"))
    assert event.data == b"ok"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert event.status == 503  # the version line is fine: no warning
    with pytest.warns(MalformedHeaderWarning, match="'s'.*no colon here.*xff") as warned:
        assert event.headers == Headers({"A": "1"})
    assert len(warned) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert event.headers == Headers({"A": "1"})


@pytest.mark.parametrize(
    "block",
    [
        b"NATS/1.0X\r\nA: 1\r\n\r\n",
        b"NATS/1.0 5034\r\nA: 1\r\n\r\n",
        b"NATS/1.0 abc\r\nA: 1\r\n\r\n",
        b"HTTP/1.1\r\nA: 1\r\n\r\n",
    ],
)
@pytest.mark.parametrize("first", ["status", "headers"])
def test_a_bad_version_line_is_no_status_and_reported_once(block: bytes, first: str) -> None:
    event = one(hmsg("s", 1, block, b""))
    with pytest.warns(MalformedHeaderWarning, match="version line|NATS/1.0") as warned:
        if first == "status":
            assert event.status is None
        else:
            assert event.headers == Headers({"A": "1"})
    assert len(warned) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (event.status, event.description) == (None, "")
        assert event.headers == Headers({"A": "1"})


@pytest.mark.parametrize(
    "line",
    [b"PING", b"ping", b"Ping", b"PING ", b"PING\t", b"ping \t"],
)
def test_ping(line: bytes) -> None:
    assert isinstance(one(line + b"\r\n"), Ping)


@pytest.mark.parametrize("line", [b"PONG", b"pong", b"PONG "])
def test_pong(line: bytes) -> None:
    assert isinstance(one(line + b"\r\n"), Pong)


@pytest.mark.parametrize("line", [b"+OK", b"+ok", b"+OK "])
def test_ok(line: bytes) -> None:
    assert isinstance(one(line + b"\r\n"), Ok)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"-ERR 'Authorization Violation'", "Authorization Violation"),
        (b"-err 'Stale Connection'", "Stale Connection"),
        (b"-ERR\t'Unknown Protocol Operation'", "Unknown Protocol Operation"),
        (
            b"-ERR 'Permissions Violation for Publish to \"foo\"'",
            'Permissions Violation for Publish to "foo"',
        ),
        (b"-ERR  ' spaced '  ", " spaced "),
        (b"-ERR no quotes", "no quotes"),
        (b"-ERR ''", ""),
        (b"-ERR '", "'"),
        (b"-ERR", ""),
    ],
)
def test_err(line: bytes, message: str) -> None:
    event = one(line + b"\r\n")
    assert event == Err(message)


@pytest.mark.parametrize(
    "frame",
    [
        b"msg foo 1 2\r\nhi\r\n",
        b"Msg foo 1 2\r\nhi\r\n",
        b"MSG\tfoo\t1\t2\r\nhi\r\n",
        b"msg\tfoo  1 \t 2 \r\nhi\r\n",
        b"MSG foo 01 002\r\nhi\r\n",
    ],
)
def test_msg_case_and_whitespace(frame: bytes) -> None:
    assert_msg(one(frame), "foo", 1, None, b"hi")


@pytest.mark.parametrize(
    "head",
    [b"hmsg foo 1 12 14", b"HMSG\tfoo\t1\t12\t14", b"HMsg  foo 1\t 12 14 "],
)
def test_hmsg_case_and_whitespace(head: bytes) -> None:
    event = one(head + b"\r\nNATS/1.0\r\n\r\nhi\r\n")
    assert_msg(event, "foo", 1, None, b"hi", b"NATS/1.0\r\n\r\n")
    assert event.headers == Headers()


def test_zero_length_payloads() -> None:
    events = parse(b"MSG a 1 0\r\n\r\nHMSG a 2 12 12\r\nNATS/1.0\r\n\r\n\r\nMSG a 3 r 0\r\n\r\n")
    assert [(e.sid, e.data, e.raw_headers, e.reply) for e in events] == [
        (1, b"", None, None),
        (2, b"", b"NATS/1.0\r\n\r\n", None),
        (3, b"", None, "r"),
    ]


def test_payload_containing_protocol_text() -> None:
    payload = b"MSG a 1 2\r\nhi\r\nPING\r\n\r\n-ERR 'x'\r\n"
    block = b"NATS/1.0\r\nX: MSG a 1 2\r\n\r\n"
    stream = (
        b"MSG s 1 %d\r\n%b\r\n" % (len(payload), payload)
        + hmsg("s", 2, block, payload)
        + b"PONG\r\n"
    )
    events = parse(stream)
    assert len(events) == 3
    assert events[0].data == payload
    assert events[1].data == payload
    assert events[1].headers["X"] == "MSG a 1 2"
    assert isinstance(events[2], Pong)
    # and the same when fed one byte at a time
    split = feed_pieces([stream[i : i + 1] for i in range(len(stream))])
    assert split.error is None
    assert describe_all(split.events) == describe_all(events)


def test_non_ascii_subject() -> None:
    subject = "ünï.çødé.日本"
    event = one(b"MSG " + subject.encode() + b" 1 0\r\n\r\n")
    assert event.subject == subject


def test_several_frames_in_one_feed_and_across_feeds() -> None:
    parser = ProtocolParser()
    assert parser.feed(b"PI") == []
    assert parser.buffered == 2
    events = parser.feed(b"NG\r\nPONG\r\nMSG a 1 3\r\nab")
    assert [type(e) for e in events] == [Ping, Pong]
    assert parser.buffered == len(b"MSG a 1 3\r\nab")
    assert parser.feed(b"c") == []
    assert parser.feed(b"\r") == []
    (event,) = parser.feed(b"\n+OK\r")
    assert event.data == b"abc"
    assert parser.buffered == 4
    assert parser.feed(b"\n") == [Ok()]
    assert parser.buffered == 0
    assert parser.feed(b"") == []


def test_accepts_bytearray_and_memoryview() -> None:
    parser = ProtocolParser()
    assert parser.feed(bytearray(b"MSG a 1 4\r\nab")) == []
    assert parser.feed(memoryview(b"cd\r\nPI")) != []
    (ping,) = parser.feed(memoryview(bytearray(b"NG\r\n")))
    assert isinstance(ping, Ping)


def test_memoryview_of_wide_items_counts_bytes() -> None:
    """``len()`` of a memoryview counts items, not bytes: a pending payload must still finish."""
    parser = ProtocolParser()
    assert parser.feed(b"MSG a 1 4\r\n") == []
    (event,) = parser.feed(memoryview(array("H", b"abcd\r\n")))
    assert event.data == b"abcd"


def test_input_buffer_is_not_kept_by_reference() -> None:
    parser = ProtocolParser()
    buf = bytearray(b"MSG a 1 4\r\nab")
    parser.feed(buf)
    buf[:] = b"XXXXXXXXXXXXXXX"
    chunk = bytearray(b"cd")
    parser.feed(memoryview(chunk)[:1])
    chunk[:] = b"ZZ"
    (event,) = parser.feed(b"d\r\n")
    assert event.data == b"abcd"


@pytest.mark.parametrize("chunk", [1000, 4096, 65536])
def test_large_payload_in_small_chunks(chunk: int) -> None:
    size = 4 * 1024 * 1024 + 7
    payload = bytes(range(256)) * (size // 256) + b"\r\nMSG x"[: size % 256]
    assert len(payload) == size
    stream = b"MSG big 1 %d\r\n%b\r\nPING\r\n" % (size, payload)
    parser = ProtocolParser()
    events: list[Any] = []
    fed = 0
    for i in range(0, len(stream), chunk):
        piece = stream[i : i + chunk]
        got = parser.feed(piece)
        fed += len(piece)
        events.extend(got)
        if not events:
            assert parser.buffered == fed
    assert len(events) == 2
    assert_msg(events[0], "big", 1, None, payload)
    assert isinstance(events[1], Ping)
    assert parser.buffered == 0


def test_large_hmsg_in_small_chunks() -> None:
    payload = b"\x00\xff" * (1024 * 1024)
    block = b"NATS/1.0\r\nNats-Msg-Id: 1\r\n\r\n"
    stream = hmsg("big", 2, block, payload)
    parser = ProtocolParser()
    events: list[Any] = []
    for i in range(0, len(stream), 3000):
        events.extend(parser.feed(stream[i : i + 3000]))
    (event,) = events
    assert event.data == payload
    assert event.headers["Nats-Msg-Id"] == "1"
    assert parser.buffered == 0


def test_payload_equal_to_max_payload_is_accepted() -> None:
    assert one(b"MSG a 1 4\r\nabcd\r\n", max_payload=4).data == b"abcd"
    assert one(hmsg("a", 1, b"NATS/1.0\r\n\r\n", b"ab"), max_payload=14).data == b"ab"


# -- limits and malformed frames --------------------------------------------------------------


def test_constructor_limits() -> None:
    with pytest.raises(ValueError):
        ProtocolParser(max_control_line=15)
    with pytest.raises(ValueError):
        ProtocolParser(max_payload=-1)
    ProtocolParser(max_control_line=16, max_payload=0)


@pytest.mark.parametrize("crlf", [b"", b"\r", b"\r\n"])
@pytest.mark.parametrize("head", [b"MSG ", b"PING", b"INFO ", b"XX"])
def test_control_line_too_long(head: bytes, crlf: bytes) -> None:
    line = head + b"a" * 200 + crlf
    fails(line, ControlLineTooLong, max_control_line=32)
    # also when it arrives piece by piece
    parser = ProtocolParser(max_control_line=32)
    with pytest.raises(ControlLineTooLong):
        for i in range(0, len(line), 7):
            parser.feed(line[i : i + 7])


def test_control_line_limit_is_exact() -> None:
    limit = 32
    line = b"MSG " + b"s" * (limit - len(b"MSG  1 0")) + b" 1 0"
    assert len(line) == limit
    assert one(line + b"\r\n\r\n", max_control_line=limit).data == b""
    # the limit is on the line, not on the payload that follows it
    assert one(line[:-1] + b"9\r\n123456789\r\n", max_control_line=limit).data == b"123456789"
    # a line of exactly the limit still waiting for its LF is not an error yet
    assert ProtocolParser(max_control_line=limit).feed(line + b"\r") == []
    fails(b"MSG s" + line[4:] + b"\r\n\r\n", ControlLineTooLong, max_control_line=limit)


def test_default_control_line_limit() -> None:
    assert ProtocolParser().max_control_line == 4096
    fails(b"MSG " + b"a" * 5000, ControlLineTooLong)
    fails(b"INFO {" + b" " * 5000 + b"}\r\n", ControlLineTooLong)


def test_long_line_error_keeps_previous_events() -> None:
    stream = b"PING\r\nMSG a 1 2\r\nhi\r\n" + b"X" * 100
    exc = fails(stream, ControlLineTooLong, max_control_line=16)
    assert [type(e) for e in exc.events] == [Ping, Msg]


def test_size_over_max_payload() -> None:
    # raised on the control line, before the payload arrives
    exc = fails(b"PING\r\nMSG a 1 11\r\n", max_payload=10)
    assert describe_all(exc.events) == [("Ping",)]
    fails(b"HMSG a 1 12 11\r\n", max_payload=10)
    fails(b"HMSG a 1 12 100\r\n", max_payload=99)
    fails(b"MSG a 1 67108865\r\n")


@pytest.mark.parametrize("size", [b"-1", b"1_0", b"+5", b"5a", b"0x5", b"", b"\xd9\xa3", b"1.0"])
def test_bad_msg_size(size: bytes) -> None:
    fails(b"MSG a 1 " + size + b"\r\nhello\r\n")
    fails(b"MSG a 1 r " + size + b"\r\nhello\r\n")


@pytest.mark.parametrize("sid", [b"-1", b"1_0", b"+5", b"x", b"\xd9\xa3", b"1e3"])
def test_bad_sid(sid: bytes) -> None:
    fails(b"MSG a " + sid + b" 2\r\nhi\r\n")
    fails(b"HMSG a " + sid + b" 12 14\r\nNATS/1.0\r\n\r\nhi\r\n")


@pytest.mark.parametrize(
    ("hdr", "total"),
    [(b"-12", b"14"), (b"12", b"+14"), (b"1_2", b"14"), (b"12", b"1_4"), (b"x", b"14")],
)
def test_bad_hmsg_sizes(hdr: bytes, total: bytes) -> None:
    fails(b"HMSG a 1 " + hdr + b" " + total + b"\r\nNATS/1.0\r\n\r\nhi\r\n")


@pytest.mark.parametrize(
    "line",
    [
        b"MSG a 1",
        b"MSG a",
        b"MSG",
        b"MSG a 1 r x 2",
        b"HMSG a 1 14",
        b"HMSG a 1 r q 12 14",
        b"HMSG",
        b"FOO bar",
        b"MSGX a 1 2",
        b"PINGX",
        b"PIN",
        b"-ERRX",
        b"INFO",
        b"INFOX {}",
        b"+OKAY",
        b"",
        b" ",
        b"\x00",
        b"PUB a 2",
    ],
)
def test_malformed_control_lines(line: bytes) -> None:
    exc = fails(b"PONG\r\n" + line + b"\r\nhi\r\n")
    assert describe_all(exc.events) == [("Pong",)]


def test_header_size_larger_than_total() -> None:
    fails(b"HMSG a 1 15 14\r\nNATS/1.0\r\n\r\nhi\r\n")


def test_header_size_below_minimal_block() -> None:
    """The header size is framing; what the block holds is not (the server relays any block
    of at least one byte, and turns an empty one into a MSG)."""
    event = one(b"HMSG a 1 11 14\r\nNATS/1.0\r\n\r\nhi\r\n")
    assert (event.raw_headers, event.data) == (b"NATS/1.0\r\n\r", b"\nhi")
    event = one(b"HMSG a 1 0 0\r\n\r\n")
    assert (event.raw_headers, event.data, event.headers) == (None, b"", None)


@pytest.mark.parametrize(
    "block",
    [
        b"NATS/2.0\r\n\r\n",
        b"HTTP/1.1\r\n\r\n",
        b"nats/1.0\r\n\r\n",
        b" NATS/1.0\r\n\r\n",
        b"NATS/1.0\r\nA: 1\r\n\r\r",
        b"NATS/1.0\r\nA: 1\r\nB",
        b"NATS/1.0\r\nA: 1\r\n",
        b"X",
    ],
)
def test_a_block_that_is_not_a_nats_block_is_delivered(block: bytes) -> None:
    """Such a block used to be a protocol error: the connection dropped and the message was
    lost (and a consumer got it again after the reconnect, and dropped again). It is a
    message like any other, its block kept as received."""
    events = parse(b"PING\r\n" + hmsg("a", 1, block, b"pay") + b"PONG\r\n")
    assert len(events) == 3 and isinstance(events[1], Msg), events
    assert (type(events[0]), type(events[2])) == (Ping, Pong)
    assert (events[1].raw_headers, events[1].data) == (block, b"pay")
    with pytest.warns(MalformedHeaderWarning):
        assert events[1].headers is not None


def test_header_size_pointing_inside_block() -> None:
    block = b"NATS/1.0\r\nA: 1\r\n\r\n"
    frame = b"HMSG a 1 %d %d\r\n%bhi\r\n" % (len(block) - 2, len(block) + 2, block)
    event = one(frame)
    assert (event.raw_headers, event.data) == (block[:-2], b"\r\nhi")
    with pytest.warns(MalformedHeaderWarning, match="does not end with an empty line"):
        assert event.headers == Headers({"A": "1"})


@pytest.mark.parametrize(
    "frame",
    [
        b"MSG a 1 3\r\nabcd\r\n",
        b"MSG a 1 5\r\nabc\r\nPING\r\n",
        b"MSG a 1 3\r\nabc\n\r",
        b"MSG a 1 3\r\nabc  ",
        b"HMSG a 1 12 13\r\nNATS/1.0\r\n\r\nab\r\n",
        b"HMSG a 1 12 12\r\nNATS/1.0\r\n\r\nX\r\n",
    ],
)
def test_payload_not_followed_by_crlf(frame: bytes) -> None:
    exc = fails(b"+OK\r\n" + frame)
    assert describe_all(exc.events) == [("Ok",)]


def test_payload_not_followed_by_crlf_when_split() -> None:
    parser = ProtocolParser()
    assert parser.feed(b"MSG a 1 3\r\nab") == []
    assert parser.feed(b"c\r") == []
    with pytest.raises(ProtocolError):
        parser.feed(b"X")


def test_invalid_utf8_subject_or_reply() -> None:
    fails(b"MSG \xff 1 0\r\n\r\n")
    fails(b"MSG a 1 \xc3 0\r\n\r\n")
    fails(b"HMSG \xfe 1 12 12\r\nNATS/1.0\r\n\r\n\r\n")


def test_error_keeps_events_of_the_failing_feed_only() -> None:
    parser = ProtocolParser()
    assert [type(e) for e in parser.feed(b"PING\r\n")] == [Ping]
    with pytest.raises(ProtocolError) as info:
        parser.feed(b"PONG\r\nMSG a 1 2\r\nhi\r\nBOGUS\r\n+OK\r\n")
    assert [type(e) for e in info.value.events] == [Pong, Msg]
    assert info.value.events[1].data == b"hi"


def test_parser_stays_failed() -> None:
    parser = ProtocolParser()
    with pytest.raises(ProtocolError) as first:
        parser.feed(b"BOGUS\r\n")
    for data in (b"PING\r\n", b"", b"MSG a 1 0\r\n\r\n"):
        with pytest.raises(ProtocolError) as again:
            parser.feed(data)
        assert again.value.__cause__ is first.value
        assert list(again.value.events) == []


def test_parser_stays_failed_after_control_line_too_long() -> None:
    parser = ProtocolParser(max_control_line=16)
    with pytest.raises(ControlLineTooLong):
        parser.feed(b"X" * 40)
    with pytest.raises(ProtocolError):
        parser.feed(b"\r\nPING\r\n")


def test_error_during_pending_payload() -> None:
    parser = ProtocolParser()
    assert parser.feed(b"PING\r\nMSG a 1 3\r\na") == [Ping()]
    with pytest.raises(ProtocolError) as info:
        parser.feed(b"bcXY")
    assert list(info.value.events) == []
    with pytest.raises(ProtocolError):
        parser.feed(b"PING\r\n")


# -- properties -------------------------------------------------------------------------------


def check_round_trip(data: st.DataObject, frames: list[Any]) -> None:
    blob = b"".join(f.wire for f in frames)
    expected = [f.expected for f in frames]

    whole = feed_pieces([blob])
    assert whole.error is None
    assert describe_all(whole.events) == expected
    assert whole.parser.buffered == 0

    pieces = draw_pieces(data, blob)
    split = feed_pieces(pieces)
    assert split.error is None
    assert describe_all(split.events) == expected
    assert split.parser.buffered == 0
    sizes = sum(e.size for e in whole.events if isinstance(e, Msg))
    assert whole.parser.message_bytes == split.parser.message_bytes == sizes

    # the same pieces cut anywhere yield exactly the frames that ended before the cut
    cut = data.draw(st.integers(0, len(blob)), label="truncate at")
    head, have = [], 0
    for piece in pieces:
        if have + len(piece) > cut:
            head.append(piece[: cut - have])
            break
        head.append(piece)
        have += len(piece)
    done, end = [], 0
    for f in frames:
        if end + len(f.wire) > cut:
            break
        end += len(f.wire)
        done.append(f.expected)
    part = feed_pieces(head)
    assert part.error is None
    assert describe_all(part.events) == done
    assert part.parser.buffered == cut - end


@PROPERTY
@given(st.data(), frame_lists)
def test_round_trip(data: st.DataObject, frames: list[Any]) -> None:
    check_round_trip(data, frames)


@pytest.mark.slow
@HEAVY
@given(st.data(), rich_frame_lists)
def test_round_trip_heavy(data: st.DataObject, frames: list[Any]) -> None:
    check_round_trip(data, frames)


def check_msg_consistent(msg: Msg, blob: bytes) -> None:
    assert isinstance(msg.subject, str)
    assert isinstance(msg.sid, int) and msg.sid >= 0
    assert msg.reply is None or (isinstance(msg.reply, str) and msg.reply)
    raw = msg.raw_headers
    frame_body = (raw or b"") + msg.data + b"\r\n"
    assert frame_body in blob
    if raw is None:
        assert msg.headers is None and msg.status is None and msg.description == ""
        return
    # status first, then headers; and the other way round: same answers, neither raises,
    # and a malformed block is reported once either way
    first = Msg(msg.subject, msg.sid, msg.reply, msg.data, raw)
    with warnings.catch_warnings(record=True) as warned_first:
        warnings.simplefilter("always")
        status_first = (first.status, first.description)
        headers_second = first.headers
        assert (first.status, first.description) == status_first
    second = Msg(msg.subject, msg.sid, msg.reply, msg.data, raw)
    with warnings.catch_warnings(record=True) as warned_second:
        warnings.simplefilter("always")
        headers_first = second.headers
        status_second = (second.status, second.description)
        assert second.headers is headers_first
    assert status_first == status_second
    assert headers_first == headers_second
    assert isinstance(headers_first, Headers)
    assert len(warned_first) == len(warned_second) <= 1
    assert all(w.category is MalformedHeaderWarning for w in warned_first + warned_second)


def check_garbage(data: st.DataObject, blob: bytes, limits: dict[str, int]) -> None:
    whole = feed_pieces([blob], **limits)
    split = feed_pieces(draw_pieces(data, blob), **limits)
    assert describe_all(split.events) == describe_all(whole.events)
    assert (whole.error is None) == (split.error is None)
    if whole.error is not None:
        assert type(whole.error) is type(split.error)
        assert str(whole.error)
        with pytest.raises(ProtocolError):
            whole.parser.feed(b"PING\r\n")
    else:
        assert whole.parser.buffered == split.parser.buffered
    # The statistics' message bytes: what the events add up to, however the bytes came, an
    # error included (the events before it are dispatched, and counted).
    for fed in (whole, split):
        msgs = [e for e in fed.events if isinstance(e, Msg)]
        assert fed.parser.message_bytes == sum(m.size for m in msgs)
    for event in whole.events:
        if isinstance(event, Msg):
            check_msg_consistent(event, blob)


@PROPERTY
@given(st.data(), st.one_of(garbage, mutated_streams()), parser_limits)
def test_fuzz(data: st.DataObject, blob: bytes, limits: dict[str, int]) -> None:
    """Arbitrary bytes and mutated valid streams: events or ProtocolError, whatever the split."""
    check_garbage(data, blob, limits)


@pytest.mark.slow
@HEAVY
@given(st.data(), garbage, parser_limits)
def test_fuzz_arbitrary_bytes_heavy(
    data: st.DataObject, blob: bytes, limits: dict[str, int]
) -> None:
    check_garbage(data, blob, limits)


@pytest.mark.slow
@HEAVY
@given(st.data(), mutated_streams(rich_frames), parser_limits)
def test_fuzz_mutated_streams_heavy(
    data: st.DataObject, blob: bytes, limits: dict[str, int]
) -> None:
    check_garbage(data, blob, limits)


def test_describe_covers_all_events() -> None:
    """Guard for the helpers: every event type has a description."""
    for event in parse(b"PING\r\nPONG\r\n+OK\r\n-ERR 'x'\r\nINFO {}\r\nMSG a 1 0\r\n\r\n"):
        assert describe(event)
