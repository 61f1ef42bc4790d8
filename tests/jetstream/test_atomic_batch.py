"""Atomic batch publish (ADR-50) against a real nats-server, with nats-py as the independent
peer that reads what the stream stored.

The server's refusals are each produced for real: the ones the client never causes by itself
(a gap, a missing sequence, a bad commit value) by sending the batch headers by hand. The
server's batch limits (size, open batches, timeout) are lowered in its configuration so that a
test reaches them in a moment; an abandoned batch is waited for on the server's own advisory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.jetstream import (
    AtomicBatch,
    AtomicBatchDuplicateMessage,
    AtomicBatchIncomplete,
    AtomicBatchSequenceMissing,
    AtomicBatchTooLarge,
    AtomicBatchTooManyInflight,
    AtomicBatchUsageError,
    AtomicPublishDisabled,
    AtomicPublishError,
    AtomicPublishOnMirror,
    AtomicUnsupportedHeader,
    BatchAbandonedAdvisory,
    InvalidBatchCommit,
    InvalidBatchId,
    JetStream,
    NoStreamForSubject,
    PubAck,
    StreamConfig,
    WrongLastSequence,
)
from headrace.jetstream.atomic_batch import BATCH_ABANDONED_ADVISORY
from headrace.jetstream.codec import from_json
from headrace.jetstream.stream_config import StreamSource
from headrace.nats import connect

from tests.servers import NatsServer

TIMEOUT = 10
BATCH_ID = "Nats-Batch-Id"
BATCH_SEQ = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"


def _limited_server(factory: Callable[..., NatsServer], store: Path, **batch: Any) -> NatsServer:
    """A server whose ``jetstream.limits.batch`` block has ``batch`` (e.g. ``timeout="1s"``)."""
    limits = " ".join(f"{key}: {value!r}".replace("'", '"') for key, value in batch.items())
    config = f'jetstream {{\n  store_dir: "{store}"\n  limits {{ batch {{ {limits} }} }}\n}}'
    return factory(jetstream=False, extra_config=config)


async def _atomic_stream(js: JetStream, name: str, **config: Any) -> None:
    await js.add_stream(
        StreamConfig(name=name, subjects=[f"{name.lower()}.>"], allow_atomic=True, **config)
    )


async def _stored(natspy: Any, url: str, stream: str) -> list[tuple[str, bytes, dict[str, str]]]:
    """Every message of ``stream`` as nats-py reads it: (subject, data, headers)."""
    nc_py = await natspy.connect(url)

    async def read() -> list[tuple[str, bytes, dict[str, str]]]:
        js = nc_py.jetstream()
        info = await js.stream_info(stream)
        if not info.state.messages:
            return []
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(stream, seq)
            out.append((msg.subject, msg.data, dict(msg.headers or {})))
        return out

    return await natspy.call(read)


# -- a committed batch ----------------------------------------------------------------------------


async def test_committed_batch_is_stored_whole(nats_server, natspy):
    """Nothing is in the stream before the commit; after it, every message, in order, under
    one PubAck whose ``batch`` and ``count`` say which and how many."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _atomic_stream(js, "ORDERS")
        assert (await js.stream_info("ORDERS")).config.allow_atomic is True
        await js.publish("orders.before", b"0")  # the batch's sequences follow this one

        batch = js.atomic_batch(batch_id="order-17")
        await batch.add("orders.line", b"1", headers={"X-Line": "1"})
        await batch.add("orders.line", b"2", msg_id="line-2")
        await batch.add("orders.total", b"3")
        assert batch.size == 3
        assert (await js.stream_info("ORDERS")).state.messages == 1  # staged, not stored
        ack = await batch.commit("orders.done", b"4")

    assert (ack.stream, ack.batch, ack.count, ack.seq) == ("ORDERS", "order-17", 4, 5)
    assert batch.done
    with pytest.raises(AtomicBatchUsageError, match="committed"):
        await batch.add("orders.late", b"5")
    stored = await _stored(natspy, nats_server.url, "ORDERS")
    assert [(s, d) for s, d, _ in stored] == [
        ("orders.before", b"0"),
        ("orders.line", b"1"),
        ("orders.line", b"2"),
        ("orders.total", b"3"),
        ("orders.done", b"4"),
    ]
    for place, (_, _, headers) in enumerate(stored[1:], start=1):
        assert headers[BATCH_ID] == "order-17"
        assert headers[BATCH_SEQ] == str(place)
        assert (headers.get(BATCH_COMMIT) == "1") == (place == 4)
    assert stored[1][2]["X-Line"] == "1"
    assert stored[2][2]["Nats-Msg-Id"] == "line-2"


async def test_publish_batch_with_acks_along_the_way(nats_server, natspy):
    """``publish_batch`` sends a list as one batch; ``ack_every`` only changes how often the
    server answers, not what it stores. A batch of one is its own commit."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _atomic_stream(js, "BULK")
        messages = [(f"bulk.{i % 3}", str(i).encode(), None) for i in range(7)]
        ack = await js.publish_batch(messages, ack_every=2)
        assert (ack.count, ack.seq) == (7, 7)
        assert ack.batch is not None and len(ack.batch) <= 64
        single = await js.publish_batch([("bulk.one", b"only", {"X": "y"})])
        assert (single.count, single.seq) == (1, 8)
        assert single.batch != ack.batch  # each batch gets its own id
    stored = await _stored(natspy, nats_server.url, "BULK")
    assert [d for _, d, _ in stored] == [str(i).encode() for i in range(7)] + [b"only"]
    assert stored[-1][2][BATCH_COMMIT] == "1"


async def test_commit_eob_stores_the_batch_without_the_marker(nats_server, natspy):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _atomic_stream(js, "EOB")
        batch = js.atomic_batch()
        with pytest.raises(AtomicBatchUsageError, match="empty"):
            await batch.commit_eob()
        await batch.add("eob.a", b"1")
        await batch.add("eob.b", b"2")
        ack = await batch.commit_eob()
    assert (ack.count, ack.seq, ack.batch) == (2, 2, batch.batch_id)
    stored = await _stored(natspy, nats_server.url, "EOB")
    assert [(s, d) for s, d, _ in stored] == [("eob.a", b"1"), ("eob.b", b"2")]
    # ADR-50: the server marks the last stored message as the commit instead.
    assert stored[-1][2][BATCH_COMMIT] == "1"
    assert BATCH_COMMIT not in stored[0][2]


async def test_messages_go_one_after_another(nats_server):
    """A second ``add`` while one is being sent would take the same batch sequence: it is
    refused, and the batch goes on as if it had not been made."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _atomic_stream(js, "SEQ")
        batch = js.atomic_batch()
        refused: list[AtomicBatchUsageError] = []

        async def add(data: bytes) -> None:
            try:
                await batch.add("seq.a", data)
            except AtomicBatchUsageError as exc:
                refused.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(add, b"1")  # the first message awaits its answer
            nursery.start_soon(add, b"2")
        assert len(refused) == 1 and "one after another" in str(refused[0])
        assert batch.size == 1 and not batch.done
        assert (await batch.commit("seq.a", b"3")).count == 2


# -- what is never committed ----------------------------------------------------------------------


async def test_abandoned_batch_stores_nothing(nats_server_factory, tmp_path, natspy):
    """A batch never committed is dropped after the server's batch timeout (1 s here): the
    server says so in an advisory, the stream holds none of it, and a late commit is refused."""
    server = _limited_server(nats_server_factory, tmp_path, timeout="1s")
    async with connect(server.url) as nc:
        js = JetStream(nc)
        await _atomic_stream(js, "GONE")
        advisories = await nc.subscribe(f"{BATCH_ABANDONED_ADVISORY}.GONE")
        batch = js.atomic_batch()
        for i in range(3):
            await batch.add("gone.x", str(i).encode())
        with trio.fail_after(TIMEOUT):
            advisory = BatchAbandonedAdvisory.from_data((await advisories.next_msg()).data)
        assert (advisory.stream, advisory.batch, advisory.reason) == (
            "GONE",
            batch.batch_id,
            "timeout",
        )
        assert advisory.timestamp is not None
        assert (await js.stream_info("GONE")).state.messages == 0
        with pytest.raises(AtomicBatchIncomplete) as caught:
            await batch.commit("gone.x", b"late")
        assert caught.value.err_code == 10176
        assert batch.done
    assert await _stored(natspy, server.url, "GONE") == []


async def test_stream_without_allow_atomic_refuses_the_batch(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="PLAIN", subjects=["plain.>"]))
        batch = js.atomic_batch()
        with pytest.raises(AtomicPublishDisabled) as caught:
            await batch.add("plain.a", b"1")  # the first message is answered: refused at once
        assert (caught.value.code, caught.value.err_code) == (400, 10174)
        assert isinstance(caught.value, AtomicPublishError)
        with pytest.raises(AtomicBatchUsageError, match="refused"):
            await batch.add("plain.a", b"2")
        with pytest.raises(AtomicPublishDisabled):
            await js.publish_batch([("plain.a", b"1", None), ("plain.a", b"2", None)])
        assert (await js.stream_info("PLAIN")).state.messages == 0

        # A stream update turns it on, and off again.
        config = (await js.stream_info("PLAIN")).config
        config.allow_atomic = True
        assert (await js.update_stream(config)).config.allow_atomic is True
        assert (await js.publish_batch([("plain.a", b"1", None)])).count == 1
        config.allow_atomic = False
        assert not (await js.update_stream(config)).config.allow_atomic
        with pytest.raises(AtomicPublishDisabled):
            await js.publish_batch([("plain.a", b"1", None)])
        assert (await js.stream_info("PLAIN")).state.messages == 1


async def test_mirror_cannot_allow_atomic(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="ORIGIN", subjects=["origin.>"]))
        with pytest.raises(AtomicPublishOnMirror) as caught:
            await js.add_stream(
                StreamConfig(name="COPY", mirror=StreamSource(name="ORIGIN"), allow_atomic=True)
            )
        assert caught.value.err_code == 10198


# -- refusals at the commit -----------------------------------------------------------------------


async def test_refusals_of_the_batch_contents(nats_server):
    """A duplicate ``Nats-Msg-Id`` (in the batch, or still in the duplicate window) and a
    failed expected-sequence check refuse the whole batch at its commit."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _atomic_stream(js, "DUP")
        await js.publish("dup.a", b"single", msg_id="seen")

        batch = js.atomic_batch()
        await batch.add("dup.a", b"1", msg_id="twice")
        with pytest.raises(AtomicBatchDuplicateMessage) as caught:
            await batch.commit("dup.a", b"2", msg_id="twice")
        assert caught.value.err_code == 10201
        with pytest.raises(AtomicBatchDuplicateMessage):
            await js.publish_batch([("dup.a", b"1", {"Nats-Msg-Id": "seen"})])

        batch = js.atomic_batch()
        await batch.add("dup.b", b"1", expected_last_seq=0)  # the stream's last is 1
        with pytest.raises(WrongLastSequence):
            await batch.commit("dup.b", b"2")
        assert (await js.stream_info("DUP")).state.messages == 1
        ack = await js.publish_batch([("dup.b", b"1", {"Nats-Expected-Last-Sequence": "1"})])
        assert ack.seq == 2


async def test_unsupported_header(nats_server):
    """``Nats-Expected-Last-Msg-Id`` is refused by the client before sending, with the
    class and err_code the server gives when it receives one."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _atomic_stream(js, "HDR")
        batch = js.atomic_batch()
        with pytest.raises(AtomicUnsupportedHeader) as by_client:
            await batch.add("hdr.a", b"", headers={"Nats-Expected-Last-Msg-Id": "m"})
        assert batch.size == 0 and not batch.done  # nothing was sent; the batch goes on
        await nc.request(
            "hdr.a", b"", headers={BATCH_ID: "h", BATCH_SEQ: "1", "Nats-Expected-Last-Msg-Id": "m"}
        )
        with pytest.raises(AtomicUnsupportedHeader) as by_server:
            await js.publish(
                "hdr.a", b"", headers={BATCH_ID: "h", BATCH_SEQ: "2", BATCH_COMMIT: "1"}
            )
        assert by_client.value.err_code == by_server.value.err_code == 10177
        assert "Nats-Expected-Last-Msg-Id" in str(by_server.value)
        assert (await js.stream_info("HDR")).state.messages == 0


async def test_malformed_batches_sent_by_hand(nats_server):
    """What AtomicBatch never sends, sent raw: each refusal still arrives as its typed error
    through the ordinary publish path, and nothing is stored."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _atomic_stream(js, "RAW")

        with pytest.raises(AtomicBatchSequenceMissing) as missing:
            await js.publish("raw.a", b"", headers={BATCH_ID: "m"})
        assert missing.value.err_code == 10175

        assert (await nc.request("raw.a", b"", headers={BATCH_ID: "g", BATCH_SEQ: "1"})).data == b""
        with pytest.raises(AtomicBatchIncomplete):  # a gap: 1, then 3
            await js.publish(
                "raw.a", b"", headers={BATCH_ID: "g", BATCH_SEQ: "3", BATCH_COMMIT: "1"}
            )

        with pytest.raises(AtomicBatchIncomplete):  # a batch must start at 1
            await js.publish(
                "raw.a", b"", headers={BATCH_ID: "s", BATCH_SEQ: "2", BATCH_COMMIT: "1"}
            )

        await nc.request("raw.a", b"", headers={BATCH_ID: "c", BATCH_SEQ: "1"})
        with pytest.raises(InvalidBatchCommit) as commit:
            await js.publish(
                "raw.a", b"", headers={BATCH_ID: "c", BATCH_SEQ: "2", BATCH_COMMIT: "yes"}
            )
        assert commit.value.err_code == 10200

        with pytest.raises(InvalidBatchId) as by_server:
            await js.publish("raw.a", b"", headers={BATCH_ID: "x" * 65, BATCH_SEQ: "1"})
        with pytest.raises(InvalidBatchId) as by_client:
            js.atomic_batch(batch_id="x" * 65)
        assert by_server.value.err_code == by_client.value.err_code == 10179
        js.atomic_batch(batch_id="x" * 64)  # the longest accepted

        assert (await js.stream_info("RAW")).state.messages == 0


# -- the server's limits --------------------------------------------------------------------------


async def test_batch_too_large(nats_server_factory, tmp_path):
    server = _limited_server(nats_server_factory, tmp_path, max_msgs=3)
    async with connect(server.url) as nc:
        js = JetStream(nc)
        await _atomic_stream(js, "BIG")
        with pytest.raises(AtomicBatchTooLarge) as at_commit:
            await js.publish_batch([("big.a", b"", None)] * 4)
        assert at_commit.value.err_code == 10199
        # Answered every message, the batch learns it at the first one over the limit.
        batch = js.atomic_batch(ack_every=1)
        for _ in range(3):
            await batch.add("big.a", b"")
        with pytest.raises(AtomicBatchTooLarge):
            await batch.add("big.a", b"")
        assert batch.size == 3 and batch.done
        assert (await js.stream_info("BIG")).state.messages == 0
        assert (await js.publish_batch([("big.a", b"", None)] * 3)).count == 3


async def test_too_many_batches_in_flight(nats_server_factory, tmp_path):
    server = _limited_server(nats_server_factory, tmp_path, max_inflight_per_stream=2)
    async with connect(server.url) as nc:
        js = JetStream(nc)
        await _atomic_stream(js, "BUSY")
        first, second, third = (js.atomic_batch() for _ in range(3))
        await first.add("busy.a", b"1")
        await second.add("busy.a", b"2")
        with pytest.raises(AtomicBatchTooManyInflight) as caught:
            await third.add("busy.a", b"3")
        assert (caught.value.code, caught.value.err_code) == (429, 10210)
        assert (await first.commit("busy.a", b"1")).count == 2
        # The committed batch freed its place.
        assert (await js.publish_batch([("busy.a", b"3", None)])).count == 1
        assert (await second.commit("busy.a", b"2")).count == 2
        assert (await js.stream_info("BUSY")).state.messages == 5


# -- client-side checks ---------------------------------------------------------------------------


async def test_client_refuses_before_sending(core_server):
    """No JetStream on this server: anything that went out would end in NoStreamForSubject."""
    async with connect(core_server.url) as nc:
        js = JetStream(nc, timeout=1)
        for bad in ("", " padded", "x" * 65):
            with pytest.raises(InvalidBatchId):
                AtomicBatch(nc, batch_id=bad)
        with pytest.raises(AtomicBatchUsageError, match="ack_every"):
            js.atomic_batch(ack_every=0)
        batch = js.atomic_batch()
        with pytest.raises(AtomicBatchUsageError, match="batch's own"):
            await batch.add("a.b", b"", headers={"Nats-Batch-Sequence": "7"})
        with pytest.raises(AtomicBatchUsageError, match="empty"):
            await js.publish_batch([])
        with pytest.raises(AtomicUnsupportedHeader):  # checked before the first is sent
            await js.publish_batch(
                [("a.b", b"", None), ("a.b", b"", {"Nats-Expected-Last-Msg-Id": "x"})]
            )
        assert batch.size == 0 and not batch.done
        with pytest.raises(NoStreamForSubject):
            await batch.add("a.b", b"")
        assert batch.done


def test_batch_pub_ack_fields():
    ack = from_json(PubAck, {"stream": "S", "seq": 9, "batch": "b1", "count": 3})
    assert (ack.seq, ack.batch, ack.count, ack.extra) == (9, "b1", 3, {})
    plain = from_json(PubAck, {"stream": "S", "seq": 4})
    assert (plain.batch, plain.count) == (None, None)
