"""The client-side encoders (PUB, HPUB, SUB, UNSUB, CONNECT) and the checks they make."""

from __future__ import annotations

import json
from typing import Any

import pytest
from headrace.errors import (
    InvalidHeaderError,
    InvalidSubjectError,
    MaxPayloadExceeded,
    ProtocolError,
)
from headrace.protocol import (
    PING,
    PONG,
    Headers,
    Msg,
    ProtocolParser,
    check_queue,
    check_subject,
    encode_connect,
    encode_hpub,
    encode_pub,
    encode_sub,
    encode_unsub,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ._strategies import (
    TRICKY_PAYLOADS,
    descriptions,
    grouped,
    header_pairs,
    sids,
    statuses,
    subjects,
)

PROPERTY = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_ping_pong() -> None:
    assert PING == b"PING\r\n"
    assert PONG == b"PONG\r\n"


# -- PUB / HPUB -------------------------------------------------------------------------------


def test_pub() -> None:
    assert encode_pub("foo.bar", b"hello") == b"PUB foo.bar 5\r\nhello\r\n"
    assert encode_pub("foo", b"") == b"PUB foo 0\r\n\r\n"
    assert encode_pub("foo", b"a\r\nb") == b"PUB foo 4\r\na\r\nb\r\n"


def test_pub_with_reply() -> None:
    assert encode_pub("foo", b"hi", "_INBOX.x.1") == b"PUB foo _INBOX.x.1 2\r\nhi\r\n"


def test_pub_accepts_bytes_like_payloads() -> None:
    assert encode_pub("foo", bytearray(b"hi")) == b"PUB foo 2\r\nhi\r\n"
    assert encode_pub("foo", memoryview(b"hi")) == b"PUB foo 2\r\nhi\r\n"


def test_pub_non_ascii_subject() -> None:
    assert encode_pub("日本", b"x") == "PUB 日本 1\r\nx\r\n".encode()


def test_hpub() -> None:
    headers = Headers([("A", "1"), ("B", "two words"), ("A", "2")])
    block = b"NATS/1.0\r\nA: 1\r\nA: 2\r\nB: two words\r\n\r\n"
    assert len(block) == 38
    assert encode_hpub("foo", headers, b"hello") == b"HPUB foo 38 43\r\n" + block + b"hello\r\n"


def test_hpub_with_reply() -> None:
    block = b"NATS/1.0\r\nA: 1\r\n\r\n"
    assert len(block) == 18
    assert (
        encode_hpub("foo", Headers({"A": "1"}), b"hi", "r.1")
        == b"HPUB foo r.1 18 20\r\n" + block + b"hi\r\n"
    )


def test_hpub_empty_headers_and_payload() -> None:
    assert encode_hpub("foo", Headers(), b"") == b"HPUB foo 12 12\r\nNATS/1.0\r\n\r\n\r\n"


def test_hpub_with_encoded_block() -> None:
    block = Headers({"Nats-Msg-Id": "7"}).encode()
    same = encode_hpub("foo", Headers({"Nats-Msg-Id": "7"}), b"x")
    assert encode_hpub("foo", block, b"x") == same
    status_block = b"NATS/1.0 503\r\n\r\n"
    assert encode_hpub("a", status_block, b"") == b"HPUB a 16 16\r\n" + status_block + b"\r\n"


def test_header_block_format() -> None:
    frame = encode_hpub("s", Headers({"K": "v", "Nats-Expected-Stream": "ORDERS"}), b"")
    head, _, rest = frame.partition(b"\r\n")
    _, _, hdr, total = head.split(b" ")
    block = rest[: int(hdr)]
    assert block.startswith(b"NATS/1.0\r\n")
    assert block.endswith(b"\r\n\r\n")
    assert block.split(b"\r\n")[1:-2] == [b"K: v", b"Nats-Expected-Stream: ORDERS"]
    assert int(total) == int(hdr)
    assert rest == block + b"\r\n"


# -- SUB / UNSUB / CONNECT --------------------------------------------------------------------


def test_sub() -> None:
    assert encode_sub("foo.bar", 1) == b"SUB foo.bar 1\r\n"
    assert encode_sub("foo.*", 22) == b"SUB foo.* 22\r\n"
    assert encode_sub(">", 3) == b"SUB > 3\r\n"
    assert encode_sub("a.*.>", 3) == b"SUB a.*.> 3\r\n"


def test_sub_with_queue() -> None:
    assert encode_sub("orders.>", 7, "workers") == b"SUB orders.> workers 7\r\n"
    assert encode_sub("a", 7, "q.1-*") == b"SUB a q.1-* 7\r\n"


@pytest.mark.parametrize("queue", ["", " ", "a b", "a\tb", "a\r\n", "\x00", "q\x7f", "\u2028", 5])
def test_sub_bad_queue(queue: Any) -> None:
    with pytest.raises(InvalidSubjectError):
        encode_sub("a", 1, queue)
    with pytest.raises(InvalidSubjectError):
        check_queue(queue)


def test_unsub() -> None:
    assert encode_unsub(1) == b"UNSUB 1\r\n"
    assert encode_unsub(12, 5) == b"UNSUB 12 5\r\n"
    assert encode_unsub(12, 0) == b"UNSUB 12 0\r\n"
    with pytest.raises(ValueError):
        encode_unsub(1, -1)


def test_connect() -> None:
    fields = {
        "verbose": False,
        "pedantic": False,
        "tls_required": False,
        "name": "héadrace\r\nx",
        "lang": "python",
        "version": "0.1",
        "protocol": 1,
        "headers": True,
        "no_responders": True,
    }
    frame = encode_connect(fields)
    assert frame.startswith(b"CONNECT {")
    assert frame.endswith(b"}\r\n")
    assert frame.count(b"\r\n") == 1
    assert b" " not in frame[len(b"CONNECT ") :]
    assert json.loads(frame[len(b"CONNECT ") : -2]) == fields
    assert encode_connect({}) == b"CONNECT {}\r\n"


# -- subjects ---------------------------------------------------------------------------------

BAD_ANYWHERE = [
    "",
    " ",
    "a b",
    " a",
    "a ",
    "a\tb",
    "a\rb",
    "a\nb",
    "a\r\nb",
    "a\x00b",
    "a\x01",
    "a\x1f",
    "a\x7f",
    "a\x0bb",
    "a\x0cb",
    "a\xa0b",
    "a\x85b",
    "a\u2028b",
    "a\u3000b",
    "a..b",
    ".a",
    "a.",
    ".",
    "..",
    "a.b.",
    ">.a",
    "a.>.b",
    "a.>.>",
]
GOOD_CONCRETE = [
    "a",
    "a.b.c",
    "a*",
    "a>",
    "*a",
    ">a",
    "a.b*.c",
    "a.**",
    "a.>>",
    "$JS.API.STREAM.INFO.ORDERS",
    "_INBOX.Zx81kQ.7",
    "ünï.çødé",
    "日本.語",
    "a-b_c~d|e",
    "x" * 1000,
]
WILDCARDS = ["*", ">", "a.*", "a.>", "*.*.>", "a.*.c", "*.b", "a.b.c.>"]


@pytest.mark.parametrize("subject", BAD_ANYWHERE)
def test_bad_subjects(subject: str) -> None:
    for wildcards in (False, True):
        with pytest.raises(InvalidSubjectError):
            check_subject(subject, wildcards=wildcards)
    with pytest.raises(InvalidSubjectError):
        encode_pub(subject, b"")
    with pytest.raises(InvalidSubjectError):
        encode_hpub(subject, Headers(), b"")
    with pytest.raises(InvalidSubjectError):
        encode_sub(subject, 1)
    with pytest.raises(InvalidSubjectError):
        encode_pub("ok", b"", subject)
    with pytest.raises(InvalidSubjectError):
        encode_hpub("ok", Headers(), b"", subject)


@pytest.mark.parametrize("subject", GOOD_CONCRETE)
def test_good_subjects(subject: str) -> None:
    check_subject(subject)
    check_subject(subject, wildcards=True)
    assert encode_pub(subject, b"").startswith(b"PUB " + subject.encode() + b" 0")
    encode_pub("a", b"", subject)
    encode_sub(subject, 1)


@pytest.mark.parametrize("subject", WILDCARDS)
def test_wildcards_only_for_subscribe(subject: str) -> None:
    check_subject(subject, wildcards=True)
    assert encode_sub(subject, 1) == b"SUB " + subject.encode() + b" 1\r\n"
    with pytest.raises(InvalidSubjectError):
        check_subject(subject)
    with pytest.raises(InvalidSubjectError):
        encode_pub(subject, b"")
    with pytest.raises(InvalidSubjectError):
        encode_hpub(subject, Headers(), b"")
    with pytest.raises(InvalidSubjectError, match="reply"):
        encode_pub("a", b"", subject)


@pytest.mark.parametrize("subject", [None, 5, b"foo", ["a"]])
def test_subject_must_be_str(subject: Any) -> None:
    with pytest.raises(InvalidSubjectError):
        check_subject(subject)
    with pytest.raises(InvalidSubjectError):
        encode_pub(subject, b"")


def test_invalid_subject_error_is_protocol_and_value_error() -> None:
    with pytest.raises(ProtocolError):
        check_subject("a b")
    with pytest.raises(ValueError):
        check_subject("")


@pytest.mark.parametrize("text", ["a\ud800", "\udfff.b"])
def test_unencodable_subject_is_an_invalid_subject(text: str) -> None:
    """Lone surrogates cannot be encoded: the check must refuse them, not ``str.encode``."""
    with pytest.raises(InvalidSubjectError):
        check_subject(text)
    with pytest.raises(InvalidSubjectError):
        encode_pub(text, b"")
    with pytest.raises(InvalidSubjectError):
        encode_sub("a", 1, text)


def test_check_false_skips_validation() -> None:
    assert encode_pub("a b", b"x", check=False) == b"PUB a b 1\r\nx\r\n"
    assert encode_pub("a.>", b"", "r.*", check=False) == b"PUB a.> r.* 0\r\n\r\n"
    assert encode_hpub("a..b", Headers(), b"", check=False).startswith(b"HPUB a..b 12 12\r\n")
    assert encode_sub("a..b", 1, "q q", check=False) == b"SUB a..b q q 1\r\n"
    assert len(encode_pub("a", b"xx", max_payload=1, check=False)) > 0


# -- headers on HPUB --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["A B", "A:", "", "A\r\n", "é"])
def test_hpub_header_names_checked(name: str) -> None:
    with pytest.raises(InvalidHeaderError):
        encode_hpub("a", Headers([(name, "v")]), b"")


@pytest.mark.parametrize("value", ["a\r\nB: injected", "a\rb", "a\nb", "\x00"])
def test_hpub_header_values_checked(value: str) -> None:
    with pytest.raises(InvalidHeaderError):
        encode_hpub("a", Headers([("A", value)]), b"")


def test_hpub_header_values_may_contain_colons_and_spaces() -> None:
    frame = encode_hpub("a", Headers({"A": "x: y z"}), b"")
    (msg,) = ProtocolParser().feed(to_server(frame, 1))
    assert msg.headers["A"] == "x: y z"


# -- max_payload ------------------------------------------------------------------------------


def test_pub_max_payload() -> None:
    assert encode_pub("a", b"12345", max_payload=5) == b"PUB a 5\r\n12345\r\n"
    with pytest.raises(MaxPayloadExceeded):
        encode_pub("a", b"123456", max_payload=5)
    with pytest.raises(MaxPayloadExceeded):
        encode_pub("a", b"1", max_payload=0)
    assert encode_pub("a", b"", max_payload=0) == b"PUB a 0\r\n\r\n"
    encode_pub("a", b"x" * 10_000, max_payload=None)


def test_hpub_max_payload_counts_headers() -> None:
    headers = Headers({"A": "1"})  # an 18-byte block
    assert encode_hpub("a", headers, b"12", max_payload=20)
    with pytest.raises(MaxPayloadExceeded):
        encode_hpub("a", headers, b"12", max_payload=19)
    with pytest.raises(MaxPayloadExceeded):
        encode_hpub("a", headers, b"", max_payload=17)
    with pytest.raises(MaxPayloadExceeded):
        encode_hpub("a", headers.encode(), b"12", max_payload=19)


def test_max_payload_exceeded_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        encode_pub("a", b"xx", max_payload=1)


# -- properties -------------------------------------------------------------------------------

ALPHABET = ["a", "b", ".", ".", "*", ">", " ", "\t", "\x00", "\x1f", "\x7f", "é", "\xa0", "\x85"]


def model_valid(subject: str, wildcards: bool) -> bool:
    tokens = subject.split(".")
    if not subject or "" in tokens:
        return False
    if any(c.isspace() or ord(c) < 0x20 or c == "\x7f" for c in subject):
        return False
    for i, token in enumerate(tokens):
        if token in ("*", ">") and (not wildcards or (token == ">" and i != len(tokens) - 1)):
            return False
    return True


@PROPERTY
@given(st.text(st.sampled_from(ALPHABET), max_size=8), st.booleans())
def test_check_subject_model(subject: str, wildcards: bool) -> None:
    try:
        check_subject(subject, wildcards=wildcards)
    except InvalidSubjectError:
        valid = False
    else:
        valid = True
    assert valid == model_valid(subject, wildcards)
    try:
        check_queue(subject)
    except InvalidSubjectError:
        valid_queue = False
    else:
        valid_queue = True
    assert valid_queue == (
        bool(subject) and not any(c.isspace() or ord(c) < 0x20 or c == "\x7f" for c in subject)
    )


def to_server(frame: bytes, sid: int) -> bytes:
    """Turn a client PUB/HPUB into the MSG/HMSG the server would deliver to subscription ``sid``.

    Only the control line changes: the operation is renamed and the sid goes after the subject.
    """
    eol = frame.index(b"\r\n")
    op, subject, *rest = frame[:eol].split(b" ")
    server_op = {b"PUB": b"MSG", b"HPUB": b"HMSG"}[op]
    return b" ".join([server_op, subject, b"%d" % sid, *rest]) + frame[eol:]


messages = st.fixed_dictionaries(
    {
        "subject": subjects,
        "reply": st.none() | subjects,
        "payload": st.one_of(st.binary(max_size=64), st.sampled_from(TRICKY_PAYLOADS)),
        "sid": sids,
        "headers": st.none() | st.tuples(header_pairs, statuses, descriptions, st.booleans()),
    }
)


@PROPERTY
@given(messages)
def test_publish_round_trip(m: dict[str, Any]) -> None:
    subject, reply, payload, sid = m["subject"], m["reply"], m["payload"], m["sid"]
    if m["headers"] is None:
        frame = encode_pub(subject, payload, reply, max_payload=len(payload))
        expected_headers = None
        expected_status: tuple[Any, str] = (None, "")
    else:
        pairs, status, description, pre_encoded = m["headers"]
        headers = Headers(pairs)
        if pre_encoded:
            given_headers: Headers | bytes = headers.encode(status, description)
        else:
            given_headers, status, description = headers, None, ""
        frame = encode_hpub(subject, given_headers, payload, reply)
        expected_headers = grouped((n, v.strip(" \t")) for n, v in pairs)
        expected_status = (status, description.strip(" \t") if status is not None else "")
    parser = ProtocolParser()
    (msg,) = parser.feed(to_server(frame, sid))
    assert parser.buffered == 0
    assert isinstance(msg, Msg)
    assert msg.subject == subject
    assert msg.reply == reply
    assert msg.sid == sid
    assert msg.data == payload
    if expected_headers is None:
        assert msg.headers is None
        assert msg.raw_headers is None
    else:
        assert msg.headers is not None
        assert list(msg.headers.multi_items()) == expected_headers
        assert msg.raw_headers is not None
        assert msg.size == len(msg.raw_headers) + len(payload)
    assert (msg.status, msg.description) == expected_status
