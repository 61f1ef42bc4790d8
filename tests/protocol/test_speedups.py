"""The parser's C fast path (``_speedups.c``) against the pure-Python parser.

The C path is an accelerator: for any bytes, split any way, the events, the error (type and
text), the message byte count and what stays buffered must be exactly what the Python parser
gives. These tests feed both the same pieces and compare, on valid streams, mutated ones and
arbitrary bytes, plus the edge cases the C code decides on by hand.
"""

from __future__ import annotations

from typing import Any

import pytest
from headrace.protocol import Msg, ProtocolParser
from headrace.protocol import parser as parser_module
from hypothesis import given
from hypothesis import strategies as st

from ._strategies import (
    HEAVY,
    PROPERTY,
    FeedResult,
    describe,
    draw_pieces,
    feed_pieces,
    frame_lists,
    garbage,
    mutated_streams,
    parser_limits,
    rich_frame_lists,
    rich_frames,
)

pytestmark = pytest.mark.skipif(
    parser_module._scan_messages is None, reason="the C fast path is not built (no compiler?)"
)


def value(event: object) -> object:
    """An event as a comparable value (``Msg`` compares by identity)."""
    if isinstance(event, Msg):
        fields = (event.subject, event.sid, event.reply, event.data, event.raw_headers)
        assert [type(f) for f in fields[:2]] == [str, int]
        return fields
    return describe(event)


def outcome(fed: FeedResult) -> tuple[Any, ...]:
    error = None if fed.error is None else (type(fed.error), str(fed.error))
    buffered = fed.parser.buffered if fed.error is None else None
    return [value(e) for e in fed.events], error, fed.parser.message_bytes, buffered


def check_same(pieces: list[Any], **limits: int) -> FeedResult:
    fast = feed_pieces(pieces, speedups=True, **limits)
    slow = feed_pieces(pieces, speedups=False, **limits)
    assert fast.parser._scan is not None and slow.parser._scan is None
    assert outcome(fast) == outcome(slow)
    return fast


def test_the_fast_path_is_used() -> None:
    """A guard for the tests below: the C path really parses (and counts) a run of frames."""
    blob = b"MSG a 1 r 2\r\nhi\r\nHMSG b 2 r 12 14\r\nNATS/1.0\r\n\r\nhi\r\nMSG c 3 1\r\nx\r\n"
    parser = ProtocolParser(speedups=True)
    events: list[object] = []
    pos, total = parser_module._scan_messages(blob, 0, 4096, 1 << 20, {}, Msg, events)  # type: ignore[misc]
    assert pos == len(blob)
    assert total == 2 + 14 + 1
    assert [value(e) for e in events] == [value(e) for e in parser.feed(blob)]
    assert [m.reply for m in events] == ["r", "r", None]  # type: ignore[attr-defined]


def test_pure_python_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parser_module, "SPEEDUPS", False)
    assert ProtocolParser()._scan is None
    monkeypatch.setattr(parser_module, "SPEEDUPS", True)
    assert ProtocolParser()._scan is not None


@pytest.mark.parametrize(
    "blob",
    [
        b"MSG a 1 r 5\r\nhello\r\n",
        b"MSG a 1 5\r\nhello\r\n",  # no reply
        b"MSG\ta 1 5\r\nhello\r\n",  # a tab after the operation: the Python path's case
        b"MSG a\t1\t r \t5 \r\nhello\r\n",  # tabs and runs between the arguments
        b"msg a 1 5\r\nhello\r\n",  # lower case
        b"MSG a 1 r 05\r\nhello\r\n",  # leading zero
        b"MSG a 1 r +5\r\nhello\r\n",  # sign
        b"MSG a 1 r 5x\r\nhello\r\n",
        b"MSG a x r 5\r\nhello\r\n",  # sid not a number
        b"MSG a 1 r 5 6\r\nhello\r\n",  # too many arguments
        b"MSG a 1\r\nhello\r\n",  # too few
        b"MSG a 1 r 5\r\nhelloXY",  # not followed by CRLF
        b"MSG a 1 r 5\r\nhel",  # incomplete payload
        b"MSG a 1 r 5\r",  # incomplete line
        b"MSG a 1 r\r 5\r\nhello\r\n",  # a lone CR in the line
        b"MSG a 1 r\x0b5\r\nhello\r\n",  # vertical tab as a separator
        b"MSG a 1 r\n5\r\nhello\r\n",
        b"MSG \xff 1 r 5\r\nhello\r\n",  # subject not UTF-8
        b"MSG a 1 \xc3 5\r\nhello\r\n",  # reply not UTF-8
        b"MSG \xc3\xa9 1 \xc3\xa9 5\r\nhello\r\n",  # UTF-8 subject and reply
        b"MSG a 1 r 99999999999999999999\r\nhello\r\n",  # size past the C digits
        b"MSG a 123456789012345678901234 r 5\r\nhello\r\n",  # sid past the C digits
        b"MSG a 18446744073709551616 r 5\r\nhello\r\n",
        b"HMSG a 1 r 12 17\r\nNATS/1.0\r\n\r\nhello\r\n",
        b"HMSG a 1 12 17\r\nNATS/1.0\r\n\r\nhello\r\n",  # no reply
        b"HMSG a 1 r 0 5\r\nhello\r\n",  # empty header block
        b"HMSG a 1 r 18 17\r\nNATS/1.0\r\n\r\nhello\r\n",  # header larger than the message
        b"HMSG\ta 1 r 12 17\r\nNATS/1.0\r\n\r\nhello\r\n",
        b"HMSG a 1 r x 17\r\nNATS/1.0\r\n\r\nhello\r\n",
        b"HMSG a 1 r 12 17 9\r\nNATS/1.0\r\n\r\nhello\r\n",
        b"MSG a 1 r 5\r\nhello\r\nPING\r\nMSG a 1 r 5\r\nworld\r\n",  # runs between others
        b"MSG a 1 r 5\r\nhello\r\nMSG a 1 r 5\r\nhello\r\n-ERR 'x'\r\n",
        b"MSG a 1 r 5\r\nhello\r\nMSG b 1 r 5\r\nhello\r\nMSG a 1 r 5\r\nhello\r\n",
        b"MSG a 1 r 0\r\n\r\n",
        b"MSG " + b"s" * 40 + b" 1 r 1\r\nx\r\n",  # near max_control_line below
        b"MSG " + b"s" * 100 + b" 1 r 1\r\nx\r\n",
    ],
)
@pytest.mark.parametrize("limits", [{}, {"max_control_line": 48, "max_payload": 5}])
def test_edge_cases_as_python_parses_them(blob: bytes, limits: dict[str, int]) -> None:
    check_same([blob], **limits)
    # and byte by byte: every frame arrives in pieces
    check_same([blob[i : i + 1] for i in range(len(blob))], **limits)


@pytest.mark.parametrize("length", [46, 47, 48, 49, 50])
def test_control_line_at_the_limit(length: int) -> None:
    line = b"MSG " + b"s" * (length - 10) + b" 1 r 1"
    assert len(line) == length
    for limit in (length - 1, length, length + 1):
        fed = check_same([line + b"\r\nx\r\n"], max_control_line=limit)
        assert (fed.error is None) == (limit >= length)


@PROPERTY
@given(st.data(), frame_lists)
def test_valid_streams(data: st.DataObject, frames: list[Any]) -> None:
    blob = b"".join(f.wire for f in frames)
    check_same([blob])
    check_same(draw_pieces(data, blob))


@PROPERTY
@given(st.data(), st.one_of(garbage, mutated_streams()), parser_limits)
def test_mutated_streams_and_garbage(
    data: st.DataObject, blob: bytes, limits: dict[str, int]
) -> None:
    check_same([blob], **limits)
    check_same(draw_pieces(data, blob), **limits)


@pytest.mark.slow
@HEAVY
@given(st.data(), st.one_of(rich_frame_lists.map(lambda fs: b"".join(f.wire for f in fs))))
def test_valid_streams_heavy(data: st.DataObject, blob: bytes) -> None:
    check_same(draw_pieces(data, blob))


@pytest.mark.slow
@HEAVY
@given(st.data(), mutated_streams(rich_frames), parser_limits)
def test_mutated_streams_heavy(data: st.DataObject, blob: bytes, limits: dict[str, int]) -> None:
    check_same(draw_pieces(data, blob), **limits)
