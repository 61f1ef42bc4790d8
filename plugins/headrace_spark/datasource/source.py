"""The driver's side of the ``jetstream`` source: where a query starts, how far each
micro-batch reads, and the partitions of a batch read.

Spark runs these methods in a Python process of its own on the driver (not the user's), once
per trigger. Each call that needs the stream's state opens a connection, asks for the stream's
info (its identity, first and last sequence, size) and closes it: tens of milliseconds a
trigger, and no connection left open between triggers.

The rules, in one place:

- ``startingOffsets``: ``earliest`` (the first stored message), ``latest`` (what is stored
  after the query starts: the default of streaming reads), a sequence (that message on), or an
  ISO 8601 time (the first message stored at or after it). Only a query's first run reads it;
  a restarted query goes on from its checkpoint.
- ``endingOffsets`` (batch reads only): ``latest`` (the default), a sequence (the last one
  read, included) or a time (messages stored before it).
- Each trigger reads up to the stream's last sequence, capped by ``maxMessagesPerTrigger``
  (sequences) or ``maxBytesPerTrigger`` (estimated from the stream's average message size),
  unless Spark asks for everything (``Trigger.AvailableNow`` pins the last sequence when the
  query starts and reads up to it in capped steps).
- A stream created again under its name fails the query
  (:class:`~headrace_spark.errors.SourceStreamRecreated`); data removed before it was read
  fails it too unless ``failOnDataLoss=false`` (:class:`~headrace_spark.errors.DataLost`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import trio
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from headrace_spark.datasource.offsets import SequenceRange, StreamOffset, partition_count, plan
from headrace_spark.datasource.options import (
    AtSequence,
    AtTime,
    Earliest,
    Latest,
    Position,
    SourceSpec,
)
from headrace_spark.datasource.reading import _iso, read_partition, skip_lost, stream_info
from headrace_spark.errors import JetStreamFormatError, SourceStreamRecreated

log = logging.getLogger("headrace_spark.datasource")

#: How long planning keeps trying to reach the stream through a transient failure (a stream
#: leader election, a server restarting) before the trigger fails: a failed trigger fails the
#: whole query, where a task's failure is retried by Spark.
PLANNING_PATIENCE = 30.0

T = TypeVar("T")


def _transient() -> tuple[type[BaseException], ...]:
    from headrace.errors import (
        ConnectionClosedError,
        ConnectionLostError,
        NoRespondersError,
        NoServersError,
        RequestTimeout,
    )
    from headrace.jetstream import JetStreamUnavailable

    return (
        ConnectionClosedError,
        ConnectionLostError,
        NoRespondersError,
        NoServersError,
        RequestTimeout,
        JetStreamUnavailable,
    )


def on_driver(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``trio.run(fn, *args)``, run again after a transient failure (with a backoff of 0.25 s
    doubling to 4 s) for up to :data:`PLANNING_PATIENCE` seconds. Wrong credentials, a missing
    stream, data lost: raised at once."""
    transient = _transient()
    deadline = time.monotonic() + PLANNING_PATIENCE
    delay = 0.25
    while True:
        try:
            return trio.run(fn, *args)
        except transient as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("jetstream: %s: %s; trying again in %.2fs", type(exc).__name__, exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 4.0)


class StreamState:
    """What the driver knows of the stream at one moment (from its stream info)."""

    __slots__ = ("avg_bytes", "created", "first_seq", "last_seq", "stream")

    def __init__(self, stream: str, info: Any) -> None:
        self.stream = stream
        self.created = _iso(info.created)
        state = info.state
        self.first_seq = int(state.first_seq) or int(state.last_seq) + 1
        self.last_seq = int(state.last_seq)
        self.avg_bytes = state.bytes / state.messages if state.messages else 1.0


async def _state(spec: SourceSpec) -> StreamState:
    async with spec.connection.open() as (_nc, js):
        return StreamState(spec.stream, await stream_info(js, spec))


async def _first_at_or_after(spec: SourceSpec, position: Position, state: StreamState) -> int:
    """The sequence ``position`` names: the first message it includes (``last_seq + 1``: none
    yet)."""
    if isinstance(position, Earliest):
        return state.first_seq
    if isinstance(position, Latest):
        return state.last_seq + 1
    if isinstance(position, AtSequence):
        return position.seq
    assert isinstance(position, AtTime)
    async with spec.connection.open() as (_nc, js):
        got = await js.direct_get_batch(spec.stream, 1, start_time=position.time)
    return got.messages[0].seq if got.messages else state.last_seq + 1


def _check_lost(spec: SourceSpec, state: StreamState, next_seq: int, end: int) -> None:
    """Fail (or warn) when sequences from ``next_seq`` on were removed before being read."""
    skip_lost(spec, state.first_seq, next_seq, end)


def _partitions(spec: SourceSpec, state: StreamState, start: int, end: int) -> list[SequenceRange]:
    return plan(
        spec.stream,
        state.created,
        start,
        end,
        avg_message_bytes=state.avg_bytes,
        num_partitions=spec.num_partitions,
        partition_bytes=spec.partition_bytes,
    )


# -- streaming ------------------------------------------------------------------------------------


class JetStreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("jetstream")``: micro-batches of stream sequence ranges."""

    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self._target: int | None = None  # Trigger.AvailableNow's last sequence
        self._state: StreamState | None = None

    def _fresh(self) -> StreamState:
        self._state = on_driver(_state, self.spec)
        return self._state

    def _same_stream(self, offset: StreamOffset, state: StreamState) -> None:
        if offset.stream != self.spec.stream:
            raise JetStreamFormatError(
                f"the query's checkpoint holds offsets of stream {offset.stream!r}, and the "
                f"query now reads {self.spec.stream!r}: use a new checkpoint location"
            )
        if offset.created != state.created:
            raise SourceStreamRecreated(self.spec.stream, offset.created, state.created)

    def initialOffset(self) -> dict[str, Any]:
        state = self._fresh()
        first = on_driver(_first_at_or_after, self.spec, self.spec.starting, state)
        return StreamOffset(self.spec.stream, state.created, first - 1).to_dict()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._fresh().last_seq

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.spec.max_messages is not None:
            return ReadMaxRows(self.spec.max_messages)
        if self.spec.max_bytes is not None:
            return ReadMaxBytes(self.spec.max_bytes)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = StreamOffset.from_dict(start)
        state = self._fresh()
        self._same_stream(begin, state)
        end = state.last_seq if self._target is None else min(state.last_seq, self._target)
        _check_lost(self.spec, state, begin.seq + 1, end)
        if not isinstance(limit, ReadAllAvailable):
            end = self._capped(begin.seq, end, limit, state)
        if end <= begin.seq:
            return start  # nothing new: the same offset, so Spark plans no batch
        parts = partition_count(
            end - begin.seq,
            state.avg_bytes,
            num_partitions=self.spec.num_partitions,
            partition_bytes=self.spec.partition_bytes,
        )
        return StreamOffset(self.spec.stream, state.created, end, parts).to_dict()

    def _capped(self, start: int, end: int, limit: ReadLimit, state: StreamState) -> int:
        if isinstance(limit, ReadMinRows):
            return end if end - start >= limit.min_rows else start
        if isinstance(limit, ReadMaxRows):
            end = min(end, start + limit.max_rows)
            limit_bytes = self.spec.max_bytes
        elif isinstance(limit, ReadMaxBytes):
            limit_bytes = limit.max_bytes
        else:
            return end
        if limit_bytes is not None:
            end = min(end, start + max(1, int(limit_bytes // state.avg_bytes)))
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, finish = StreamOffset.from_dict(start), StreamOffset.from_dict(end)
        if finish.seq <= begin.seq:
            return []
        if finish.created != begin.created:
            raise SourceStreamRecreated(self.spec.stream, begin.created, finish.created)
        parts: int | None
        if finish.parts is not None:  # cut as when the batch was planned (StreamOffset)
            avg_bytes, parts = 1.0, finish.parts
        else:  # an offset written before parts were recorded
            state = self._state if self._state is not None else self._fresh()
            avg_bytes, parts = state.avg_bytes, self.spec.num_partitions
        return plan(
            self.spec.stream,
            finish.created,
            begin.seq,
            finish.seq,
            avg_message_bytes=avg_bytes,
            num_partitions=parts,
            partition_bytes=self.spec.partition_bytes,
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SequenceRange)
        return read_partition(self.spec, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the source holds no server state (no consumer, no acks)."""

    def stop(self) -> None:
        """Nothing to close: each call connects and disconnects."""


# -- batch ----------------------------------------------------------------------------------------


class JetStreamBatchReader(DataSourceReader):
    """``spark.read.format("jetstream")``: one range, from ``startingOffsets`` (default
    ``earliest``) to ``endingOffsets`` (default ``latest``), read by all cores at once."""

    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec

    def partitions(self) -> Sequence[InputPartition]:
        return on_driver(self._plan)

    async def _plan(self) -> list[SequenceRange]:
        spec = self.spec
        state = await _state(spec)
        first = await _first_at_or_after(spec, spec.starting, state)
        ending = spec.ending
        if isinstance(ending, AtSequence):
            end = min(ending.seq, state.last_seq)
        elif isinstance(ending, AtTime):
            end = await _first_at_or_after(spec, ending, state) - 1
        else:
            end = state.last_seq
        _check_lost(spec, state, first, end)
        return _partitions(spec, state, first - 1, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SequenceRange):
            # An empty range: PySpark plans one InputPartition(None) when partitions() is
            # empty (plan_data_source_read.py), and its task reads nothing.
            return iter(())
        return read_partition(self.spec, partition)
