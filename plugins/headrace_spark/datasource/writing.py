"""The ``jetstream`` sink: rows published to a stream, each confirmed by its PubAck, none
stored twice.

Each Spark task publishes its partition's rows on one connection with up to ``maxInFlight``
PubAcks outstanding (collected on one inbox), and returns only once every row was confirmed.
Any refusal, or a PubAck that does not come within ``publishTimeout``, fails the task, and
Spark runs it again.

A rerun must not store anything twice, and that is the ``Nats-Msg-Id`` every message carries:
``<prefix>:<partition>:<row>``, where the prefix is, for a streaming query, its id (kept in the
checkpoint, so the same across driver restarts) and the micro-batch id, and for a batch write
an id made once when the write is planned (or ``msgIdPrefix``). A task retry, a stage retry,
and a micro-batch run again after the driver died all publish the same ids for the same rows,
and the stream drops the repeats within its duplicate window (``duplicate_window``, 2 minutes
by default): a rerun later than that stores them again. ``msgIdColumn`` names a column whose
value replaces ``<partition>:<row>``, for plans whose row order within a partition is not
deterministic (the output of a shuffle).

The rows need a ``data`` column (binary or string), a ``subject`` column (string) unless the
``subject`` option sets one for all, and may have ``headers`` (``map<string,string>`` or
``map<string,array<string>>``). Any other column is refused rather than silently dropped.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import trio
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    MapType,
    StringType,
    StructType,
)

from headrace_spark.datasource.options import SinkSpec
from headrace_spark.errors import JetStreamFormatError, JetStreamOptionError, PublishFailed

log = logging.getLogger("headrace_spark.datasource")

#: The local properties Spark sets on a streaming query's tasks.
QUERY_ID = "sql.streaming.queryId"
BATCH_ID = "streaming.sql.batchId"
MSG_ID = "Nats-Msg-Id"


@dataclass(frozen=True)
class SinkLayout:
    """Which columns the rows have, checked on the driver before any task runs."""

    subject_column: bool
    data_is_text: bool
    headers: str | None  # None, "one" (map<string,string>) or "many" (map<string,array<string>>)
    id_column: str | None


def check_schema(schema: StructType, spec: SinkSpec) -> SinkLayout:
    """The layout of ``schema``'s rows, or a :class:`JetStreamOptionError` saying what to
    select."""
    fields = {f.name: f.dataType for f in schema.fields}
    allowed = {"subject", "data", "headers"}
    if spec.msg_id_column is not None:
        if spec.msg_id_column not in fields:
            raise JetStreamOptionError(
                "msgIdColumn", f"names no column of the rows ({', '.join(fields)})"
            )
        allowed.add(spec.msg_id_column)
    extra = [name for name in fields if name not in allowed]
    if extra:
        raise JetStreamOptionError(
            "columns",
            f"the jetstream sink writes subject, data and headers; the rows also have "
            f"{', '.join(extra)}: select only those (to_json(struct(...)) AS data packs others)",
        )
    if "data" not in fields:
        raise JetStreamOptionError("columns", "the rows need a data column (binary or string)")
    if not isinstance(fields["data"], BinaryType | StringType):
        raise JetStreamOptionError(
            "columns", f"data must be binary or string, not {fields['data'].simpleString()}"
        )
    if "subject" in fields:
        if spec.subject is not None:
            raise JetStreamOptionError(
                "subject", "is set and the rows have a subject column too: keep one"
            )
        if not isinstance(fields["subject"], StringType):
            raise JetStreamOptionError("columns", "subject must be a string column")
    elif spec.subject is None:
        raise JetStreamOptionError(
            "subject", "the rows have no subject column: give one, or set this option"
        )
    headers = None
    if "headers" in fields:
        kind = fields["headers"]
        if isinstance(kind, MapType) and isinstance(kind.keyType, StringType):
            if isinstance(kind.valueType, StringType):
                headers = "one"
            elif isinstance(kind.valueType, ArrayType) and isinstance(
                kind.valueType.elementType, StringType
            ):
                headers = "many"
        if headers is None:
            raise JetStreamOptionError(
                "columns",
                "headers must be map<string,string> or map<string,array<string>>, not "
                f"{kind.simpleString()}",
            )
    return SinkLayout(
        subject_column="subject" in fields,
        data_is_text=isinstance(fields["data"], StringType),
        headers=headers,
        id_column=spec.msg_id_column,
    )


@dataclass(frozen=True)
class Published(WriterCommitMessage):
    """What one task published: rows sent, and how many of them the stream already had (a
    retry's repeats, dropped by the duplicate window)."""

    partition: int
    sent: int
    duplicates: int


def _task() -> Any:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise JetStreamFormatError("the jetstream sink's write() runs in a Spark task only")
    return context


def _rows(
    batches: Iterator[pa.RecordBatch], layout: SinkLayout, spec: SinkSpec
) -> Iterator[tuple[str, bytes, dict[str, Any], str | None]]:
    """``(subject, data, headers, id value)`` per row."""
    for batch in batches:
        columns = batch.to_pydict()
        n = batch.num_rows
        subjects = columns["subject"] if layout.subject_column else [spec.subject] * n
        datas = columns["data"]
        headers = columns["headers"] if layout.headers else [None] * n
        ids = columns[layout.id_column] if layout.id_column else [None] * n
        for subject, data, hdrs, ident in zip(subjects, datas, headers, ids, strict=True):
            if subject is None:
                raise JetStreamFormatError("a row has a null subject: every row needs one")
            if data is None:
                payload = b""
            elif layout.data_is_text:
                payload = data.encode()
            else:
                payload = data
            message_headers: dict[str, Any] = {}
            if hdrs:
                for name, value in hdrs:
                    if value is None:
                        continue
                    message_headers[name] = value if layout.headers == "many" else str(value)
            yield subject, payload, message_headers, None if ident is None else str(ident)


async def publish_rows(
    spec: SinkSpec,
    prefix: str,
    partition: int,
    rows: Iterator[tuple[str, bytes, dict[str, Any], str | None]],
) -> Published:
    """Publish ``rows`` with ``Nats-Msg-Id`` ``<prefix>:<partition>:<row>`` (or
    ``<prefix>:<id value>``), at most ``spec.max_in_flight`` PubAcks outstanding; raises
    :class:`PublishFailed` unless every one confirmed its message."""
    async with spec.connection.open() as (nc, _js):
        # One reply subject per row under one wildcard subscription: a refusal without a body
        # (no responders) names only its reply subject, which says whose row it was.
        inbox = nc.new_inbox()
        acks = await nc.subscribe(f"{inbox}.*")
        waiting: dict[str, str] = {}  # reply subject -> the subject its row went to
        sent = answered = duplicates = refused = 0
        first_refusal: str | None = None

        async def collect() -> None:
            nonlocal answered, duplicates, refused, first_refusal
            with trio.move_on_after(spec.publish_timeout) as waited:
                batch = await acks.next_batch()
            if waited.cancelled_caught:
                raise PublishFailed(
                    f"{sent - answered} of {sent} messages had no PubAck within "
                    f"{spec.publish_timeout}s (publishTimeout); the task is retried and "
                    "the stream drops what it already stored"
                )
            answered += len(batch)
            for msg in batch:
                subject = waiting.pop(msg.subject, None)
                data = msg.data
                if msg.status is not None or b'"error"' in data:
                    refused += 1
                    if first_refusal is None:
                        first_refusal = _refusal(msg, subject)
                elif b'"duplicate":true' in data:
                    duplicates += 1

        expected = {"Nats-Expected-Stream": spec.stream} if spec.stream else {}
        for row, (subject, data, headers, ident) in enumerate(rows):
            headers.update(expected)
            headers[MSG_ID] = (
                f"{prefix}:{ident}" if spec.msg_id_column else f"{prefix}:{partition}:{row}"
            )
            reply = f"{inbox}.{row}"
            waiting[reply] = subject
            await nc.publish(subject, data, reply=reply, headers=headers)
            sent += 1
            while sent - answered >= spec.max_in_flight:
                await collect()
            if refused:
                break
        while answered < sent and not refused:
            await collect()
        await acks.unsubscribe()
    if refused:
        raise PublishFailed(f"the stream refused a message: {first_refusal}")
    return Published(partition, sent, duplicates)


def _refusal(msg: Any, subject: str | None) -> str:
    if msg.status == 503:
        return f"no stream captures subject {subject!r} (no responders)"
    if msg.status is not None:
        return f"status {msg.status} {msg.description or ''}".strip()
    try:
        error = json.loads(msg.data).get("error", {})
        return f"{error.get('description', 'refused')} (err_code {error.get('err_code')})"
    except (ValueError, AttributeError):
        return repr(msg.data[:200])


class _Publishing:
    spec: SinkSpec
    layout: SinkLayout

    def _publish(self, prefix: str, batches: Iterator[pa.RecordBatch]) -> Published:
        partition = _task().partitionId()
        return trio.run(
            publish_rows, self.spec, prefix, partition, _rows(batches, self.layout, self.spec)
        )


class JetStreamBatchWriter(_Publishing, DataSourceArrowWriter):
    """``df.write.format("jetstream")``: the ids' prefix is made once, when the write is
    planned (``msgIdPrefix`` to choose it, so that running the whole job again stores
    nothing twice within the duplicate window)."""

    def __init__(self, spec: SinkSpec, layout: SinkLayout) -> None:
        self.spec = spec
        self.layout = layout
        self.prefix = spec.msg_id_prefix or uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return self._publish(self.prefix, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_done("write", None, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Published messages cannot be taken back; a rerun's repeats are dropped."""
        log.warning("jetstream write aborted after %d tasks published", _count(messages)[0])


class JetStreamStreamWriter(_Publishing, DataSourceStreamArrowWriter):
    """``df.writeStream.format("jetstream")``: the ids' prefix is the query's id (or
    ``msgIdPrefix``) and the micro-batch id, both the same when a batch runs again."""

    def __init__(self, spec: SinkSpec, layout: SinkLayout) -> None:
        self.spec = spec
        self.layout = layout

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        context = _task()
        query = self.spec.msg_id_prefix or context.getLocalProperty(QUERY_ID)
        batch = context.getLocalProperty(BATCH_ID)
        if not query or batch is None:
            raise JetStreamFormatError(
                "a streaming write without Spark's query and batch ids (a continuous trigger?): "
                "the jetstream sink needs micro-batches"
            )
        return self._publish(f"{query}:{batch}", iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_done("batch", batchId, messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("jetstream micro-batch %d aborted; it runs again with the same ids", batchId)


def _count(messages: list[WriterCommitMessage | None]) -> tuple[int, int]:
    done = [m for m in messages if isinstance(m, Published)]
    return sum(m.sent for m in done), sum(m.duplicates for m in done)


def _log_done(what: str, batch: int | None, messages: list[WriterCommitMessage | None]) -> None:
    sent, duplicates = _count(messages)
    log.info(
        "jetstream %s%s: %d messages published, %d already stored (repeats dropped)",
        what,
        "" if batch is None else f" {batch}",
        sent,
        duplicates,
    )
