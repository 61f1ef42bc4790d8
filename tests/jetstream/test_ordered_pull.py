"""The pull-based ordered consumer (issue 24, nats.go's OrderedConsumer): fetch, fetch by
bytes, no-wait fetch and next, in stream order, exactly once; named by a prefix; a deleted
consumer noticed from the pull's status and replaced without a hole or a repeat. Real
nats-server; nats-py deletes the consumer from outside."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio
import trio.testing
from headrace.jetstream import JetStream, StreamConfig, StreamNotFound
from headrace.jetstream.message import JsMsg
from headrace.jetstream.ordered_pull import OrderedConsumer, OrderedConsumerConfig
from headrace.nats import connect
from headrace.protocol.events import Msg


def _data(msgs: list[JsMsg]) -> list[int]:
    return [int(m.data) for m in msgs]


async def _stream(js: JetStream, n: int) -> None:
    await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
    for i in range(n):
        await js.publish(f"s.{i % 3}", b"%d" % i)


async def test_fetch_by_count_bytes_no_wait_and_next_read_everything_once(
    nats_server: Any,
) -> None:
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js, 30)
        oc = await js.ordered_consumer("S", name_prefix="reader")
        assert oc.consumer_name == "reader_1"
        got: list[int] = []
        with trio.fail_after(20):
            got += _data(await oc.fetch(7, expires=2))
            got += _data(await oc.fetch_bytes(300, expires=2))
            got += _data(await oc.fetch(5, no_wait=True))
            msg = await oc.next(expires=2)
            assert msg is not None
            got.append(int(msg.data))
            while len(got) < 30:
                got += _data(await oc.fetch(min(10, 30 - len(got)), expires=2))
            assert got == list(range(30))
            # Nothing left: a no-wait fetch answers at once, next() gives None after expires.
            started = trio.current_time()
            assert await oc.fetch(5, no_wait=True) == []
            assert trio.current_time() - started < 1.0
            assert await oc.next(expires=0.5) is None
        assert oc.resets == [] and oc.serial == 1
        await oc.delete()
        assert await js.consumer_names("S") == []


async def test_filtered_from_a_sequence(nats_server: Any) -> None:
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js, 12)
        config = OrderedConsumerConfig(
            filter_subjects=["s.1", "s.2"], deliver_policy="by_start_sequence", opt_start_seq=5
        )
        oc = await js.ordered_consumer("S", config)
        expected = [i for i in range(4, 12) if i % 3 in (1, 2)]
        with trio.fail_after(10):
            got = _data(await oc.fetch(len(expected), expires=5))
            assert await oc.fetch(5, no_wait=True) == []  # and nothing else
        assert got == expected


async def test_a_deleted_consumer_is_noticed_at_once_and_replaced(
    nats_server: Any, natspy: Any
) -> None:
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js, 3)
        oc = await js.ordered_consumer("S", name_prefix="rd")
        with trio.fail_after(10):
            assert _data(await oc.fetch(3, expires=2)) == [0, 1, 2]

        async def delete_then_publish() -> None:
            await trio.testing.wait_all_tasks_blocked()  # the fetch below is waiting
            peer = natspy.nc.jetstream()
            await natspy.call(peer.delete_consumer, "S", "rd_1")
            for i in (3, 4):
                await natspy.call(peer.publish, "s.x", b"%d" % i)

        rest: list[int] = []
        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(delete_then_publish)
            with trio.fail_after(10):
                while len(rest) < 2:
                    rest += _data(await oc.fetch(2 - len(rest), expires=8))
        # Replaced from the status of the waiting pull, not after missed heartbeats (15 s).
        assert time.monotonic() - started < 5
        assert rest == [3, 4]
        assert oc.consumer_name == "rd_2" and len(oc.resets) == 1
        assert oc.resets[0].old == "rd_1" and oc.resets[0].start_seq == 4
        # Which answer tells depends on whether the pull reached the server before the delete
        # (409 Consumer Deleted) or after (no responders, or a 404 from the fetch's check of
        # its consumer): each is a prompt path, none the heartbeats'.
        reason = oc.resets[0].reason
        assert reason.split(":")[0] in {"ConsumerDeleted", "NoRespondersError", "ConsumerNotFound"}


def _msg(consumer_seq: int, stream_seq: int, delivered: int = 1) -> JsMsg:
    reply = f"$JS.ACK.S.c.{delivered}.{stream_seq}.{consumer_seq}.1700000000000000000.0"
    return JsMsg(Msg("s.x", 1, reply, b"x", None), conn=None)  # type: ignore[arg-type]


def test_a_gap_hands_out_what_came_before_and_replaces_next() -> None:
    oc = OrderedConsumer(None, "S", OrderedConsumerConfig())  # type: ignore[arg-type]
    assert oc._in_order([_msg(1, 10), _msg(2, 11)]) is not None
    got = oc._in_order([_msg(3, 12), _msg(5, 14), _msg(6, 15)])
    assert got is not None and [m.metadata.stream_seq for m in got] == [12]
    assert oc.last_stream_seq == 12 and oc._stale is not None
    oc2 = OrderedConsumer(None, "S", OrderedConsumerConfig())  # type: ignore[arg-type]
    assert oc2._in_order([_msg(2, 10)]) is None  # nothing before the gap
    assert oc2._in_order([_msg(1, 10, delivered=2)]) is None  # a redelivery is a gap too


async def test_a_missing_stream_and_bad_arguments(nats_server: Any) -> None:
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        with pytest.raises(StreamNotFound):
            await js.ordered_consumer("NOPE")
        with pytest.raises(ValueError):
            OrderedConsumerConfig(name_prefix="a.b")


async def test_a_push_ordered_consumer_notices_its_deletion_at_once(
    nats_server: Any, natspy: Any
) -> None:
    """Issue 24: the push ordered consumer noticed a deleted consumer only after three missed
    heartbeats (15 s). It listens to the server's deletion advisory now."""
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js, 1)
        async with js.subscribe("s.>", ordered=True) as sub:
            with trio.fail_after(5):
                assert int((await sub.next_msg()).data) == 0
            name = sub.consumer
            peer = natspy.nc.jetstream()
            await natspy.call(peer.delete_consumer, "S", name)
            await natspy.call(peer.publish, "s.x", b"1")
            with trio.fail_after(5):  # well inside the 15 s of missed heartbeats
                assert int((await sub.next_msg()).data) == 1
            assert sub.recreated == 1 and sub.consumer != name
            # Its own deletion of the old consumer was no news: replaced once only.
            await natspy.call(peer.publish, "s.x", b"2")
            with trio.fail_after(5):
                assert int((await sub.next_msg()).data) == 2
            assert sub.recreated == 1
