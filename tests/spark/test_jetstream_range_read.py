"""A task's range read against situations a real server will not produce on demand: a Direct
Get answered by a replica behind the stream leader (a read that ends short of its range must
ask the leader and read on, never truncate), a message lost on the way (the
``Nats-Last-Sequence`` chain), a header block of another shape. The answers are made byte for
byte as nats-server 2.15 writes them (the block layout was read off a real server); the
stand-in stream answers only the two requests a read makes."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest
from headrace.jetstream import BatchGet, DirectBatchBroken, MessageNotFound, StoredMessage
from headrace.protocol import Msg
from headrace_spark.datasource.offsets import SequenceRange
from headrace_spark.datasource.options import SourceSpec
from headrace_spark.datasource.reading import _Columns, _read_direct

STAMP = "2026-11-27T21:27:24.101921033Z"


def answer(seq: int, previous: int, pending: int, *, own: bytes = b"") -> Msg:
    block = (
        b"NATS/1.0\r\n"
        + own
        + f"Nats-Stream: S\r\nNats-Subject: s.{seq % 3}\r\nNats-Sequence: {seq}\r\n"
        f"Nats-Time-Stamp: {STAMP}\r\nNats-Num-Pending: {pending}\r\n"
        f"Nats-Last-Sequence: {previous}\r\n\r\n".encode()
    )
    return Msg("_INBOX.x.1", 1, None, f"m{seq}".encode(), block)


def end_of_batch(last: int, pending: int) -> Msg:
    block = f"NATS/1.0 204 EOB\r\nNats-Num-Pending: {pending}\r\nNats-Last-Sequence: {last}\r\n\r\n"
    return Msg("_INBOX.x.1", 1, None, b"", block.encode())


class LaggingReplicaStream:
    """Sequences 1..``stored``; Direct Gets answered from a replica that holds only up to
    ``replica_has`` until it has been asked ``catch_up_after`` times."""

    def __init__(self, stored: int, replica_has: int, catch_up_after: int) -> None:
        self.stored = stored
        self.replica_has = replica_has
        self.catch_up_after = catch_up_after
        self.gets = 0
        self.leader_asked = 0

    async def direct_get_many(self, stream: str, request: BatchGet, *, reader: Any) -> Any:
        self.gets += 1
        has = self.stored if self.gets > self.catch_up_after else self.replica_has
        first = request.seq or 1
        last = min(has, first + request.batch - 1)
        done = None
        previous = 0
        for seq in range(first, last + 1):
            done = reader.feed(answer(seq, previous, has - seq))
            previous = seq
        if last < first:
            return reader.feed(Msg("_INBOX.x.1", 1, None, b"", b"NATS/1.0 404 No Results\r\n\r\n"))
        done = reader.feed(end_of_batch(last, has - last))
        assert done is not None
        return done

    async def get_msg(self, stream: str, seq: int, *, next_by_subject: str) -> StoredMessage:
        self.leader_asked += 1
        if seq > self.stored:
            raise MessageNotFound(404, 10037, "no message found")
        return StoredMessage(stream="S", subject="s.0", seq=seq, data=b"")


SPEC = SourceSpec.from_options({"servers": "nats://127.0.0.1:1", "stream": "S"}, streaming=False)


async def read(stream: Any, first: int, last: int) -> pa.Table:
    columns = _Columns("S")
    batches: list[pa.RecordBatch] = []

    async def emit(batch: pa.RecordBatch) -> None:
        batches.append(batch)

    await _read_direct(stream, SPEC, SequenceRange(0, "S", "c", first, last), first, columns, emit)
    if len(columns):
        batches.append(columns.take())
    return pa.Table.from_batches(batches)


async def test_a_replica_behind_the_leader_does_not_truncate_the_range() -> None:
    stream = LaggingReplicaStream(stored=100, replica_has=60, catch_up_after=2)
    table = await read(stream, 1, 100)
    assert table.column("seq").to_pylist() == list(range(1, 101))
    assert stream.leader_asked >= 1


async def test_a_read_that_ends_at_the_stream_s_end_asks_the_leader_once() -> None:
    stream = LaggingReplicaStream(stored=50, replica_has=50, catch_up_after=0)
    table = await read(stream, 11, 80)  # the range runs past what is stored
    assert table.column("seq").to_pylist() == list(range(11, 51))
    assert stream.leader_asked == 1


async def test_rows_carry_the_message_s_own_headers_only() -> None:
    class WithHeaders(LaggingReplicaStream):
        async def direct_get_many(self, stream: str, request: BatchGet, *, reader: Any) -> Any:
            reader.feed(answer(1, 0, 1, own=b"A: 1\r\nA: 2\r\nNats-Stream: mine\r\n"))
            reader.feed(answer(2, 1, 0))
            return reader.feed(end_of_batch(2, 0))

    table = await read(WithHeaders(2, 2, 0), 1, 2)
    rows = table.to_pylist()
    assert rows[0]["headers"] == [("A", ["1", "2"]), ("Nats-Stream", ["mine"])]
    assert rows[1]["headers"] is None
    assert rows[0]["subject"] == "s.1" and rows[0]["data"] == b"m1"
    assert rows[0]["timestamp"] == dt.datetime(2026, 11, 27, 21, 27, 24, 101921, tzinfo=dt.UTC)


async def test_a_message_lost_on_the_way_fails_the_read() -> None:
    class Lossy(LaggingReplicaStream):
        async def direct_get_many(self, stream: str, request: BatchGet, *, reader: Any) -> Any:
            reader.feed(answer(1, 0, 2))
            return reader.feed(answer(3, 2, 0))  # 2 never came

    with pytest.raises(DirectBatchBroken, match="lost messages between sequence 1 and 2"):
        await read(Lossy(3, 3, 0), 1, 3)
