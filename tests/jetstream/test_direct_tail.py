"""The C split of a batched Direct Get answer's server lines (``jetstream/_direct_tail.c``)
against the Python path of the Spark source's task reader (``ColumnReader``).

``split_tail`` is an accelerator: it returns ``None`` for every block it does not take, and
``ColumnReader`` then reads the block in Python. So two things are checked: what it returns
for a block is what a Python model of its contract gives (built on the Python path's own
pieces: ``rfind``, ``split``, ``int``, ``_stamp_micros``), and a reader with it and a reader
without it give the same rows, errors and warnings for the same replies, on the typical
blocks and edge cases below and on generated ones (valid, mutated, odd time stamps).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
import warnings
from typing import Any

import pytest
from headrace.protocol import Msg
from hypothesis import example, given, settings
from hypothesis import strategies as st

reading = pytest.importorskip("headrace_spark.datasource.reading")

try:
    from headrace.jetstream._direct_tail import split_tail
except ImportError:  # pragma: no cover - built without a C compiler
    pytestmark = pytest.mark.skip(reason="the C split is not built (no compiler?)")

NAMES = (
    b"Nats-Stream",
    b"Nats-Subject",
    b"Nats-Sequence",
    b"Nats-Time-Stamp",
    b"Nats-Num-Pending",
    b"Nats-Last-Sequence",
)
STAMP = b"2026-11-27T21:27:24.101921033Z"
STAMP_MICROS = 1_795_814_844_101_921
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
STRICT = re.compile(rb"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{0,9}))?Z\Z")


def block(
    *,
    own: bytes = b"",
    stream: bytes = b"S",
    subject: bytes = b"orders.1",
    seq: bytes = b"7",
    stamp: bytes = STAMP,
    pending: bytes = b"3",
    last: bytes = b"6",
) -> bytes:
    """A reply's header block as nats-server 2.11+ writes it (``own``: the message's lines)."""
    values = (stream, subject, seq, stamp, pending, last)
    server = b"".join(
        name + b": " + value + b"\r\n" for name, value in zip(NAMES, values, strict=True)
    )
    return b"NATS/1.0\r\n" + own + server + b"\r\n"


def strict_micros(stamp: bytes) -> int | None:
    """``YYYY-MM-DDTHH:MM:SS[.fraction]Z`` (0-9 digits) in microseconds, by datetime; None for
    any other text or an impossible date or time."""
    found = STRICT.match(stamp)
    if found is None:
        return None
    y, mo, d, h, mi, s, fraction = found.groups()
    try:
        when = dt.datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), tzinfo=dt.UTC)
    except ValueError:
        return None
    delta = when - EPOCH
    seconds = delta.days * 86_400 + delta.seconds
    return seconds * 1_000_000 + int(((fraction or b"") + b"000000")[:6])


def model(raw: bytes) -> tuple[int, bytes, int, int, int | None] | None:
    """What ``split_tail(raw)`` must return, in Python."""
    if not (raw.startswith(b"NATS/1.0\r\n") and raw.endswith(b"\r\n\r\n")):
        return None
    at = raw.rfind(b"\r\nNats-Stream: ")
    if at < 8:
        return None
    lines = raw[at + 2 : -4].split(b"\r\n")
    if len(lines) != 6 or not all(
        line.startswith(name + b": ") for line, name in zip(lines, NAMES, strict=True)
    ):
        return None
    seq, last = lines[2][15:], lines[5][20:]
    for number in (seq, last):
        # Plain ASCII digits, at most 20 of them, below 2**64 (anything else: Python decides).
        if not (0 < len(number) <= 20 and number.isdigit() and int(number) < 2**64):
            return None
    return at, lines[1][14:], int(seq), int(last), strict_micros(lines[3][17:])


def check_split(raw: bytes) -> tuple[int, bytes, int, int, int | None] | None:
    """``split_tail(raw)``, checked against :func:`model` and the Python path's pieces."""
    got = split_tail(raw)
    assert got == model(raw)
    if got is not None:
        at, subject, seq, last, micros = got
        assert at == raw.rfind(b"\r\nNats-Stream: ")
        lines = raw[at + 2 : -4].split(b"\r\n")
        assert (subject, seq, last) == (lines[1][14:], int(lines[2][15:]), int(lines[5][20:]))
        if micros is not None:  # the time stamp as the Python path reads it
            assert micros == reading._stamp_micros(lines[3][17:])
    return got


def taken(raw: bytes) -> tuple[int, bytes, int, int, int | None]:
    """``split_tail(raw)``, checked, for a block it must take."""
    got = check_split(raw)
    assert got is not None
    return got


# -- what a reader does with it ------------------------------------------------------------------


def reply(raw: bytes) -> Msg:
    return Msg("_INBOX.x.1", 1, None, b"payload", raw)


def feed_all(split: Any, answer: list[bytes], previous: int, last: int) -> tuple[Any, ...]:
    """Everything observable of a ColumnReader fed ``answer``, with ``split`` as its split."""
    columns = reading._Columns("S")
    reader = reading.ColumnReader("S", columns, last, split=split)
    reader._previous = previous
    results: list[Any] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for raw in answer:
            try:
                results.append(reader.feed(reply(raw)))
            except Exception as exc:  # the same error either way, or none
                results.append((type(exc), str(exc)))
                break
    rows = (columns.subjects, columns.data, columns.headers, columns.seqs, columns.times)
    stored = [(m.subject, m.seq, m.data, m.time) for m in reader._messages]
    said = [(w.category, str(w.message)) for w in caught]
    return results, rows, stored, said, reader.taken, reader._previous, reader.received


def check_same(answer: list[bytes], previous: int = 0, last: int = 2**64) -> tuple[Any, ...]:
    """The same rows, errors and warnings for ``answer`` with and without the C split."""
    fast = feed_all(split_tail, answer, previous, last)
    slow = feed_all(None, answer, previous, last)
    assert fast == slow
    return fast


# -- typical blocks --------------------------------------------------------------------------------


def test_a_typical_block() -> None:
    assert check_split(block()) == (8, b"orders.1", 7, 6, STAMP_MICROS)


def test_a_block_with_the_message_s_own_headers() -> None:
    own = b"A: 1\r\nA: 2\r\nNats-Stream: mine\r\nNats-Subject: x\r\n"
    raw = block(own=own)
    assert check_split(raw) == (8 + len(own), b"orders.1", 7, 6, STAMP_MICROS)


def test_the_last_nats_stream_line_is_the_server_s() -> None:
    # The message's own block may end with lines named as the server's (a copy of a reply).
    raw = block(own=block()[10:-2])
    assert taken(raw)[0] == raw.rfind(b"\r\nNats-Stream: ")


def test_values_may_be_empty_or_odd_where_the_python_path_does_not_look() -> None:
    assert check_split(block(stream=b"", subject=b"")) == (8, b"", 7, 6, STAMP_MICROS)
    got = check_split(block(subject="é.\r.\n".encode(), pending=b"x"))
    assert got is not None and got[1] == "é.\r.\n".encode()
    assert check_split(block(subject=b"\xff")) is not None  # decoded (and refused) by Python


@pytest.mark.parametrize("digits", range(10))
def test_fractions_of_0_to_9_digits(digits: int) -> None:
    fraction = "123456789"[:digits]
    stamp = f"2026-11-27T21:27:24.{fraction}Z".encode()
    micros = 1_795_814_844_000_000 + int((fraction + "000000")[:6])
    assert check_split(block(stamp=stamp)) == (8, b"orders.1", 7, 6, micros)


def test_no_fraction() -> None:
    assert taken(block(stamp=b"2026-11-27T21:27:24Z"))[4] == 1_795_814_844_000_000


@pytest.mark.parametrize(
    ("stamp", "when"),
    [
        (b"2024-02-29T23:59:59.999999Z", dt.datetime(2024, 2, 29, 23, 59, 59, 999999)),
        (b"2000-02-29T00:00:00Z", dt.datetime(2000, 2, 29)),
        (b"2024-03-01T00:00:00Z", dt.datetime(2024, 3, 1)),
        (b"2024-12-31T12:00:00Z", dt.datetime(2024, 12, 31, 12)),
        (b"1970-01-01T00:00:00Z", dt.datetime(1970, 1, 1)),
        (b"1969-12-31T23:59:59.5Z", dt.datetime(1969, 12, 31, 23, 59, 59, 500000)),
        (b"1900-03-01T00:00:00Z", dt.datetime(1900, 3, 1)),
        (b"0001-01-01T00:00:00.000001Z", dt.datetime(1, 1, 1, 0, 0, 0, 1)),
        (b"9999-12-31T23:59:59.999999999Z", dt.datetime(9999, 12, 31, 23, 59, 59, 999999)),
    ],
)
def test_dates_leap_years_and_before_1970(stamp: bytes, when: dt.datetime) -> None:
    want = reading._micros(when.replace(tzinfo=dt.UTC))
    assert taken(block(stamp=stamp))[4] == want


@pytest.mark.parametrize(
    "stamp",
    [
        b"2023-02-29T00:00:00Z",  # not a leap year
        b"1900-02-29T00:00:00Z",  # nor is a century not divisible by 400
        b"2026-04-31T00:00:00Z",
        b"2026-13-01T00:00:00Z",
        b"2026-00-10T00:00:00Z",
        b"2026-01-00T00:00:00Z",
        b"0000-01-01T00:00:00Z",
        b"2026-01-01T24:00:00Z",
        b"2026-01-01T23:60:00Z",
        b"2026-01-01T23:59:60Z",  # a leap second: datetime has none
        b"2026-01-01T00:00:00.1234567890Z",  # ten digits
        b"2026-01-01T00:00:00.12a4Z",
        b"2026-01-01T00:00:00+00:00",
        b"2026-01-01t00:00:00Z",
        b"2026-01-01 00:00:00Z",
        b"2022-08-06 00:29:27.5878 +0000 UTC",  # an older server's form
        b"2026-1-01T00:00:00Z",
        b"+026-01-01T00:00:00Z",
        b"",
    ],
)
def test_other_time_stamps_are_left_to_python(stamp: bytes) -> None:
    got = check_split(block(stamp=stamp))
    assert got is not None and got[4] is None
    check_same([block(stamp=stamp)], previous=6)


@pytest.mark.parametrize(
    "number",
    [
        b"",
        b"-1",
        b"+1",
        b" 1",
        b"1 ",
        b"1_000",
        b"1.0",
        b"0x10",
        b"\xd9\xa1",
        b"18446744073709551616",  # 2**64
        b"99999999999999999999",
        b"1" * 21,
        b"0" * 21,  # fits, but more digits than the C split reads: Python decides
    ],
)
def test_malformed_sequences_are_left_to_python(number: bytes) -> None:
    assert check_split(block(seq=number)) is None
    assert check_split(block(last=number)) is None
    check_same([block(seq=number)], previous=6)
    check_same([block(last=number)], previous=6)


def test_huge_sequences() -> None:
    top = 2**64 - 1
    assert taken(block(seq=str(top).encode(), last=b"9223372036854775808"))[2:4] == (
        top,
        2**63,
    )
    assert taken(block(seq=b"0", last=b"00000000000000000000"))[2:4] == (0, 0)


def test_blocks_of_another_shape_are_left_to_python() -> None:
    raw = block()
    lines = raw[10:-2].split(b"\r\n")[:-1]

    def joined(parts: list[bytes]) -> bytes:
        return b"NATS/1.0\r\n" + b"".join(p + b"\r\n" for p in parts) + b"\r\n"

    shapes = [
        joined(lines[:4] + lines[5:]),  # Nats-Num-Pending missing
        joined(lines[1:]),  # Nats-Stream missing
        joined([*lines[:2], lines[3], lines[2], *lines[4:]]),  # two lines swapped
        joined([*lines, b"X-Extra: 1"]),  # a line after the server's
        joined([*lines[:3], b"X-Extra: 1", *lines[3:]]),  # a line among them
        joined([*lines, lines[5]]),  # one twice
        joined([lines[0].lower(), *lines[1:]]),
        joined([*lines[:5], b"Nats-Last-Sequence:6"]),
        joined([*lines[:4], b"Nats-Num-Pendin: 3", lines[5]]),  # a name Python does not check
        raw[:-2],  # not ended by an empty line
        raw + b"\r\n",
        b"NATS/1.0 204 EOB\r\n" + raw[10:],  # a status
        b"NATS/1.1\r\n" + raw[10:],
        b"NATS/1.0\r\n\r\n",
        b"NATS/1.0\r\nNats-Stream: \r\n\r\n",
        b"",
    ]
    for shape in shapes:
        assert check_split(shape) is None, shape
        check_same([shape], previous=6)


def test_a_whole_answer_reads_the_same() -> None:
    end = b"NATS/1.0 204 EOB\r\nNats-Num-Pending: 0\r\nNats-Last-Sequence: 4\r\n\r\n"
    answer = [
        block(seq=b"1", last=b"0", pending=b"3"),
        block(seq=b"2", last=b"1", pending=b"2", own=b"A: 1\r\nNats-Stream: mine\r\n"),
        block(seq=b"3", last=b"2", pending=b"1", stamp=b"2022-08-06 00:29:27.5878 +0000 UTC"),
        block(seq=b"4", last=b"3", pending=b"0", subject="é".encode()),
        end,
    ]
    results, rows, *_ = check_same(answer)
    assert results[-1].last_seq == 4 and rows[3] == [1, 2, 3, 4]
    assert rows[2][1] == [("A", ["1"]), ("Nats-Stream", ["mine"])]
    # Past the range: chained, not taken.
    results, rows, *_ = check_same(answer, last=2)
    assert rows[3] == [1, 2] and results[-1].last_seq == 4
    # A break in the chain, or a subject that is not UTF-8: the same error.
    results, *_ = check_same([answer[0], answer[2]])
    assert results[-1][0].__name__ == "DirectBatchBroken"
    results, *_ = check_same([block(subject=b"\xff", last=b"0")])
    assert results[-1][0] is UnicodeDecodeError


def test_it_takes_bytes_only() -> None:
    with pytest.raises(TypeError, match="takes bytes"):
        split_tail(bytearray(block()))  # type: ignore[arg-type]


def test_headrace_pure_python_turns_it_off() -> None:
    code = (
        "from headrace.jetstream import split_direct_tail\n"
        "from headrace_spark.datasource import reading\n"
        "print(split_direct_tail, reading.ColumnReader('S', reading._Columns('S'), 1)._split)"
    )
    env = {**os.environ, "HEADRACE_PURE_PYTHON": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["None", "None"]


# -- generated blocks ------------------------------------------------------------------------------

#: Sequences: mostly plain (some past 64 bits), one in five what only int() or nothing reads.
plain_numbers = st.one_of(
    st.integers(0, 2**20), st.integers(0, 2**64 + 5), st.sampled_from([0, 2**63, 2**64 - 1])
).map(lambda n: str(n).encode())
odd_numbers = st.one_of(
    st.integers(0, 999).map(lambda n: f"{n:021d}".encode()),
    st.sampled_from([b"", b"-1", b"+7", b" 7", b"7 ", b"1_0", b"\xd9\xa1", b"7\r", b"7\n"]),
    st.binary(max_size=4),
)
numbers = st.integers(0, 9).flatmap(lambda k: odd_numbers if k < 2 else plain_numbers)


def stamp_text(y: int, mo: int, d: int, h: int, mi: int, s: int, fraction: bytes | None) -> bytes:
    whole = f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}".encode()
    return whole + (b"" if fraction is None else b"." + fraction) + b"Z"


fractions = st.none() | st.text("0123456789", max_size=11).map(str.encode)
#: YYYY-MM-DDTHH:MM:SS[.fraction]Z with valid fields (days up to 31: some impossible dates).
valid_stamps = st.builds(
    stamp_text,
    st.integers(1, 9999),
    st.integers(1, 12),
    st.integers(1, 31),
    st.integers(0, 23),
    st.integers(0, 59),
    st.integers(0, 59),
    fractions,
)
#: The same form with each field anywhere its digits allow.
any_stamps = st.builds(
    stamp_text,
    st.integers(0, 9999),
    st.integers(0, 99),
    st.integers(0, 99),
    st.integers(0, 99),
    st.integers(0, 99),
    st.integers(0, 99),
    fractions,
)
other_stamps = st.one_of(
    any_stamps,
    valid_stamps.map(lambda s: s.replace(b"T", b" ")),
    valid_stamps.map(lambda s: s[:-1] + b"+00:00"),
    st.sampled_from([b"", b"2022-08-06 00:29:27.5878 +0000 UTC", b"2026-01-01T00:00:00.1a2Z"]),
    st.binary(max_size=32),
)
stamps = st.integers(0, 9).flatmap(lambda k: other_stamps if k < 3 else valid_stamps)
texts = st.one_of(
    st.sampled_from([b"", b"S", b"orders.1", b"a\rb", b"a\nb", b"\xff\xfe", "é".encode()]),
    st.binary(max_size=12),
)
own_lines = st.lists(
    st.one_of(
        st.sampled_from(
            [b"A: 1", b"Nats-Stream: mine", b"Nats-Sequence: 3", b"Nats-Last-Sequence: 1", b""]
        ),
        st.binary(max_size=16),
    ),
    max_size=4,
)


@st.composite
def replies(draw: st.DrawFn) -> tuple[bytes, int]:
    """A reply block, mostly well formed, sometimes mutated; and the previous sequence."""
    last = draw(numbers)
    raw = block(
        own=b"".join(line + b"\r\n" for line in draw(own_lines)),
        stream=draw(texts),
        subject=draw(texts),
        seq=draw(numbers),
        stamp=draw(stamps),
        pending=draw(numbers),
        last=last,
    )
    mutation = draw(st.sampled_from(["none"] * 10 + ["drop", "swap", "insert", "cut", "byte"]))
    lines = raw[:-4].split(b"\r\n")
    if mutation == "drop" and len(lines) > 1:
        del lines[draw(st.integers(1, len(lines) - 1))]
    elif mutation == "swap" and len(lines) > 2:
        i = draw(st.integers(1, len(lines) - 2))
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
    elif mutation == "insert":
        lines.insert(draw(st.integers(1, len(lines))), draw(st.binary(max_size=20)))
    raw = b"\r\n".join(lines) + b"\r\n\r\n"
    if mutation == "cut":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif mutation == "byte" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=1)) + raw[at + 1 :]
    try:
        previous = int(last) + draw(st.sampled_from([0, 0, 0, 1]))
    except ValueError:
        previous = 0
    return raw, previous


@settings(deadline=None)
@given(replies(), st.sampled_from([0, 5, 2**64]))
@example((block(), 6), 2**64)
@example((block(stamp=b"2024-02-29T23:59:59.123456789Z"), 6), 2**64)
def test_generated_blocks(case: tuple[bytes, int], last: int) -> None:
    raw, previous = case
    check_split(raw)
    check_same([raw], previous=previous, last=last)


def test_a_stamp_whose_fraction_is_not_digits_is_left_empty_not_raised() -> None:
    """``...:24.1a2Z`` is no RFC 3339 time: the row gets no timestamp (the general parser's
    answer), and the read goes on, rather than a ValueError out of the reader."""
    assert reading._stamp_micros(b"2026-11-28T00:22:24.1a2Z") is None
    assert reading._stamp_micros(b"2026-11-28T00:22:24.5Z") == (
        reading._stamp_micros(b"2026-11-28T00:22:24Z") + 500_000
    )
