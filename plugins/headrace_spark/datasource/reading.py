"""Reading one :class:`~headrace_spark.datasource.offsets.SequenceRange` in a Spark task.

The task connects with headrace's own client and reads its range with ADR-31 batched Direct
Gets: "up to N messages from sequence S" (of a subject filter), answered as one burst that ends
with an end-of-batch status. No consumer is created and nothing is acked: the range is fixed by
the offsets Spark checkpointed, and reading it again gives the same rows, which is what makes a
query exactly once (Spark's checkpoint plus a deterministic replay, as with Kafka's source).

Why Direct Get and not an ordered consumer: a consumer is server state (created, then deleted)
for every task of every micro-batch, and the server's dispatch paces it; a batched get is one
request per chunk, served by any replica, with nothing left behind. ``bench/README.md`` has the
measurements.

Two things a range read must not get wrong:

- **A replica behind the leader.** Any replica may answer a Direct Get, and a follower may not
  yet hold the last sequences the driver saw on the leader. A read that ends short of its range
  asks the stream leader (``STREAM.MSG.GET`` next-by-subject) whether a message of the range is
  left; if one is, the read goes on from there, so a lagging follower never truncates a range.
- **Data gone.** Messages below the stream's first sequence were removed (limits, a purge)
  before the task read them: :class:`~headrace_spark.errors.DataLost` with
  ``failOnDataLoss=true``, else a warning with the count and the range is read from what is
  left. Messages deleted one by one inside the range are simply not there (as a subject filter
  leaves sequences out); only what fell below the first sequence is counted as lost.

The task's generator (Spark iterates it in its Python worker) and the trio loop run on two
threads joined by a bounded queue: at most ``_QUEUE`` Arrow batches wait, so a slow consumer of
the rows holds the reading back rather than growing memory. Closing the generator early (a
``limit``, a cancelled task) stops the loop.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import trio

from headrace_spark.datasource.offsets import SequenceRange
from headrace_spark.datasource.options import SourceSpec
from headrace_spark.errors import DataLost, SourceStreamRecreated

log = logging.getLogger("headrace_spark.datasource")

#: The rows of the source, as Arrow (the Spark schema is ``datasource.schema.SOURCE_SCHEMA``).
ARROW_SCHEMA = pa.schema(
    [
        ("subject", pa.string()),
        ("data", pa.binary()),
        ("headers", pa.map_(pa.string(), pa.list_(pa.string()))),
        ("stream", pa.string()),
        ("seq", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)

#: Headers a Direct Get answer adds after the stored message's own.
SERVER_HEADERS = (
    "Nats-Stream",
    "Nats-Subject",
    "Nats-Sequence",
    "Nats-Time-Stamp",
    "Nats-Num-Pending",
    "Nats-Last-Sequence",
)

#: Arrow batches waiting between the reading loop and Spark.
_QUEUE = 4
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class _Columns:
    """The columns of the rows read so far, turned into one Arrow batch at a time."""

    __slots__ = ("data", "headers", "seqs", "stream", "subjects", "times")

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.subjects: list[str] = []
        self.data: list[bytes] = []
        self.headers: list[list[tuple[str, list[str]]] | None] = []
        self.seqs: list[int] = []
        self.times: list[int | None] = []

    def __len__(self) -> int:
        return len(self.seqs)

    def add(self, stored: Any) -> None:
        self.subjects.append(stored.subject)
        self.data.append(stored.data)
        self.headers.append(user_headers(stored.headers))
        self.seqs.append(stored.seq)
        when = stored.time
        self.times.append(None if when is None else _micros(when))

    def take(self) -> pa.RecordBatch:
        n = len(self.seqs)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self.subjects, pa.string()),
                pa.array(self.data, pa.binary()),
                pa.array(self.headers, ARROW_SCHEMA.field("headers").type),
                pa.array([self.stream] * n, pa.string()),
                pa.array(self.seqs, pa.int64()),
                pa.array(self.times, ARROW_SCHEMA.field("timestamp").type),
            ],
            schema=ARROW_SCHEMA,
        )
        self.subjects, self.data, self.headers, self.seqs, self.times = [], [], [], [], []
        return batch


class _ConsumerGone(Exception):  # noqa: N818 (control flow, never leaves this module)
    """Spark closed the task's generator: the reading loop ends quietly."""


def _micros(when: dt.datetime) -> int:
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def user_headers(headers: Any) -> list[tuple[str, list[str]]] | None:
    """The stored message's own headers: a Direct Get answer's block less the values the
    server appended (the last value of each of :data:`SERVER_HEADERS`). ``None`` when none."""
    if headers is None:
        return None
    values = headers.as_dict()
    for name in SERVER_HEADERS:
        found = values.get(name)
        if found:
            found.pop()
            if not found:
                del values[name]
    return list(values.items()) or None


def read_partition(spec: SourceSpec, part: SequenceRange) -> Iterator[pa.RecordBatch]:
    """The rows of ``part`` as Arrow batches, for a Spark task's ``read()``."""
    out: queue.Queue[pa.RecordBatch | BaseException | None] = queue.Queue(maxsize=_QUEUE)
    stop = threading.Event()

    def put(item: pa.RecordBatch | BaseException | None) -> None:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    async def emit(batch: pa.RecordBatch) -> None:
        await trio.to_thread.run_sync(put, batch, abandon_on_cancel=True)
        if stop.is_set():
            raise _ConsumerGone

    def run() -> None:
        try:
            trio.run(read_range, spec, part, emit)
        except _ConsumerGone:
            pass
        except BaseException as exc:  # handed to the consuming thread, raised there
            put(exc)
        else:
            put(None)

    thread = threading.Thread(target=run, name=f"headrace-read-{part.index}", daemon=True)
    thread.start()
    try:
        while True:
            item = out.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=30)


async def read_range(spec: SourceSpec, part: SequenceRange, emit: Any) -> None:
    """Read ``part`` and hand its rows to ``emit`` (an async callable taking an Arrow batch)
    in chunks of at most ``spec.fetch_batch`` rows."""
    from headrace.jetstream import MessageNotFound

    async with spec.connection.open() as (_nc, js):
        info = await js.stream_info(spec.stream)
        created = _iso(info.created)
        if created != part.created:
            raise SourceStreamRecreated(spec.stream, part.created, created)
        first = part.first
        if info.state.first_seq > first:
            gone_to = min(part.last, info.state.first_seq - 1)
            if spec.fail_on_data_loss:
                raise DataLost(spec.stream, first, gone_to)
            log.warning(
                "stream %r: skipped sequences %d-%d (%d messages), removed before they were "
                "read (failOnDataLoss=false)",
                spec.stream,
                first,
                gone_to,
                gone_to - first + 1,
            )
            first = gone_to + 1
        if first > part.last:
            return
        columns = _Columns(spec.stream)
        for subject in spec.subjects or (None,):
            position = first
            while position <= part.last:
                want = min(spec.fetch_batch, part.last - position + 1)
                got = await js.direct_get_batch(spec.stream, want, subject=subject, seq=position)
                for stored in got.messages:
                    if stored.seq > part.last:
                        break
                    columns.add(stored)
                if got.messages:
                    position = got.messages[-1].seq + 1
                    if len(columns) >= spec.fetch_batch:
                        await emit(columns.take())
                if got.messages and got.num_pending and got.messages[-1].seq < part.last:
                    continue  # a limit cut the answer: ask on from the last one
                if position > part.last:
                    break
                # The answer ended short of the range: nothing more is stored there, or the
                # replica that answered is behind the leader. Ask the leader.
                try:
                    nxt = await js.get_msg(spec.stream, position, next_by_subject=subject or ">")
                except MessageNotFound:
                    break
                if nxt.seq > part.last:
                    break
                position = nxt.seq  # a replica behind: read on from what the leader has
                await trio.sleep(0.01)
        if len(columns):
            await emit(columns.take())


def _iso(created: dt.datetime | None) -> str:
    from headrace.commits import StreamIdentity

    return StreamIdentity.of("", created).created
