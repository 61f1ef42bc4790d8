"""JetStream publish (PubAck, de-duplication, the expected-* conditions) and reading messages
back (get_msg, direct_get, delete_msg) against a real nats-server, with nats-py fetching what
headrace stored."""

from __future__ import annotations

import datetime as dt

import pytest
import trio
from headrace.errors import InvalidSubjectError
from headrace.jetstream import (
    ConsumerConfig,
    JetStream,
    JetStreamAPIError,
    JetStreamError,
    JetStreamUnavailable,
    MessageNotFound,
    NoStreamForSubject,
    PubAck,
    StorageType,
    StoredMessage,
    StreamConfig,
    StreamNotFound,
    WrongLastMsgId,
    WrongLastSequence,
)
from headrace.jetstream.stream_config import RePublish
from headrace.nats import connect
from headrace.protocol import Headers

MEM = StorageType.MEMORY


def _recent(value: dt.datetime | None) -> bool:
    return value is not None and abs(dt.datetime.now(dt.UTC) - value) < dt.timedelta(minutes=5)


async def _stream(js: JetStream, name: str = "S", subjects: list[str] | None = None, **kw):
    return await js.add_stream(
        StreamConfig(name=name, subjects=subjects or ["s.>"], storage=MEM, **kw)
    )


async def test_publish_returns_pub_acks(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        acks = [await js.publish(f"s.{i % 2}", b"%d" % i) for i in range(5)]
        assert all(isinstance(a, PubAck) for a in acks)
        assert [a.seq for a in acks] == [1, 2, 3, 4, 5]
        assert {a.stream for a in acks} == {"S"}
        assert not any(a.duplicate for a in acks)
        assert {a.domain for a in acks} == {None}
        state = (await js.stream_info("S")).state
        assert (state.messages, state.last_seq) == (5, 5)


async def test_msg_id_deduplication(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        first = await js.publish("s.a", b"1", msg_id="order-1")
        dup = await js.publish("s.a", b"1 again", msg_id="order-1")
        other = await js.publish("s.a", b"2", msg_id="order-2")
        assert (first.seq, first.duplicate) == (1, False)
        assert (dup.seq, dup.duplicate) == (1, True)
        assert (other.seq, other.duplicate) == (2, False)
        assert (await js.stream_info("S")).state.messages == 2
        stored = await js.get_msg("S", 1)
        assert stored.data == b"1"  # the duplicate did not replace it
        assert stored.headers is not None and stored.headers["Nats-Msg-Id"] == "order-1"


async def test_expected_stream(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        assert (await js.publish("s.a", b"ok", expected_stream="S")).seq == 1
        with pytest.raises(JetStreamAPIError) as wrong:
            await js.publish("s.a", b"no", expected_stream="OTHER")
        assert (wrong.value.code, wrong.value.err_code) == (400, 10060)
        assert "expected stream" in wrong.value.description
        assert (await js.stream_info("S")).state.messages == 1


async def test_expected_last_seq(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        await js.publish("s.a", b"1")
        await js.publish("s.b", b"2")
        assert (await js.publish("s.a", b"3", expected_last_seq=2)).seq == 3
        with pytest.raises(WrongLastSequence) as stale:
            await js.publish("s.a", b"4", expected_last_seq=2)
        assert stale.value.err_code == 10071
        assert "3" in stale.value.description  # the server names the actual last sequence
        assert (await js.stream_info("S")).state.last_seq == 3


async def test_expected_last_subject_seq(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        await js.publish("s.a", b"1")  # seq 1
        await js.publish("s.b", b"2")  # seq 2
        # The last s.a message is 1, though the stream's last is 2.
        assert (await js.publish("s.a", b"3", expected_last_subject_seq=1)).seq == 3
        with pytest.raises(WrongLastSequence):
            await js.publish("s.a", b"4", expected_last_subject_seq=1)
        with pytest.raises(WrongLastSequence):
            await js.publish("s.b", b"4", expected_last_subject_seq=3)
        # 0 means "no message on this subject yet".
        assert (await js.publish("s.c", b"5", expected_last_subject_seq=0)).seq == 4
        with pytest.raises(WrongLastSequence):
            await js.publish("s.c", b"6", expected_last_subject_seq=0)
        assert (await js.stream_info("S")).state.messages == 4


async def test_expected_last_msg_id(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        await js.publish("s.a", b"1", msg_id="a")
        ack = await js.publish("s.a", b"2", msg_id="b", expected_last_msg_id="a")
        assert ack.seq == 2
        with pytest.raises(WrongLastMsgId) as wrong:
            await js.publish("s.a", b"3", msg_id="c", expected_last_msg_id="a")
        assert (wrong.value.code, wrong.value.err_code) == (400, 10070)
        assert (await js.stream_info("S")).state.messages == 2


async def test_no_stream_for_subject(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        with trio.fail_after(5), pytest.raises(NoStreamForSubject) as none:
            await js.publish("elsewhere.x", b"lost")
        assert none.value.subject == "elsewhere.x"
        assert isinstance(none.value, JetStreamError)
        assert (await js.stream_info("S")).state.messages == 0


async def test_headers_preserved(nats_server, natspy):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js, allow_direct=True)
        headers = Headers([("Trace", "a"), ("Trace", "b"), ("Region", "eu")])
        ack = await js.publish("s.h", b"payload", headers=headers, msg_id="h-1")
        # The caller's headers were copied, not extended with Nats-Msg-Id.
        assert list(headers.multi_items()) == [("Trace", "a"), ("Trace", "b"), ("Region", "eu")]
        await js.publish("s.m", b"mapping", headers={"One": "1", "Many": ["x", "y"]})

        got = await js.get_msg("S", ack.seq)
        assert got.headers is not None
        assert got.headers.get_all("Trace") == ["a", "b"]
        assert got.headers["Region"] == "eu"
        assert got.headers["Nats-Msg-Id"] == "h-1"
        assert got.data == b"payload"

        direct = await js.direct_get("S", ack.seq)
        assert direct.headers is not None
        assert direct.headers.get_all("Trace") == ["a", "b"]
        assert direct.headers["Region"] == "eu"
        assert direct.headers["Nats-Msg-Id"] == "h-1"
        assert direct.data == b"payload"

        mapped = await js.get_msg("S", last_by_subject="s.m")
        assert mapped.headers is not None
        assert mapped.headers["One"] == "1"
        assert mapped.headers.get_all("Many") == ["x", "y"]

        # nats-py reads the same message through a pull consumer.
        await js.create_consumer("S", ConsumerConfig(durable_name="py", filter_subject="s.h"))
        await natspy.connect(nats_server.url)
        js_py = natspy.nc.jetstream()

        async def fetch() -> tuple[bytes, dict[str, str] | None, str]:
            sub = await js_py.pull_subscribe_bind(durable="py", stream="S")
            [msg] = await sub.fetch(1, timeout=5)
            await msg.ack()
            return msg.data, msg.headers, msg.subject

        data, py_headers, subject = await natspy.call(fetch)
        assert (data, subject) == (b"payload", "s.h")
        assert py_headers is not None
        assert py_headers["Region"] == "eu"
        assert py_headers["Nats-Msg-Id"] == "h-1"
        assert py_headers["Trace"] in ("a", "b")  # nats-py keeps one value per name


async def test_get_msg(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        for subject, data in [("s.a", b"a1"), ("s.b", b"b1"), ("s.a", b"a2"), ("s.b", b"")]:
            await js.publish(subject, data)

        first = await js.get_msg("S", 1)
        assert isinstance(first, StoredMessage)
        assert (first.stream, first.subject, first.seq, first.data) == ("S", "s.a", 1, b"a1")
        assert first.headers is None
        assert _recent(first.time)

        last_a = await js.get_msg("S", last_by_subject="s.a")
        assert (last_a.seq, last_a.data) == (3, b"a2")
        empty = await js.get_msg("S", last_by_subject="s.b")
        assert (empty.seq, empty.data) == (4, b"")
        assert (await js.get_msg("S", last_by_subject="s.*")).seq == 4

        # next_by_subject: the first message of the subject at or after seq.
        assert (await js.get_msg("S", 2, next_by_subject="s.a")).seq == 3
        assert (await js.get_msg("S", 3, next_by_subject="s.a")).seq == 3
        assert (await js.get_msg("S", next_by_subject="s.b")).seq == 2
        with pytest.raises(MessageNotFound):
            await js.get_msg("S", 4, next_by_subject="s.a")

        with pytest.raises(MessageNotFound) as missing:
            await js.get_msg("S", 99)
        assert (missing.value.code, missing.value.err_code) == (404, 10037)
        with pytest.raises(MessageNotFound):
            await js.get_msg("S", last_by_subject="s.none")
        with pytest.raises(StreamNotFound):
            await js.get_msg("NOPE", 1)

        with pytest.raises(ValueError, match="give seq"):
            await js.get_msg("S")
        with pytest.raises(ValueError, match="cannot be combined"):
            await js.get_msg("S", 1, last_by_subject="s.a")


async def test_direct_get(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js, allow_direct=True)
        for subject, data in [("s.a", b"a1"), ("s.b", b"b1"), ("s.a", b"a2")]:
            await js.publish(subject, data)

        by_seq = await js.direct_get("S", 2)
        assert (by_seq.stream, by_seq.subject, by_seq.seq, by_seq.data) == ("S", "s.b", 2, b"b1")
        # Same stored time as through the leader's STREAM.MSG.GET.
        assert by_seq.time is not None
        assert by_seq.time == (await js.get_msg("S", 2)).time

        last = await js.direct_get("S", last_by_subject="s.a")
        assert (last.seq, last.subject, last.data) == (3, "s.a", b"a2")
        nxt = await js.direct_get("S", 2, next_by_subject="s.a")
        assert (nxt.seq, nxt.data) == (3, b"a2")
        from_start = await js.direct_get("S", next_by_subject="s.a")
        assert from_start.seq == 1
        # A wildcard, as get_msg and the server take it (issue 24: refused before sending).
        for pattern, seq in (("s.*", 3), ("*.b", 2), (">", 3)):
            wild = await js.direct_get("S", last_by_subject=pattern)
            assert wild.seq == seq == (await js.get_msg("S", last_by_subject=pattern)).seq
        with pytest.raises(InvalidSubjectError):
            await js.direct_get("S", last_by_subject="s.>.a")

        with trio.fail_after(5):
            with pytest.raises(MessageNotFound) as missing:
                await js.direct_get("S", 99)
            assert missing.value.code == 404
            with pytest.raises(MessageNotFound):
                await js.direct_get("S", last_by_subject="s.none")
            with pytest.raises(MessageNotFound):
                await js.direct_get("S", 4, next_by_subject="s.a")

        # A stream without allow_direct has no Direct Get responder.
        await _stream(js, name="NODIRECT", subjects=["nd.>"])
        await js.publish("nd.1", b"x")
        with trio.fail_after(5), pytest.raises(JetStreamUnavailable, match="allow_direct"):
            await js.direct_get("NODIRECT", 1)


async def test_delete_msg(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js, allow_direct=True)
        for i in range(4):
            await js.publish("s.a", b"%d" % i)

        await js.delete_msg("S", 2)
        await js.delete_msg("S", 3, erase=True)
        with pytest.raises(MessageNotFound):
            await js.get_msg("S", 2)
        with pytest.raises(MessageNotFound):
            await js.get_msg("S", 3)
        with pytest.raises(MessageNotFound):
            await js.direct_get("S", 2)
        state = (await js.stream_info("S")).state
        assert (state.messages, state.first_seq, state.last_seq) == (2, 1, 4)
        assert state.num_deleted == 2
        assert (await js.get_msg("S", 2, next_by_subject="s.a")).seq == 4

        with pytest.raises(JetStreamAPIError) as again:
            await js.delete_msg("S", 2)
        assert again.value.err_code == 10043  # "sequence 2 not found"
        with pytest.raises(StreamNotFound):
            await js.delete_msg("NOPE", 1)


async def test_direct_get_of_a_republished_message(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(
            js, name="ORIGIN", subjects=["a.>"], republish=RePublish(src=">", dest="copy.>")
        )
        await _stream(js, name="COPY", subjects=["copy.>"], allow_direct=True)
        await js.publish("copy.own", b"0")  # COPY seq 1, so the sequences differ
        await js.publish("a.x", b"1")  # ORIGIN seq 1, republished as COPY seq 2
        # The PubAck is ORIGIN's: the republished copy reaches COPY on its own, a moment later.
        with trio.fail_after(10):
            while True:
                if (await js.stream_info("COPY")).state.last_seq >= 2:
                    break
                await trio.sleep(0.01)  # pacing the reads, not waiting for a condition
        via_leader = await js.get_msg("COPY", 2)
        assert (via_leader.subject, via_leader.seq, via_leader.data) == ("copy.a.x", 2, b"1")
        direct = await js.direct_get("COPY", 2)
        assert direct.data == b"1"
        assert (direct.stream, direct.subject, direct.seq) == ("COPY", "copy.a.x", 2)
        assert direct.time == via_leader.time


async def test_expected_last_sequence_of_other_subjects(nats_server):
    """``expected_last_subject_seq_subject`` (issue 24): the condition is on the last
    sequence of the subjects matching it, not of the subject published to. (A ledger that
    appends ``acct.1.<n>`` only if nothing else was written to ``acct.1.>`` meanwhile.)"""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js, name="L", subjects=["acct.>"])
        first = await js.publish("acct.1.a", b"1")
        await js.publish("acct.2.a", b"x")  # another account: no matter
        ok = await js.publish(
            "acct.1.b",
            b"2",
            expected_last_subject_seq=first.seq,
            expected_last_subject_seq_subject="acct.1.>",
        )
        with pytest.raises(WrongLastSequence):
            await js.publish(
                "acct.1.c",
                b"3",
                expected_last_subject_seq=first.seq,  # acct.1.b came since
                expected_last_subject_seq_subject="acct.1.>",
            )
        assert (await js.stream_info("L")).state.last_seq == ok.seq
        with pytest.raises(ValueError, match="goes with expected_last_subject_seq"):
            await js.publish("acct.1.d", b"", expected_last_subject_seq_subject="acct.1.>")
        with pytest.raises(InvalidSubjectError):
            await js.publish(
                "acct.1.d", b"", expected_last_subject_seq=1,
                expected_last_subject_seq_subject="acct.>.x",
            )  # fmt: skip


async def test_create_or_update_stream(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        made = await js.create_or_update_stream(StreamConfig(name="U", subjects=["u.a"]))
        assert made.config.subjects == ["u.a"]
        changed = await js.create_or_update_stream(StreamConfig(name="U", subjects=["u.a", "u.b"]))
        assert changed.config.subjects == ["u.a", "u.b"]
        assert changed.created == made.created  # the same stream, updated
