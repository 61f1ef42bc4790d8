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
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import trio
from headrace.jetstream import (
    BatchGet,
    DecodeError,
    DirectBatch,
    DirectBatchReader,
    StoredMessage,
    direct_time,
    split_direct_tail,
)
from headrace.protocol import Headers, Msg, read_header_block

from headrace_spark.datasource.offsets import SequenceRange
from headrace_spark.datasource.options import SourceSpec
from headrace_spark.errors import DataLost, JetStreamFormatError, SourceStreamRecreated

if TYPE_CHECKING:
    from headrace.jetstream import JetStream, StreamInfo

log = logging.getLogger("headrace_spark.datasource")

#: What a read hands its Arrow batches to.
Emit = Callable[[pa.RecordBatch], Awaitable[None]]

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
#: How many times a read may find the answering replica behind the leader before it fails.
_BEHIND_TRIES = 500


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

    def add_stored(self, stored: StoredMessage) -> None:
        """A message read the general way (an unusual header block)."""
        self.subjects.append(stored.subject)
        self.data.append(stored.data)
        self.headers.append(user_headers(stored.headers))
        self.seqs.append(stored.seq)
        self.times.append(None if stored.time is None else _micros(stored.time))

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


def _micros(when: dt.datetime) -> int:
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


#: Seconds since the epoch of each ``YYYY-MM-DDTHH:MM:SS`` seen (messages share seconds).
_SECONDS: dict[bytes, int] = {}


def _stamp_micros(text: bytes) -> int | None:
    """``Nats-Time-Stamp`` (RFC 3339 in UTC with up to nanoseconds, as nats-server writes it)
    in microseconds since the epoch, without a datetime; anything else the general way."""
    if len(text) >= 20 and text[19:20] in (b".", b"Z") and text[-1:] == b"Z":
        whole = text[:19]
        seconds = _SECONDS.get(whole)
        if seconds is None:
            try:
                parsed = dt.datetime.fromisoformat(whole.decode() + "+00:00")
            except ValueError:
                return _slow_stamp(text)
            seconds = int((parsed - _EPOCH).total_seconds())
            if len(_SECONDS) > 100_000:
                _SECONDS.clear()
            _SECONDS[whole] = seconds
        fraction = text[20:-1]
        if fraction and not fraction.isdigit():
            return _slow_stamp(text)  # not a fraction: the general parser says what it is
        micros = int((fraction + b"000000")[:6]) if fraction else 0
        return seconds * 1_000_000 + micros
    return _slow_stamp(text)


def _slow_stamp(text: bytes) -> int | None:
    when = direct_time(text.decode(errors="replace"))
    return None if when is None else _micros(when)


_STATUS_LINE = b"NATS/1.0 "
_VERSION_LINE = b"NATS/1.0\r\n"


#: A split of a reply's server tail, as :data:`headrace.jetstream.split_direct_tail`.
TailSplit = Callable[[bytes], "tuple[int, bytes, int, int, int | None] | None"]


class ColumnReader(DirectBatchReader):
    """Reads one batched Direct Get answer straight into :class:`_Columns`.

    The server's part of each message's header block is always the same six lines at its end
    (``Nats-Stream``, ``-Subject``, ``-Sequence``, ``-Time-Stamp``, ``-Num-Pending``,
    ``-Last-Sequence``), so it is split by position, not parsed as a general header block (two
    general parses a message were two thirds of a task's time). A block that does not end that way
    (another server version) goes through :class:`DirectBatchReader` as usual. Messages past
    ``last`` (a subject filter's answer can run past the range) are left out; the chain of
    ``Nats-Last-Sequence`` is checked for every message all the same.

    The split itself is in C when it is built (``headrace.jetstream._direct_tail``, off with
    ``HEADRACE_PURE_PYTHON=1``): in Python, finding the six lines, checking their names,
    reading both sequences and the time stamp were about 60% of a task's CPU. The C split
    takes only a block of exactly that shape with plain decimal sequences; for any other it
    returns ``None`` and :meth:`_feed_python`, the same split in Python, decides, so the rows
    and the errors are the same either way (tests/jetstream/test_direct_tail.py).
    """

    def __init__(
        self,
        stream: str,
        columns: _Columns,
        last: int,
        split: TailSplit | None = split_direct_tail,
    ) -> None:
        super().__init__(stream)
        self.columns = columns
        self.last = last
        self.taken = 0
        #: The C split (``split_direct_tail``: None when headrace has none); a test gives
        #: None to compare the Python path with it.
        self._split = split

    def feed(self, msg: Msg) -> DirectBatch | None:
        """Take the next reply (as :meth:`DirectBatchReader.feed`), split in C when it can be.

        The hot loop of a task: 0.6 us a message with the C split where the Python path takes
        3 (one call instead of rfind, split, four startswith, two int() and a time stamp). The
        column appends stay ``columns.x.append``: CPython 3.11 specialises a list's append
        call, and appends bound to locals once measured no faster, only harder to read (and
        wrong after :meth:`_Columns.take` swaps the lists).
        """
        raw = msg.raw_headers
        split = self._split
        if split is None or raw is None or (tail := split(raw)) is None:
            return self._feed_python(msg)  # no C split, or a status or another shape: Python
        at, subject, seq, previous, stamp = tail
        self._take(msg, raw, at, subject, seq, previous, stamp)
        return None

    def _take(
        self,
        msg: Msg,
        raw: bytes,
        at: int,
        subject: bytes,
        seq: int,
        previous: int,
        stamp: int | bytes | None,
    ) -> None:
        """One split message into the columns: the chain checked first, then ``last``.
        ``stamp``: microseconds, ``None`` (another form, read from the block) or the stamp's
        text (the Python path)."""
        if previous != self._previous:
            self._check_chain([str(previous)])
        self._previous = seq
        if seq > self.last:
            return
        columns = self.columns
        columns.subjects.append(subject.decode())
        columns.data.append(msg.data)
        columns.headers.append(_own_headers(raw, at) if at > 8 else None)
        columns.seqs.append(seq)
        if stamp is None:  # not YYYY-MM-DDTHH:MM:SS[.fraction]Z: read as the Python path does
            stamp = raw[at + 2 : -4].split(b"\r\n")[3][17:]
        columns.times.append(_stamp_micros(stamp) if isinstance(stamp, bytes) else stamp)
        self.taken += 1

    def _feed_python(self, msg: Msg) -> DirectBatch | None:
        """:meth:`feed` without the C split: any header block, in Python."""
        raw = msg.raw_headers
        if raw is None or raw.startswith(_STATUS_LINE):
            return super().feed(msg)
        at = raw.rfind(b"\r\nNats-Stream: ")
        lines = raw[at + 2 : -4].split(b"\r\n") if at >= 8 else ()
        if not (
            len(lines) == 6
            and lines[1].startswith(b"Nats-Subject: ")
            and lines[2].startswith(b"Nats-Sequence: ")
            and lines[3].startswith(b"Nats-Time-Stamp: ")
            and lines[5].startswith(b"Nats-Last-Sequence: ")
        ):
            done = super().feed(msg)
            stored = self._messages.pop()
            if stored.seq <= self.last:
                self.columns.add_stored(stored)
                self.taken += 1
            return done
        try:
            seq = int(lines[2][15:])
            previous = int(lines[5][20:])
        except ValueError:
            raise DecodeError(
                f"a Direct Get answer had a malformed header block: {raw!r}"
            ) from None
        self._take(msg, raw, at, lines[1][14:], seq, previous, lines[3][17:])
        return None

    @property
    def received(self) -> int:
        return self.taken + len(self._messages)


def _own_headers(raw: bytes, at: int) -> list[tuple[str, list[str]]] | None:
    """The stored message's own headers: the lines of ``raw`` between its version line and the
    server's part, which starts at ``at``."""
    own = read_header_block(_VERSION_LINE + raw[10:at] + b"\r\n\r\n")[0]
    return list(own.as_dict().items()) or None


def user_headers(headers: Headers | None) -> list[tuple[str, list[str]]] | None:
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


class _ConsumerGone(Exception):
    """Spark closed the task's generator: the reading loop ends quietly."""


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


async def read_range(spec: SourceSpec, part: SequenceRange, emit: Emit) -> None:
    """Read ``part`` and hand its rows to ``emit`` (an async callable taking an Arrow batch)
    in chunks of at most ``spec.fetch_batch`` rows."""
    async with spec.connection.open() as (_nc, js):
        info = await stream_info(js, spec)
        created = _iso(info.created)
        if created != part.created:
            raise SourceStreamRecreated(spec.stream, part.created, created)
        first = skip_lost(spec, info.state.first_seq, part.first, part.last)
        if first > part.last:
            return
        columns = _Columns(spec.stream)
        method = spec.read_method
        if method == "auto":
            method = "direct" if info.config.allow_direct else "consumer"
        if method == "direct":
            await _read_direct(js, spec, part, first, columns, emit)
        else:
            await _read_consumer(js, spec, part, first, columns, emit)
        if len(columns):
            await emit(columns.take())


def skip_lost(spec: SourceSpec, first_stored: int, first: int, last: int) -> int:
    """The first sequence of ``first``..``last`` left to read, when the stream's first stored
    message is ``first_stored``: what fell below it was removed before it was read, which
    fails the read (:class:`DataLost`) or, with ``failOnDataLoss=false``, is skipped with a
    warning naming the range and the count. The driver and each task check alike."""
    if first_stored <= first or first > last:
        return first
    gone_to = min(last, first_stored - 1)
    if spec.fail_on_data_loss:
        raise DataLost(spec.stream, first, gone_to)
    log.warning(
        "stream %r: sequences %d-%d (%d messages) were removed before the query read them; "
        "skipped (failOnDataLoss=false)",
        spec.stream,
        first,
        gone_to,
        gone_to - first + 1,
    )
    return gone_to + 1


def _still_behind(spec: SourceSpec, behind: int, seq: int) -> int:
    """Count one more answer behind the leader at ``seq``; fail past :data:`_BEHIND_TRIES`."""
    behind += 1
    if behind > _BEHIND_TRIES:
        raise JetStreamFormatError(
            f"stream {spec.stream!r}: the answers stayed behind the stream leader at sequence "
            f"{seq} for {_BEHIND_TRIES} tries; is a replica stuck?"
        )
    return behind


async def _read_direct(
    js: JetStream,
    spec: SourceSpec,
    part: SequenceRange,
    first: int,
    columns: _Columns,
    emit: Emit,
) -> None:
    """Read with batched Direct Gets, one subject filter after the other."""
    from headrace.jetstream import MessageNotFound

    for subject in spec.subjects or (None,):
        position = first
        behind = 0
        while position <= part.last:
            want = min(spec.fetch_batch, part.last - position + 1)
            request = BatchGet(batch=want, subject=subject, seq=position)
            reader = ColumnReader(spec.stream, columns, part.last)
            got = await js.direct_get_many(spec.stream, request, reader=reader)
            if got.last_seq:
                position = got.last_seq + 1
            if len(columns) >= spec.fetch_batch:
                await emit(columns.take())
            if got.last_seq and got.num_pending:
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
            behind = _still_behind(spec, behind, nxt.seq)
            position = nxt.seq  # a replica behind: read on from what the leader has
            await trio.sleep(0.01)


async def _next_on_leader(js: JetStream, spec: SourceSpec, position: int) -> int | None:
    """The sequence of the first message at or after ``position`` that the filters match, as
    the stream leader has it (``None``: none)."""
    from headrace.jetstream import MessageNotFound

    found = []
    for subject in spec.subjects or (">",):
        try:
            found.append((await js.get_msg(spec.stream, position, next_by_subject=subject)).seq)
        except MessageNotFound:
            continue
    return min(found) if found else None


async def _read_consumer(
    js: JetStream,
    spec: SourceSpec,
    part: SequenceRange,
    first: int,
    columns: _Columns,
    emit: Emit,
) -> None:
    """Read with an ephemeral pull consumer (ack none, from ``first``, in memory, one replica):
    for streams without Direct Get. The consumer is deleted at the end, and the server
    removes it by itself after a minute if the task dies first."""
    from headrace.jetstream import AckPolicy, ConsumerConfig, DeliverPolicy

    subjects = list(spec.subjects)
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=first,
        ack_policy=AckPolicy.NONE,
        filter_subjects=subjects if len(subjects) > 1 else None,
        filter_subject=subjects[0] if len(subjects) == 1 else None,
        mem_storage=True,
        num_replicas=1,
        inactive_threshold=60.0,
    )
    info = await js.create_consumer(spec.stream, config)
    try:
        consumer = await js.pull_consumer(spec.stream, info.name)
        position = first
        behind = 0
        # Ask for no more than the consumer has pending: a pull for more would wait out its
        # expiry for messages the filters do not match.
        pending: int | None = info.num_pending
        while position <= part.last:
            want = min(spec.fetch_batch, part.last - position + 1, max(pending or 0, 1))
            msgs = await consumer.fetch(want, expires=2.0) if pending != 0 else []
            for msg in msgs:
                meta = msg.metadata
                if meta.stream_seq > part.last:
                    position = part.last + 1
                    break
                columns.subjects.append(msg.subject)
                columns.data.append(msg.data)
                headers = msg.headers
                columns.headers.append(list(headers.as_dict().items()) or None if headers else None)
                columns.seqs.append(meta.stream_seq)
                columns.times.append(meta.timestamp_ns // 1000)
                position = meta.stream_seq + 1
                pending = meta.num_pending
            if len(columns) >= spec.fetch_batch:
                await emit(columns.take())
            if position > part.last or (msgs and pending):
                continue
            nxt = await _next_on_leader(js, spec, position)
            if nxt is None or nxt > part.last:
                break
            pending = None  # the leader has more: the consumer will have it soon
            behind = _still_behind(spec, behind, nxt)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                await js.delete_consumer(spec.stream, info.name)
            except Exception:  # the server removes it after inactive_threshold anyway
                log.debug("could not delete consumer %s", info.name, exc_info=True)


async def stream_info(js: JetStream, spec: SourceSpec) -> StreamInfo:
    """The stream's info; a stream that does not exist is said in words naming it and where
    it was looked for."""
    from headrace.jetstream import StreamNotFound

    try:
        return await js.stream_info(spec.stream)
    except StreamNotFound as exc:
        raise JetStreamFormatError(
            f"stream {spec.stream!r} does not exist on {spec.connection.where}"
        ) from exc


def _iso(created: dt.datetime | None) -> str:
    from headrace.commits import StreamIdentity

    return StreamIdentity.of("", created).created
