"""Hypothesis strategies, a small server-side frame encoder and feeding helpers.

The encoder here is written for the tests, independently of ``headrace.protocol.commands``: it
produces what a NATS server sends (``MSG``, ``HMSG``, ``INFO``, ``PING``, ``PONG``, ``+OK``,
``-ERR``) together with the event each frame must parse to, in the normalised form of
:func:`describe`.
"""

from __future__ import annotations

import itertools
import json
import string
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from headrace.errors import MalformedHeaderWarning, ProtocolError
from headrace.protocol import Err, Headers, Info, Msg, Ok, Ping, Pong, ProtocolParser
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: Settings of the parser's property tests (the heavy ones run in the slow set).
PROPERTY = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
HEAVY = settings(PROPERTY, max_examples=20_000)

# -- normalised events ------------------------------------------------------------------------


def describe(event: object) -> tuple[Any, ...]:
    """A comparable description of a parsed event (``Msg`` compares by identity)."""
    if isinstance(event, Msg):
        # A malformed block is read as far as it can be, and reported as a warning: the
        # description notes whether it was (reading never raises).
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always", MalformedHeaderWarning)
            headers = event.headers
            status = (event.status, event.description)
        items = None if headers is None else list(headers.multi_items())
        return (
            "msg" if not warned else "msg, malformed headers",
            event.subject,
            event.sid,
            event.reply,
            event.data,
            event.raw_headers,
            items,
            status,
        )
    if isinstance(event, Info):
        i = event.info
        fields = (i.server_id, i.max_payload, i.connect_urls, i.lame_duck_mode, i.proto, i.headers)
        return ("info", fields, i.raw)
    if isinstance(event, Err):
        return ("err", event.message)
    if isinstance(event, Ping | Pong | Ok):
        return (type(event).__name__,)
    raise AssertionError(f"unexpected event {event!r}")


def describe_all(events: Iterable[object]) -> list[tuple[Any, ...]]:
    return [describe(e) for e in events]


# -- feeding ----------------------------------------------------------------------------------


@dataclass
class FeedResult:
    events: list[object]
    error: ProtocolError | None
    parser: ProtocolParser


def feed_pieces(pieces: Iterable[bytes | bytearray | memoryview], **kwargs: Any) -> FeedResult:
    """Feed ``pieces`` in order; collect the events, including ``exc.events`` at an error.

    Any exception other than :class:`ProtocolError` propagates (and fails the test).
    """
    parser = ProtocolParser(**kwargs)
    events: list[object] = []
    for piece in pieces:
        try:
            events.extend(parser.feed(piece))
        except ProtocolError as exc:
            events.extend(exc.events)
            return FeedResult(events, exc, parser)
    return FeedResult(events, None, parser)


def split_at(blob: bytes, cuts: Iterable[int]) -> list[bytes]:
    points = [0, *sorted(cuts), len(blob)]
    return [blob[a:b] for a, b in itertools.pairwise(points)]


def draw_pieces(data: st.DataObject, blob: bytes) -> list[bytes | bytearray | memoryview]:
    """Split ``blob`` the way hypothesis likes: arbitrary cuts, empty pieces, single bytes."""
    n = len(blob)
    mode = data.draw(st.sampled_from(["cuts", "bytewise", "fixed"]), label="split mode")
    pieces: list[bytes]
    if mode == "bytewise":
        pieces = [blob[i : i + 1] for i in range(n)]
    elif mode == "fixed":
        k = data.draw(st.integers(1, 16), label="chunk size")
        pieces = [blob[i : i + k] for i in range(0, n, k)]
    else:
        cuts = data.draw(st.lists(st.integers(0, n), max_size=12), label="cuts")
        pieces = split_at(blob, cuts)
    kind = data.draw(st.sampled_from(["bytes", "bytearray", "memoryview"]), label="piece type")
    if kind == "bytearray":
        return [bytearray(p) for p in pieces]
    if kind == "memoryview":
        return [memoryview(p) for p in pieces]
    return list(pieces)


# -- valid alphabets --------------------------------------------------------------------------

HEADER_NAME_CHARS = "!#$%&'*+-.^_`|~" + string.digits + string.ascii_letters


#: no whitespace (every str.isspace() character is in Cc, Zs, Zl or Zp), no control, no dot
subject_chars = st.characters(
    exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp"), exclude_characters="."
)
#: a token of a concrete subject: no wildcard token, but "a*" and "b>" are literal characters.
tokens = st.text(subject_chars, min_size=1, max_size=6).map(
    lambda t: t + "x" if t in ("*", ">") else t
)
subjects = st.lists(tokens, min_size=1, max_size=3).map(".".join)
sids = st.integers(0, 2**64)

header_names = st.one_of(
    st.sampled_from(["A", "a", "Nats-Msg-Id"]),
    st.text(st.sampled_from(HEADER_NAME_CHARS), min_size=1, max_size=8),
)
header_values = st.one_of(
    st.text(st.sampled_from(string.ascii_letters + string.digits + " \t:-"), max_size=12),
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\r\n\x00"), max_size=8),
)
header_pairs = st.lists(st.tuples(header_names, header_values), max_size=4)
descriptions = st.one_of(
    st.sampled_from(["", "No Responders", "Idle Heartbeat", "No Messages", "Request Timeout"]),
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\r\n\x00"), max_size=10),
)
statuses = st.one_of(st.none(), st.sampled_from([100, 404, 408, 409, 503]), st.integers(100, 999))

TRICKY = [
    b"\r\n",
    b"\r\n\r\n",
    b"MSG a 1 2\r\nhi\r\n",
    b"HMSG a 1 12 12\r\n",
    b"PING\r\n",
    b"NATS/1.0\r\n\r\n",
    b"-ERR 'x'\r\n",
    b"\r",
    b"\n",
]
TRICKY_PAYLOADS = [*TRICKY, b"".join(TRICKY), b"x" * 300 + b"\r\n" + b"MSG a 1 0\r\n\r\n"]
payloads = st.one_of(
    st.binary(max_size=48),
    st.sampled_from(TRICKY_PAYLOADS),
    st.tuples(st.binary(max_size=3), st.sampled_from(TRICKY), st.binary(max_size=3)).map(b"".join),
)

separators = st.sampled_from([" ", "\t", "  ", " \t"])


def grouped(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The multi_items order of a header multi-map: names by first appearance, values in order."""
    out: dict[str, list[str]] = {}
    for name, value in pairs:
        out.setdefault(name, []).append(value)
    return [(n, v) for n, vs in out.items() for v in vs]


# -- server frames ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    wire: bytes
    expected: tuple[Any, ...]


@dataclass(frozen=True)
class Style:
    """How a control line is spelled: operation case, separator, trailer, zero padding."""

    case: str = "upper"
    sep: str = " "
    trailer: str = ""
    zeros: str = ""

    def line(self, op: str, parts: Sequence[str | int]) -> bytes:
        op = getattr(op, self.case)()
        words = [p if isinstance(p, str) else self.zeros + str(p) for p in parts]
        return (op + "".join(self.sep + w for w in words) + self.trailer).encode()


styles = st.one_of(
    st.just(Style()),
    st.builds(
        Style,
        st.sampled_from(["upper", "lower", "title"]),
        st.sampled_from([" ", "\t", "  ", " \t"]),
        st.sampled_from(["", " ", "\t"]),
        st.sampled_from(["", "0", "00"]),
    ),
)


@dataclass(frozen=True)
class Alphabets:
    """Where frame fields come from: generated from the valid alphabets, or drawn from pools.

    Pools cost one draw per field, which keeps the fast properties fast; the heavy ones and
    the command round trip generate every field.
    """

    subjects: st.SearchStrategy[str]
    header_pairs: st.SearchStrategy[list[tuple[str, str]]]
    descriptions: st.SearchStrategy[str]
    texts: st.SearchStrategy[str]


SUBJECT_POOL = [
    "a",
    "foo.bar",
    "_INBOX.Zx81kQ.7",
    "$JS.ACK.ORDERS.c1.1.42.42.1700000000000000000.0",
    "a*.b>.c",
    "ünï.çødé",
    "日本.語",
    "𝄞.x",
    "A-B_C.$d.~e",
    "x" * 60,
    "t.MSG.HMSG.PING",
]
HEADER_PAIR_POOL = [
    ("Nats-Msg-Id", "abc-1"),
    ("X", "1"),
    ("X", "2"),
    ("x", "lower"),
    ("Empty", ""),
    ("Colon", "a: b: c"),
    ("Spaced", "  padded \t"),
    ("Inner", "two  words\tand tabs"),
    ("U", "ünïcødé 日本"),
    ("!#$%&'*+-.^_`|~", "token chars"),
    ("Nats-Last-Consumer", "42"),
    ("Ctl", "\x01\x0b\x7f"),
    ("Crlfish", "MSG a 1 2"),
]
TEXT_POOL = ["", "Authorization Violation", " spaced ", "'", "it's", "日本", "a\tb", "\x7f"]

RICH = Alphabets(
    subjects=subjects,
    header_pairs=header_pairs,
    descriptions=descriptions,
    texts=st.text(
        st.characters(exclude_categories=("Cs",), exclude_characters="\r\n"), max_size=20
    ),
)
POOLED = Alphabets(
    subjects=st.sampled_from(SUBJECT_POOL),
    header_pairs=st.lists(st.sampled_from(HEADER_PAIR_POOL), max_size=4),
    descriptions=st.sampled_from(
        ["", "No Responders", "Idle Heartbeat", " Request  Timeout ", "x\ty", "日本"]
    ),
    texts=st.sampled_from(TEXT_POOL),
)


@st.composite
def msg_frames(draw: st.DrawFn, ab: Alphabets = RICH) -> Frame:
    subject = draw(ab.subjects)
    sid = draw(sids)
    reply = draw(st.none() | ab.subjects)
    data = draw(payloads)
    parts: list[str | int] = [subject, sid]
    if reply is not None:
        parts.append(reply)
    parts.append(len(data))
    line = draw(styles).line("MSG", parts)
    wire = line + b"\r\n" + data + b"\r\n"
    return Frame(wire, ("msg", subject, sid, reply, data, None, None, (None, "")))


@st.composite
def hmsg_frames(draw: st.DrawFn, ab: Alphabets = RICH) -> Frame:
    subject = draw(ab.subjects)
    sid = draw(sids)
    reply = draw(st.none() | ab.subjects)
    data = draw(payloads)
    pairs = draw(ab.header_pairs)
    status = draw(statuses)
    description = draw(ab.descriptions) if status is not None else ""
    block = Headers(pairs).encode(status, description)
    parts: list[str | int] = [subject, sid]
    if reply is not None:
        parts.append(reply)
    parts += [len(block), len(block) + len(data)]
    line = draw(styles).line("HMSG", parts)
    wire = line + b"\r\n" + block + data + b"\r\n"
    items = grouped((n, v.strip(" \t")) for n, v in pairs)
    expected = (
        "msg",
        subject,
        sid,
        reply,
        data,
        block,
        items,
        (status, description.strip(" \t")),
    )
    return Frame(wire, expected)


@st.composite
def info_frames(draw: st.DrawFn, ab: Alphabets = RICH) -> Frame:
    obj = draw(
        st.fixed_dictionaries(
            {"server_id": ab.texts, "max_payload": st.integers(1, 2**40)},
            optional={
                "connect_urls": st.lists(ab.texts, max_size=3),
                "ldm": st.booleans(),
                "proto": st.integers(0, 3),
                "headers": st.booleans(),
                "go": ab.texts,
                "xkey": st.none() | st.integers() | st.lists(st.booleans(), max_size=2),
            },
        )
    )
    op = draw(st.sampled_from(["INFO", "info", "Info"]))
    sep = draw(separators)
    wire = (op + sep + json.dumps(obj)).encode() + b"\r\n"
    fields = (
        obj["server_id"],
        obj["max_payload"],
        tuple(obj.get("connect_urls", ())),
        obj.get("ldm", False),
        obj.get("proto", 0),
        obj.get("headers", False),
    )
    return Frame(wire, ("info", fields, obj))


@st.composite
def simple_frames(draw: st.DrawFn) -> Frame:
    name, op = draw(
        st.sampled_from(
            [
                ("Ping", "PING"),
                ("Pong", "PONG"),
                ("Ok", "+OK"),
                ("Ping", "ping"),
                ("Pong", "pOnG"),
                ("Ok", "+ok"),
            ]
        )
    )
    trailer = draw(st.sampled_from(["", " ", "\t", " \t "]))
    return Frame((op + trailer).encode() + b"\r\n", (name,))


@st.composite
def err_frames(draw: st.DrawFn, ab: Alphabets = RICH) -> Frame:
    text = draw(ab.texts)
    op = draw(st.sampled_from(["-ERR", "-err", "-Err"]))
    sep = draw(separators)
    return Frame(f"{op}{sep}'{text}'".encode() + b"\r\n", ("err", text))


def frames_from(ab: Alphabets) -> st.SearchStrategy[Frame]:
    return st.one_of(
        msg_frames(ab), hmsg_frames(ab), simple_frames(), err_frames(ab), info_frames(ab)
    )


frames = frames_from(POOLED)
rich_frames = frames_from(RICH)
frame_lists = st.lists(frames, max_size=5)
rich_frame_lists = st.lists(rich_frames, max_size=8)


# -- malformed input --------------------------------------------------------------------------

SOUP = [
    b"MSG ",
    b"HMSG ",
    b"msg\t",
    b"\r\n",
    b"\r",
    b"\n",
    b" ",
    b"\t",
    b"0",
    b"1",
    b"2",
    b"12",
    b"-1",
    b"+5",
    b"1_0",
    b"a",
    b"a.b",
    b"NATS/1.0",
    b"NATS/1.0 503",
    b"\r\n\r\n",
    b"X: y\r\n",
    b":",
    b"PING",
    b"PONG",
    b"+OK",
    b"-ERR ",
    b"'",
    b"INFO ",
    b"{}",
    b'{"max_payload":5}',
    b"[",
    b"\xff",
    b"\xc3\xa9",
]
#: arbitrary bytes, and arbitrary sequences of protocol-looking tokens
garbage = st.one_of(
    st.binary(max_size=120),
    st.lists(st.one_of(st.sampled_from(SOUP), st.binary(max_size=3)), max_size=24).map(b"".join),
)

interesting_bytes = st.one_of(st.sampled_from(b"\r\n \t0129-+_:.'{"), st.integers(0, 255))


@st.composite
def mutated_streams(draw: st.DrawFn, source: st.SearchStrategy[Frame] = frames) -> bytes:
    """A valid server stream with a few random byte edits."""
    blob = bytearray(b"".join(f.wire for f in draw(st.lists(source, max_size=4))))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["replace", "insert", "delete", "truncate"]))
        i = draw(st.integers(0, len(blob)))
        if kind == "replace" and i < len(blob):
            blob[i] = draw(interesting_bytes)
        elif kind == "insert":
            blob[i:i] = bytes(draw(st.lists(interesting_bytes, min_size=1, max_size=4)))
        elif kind == "delete":
            del blob[i : i + draw(st.integers(1, 8))]
        else:
            del blob[i:]
    return bytes(blob)


parser_limits = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {"max_control_line": st.integers(16, 96), "max_payload": st.integers(0, 96)}
    ),
)
