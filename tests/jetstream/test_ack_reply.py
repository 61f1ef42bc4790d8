"""``$JS.ACK`` reply subjects (ADR-15): the v1 and v2 forms, what is refused, and the metadata
of messages a real server delivers, checked against the stream and against nats-py."""

from __future__ import annotations

import datetime as dt
import json
import string

import pytest
import trio
from headrace.jetstream import (
    AckMetadata,
    AckPolicy,
    ConsumerConfig,
    InvalidAckReply,
    JetStream,
    JetStreamError,
    StorageType,
    StreamConfig,
    parse_ack_reply,
)
from headrace.nats import connect
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=300)

TS = 1_700_000_000_123_456_789
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


# -- v1 and v2 --------------------------------------------------------------------------------


def test_v1_nine_tokens() -> None:
    meta = parse_ack_reply(f"$JS.ACK.ORDERS.worker.3.1042.17.{TS}.250")
    assert meta == AckMetadata(
        stream="ORDERS",
        consumer="worker",
        num_delivered=3,
        stream_seq=1042,
        consumer_seq=17,
        timestamp_ns=TS,
        num_pending=250,
        domain=None,
        account_hash=None,
    )
    assert meta.timestamp == dt.datetime(2023, 11, 14, 22, 13, 20, 123457, tzinfo=dt.UTC)


def test_v2_eleven_tokens() -> None:
    meta = parse_ack_reply(f"$JS.ACK.hub.ACCHASH.ORDERS.worker.1.2.3.{TS}.0")
    assert (meta.domain, meta.account_hash) == ("hub", "ACCHASH")
    assert (meta.stream, meta.consumer) == ("ORDERS", "worker")
    assert (meta.num_delivered, meta.stream_seq, meta.consumer_seq) == (1, 2, 3)
    assert (meta.timestamp_ns, meta.num_pending) == (TS, 0)


@pytest.mark.parametrize("extra", [["r4nd0m"], ["a", "b"], ["x", "y", "z", "123"]])
def test_v2_extra_tokens_ignored(extra: list[str]) -> None:
    base = f"$JS.ACK.hub.ACC.S.C.4.5.6.{TS}.7"
    meta = parse_ack_reply(".".join([base, *extra]))
    assert meta == parse_ack_reply(base)
    assert meta.num_pending == 7
    assert meta.domain == "hub"


def test_v2_underscore_domain_means_none() -> None:
    meta = parse_ack_reply(f"$JS.ACK._.ACC.S.C.1.1.1.{TS}.0")
    assert meta.domain is None
    assert meta.account_hash == "ACC"
    # Only exactly "_" means "no domain".
    assert parse_ack_reply(f"$JS.ACK.__.ACC.S.C.1.1.1.{TS}.0").domain == "__"
    assert parse_ack_reply(f"$JS.ACK._hub.ACC.S.C.1.1.1.{TS}.0").domain == "_hub"


def test_zero_and_huge_numbers() -> None:
    big = 2**64 - 1
    meta = parse_ack_reply(f"$JS.ACK.S.C.0.{big}.{big}.0.{big}")
    assert (meta.num_delivered, meta.stream_seq, meta.consumer_seq) == (0, big, big)
    assert (meta.timestamp_ns, meta.num_pending) == (0, big)


# -- invalid ----------------------------------------------------------------------------------

V1 = ["$JS", "ACK", "S", "C", "1", "2", "3", str(TS), "4"]
V2 = ["$JS", "ACK", "hub", "ACC", "S", "C", "1", "2", "3", str(TS), "4"]


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "$JS",
        "$JS.ACK",
        "_INBOX.abc.def",
        f"$JS.NAK.S.C.1.2.3.{TS}.4",
        f"JS.ACK.S.C.1.2.3.{TS}.4",
        f"$js.ack.S.C.1.2.3.{TS}.4",
        f"$JS.API.S.C.1.2.3.{TS}.4",
        f"$JS.ACK.S.C.1.2.3.{TS}.4.5",  # 10 tokens
        f"$JS.ACK.S.C.1.2.3.{TS}",  # 8 tokens
        "$JS.ACK.S.C.1.2.3",
        f"$JS.ACK..C.1.2.3.{TS}.4",  # empty stream
        f"$JS.ACK.S..1.2.3.{TS}.4",  # empty consumer
        f"$JS.ACK.hub.ACC..C.1.2.3.{TS}.4",
        f"$JS.ACK.hub.ACC.S..1.2.3.{TS}.4",
    ],
)
def test_invalid_replies(reply: str) -> None:
    with pytest.raises(InvalidAckReply):
        parse_ack_reply(reply)


@pytest.mark.parametrize("form", ["v1", "v2"])
@pytest.mark.parametrize("position", range(5), ids=["delivered", "sseq", "cseq", "ts", "pending"])
@pytest.mark.parametrize("bad", ["", "x", "-1", "+1", "1e3", "0x1", " 1", "\u0661", "\u00b2"])
def test_non_numeric_fields(form: str, position: int, bad: str) -> None:
    tokens = list(V1 if form == "v1" else V2)
    tokens[(4 if form == "v1" else 6) + position] = bad
    with pytest.raises(InvalidAckReply):
        parse_ack_reply(".".join(tokens))


def test_invalid_ack_reply_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"\$JS\.ACK") as info:
        parse_ack_reply("nope")
    assert isinstance(info.value, JetStreamError)


# -- properties -------------------------------------------------------------------------------

_name = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1, max_size=16)
_number = st.integers(min_value=0, max_value=2**64 - 1)


@st.composite
def ack_replies(draw: st.DrawFn) -> tuple[str, AckMetadata]:
    stream, consumer = draw(_name), draw(_name)
    delivered, sseq, cseq, ts, pending = (draw(_number) for _ in range(5))
    numbers = [str(n) for n in (delivered, sseq, cseq, ts, pending)]
    if draw(st.booleans()):
        tokens = ["$JS", "ACK", stream, consumer, *numbers]
        domain = account = None
    else:
        domain = draw(st.one_of(st.none(), _name.filter(lambda d: d != "_")))
        account = draw(_name)
        extra = draw(st.lists(_name, max_size=3))
        tokens = ["$JS", "ACK", domain or "_", account, stream, consumer, *numbers, *extra]
    expected = AckMetadata(
        stream=stream,
        consumer=consumer,
        num_delivered=delivered,
        stream_seq=sseq,
        consumer_seq=cseq,
        timestamp_ns=ts,
        num_pending=pending,
        domain=domain,
        account_hash=account,
    )
    return ".".join(tokens), expected


@FAST
@given(ack_replies())
def test_valid_replies_parse_back(case: tuple[str, AckMetadata]) -> None:
    reply, expected = case
    assert parse_ack_reply(reply) == expected


@FAST
@given(
    st.one_of(st.integers(min_value=0, max_value=6), st.just(8)).flatmap(
        lambda n: st.lists(st.one_of(_name, _number.map(str)), min_size=n, max_size=n)
    )
)
def test_wrong_token_counts_refused(tokens: list[str]) -> None:
    """Whatever the tokens, a $JS.ACK reply of 2 to 8 or of 10 tokens is refused."""
    with pytest.raises(InvalidAckReply):
        parse_ack_reply(".".join(["$JS", "ACK", *tokens]))


# -- against a real server --------------------------------------------------------------------


async def test_metadata_of_real_deliveries(nats_server, natspy):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="META", subjects=["meta.>"]))
        for i in range(4):
            await js.publish(f"meta.{i}", b"%d" % i)
        await js.create_consumer(
            "META", ConsumerConfig(durable_name="reader", ack_policy=AckPolicy.EXPLICIT)
        )
        consumer = await js.pull_consumer("META", "reader")
        with trio.fail_after(10):
            batch = await consumer.fetch(3, expires=5)
        assert len(batch) == 3
        metas = [m.metadata for m in batch]
        assert [(m.stream, m.consumer) for m in metas] == [("META", "reader")] * 3
        assert [m.stream_seq for m in metas] == [1, 2, 3]
        assert [m.consumer_seq for m in metas] == [1, 2, 3]
        assert [m.num_delivered for m in metas] == [1, 1, 1]
        assert [m.num_pending for m in metas] == [3, 2, 1]
        for msg, meta in zip(batch, metas, strict=True):
            stored = await js.get_msg("META", meta.stream_seq)
            assert stored.subject == msg.subject
            # The reply carries the stored time in nanoseconds; get_msg has microseconds.
            assert stored.time is not None
            micros = (stored.time - EPOCH) // dt.timedelta(microseconds=1)
            assert meta.timestamp_ns // 1000 == micros
            assert abs(meta.timestamp - stored.time) < dt.timedelta(microseconds=2)

        # A NAK redelivers message 2: same stream sequence, next consumer sequence, count 2.
        await batch[1].nak()
        await batch[0].ack()
        await batch[2].ack_sync()
        with trio.fail_after(10):
            again = await consumer.fetch(1, expires=5)
        meta = again[0].metadata
        assert (meta.stream_seq, meta.consumer_seq, meta.num_delivered) == (2, 4, 2)
        assert meta.num_pending == 1  # message 4 is still waiting
        await again[0].ack_sync()
        info = await consumer.info()
        assert info.delivered.consumer_seq == 4
        assert info.delivered.stream_seq == 3
        assert info.num_redelivered == 0  # nothing unacked is in redelivery any more
        assert info.num_pending == 1

        # nats-py reads the same reply subject the same way.
        await natspy.connect(nats_server.url)
        js_py = natspy.nc.jetstream()

        async def fetch_with_natspy() -> tuple[str, object]:
            sub = await js_py.pull_subscribe_bind(durable="reader", stream="META")
            [msg] = await sub.fetch(1, timeout=5)
            await msg.ack_sync()
            return msg.reply, msg.metadata

        reply, py_meta = await natspy.call(fetch_with_natspy)
        ours = parse_ack_reply(reply)
        assert ours.stream_seq == py_meta.sequence.stream == 4
        assert ours.consumer_seq == py_meta.sequence.consumer == 5
        assert ours.num_delivered == py_meta.num_delivered == 1
        assert ours.num_pending == py_meta.num_pending == 0
        assert (ours.stream, ours.consumer) == (py_meta.stream, py_meta.consumer)
        assert abs(ours.timestamp - py_meta.timestamp) < dt.timedelta(microseconds=2)


async def test_metadata_with_a_domain(nats_server_factory, tmp_path):
    """Whatever form the server uses (v1 today), the domain and names come out right."""
    server = nats_server_factory(
        jetstream=False,
        extra_config=f"jetstream {{\n  domain: hub\n  store_dir: {json.dumps(str(tmp_path))}\n}}",
    )
    async with connect(server.url) as nc:
        js = JetStream(nc, domain="hub")
        await js.add_stream(StreamConfig(name="D", subjects=["d.>"], storage=StorageType.MEMORY))
        await js.publish("d.1", b"x")
        await js.create_consumer("D", ConsumerConfig(durable_name="c"))
        with trio.fail_after(10):
            [msg] = await (await js.pull_consumer("D", "c")).fetch(1, expires=5)
    assert msg.reply is not None
    meta = msg.metadata
    assert (meta.stream, meta.consumer, meta.stream_seq, meta.num_pending) == ("D", "c", 1, 0)
    if len(msg.reply.split(".")) == 9:
        assert meta.domain is None
    else:
        assert meta.domain == "hub"
