"""``BatchMetadata``: a batch's delivery metadata parsed from its ``$JS.ACK`` replies by Arrow
must equal what each message's own parse gives, for every reply; replies the bulk path does not
take (v2, malformed, none) fall back to that parse and fail as it fails."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from headrace.jetstream.errors import InvalidAckReply, NotAJetStreamMessage
from headrace.jetstream.message import JsMsg
from headrace.pipeline.record import Delivery, Record
from headrace.protocol.events import Msg
from headrace.sinks.output import SeqSet
from headrace_spark.metadata import BatchMetadata
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.spark


def record(reply: str | None) -> Record:
    msg = JsMsg(Msg("orders.new", 1, reply, b"x"), conn=None)  # type: ignore[arg-type]
    return Record(b"x", Delivery(msg, 0.0, "src"))


def expected(records: list[Record]) -> dict[str, list[Any]]:
    """The columns from each message's own parse."""
    metas = [r.delivery.msg.metadata for r in records]
    names = ["stream", "num_delivered", "stream_seq", "consumer_seq", "timestamp_ns"]
    return {name: [getattr(m, name) for m in metas] for name in names}


NAMES = ["stream", "num_delivered", "stream_seq", "consumer_seq", "timestamp_ns"]


def columns(meta: BatchMetadata) -> dict[str, list[Any]]:
    return {name: meta.column(name).to_pylist() for name in NAMES}


names = st.text("abcXYZ_-09", min_size=1, max_size=6)
numbers = st.integers(min_value=0, max_value=2**63 - 1)


@st.composite
def replies(draw: st.DrawFn) -> str:
    stream, consumer = draw(names), draw(names)
    tail = ".".join(str(draw(numbers)) for _ in range(5))
    if draw(st.booleans()):
        return f"$JS.ACK.{stream}.{consumer}.{tail}"
    domain = draw(st.sampled_from(["_", "hub"]))
    return f"$JS.ACK.{domain}.acchash.{stream}.{consumer}.{tail}.token.extra"


@given(st.lists(replies(), min_size=1, max_size=30))
def test_the_bulk_parse_equals_each_messages_own(batch_replies: list[str]) -> None:
    records = [record(r) for r in batch_replies]
    meta = BatchMetadata.of(records)
    assert meta.size == len(records)
    assert columns(meta) == expected(records)
    assert all(meta.column(n).type == pa.int64() for n in NAMES if n != "stream")


V1 = "$JS.ACK.ORDERS.c.1.{seq}.{seq}.1700000000123456789.0"


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ("$JS.ACK.ORDERS.c.1.+5.5.17.0", InvalidAckReply),  # int() alone takes "+5"
        ("$JS.ACK.ORDERS.c.1..5.17.0", InvalidAckReply),
        ("$JS.ACK..c.1.5.5.17.0", InvalidAckReply),
        ("$JS.NAK.ORDERS.c.1.5.5.17.0", InvalidAckReply),
        ("$JS.ACK.ORDERS.c.1.5.5.17", InvalidAckReply),
        ("$JS.ACK.ORDERS.c.1.5.5.17.pending", InvalidAckReply),  # not written, still checked
        ("$JS.ACK.ORDERS.c.1.5.5.17.", InvalidAckReply),
        ("$JS.ACK.ORDERS.c.1.٣.5.17.0", InvalidAckReply),  # a digit, but not an ASCII one
        (None, NotAJetStreamMessage),
    ],
)
def test_a_reply_the_bulk_parse_refuses_fails_as_its_own_parse(
    bad: str | None, error: type[Exception]
) -> None:
    records = [record(V1.format(seq=1)), record(bad), record(V1.format(seq=3))]
    with pytest.raises(error):
        BatchMetadata.of(records)


def test_sequences_and_ranges_per_stream() -> None:
    replies_ = [
        "$JS.ACK.ORDERS.c.1.5.1.17.0",
        "$JS.ACK.RETURNS.c.1.9.2.17.0",
        "$JS.ACK.ORDERS.c.2.3.3.17.0",
        "$JS.ACK.ORDERS.c.1.4.4.17.0",
        "$JS.ACK.ORDERS.c.1.8.5.17.0",
        "$JS.ACK.ORDERS.c.1.8.6.17.0",  # a repeat: still one sequence
    ]
    meta = BatchMetadata.of([record(r) for r in replies_])
    assert meta.ranges() == [("ORDERS", 3, 8), ("RETURNS", 9, 9)]
    assert meta.sequences() == {"ORDERS": SeqSet([(3, 5), (8, 8)]), "RETURNS": SeqSet([(9, 9)])}
    one_run = BatchMetadata.of([record(V1.format(seq=s)) for s in (4, 2, 3)])
    assert one_run.sequences() == {"ORDERS": SeqSet([(2, 4)])}
    assert BatchMetadata.of([]).ranges() == []


def test_a_number_past_int64_fails_only_the_column_that_holds_it() -> None:
    big = 2**64 - 1  # a valid reply for the per-message parse; Spark has no unsigned longs
    meta = BatchMetadata.of([record(f"$JS.ACK.ORDERS.c.1.5.5.{big}.0")])
    assert meta.column("stream_seq").to_pylist() == [5]
    assert meta.ranges() == [("ORDERS", 5, 5)]
    with pytest.raises(OverflowError):
        meta.column("timestamp_ns")
