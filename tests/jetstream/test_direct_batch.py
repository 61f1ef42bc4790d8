"""Batched Direct Get (ADR-31 batch and multi-last) against a real nats-server, with nats-py
writing what headrace reads; the reply reader alone for what a current server cannot send (a
server before 2.11, a message lost on the way)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import trio
from headrace.errors import InvalidSubjectError
from headrace.jetstream import (
    BatchGet,
    BatchGetUnsupported,
    DirectBatchBroken,
    DirectGetNotAllowed,
    JetStream,
    JetStreamUnavailable,
    MessageNotFound,
    MultiLastGet,
    StorageType,
    StreamConfig,
    StreamNotFound,
    TooManySubjects,
)
from headrace.jetstream.direct_batch import DirectBatchReader
from headrace.nats import connect
from headrace.protocol.events import Msg

MEM = StorageType.MEMORY


async def _stream(js: JetStream, name: str = "S", *, direct: bool = True) -> None:
    await js.add_stream(
        StreamConfig(name=name, subjects=[f"{name.lower()}.>"], storage=MEM, allow_direct=direct)
    )


async def test_batch_pages_through_a_subject_in_order(nats_server: Any, natspy: Any) -> None:
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        await natspy.connect(nats_server.url)
        js_py = natspy.nc.jetstream()
        for n in range(10):
            await natspy.call(js_py.publish, f"s.{'ab'[n % 2]}", b"%d" % n)

        with trio.fail_after(10):
            first = await js.direct_get_batch("S", 3, subject="s.a")
            assert [m.data for m in first.messages] == [b"0", b"2", b"4"]
            assert [m.seq for m in first.messages] == [1, 3, 5]
            assert {m.subject for m in first.messages} == {"s.a"}
            assert (first.num_pending, first.last_seq, first.complete) == (2, 5, False)
            assert first.up_to_seq is None
            rest = await js.direct_get_batch("S", 3, subject="s.a", seq=first.last_seq + 1)
            assert [m.data for m in rest.messages] == [b"6", b"8"]
            assert rest.complete
            # Any subject, from a sequence; the stored time is the server's.
            tail = await js.direct_get_batch("S", 100, seq=8)
            assert [m.seq for m in tail.messages] == [8, 9, 10]
            assert all(m.time is not None and m.stream == "S" for m in tail.messages)
            assert tail.complete


async def test_batch_from_a_time_and_capped_by_bytes(nats_server: Any) -> None:
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        for n in range(3):
            await js.publish("s.x", b"old%d" % n)
        third = await js.direct_get("S", 3)
        assert third.time is not None
        for _ in range(3):
            await js.publish("s.x", b"x" * 100)
        with trio.fail_after(10):
            later = await js.direct_get_batch("S", 10, start_time=third.time)
            assert [m.seq for m in later.messages] == [3, 4, 5, 6]
            # The server stops once it has sent max_bytes (counting the one that crossed it).
            capped = await js.direct_get_batch("S", 10, seq=4, max_bytes=150)
            assert [m.seq for m in capped.messages] == [4, 5]
            assert (capped.num_pending, capped.complete) == (1, False)


async def test_multi_last_reads_keys_as_of_a_sequence_and_a_time(
    nats_server: Any, natspy: Any
) -> None:
    # ADR-31's own example: the address changed at sequence 4.
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js, "USERS")
        await natspy.connect(nats_server.url)
        js_py = natspy.nc.jetstream()
        for subject, value in [
            ("users.1234.name", b"Bob"),
            ("users.1234.surname", b"Smith"),
            ("users.1234.address", b"1 Main Street"),
        ]:
            await natspy.call(js_py.publish, subject, value)
        before_move = (await js.direct_get("USERS", 3)).time
        assert before_move is not None
        await natspy.call(js_py.publish, "users.1234.address", b"10 Oak Lane")
        await natspy.call(js_py.publish, "users.9.name", b"Eve")

        def values(page: Any) -> dict[str, bytes]:
            return {m.subject.rsplit(".", 1)[1]: m.data for m in page.messages}

        with trio.fail_after(10):
            now = await js.direct_get_last_for("USERS", ["users.1234.>"])
            assert values(now) == {"name": b"Bob", "surname": b"Smith", "address": b"10 Oak Lane"}
            assert (now.complete, now.up_to_seq) == (True, 5)
            assert [m.seq for m in now.messages] == sorted(m.seq for m in now.messages)
            then = await js.direct_get_last_for("USERS", ["users.1234.>"], up_to_seq=3)
            assert values(then)["address"] == b"1 Main Street"
            assert then.up_to_seq == 3
            at = await js.direct_get_last_for(
                "USERS",
                ["users.1234.address"],
                up_to_time=before_move + dt.timedelta(microseconds=1),
            )
            assert values(at) == {"address": b"1 Main Street"}
            two = await js.direct_get_last_for("USERS", ["users.1234.name", "users.9.name"])
            assert sorted(m.data for m in two.messages) == [b"Bob", b"Eve"]
            none = await js.direct_get_last_for("USERS", ["users.nobody"])
            assert (none.messages, none.complete) == ((), True)


async def test_multi_last_pages_keep_one_moment_while_writes_go_on(nats_server: Any) -> None:
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js, "K")
        for n in range(5):
            await js.publish(f"k.{n}", b"v1")
        request = MultiLastGet(subjects=["k.>"], batch=2)
        seen: dict[str, bytes] = {}
        pages = 0
        with trio.fail_after(10):
            page = await js.direct_get_many("K", request)
            while True:
                pages += 1
                seen.update({m.subject: m.data for m in page.messages})
                # A write between pages: the next pages still read the first page's moment.
                await js.publish("k.4", b"v2")
                if page.complete:
                    break
                request = request.next_page(page)
                assert request.up_to_seq == 5
                page = await js.direct_get_many("K", request)
        assert pages == 3
        assert seen == {f"k.{n}": b"v1" for n in range(5)}


async def test_refusals_are_typed(nats_server: Any) -> None:
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js, "MANY")
        await _stream(js, "NODIRECT", direct=False)
        await js.publish("nodirect.x", b"")
        for n in range(1025):
            await js.publish(f"many.{n}", b"")
        with trio.fail_after(10):
            with pytest.raises(TooManySubjects) as many:
                await js.direct_get_last_for("MANY", ["many.>"], batch=10)
            assert many.value.code == 413
            # 1024 is allowed.
            page = await js.direct_get_last_for("MANY", [f"many.{n}" for n in range(1024)])
            assert len(page.messages) == 1024 and page.complete
            with pytest.raises(DirectGetNotAllowed, match="allow_direct"):
                await js.direct_get_batch("NODIRECT", 5)
            with pytest.raises(StreamNotFound):
                await js.direct_get_batch("NONE", 5)


async def test_bad_requests_are_refused_before_sending(core_server: Any) -> None:
    # A server without JetStream: nothing here may reach it.
    async with connect(core_server.url) as nc:
        js = JetStream(nc)
        aware = dt.datetime.now(dt.UTC)
        with pytest.raises(ValueError, match="batch"):
            await js.direct_get_batch("S", 0)
        with pytest.raises(ValueError, match="not both"):
            await js.direct_get_batch("S", 1, seq=2, start_time=aware)
        with pytest.raises(ValueError, match="aware"):
            await js.direct_get_batch("S", 1, start_time=dt.datetime(2026, 1, 1))
        with pytest.raises(ValueError, match="not one string"):
            await js.direct_get_last_for("S", "s.a")
        with pytest.raises(ValueError, match="at least one"):
            await js.direct_get_last_for("S", [])
        with pytest.raises(ValueError, match="not both"):
            await js.direct_get_last_for("S", ["s.a"], up_to_seq=3, up_to_time=aware)
        with pytest.raises(InvalidSubjectError):
            await js.direct_get_last_for("S", ["s..a"])
    assert BatchGet(batch=2).body() == {"batch": 2, "seq": 1}


def _reply(headers: str, data: bytes = b"") -> Msg:
    return Msg("_INBOX.x", 1, None, data, raw_headers=f"NATS/1.0{headers}\r\n\r\n".encode())


def test_a_server_without_batches_is_told_apart() -> None:
    # What a server before 2.11 sends: the first match, as a plain Direct Get.
    reader = DirectBatchReader("S")
    plain = "\r\nNats-Stream: S\r\nNats-Subject: s.a\r\nNats-Sequence: 1"
    with pytest.raises(BatchGetUnsupported, match=r"2\.11"):
        reader.feed(_reply(plain + "\r\nNats-Time-Stamp: 2026-01-01T00:00:00Z", b"x"))


def test_a_lost_message_breaks_the_batch() -> None:
    reader = DirectBatchReader("S")
    head = "\r\nNats-Stream: S\r\nNats-Subject: s.a\r\nNats-Time-Stamp: 2026-01-01T00:00:00Z"
    first = head + "\r\nNats-Sequence: 1\r\nNats-Num-Pending: 2\r\nNats-Last-Sequence: 0"
    assert reader.feed(_reply(first, b"1")) is None
    # Sequence 2 was dropped on the way: the third names 2 as the one before it.
    third = head + "\r\nNats-Sequence: 3\r\nNats-Num-Pending: 0\r\nNats-Last-Sequence: 2"
    with pytest.raises(DirectBatchBroken, match="between sequence 1 and 2"):
        reader.feed(_reply(third, b"3"))
    # An EOB that does not name the last message received is a loss too.
    reader = DirectBatchReader("S")
    assert reader.feed(_reply(first, b"1")) is None
    with pytest.raises(DirectBatchBroken):
        reader.feed(_reply(" 204 EOB\r\nNats-Num-Pending: 0\r\nNats-Last-Sequence: 3"))


async def test_a_direct_get_sent_now_and_awaited_later(nats_server: Any, natspy: Any) -> None:
    """``direct_get_soon`` answers as ``direct_get`` does, while the task awaits something
    else in between; a missing message, a stream without Direct Get and an abandoned read
    behave as the awaited kind does, and nothing is left registered."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        await _stream(js, "N", direct=False)
        await natspy.connect(nats_server.url)
        js_py = natspy.nc.jetstream()
        for n in range(4):
            await natspy.call(js_py.publish, f"s.{'ab'[n % 2]}", b"%d" % n)
        with trio.fail_after(10):
            pending = js.direct_get_soon("S", 2, next_by_subject="s.a")
            other = await js.direct_get("S", 1)  # awaited while the first is in flight
            got = await pending.result()
            assert (got.seq, got.data, got.subject) == (3, b"2", "s.a")
            assert got == await js.direct_get("S", 2, next_by_subject="s.a")
            assert other.seq == 1
            with pytest.raises(MessageNotFound):
                await js.direct_get_soon("S", 99).result()
            with pytest.raises(JetStreamUnavailable, match="allow_direct"):
                await js.direct_get_soon("N", 1).result()
            dropped = js.direct_get_soon("S", 1)
            dropped.abandon()
            dropped.abandon()  # twice is harmless
            await nc.flush()
        mux = nc._mux
        assert mux is not None and mux._pending == {}
