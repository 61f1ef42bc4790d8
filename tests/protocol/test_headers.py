"""Headers: the multi-map, the NATS/1.0 block encoder and parser, and inline status lines."""

from __future__ import annotations

import re
from typing import Any

import pytest
from headrace.errors import InvalidHeaderError, ProtocolError
from headrace.protocol import Headers, encode_header_block, parse_header_block
from headrace.protocol.headers import parse_status_line, read_header_block
from hypothesis import HealthCheck, given, settings

from ._strategies import HEADER_NAME_CHARS, descriptions, grouped, header_pairs, statuses

PROPERTY = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- the mapping ------------------------------------------------------------------------------


def test_empty() -> None:
    h = Headers()
    assert len(h) == 0
    assert list(h) == []
    assert "A" not in h
    assert h.get("A") is None
    assert h.get_all("A") == []
    assert list(h.multi_items()) == []
    assert h == Headers()
    assert h == {}
    assert Headers(None) == h


def test_first_value_and_get_all() -> None:
    h = Headers([("A", "1"), ("B", "x"), ("A", "2"), ("A", "3")])
    assert h["A"] == "1"
    assert h.get("A") == "1"
    assert h.get_all("A") == ["1", "2", "3"]
    assert h.get_all("B") == ["x"]
    assert len(h) == 2
    assert list(h) == ["A", "B"]
    assert list(h.keys()) == ["A", "B"]
    assert list(h.values()) == ["1", "x"]
    assert dict(h) == {"A": "1", "B": "x"}
    with pytest.raises(KeyError):
        h["C"]


def test_multi_items_order() -> None:
    """Names in order of first appearance; each name's values in the order they were added."""
    pairs = [("B", "1"), ("A", "2"), ("B", "3"), ("C", "4"), ("A", "5")]
    h = Headers(pairs)
    assert list(h.multi_items()) == [("B", "1"), ("B", "3"), ("A", "2"), ("A", "5"), ("C", "4")]
    assert list(h.multi_items()) == grouped(pairs)


def test_get_all_returns_a_copy() -> None:
    h = Headers({"A": "1"})
    h.get_all("A").append("2")
    assert h.get_all("A") == ["1"]


def test_keys_are_case_sensitive() -> None:
    h = Headers([("Nats-Msg-Id", "1"), ("nats-msg-id", "2")])
    assert h["Nats-Msg-Id"] == "1"
    assert h["nats-msg-id"] == "2"
    assert "NATS-MSG-ID" not in h
    assert len(h) == 2


def test_construct_from_mapping_with_lists() -> None:
    h = Headers({"A": ["1", "2"], "B": "3", "C": ("4",), "D": []})
    assert list(h.multi_items()) == [("A", "1"), ("A", "2"), ("B", "3"), ("C", "4")]
    assert "D" not in h


def test_construct_from_iterable_of_pairs() -> None:
    h = Headers(iter([("A", "1"), ("A", "2")]))
    assert h.get_all("A") == ["1", "2"]


def test_add_set_remove() -> None:
    h = Headers()
    h.add("A", "1")
    h.add("B", "x")
    h.add("A", "2")
    assert h.get_all("A") == ["1", "2"]
    h.set("A", "3")
    assert h.get_all("A") == ["3"]
    # set keeps the name's position
    assert list(h) == ["A", "B"]
    h.set("C", "new")
    assert list(h.multi_items()) == [("A", "3"), ("B", "x"), ("C", "new")]
    h.remove("A")
    assert "A" not in h
    assert h.get_all("A") == []
    h.remove("missing")  # no error
    assert list(h.multi_items()) == [("B", "x"), ("C", "new")]


def test_equality() -> None:
    a = Headers([("A", "1"), ("A", "2"), ("B", "3")])
    assert a == Headers({"A": ["1", "2"], "B": "3"})
    assert a != Headers([("A", "2"), ("A", "1"), ("B", "3")])  # value order matters
    assert a != Headers([("A", "1"), ("B", "3")])  # so do repeated values
    assert a != Headers([("A", "1"), ("A", "2"), ("b", "3")])
    # against a plain mapping, the first values are compared
    assert a == {"A": "1", "B": "3"}
    assert a != {"A": "2", "B": "3"}
    assert a != "A: 1"
    assert a != 1


def test_unhashable() -> None:
    with pytest.raises(TypeError):
        hash(Headers())


def test_copy_is_independent() -> None:
    a = Headers([("A", "1")])
    b = a.copy()
    b.add("A", "2")
    b.add("B", "3")
    assert a.get_all("A") == ["1"]
    assert "B" not in a
    assert b == Headers([("A", "1"), ("A", "2"), ("B", "3")])


def test_repr() -> None:
    assert repr(Headers([("A", "1"), ("A", "2")])) == "Headers([('A', '1'), ('A', '2')])"


@pytest.mark.parametrize(
    "name",
    ["", "A B", "A:B", "A:", " A", "A\t", "A\r", "A\n", "A\x00", "é", "A(", "A@", "A/", "A;", 5],
)
def test_invalid_names(name: Any) -> None:
    for call in (
        lambda: Headers().add(name, "v"),
        lambda: Headers().set(name, "v"),
        lambda: Headers([(name, "v")]),
    ):
        with pytest.raises(InvalidHeaderError):
            call()


@pytest.mark.parametrize("value", ["a\rb", "a\nb", "\r\n", "a\x00", "end\r", 5, None, b"x"])
def test_invalid_values(value: Any) -> None:
    with pytest.raises(InvalidHeaderError):
        Headers().add("A", value)
    with pytest.raises(InvalidHeaderError):
        Headers().set("A", value)


def test_invalid_header_error_is_protocol_and_value_error() -> None:
    with pytest.raises(ProtocolError):
        Headers().add("A B", "v")
    with pytest.raises(ValueError):
        Headers().add("A", "\n")


def test_surrogate_value_rejected() -> None:
    """A value that cannot be encoded must fail at insertion, not later at encode time."""
    with pytest.raises(InvalidHeaderError):
        Headers().add("A", "\ud800")


@pytest.mark.parametrize("value", ["", "a: b", "  x  ", "\t", "ünï 日本", "\x01\x7f", "a;b=c"])
def test_valid_values(value: str) -> None:
    assert Headers([("A", value)])["A"] == value


def test_all_token_characters_are_valid_names() -> None:
    Headers().add(HEADER_NAME_CHARS, "v")


# -- encoding ---------------------------------------------------------------------------------


def test_encode_block() -> None:
    h = Headers([("A", "1"), ("B", "two words"), ("A", "2")])
    assert h.encode() == b"NATS/1.0\r\nA: 1\r\nA: 2\r\nB: two words\r\n\r\n"
    assert encode_header_block(h) == h.encode()
    assert Headers().encode() == b"NATS/1.0\r\n\r\n"
    assert encode_header_block(None) == b"NATS/1.0\r\n\r\n"


def test_encode_status() -> None:
    assert encode_header_block(None, 503) == b"NATS/1.0 503\r\n\r\n"
    assert Headers().encode(404, "No Messages") == b"NATS/1.0 404 No Messages\r\n\r\n"
    h = Headers({"Nats-Last-Consumer": "42"})
    assert h.encode(100, "Idle Heartbeat") == (
        b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 42\r\n\r\n"
    )
    assert Headers({"A": "é"}).encode() == "NATS/1.0\r\nA: é\r\n\r\n".encode()


@pytest.mark.parametrize("status", [0, 99, 1000, -100])
def test_encode_bad_status(status: int) -> None:
    with pytest.raises(InvalidHeaderError):
        encode_header_block(None, status)


@pytest.mark.parametrize("description", ["a\r\nb", "\n", "x\r", "\x00"])
def test_encode_bad_description(description: str) -> None:
    with pytest.raises(InvalidHeaderError):
        encode_header_block(None, 503, description)


# -- parsing ----------------------------------------------------------------------------------


def test_parse_block() -> None:
    block = b"NATS/1.0\r\nA: 1\r\nB:two\r\nA:\t 2 \t\r\nC:\r\nD: x: y\r\n\r\n"
    headers, status, description = parse_header_block(block)
    assert status is None
    assert description == ""
    assert list(headers.multi_items()) == [
        ("A", "1"),
        ("A", "2"),
        ("B", "two"),
        ("C", ""),
        ("D", "x: y"),
    ]


def test_parse_keeps_inner_whitespace_and_unicode() -> None:
    headers, _, _ = parse_header_block("NATS/1.0\r\nA: a  b\tc\r\nU: 日本\r\n\r\n".encode())
    assert headers["A"] == "a  b\tc"
    assert headers["U"] == "日本"


@pytest.mark.parametrize(
    "block",
    [
        b"NATS/1.0\r\n",  # no blank line
        b"NATS/1.0\r\nA: 1\r\n",
        b"NATS/1.0\r\nA: 1\r\n\r",
        b"NATS/1.1\r\n\r\n",
        b"HTTP/1.0\r\n\r\n",
        b"\r\n\r\n",
        b"",
        b"NATS/1.0\r\nno colon\r\n\r\n",
        b"NATS/1.0\r\n\r\nA: 1\r\n\r\n",  # blank line inside the block
        b"NATS/1.0\r\nA B: 1\r\n\r\n",
        b"NATS/1.0\r\nA : 1\r\n\r\n",
        b"NATS/1.0\r\n A: 1\r\n\r\n",  # continuation lines are not supported
        b"NATS/1.0\r\n: 1\r\n\r\n",
        b"NATS/1.0\r\n\xc3\xa9: 1\r\n\r\n",
        b"NATS/1.0\r\nA: \xff\r\n\r\n",
        b"NATS/1.0\r\nA: 1\rB: 2\r\n\r\n",
        b"NATS/1.0\r\nA: 1\nB: 2\r\n\r\n",
        b"NATS/1.0\r\n\r\n\r\n",
        b"NATS/1.0 50\r\n\r\n",
    ],
)
def test_parse_bad_block(block: bytes) -> None:
    with pytest.raises(InvalidHeaderError):
        parse_header_block(block)


@pytest.mark.parametrize(
    ("block", "headers", "status", "problems"),
    [
        (b"NATS/1.0\r\nA: 1\r\n", {"A": "1"}, None, ["does not end with an empty line"]),
        (b"NATS/1.0\r\nA: 1\r\n\r", {"A": "1"}, None, ["does not end", "without a colon"]),
        (b"XATS/1.0\r\nA: 1\r\n\r\n", {"A": "1"}, None, ["does not start with NATS/1.0"]),
        (b"NATS/1.0 50x\r\nA: 1\r\n\r\n", {"A": "1"}, None, ["malformed status code"]),
        (b"NATS/1.0 503\r\n\xff\xfe: x\r\nA: 1\r\n\r\n", {"A": "1"}, 503, ["not valid text"]),
        (b"NATS/1.0\r\nA: \xff\r\nB: 2\r\n\r\n", {"B": "2"}, None, ["not valid text"]),
        (b"NATS/1.0\r\n\r\nA: 1\r\n\r\n", {"A": "1"}, None, ["empty line inside"]),
        (b"NATS/1.0\r\nA B: 1\r\nA: 2\r\n\r\n", {"A": "2"}, None, ["invalid header name"]),
        (b"NATS/1.0\r\nA: 1\rB: 2\r\nC: 3\r\n\r\n", {"C": "3"}, None, ["contains CR or LF"]),
        (b"", {}, None, ["does not end", "does not start"]),
    ],
)
def test_read_leaves_out_what_it_cannot_read(
    block: bytes, headers: dict[str, str], status: int | None, problems: list[str]
) -> None:
    """A received block is read as far as it can be: each unreadable part is left out and
    described; the strict parser refuses the same block with the first of them."""
    got_headers, got_status, _, got_problems = read_header_block(block)
    assert (got_headers, got_status) == (Headers(headers), status)
    assert len(got_problems) == len(problems)
    for problem, fragment in zip(got_problems, problems, strict=True):
        assert fragment in problem
    with pytest.raises(InvalidHeaderError, match=re.escape(got_problems[0])):
        parse_header_block(block)


@PROPERTY
@given(header_pairs, statuses, descriptions)
def test_read_agrees_with_parse_on_good_blocks(
    pairs: list[tuple[str, str]], status: int | None, description: str
) -> None:
    block = encode_header_block(Headers(pairs), status, description)
    assert read_header_block(block) == (*parse_header_block(block), [])


@pytest.mark.parametrize(
    ("line", "status", "description"),
    [
        (b"NATS/1.0", None, ""),
        (b"NATS/1.0 ", None, ""),
        (b"NATS/1.0 \t ", None, ""),
        (b"NATS/1.0 503", 503, ""),
        (b"NATS/1.0 503 ", 503, ""),
        (b"NATS/1.0\t503", 503, ""),
        (b"NATS/1.0 100 Idle Heartbeat", 100, "Idle Heartbeat"),
        (b"NATS/1.0 100 FlowControl Request", 100, "FlowControl Request"),
        (b"NATS/1.0 404 No Messages", 404, "No Messages"),
        (b"NATS/1.0 408 Request Timeout", 408, "Request Timeout"),
        (b"NATS/1.0 409 Exceeded MaxWaiting", 409, "Exceeded MaxWaiting"),
        (b"NATS/1.0  404   No Messages  ", 404, "No Messages"),
        (b"NATS/1.0 409 Consumer Deleted\t", 409, "Consumer Deleted"),
        (b"NATS/1.0 200 d\xc3\xa9j\xc3\xa0", 200, "déjà"),
        (b"NATS/1.0 200 \xff", 200, "\ufffd"),
    ],
)
def test_status_line(line: bytes, status: int | None, description: str) -> None:
    assert parse_status_line(line) == (status, description)
    headers, got_status, got_description = parse_header_block(line + b"\r\n\r\n")
    assert (got_status, got_description) == (status, description)
    assert len(headers) == 0


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"NATS",
        b"NATS/1.",
        b"NATS/1.0X",
        b"NATS/1.01",
        b"NATS/1.0 50",
        b"NATS/1.0 5034",
        b"NATS/1.0 50a",
        b"NATS/1.0 abc",
        b"NATS/1.0 +50",
        b"NATS/1.0 -50",
        b"NATS/1.0 5\xd9\xa30",
        b"NATS/1.0 503No",
        b" NATS/1.0 503",
        b"nats/1.0 503",
        b"NATS/2.0 503",
    ],
)
def test_bad_status_line(line: bytes) -> None:
    with pytest.raises(InvalidHeaderError):
        parse_status_line(line)


def test_status_with_headers() -> None:
    block = (
        b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 42\r\nNats-Last-Stream: 97\r\n"
        b"Nats-Consumer-Stalled: _INBOX.x\r\n\r\n"
    )
    headers, status, description = parse_header_block(block)
    assert (status, description) == (100, "Idle Heartbeat")
    assert headers == Headers(
        {
            "Nats-Last-Consumer": "42",
            "Nats-Last-Stream": "97",
            "Nats-Consumer-Stalled": "_INBOX.x",
        }
    )


# -- round trip -------------------------------------------------------------------------------


@PROPERTY
@given(header_pairs, statuses, descriptions)
def test_block_round_trip(
    pairs: list[tuple[str, str]], status: int | None, description: str
) -> None:
    headers = Headers(pairs)
    block = encode_header_block(headers, status, description)
    assert block == headers.encode(status, description)
    assert block.startswith(b"NATS/1.0") and block.endswith(b"\r\n\r\n")
    parsed, got_status, got_description = parse_header_block(block)
    # values lose their surrounding spaces and tabs, as on every NATS client
    assert list(parsed.multi_items()) == grouped((n, v.strip(" \t")) for n, v in pairs)
    assert got_status == status
    assert got_description == (description.strip(" \t") if status is not None else "")
    assert parse_status_line(block[: block.index(b"\r\n")]) == (got_status, got_description)
    # the multi-map against a plain model
    model: dict[str, list[str]] = {}
    for name, value in pairs:
        model.setdefault(name, []).append(value)
    assert list(headers) == list(model)
    assert len(headers) == len(model)
    for name in [*model, "A", "a", "Nats-Msg-Id"]:
        assert headers.get_all(name) == model.get(name, [])
        assert headers.get(name) == (model[name][0] if name in model else None)
        assert (name in headers) == (name in model)
    # a parsed block re-encodes to a block that parses the same
    again = parse_header_block(parsed.encode(got_status, got_description))
    assert again == (parsed, got_status, got_description)
