"""Atomic batch publish (ADR-50, nats-server 2.12+): messages a stream stores all or none of.

A batch is a run of ordinary publishes that carry its id (``Nats-Batch-Id``) and their place in
it (``Nats-Batch-Sequence``, 1, 2, ...). The server stages them and writes nothing to the stream
until the commit (``Nats-Batch-Commit``): ``1`` on the last message stores it and the batch,
``eob`` (end of batch, nats-server 2.14+) stores the batch without the message that says so.
One PubAck answers the whole batch, with its id and count. The stream must have
``allow_atomic``.

The first message goes out as a request: the server answers it with an empty message, or
with the refusal (no ``allow_atomic``, too many open batches, a bad id), so nothing more is sent
in vain. The others need no answer; ``ack_every`` asks for one every that many messages, which
keeps the client within that distance of the server and brings a refusal back early. A refusal
the server does not answer (no reply subject) abandons the batch and reaches the client at the
latest in the answer to the commit, which always has one. Nothing is lost either way: an
abandoned batch has stored nothing, and every refusal is raised as its
:class:`~headrace.jetstream.errors.AtomicPublishError` subclass.

There is no message to abandon a batch: a batch that is never committed is dropped by the
server once it has had no message for its batch timeout (10 s by default), which it announces
with a :class:`BatchAbandonedAdvisory`.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs
import trio

from headrace.errors import NoRespondersError
from headrace.jetstream.codec import TIME, DecodeError, from_json, jfield
from headrace.jetstream.errors import (
    AtomicBatchUsageError,
    AtomicPublishUnsupported,
    AtomicUnsupportedHeader,
    InvalidBatchId,
    JetStreamAPIError,
    NoStreamForSubject,
)
from headrace.jetstream.msg_ttl import MessageTTL
from headrace.jetstream.publish_headers import parse_pub_ack, publish_headers
from headrace.jetstream.responses import PubAck
from headrace.nats.connection import Connection
from headrace.protocol.commands import check_subject
from headrace.protocol.headers import Headers

#: The header naming the batch a message belongs to.
NATS_BATCH_ID: Final = "Nats-Batch-Id"
#: The header giving a message's place in its batch, from 1 with no gap.
NATS_BATCH_SEQUENCE: Final = "Nats-Batch-Sequence"
#: The header that commits the batch, on its last message.
NATS_BATCH_COMMIT: Final = "Nats-Batch-Commit"
#: ``Nats-Batch-Commit`` value: store this message, then the batch.
COMMIT: Final = "1"
#: ``Nats-Batch-Commit`` value: store the batch without this message (nats-server 2.14+).
COMMIT_EOB: Final = "eob"
#: The longest batch id the server accepts.
MAX_BATCH_ID_LENGTH: Final = 64
#: Where the server announces an abandoned batch (``.<stream>`` follows).
BATCH_ABANDONED_ADVISORY: Final = "$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED"

#: Headers a batch may not carry: the server refuses the batch at its commit (10177).
UNSUPPORTED_HEADERS: Final = ("Nats-Expected-Last-Msg-Id",)
_OWN_PREFIX = "nats-batch-"
# As a single publish does: a stream just created, or electing a leader, answers a moment later.
_FIRST_MESSAGE_RETRIES = 2
_RETRY_WAIT = 0.25


def check_batch_id(batch_id: str) -> str:
    """``batch_id`` if the server accepts it: 1 to 64 characters, usable as a header value;
    :class:`InvalidBatchId` (the server's 10179) otherwise."""
    if not isinstance(batch_id, str) or not 0 < len(batch_id) <= MAX_BATCH_ID_LENGTH:
        raise InvalidBatchId(
            400,
            10179,
            f"invalid batch id {batch_id!r}: give 1 to {MAX_BATCH_ID_LENGTH} characters",
        )
    if batch_id != batch_id.strip() or any(c in batch_id for c in "\r\n\0"):
        raise InvalidBatchId(
            400, 10179, f"invalid batch id {batch_id!r}: it must be usable as a header value"
        )
    return batch_id


@attrs.define(kw_only=True)
class BatchAbandonedAdvisory:
    """The server dropped a batch without storing any of it
    (``io.nats.jetstream.advisory.v1.stream_batch_abandoned``, on
    ``$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED.<stream>``). ``reason`` is ``timeout`` (no
    message for the batch timeout), ``large`` (more messages than allowed), ``incomplete`` (a
    gap) or ``unsupported`` (a ``Nats-Required-Api-Level`` the server does not meet). A
    client hears of the last three in the answer to its commit; of a timeout only here."""

    stream: str = jfield(default="")
    batch: str = jfield(default="")
    reason: str = jfield(default="")
    timestamp: dt.datetime | None = jfield(kind=TIME)
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False)

    @classmethod
    def from_data(cls, data: bytes) -> BatchAbandonedAdvisory:
        """The advisory in a message's payload; :class:`DecodeError` if it is not one."""
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise DecodeError(f"not a batch advisory: {data[:80]!r}") from exc
        if not isinstance(raw, dict):
            raise DecodeError(f"not a batch advisory: {data[:80]!r}")
        return from_json(cls, raw)


@attrs.frozen(kw_only=True)
class _Prepared:
    """One message of a batch, checked and with its headers built, before anything is sent."""

    subject: str
    data: bytes
    headers: Headers


def _prepare(
    subject: str,
    data: bytes,
    headers: Headers | Mapping[str, str | list[str]] | None,
    *,
    msg_id: str | None = None,
    expected_stream: str | None = None,
    expected_last_seq: int | None = None,
    expected_last_subject_seq: int | None = None,
    ttl: MessageTTL | None = None,
) -> _Prepared:
    check_subject(subject)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"a batch message's data must be bytes, not {type(data).__name__}")
    hdrs = (
        publish_headers(
            headers,
            msg_id=msg_id,
            expected_stream=expected_stream,
            expected_last_seq=expected_last_seq,
            expected_last_subject_seq=expected_last_subject_seq,
            ttl=ttl,
        )
        or Headers()
    )
    for name in hdrs:
        if name.lower().startswith(_OWN_PREFIX):
            raise AtomicBatchUsageError(
                f"header {name!r} is the batch's own: AtomicBatch sets it on every message"
            )
        if name in UNSUPPORTED_HEADERS:
            raise AtomicUnsupportedHeader(
                400, 10177, f"atomic publish unsupported header used: {name} (refused by ADR-50)"
            )
    return _Prepared(subject=subject, data=bytes(data), headers=hdrs)


class AtomicBatch:
    """An atomic batch being published (ADR-50): :meth:`add` sends messages, :meth:`commit` (or
    :meth:`commit_eob`) has the stream store them all at once and returns its one PubAck.

    Made by :meth:`JetStream.atomic_batch <headrace.jetstream.JetStreamAPI.atomic_batch>`, or
    on a connection ``nc``. All messages must go to subjects of one stream, which has
    ``allow_atomic``. Messages are sent as they are added, so the server holds them, not the
    client. ``batch_id`` defaults to a fresh unique id; ``ack_every`` (see the module) asks
    for an answer every that many messages; ``timeout`` bounds each answer awaited.

    A batch is used once: after its commit, after any refusal and after any failure whose
    outcome is unknown (a timeout, a cancellation), every call raises
    :class:`AtomicBatchUsageError`. A refused batch stored nothing; start a new one.
    """

    def __init__(
        self,
        nc: Connection,
        *,
        batch_id: str | None = None,
        ack_every: int | None = None,
        timeout: float = 5.0,
    ) -> None:
        if ack_every is not None and (isinstance(ack_every, bool) or ack_every < 1):
            raise AtomicBatchUsageError(f"ack_every must be at least 1, not {ack_every!r}")
        self.batch_id = uuid.uuid4().hex if batch_id is None else check_batch_id(batch_id)
        self.ack_every = ack_every
        self._nc = nc
        self._timeout = timeout
        self._size = 0
        self._last_subject: str | None = None
        self._ended: str | None = None
        self._sending = False

    def __repr__(self) -> str:
        state = self._ended or "open"
        return f"<AtomicBatch {self.batch_id!r} size={self._size} {state}>"

    @property
    def size(self) -> int:
        """How many messages have been sent in this batch."""
        return self._size

    @property
    def done(self) -> bool:
        """True once the batch was committed, refused or failed: it takes no more calls."""
        return self._ended is not None

    async def add(
        self,
        subject: str,
        data: bytes = b"",
        *,
        headers: Headers | Mapping[str, str | list[str]] | None = None,
        msg_id: str | None = None,
        expected_stream: str | None = None,
        expected_last_seq: int | None = None,
        expected_last_subject_seq: int | None = None,
        ttl: MessageTTL | None = None,
    ) -> None:
        """Send the next message of the batch; the stream stores nothing before the commit.

        The ``expected_*`` checks are made at the commit, against the stream as it was before
        the batch (a subject's sequence only if no earlier message of the batch wrote that
        subject); ``msg_id`` must not repeat within the batch nor the duplicate window
        (:class:`AtomicBatchDuplicateMessage`). ``Nats-Expected-Last-Msg-Id`` is refused
        (:class:`AtomicUnsupportedHeader`)."""
        self._check_open()
        prepared = _prepare(
            subject,
            data,
            headers,
            msg_id=msg_id,
            expected_stream=expected_stream,
            expected_last_seq=expected_last_seq,
            expected_last_subject_seq=expected_last_subject_seq,
            ttl=ttl,
        )
        await self._send(prepared, None)

    async def commit(
        self,
        subject: str,
        data: bytes = b"",
        *,
        headers: Headers | Mapping[str, str | list[str]] | None = None,
        msg_id: str | None = None,
        expected_stream: str | None = None,
        expected_last_seq: int | None = None,
        expected_last_subject_seq: int | None = None,
        ttl: MessageTTL | None = None,
    ) -> PubAck:
        """Send the last message with ``Nats-Batch-Commit: 1``: the stream stores the batch,
        this message included, or none of it. Returns the batch's PubAck (``batch``,
        ``count``; ``seq`` is the last message's), or raises the refusal.

        A timeout here leaves the outcome unknown: look at the stream (the last message's
        ``Nats-Batch-Id`` header says which batch it closed)."""
        self._check_open()
        prepared = _prepare(
            subject,
            data,
            headers,
            msg_id=msg_id,
            expected_stream=expected_stream,
            expected_last_seq=expected_last_seq,
            expected_last_subject_seq=expected_last_subject_seq,
            ttl=ttl,
        )
        return await self._commit(prepared, COMMIT)

    async def commit_eob(self) -> PubAck:
        """Commit without a message of its own (``Nats-Batch-Commit: eob``, nats-server 2.14+;
        older servers refuse it with :class:`InvalidBatchCommit`). The marker goes, empty, to
        the subject of the batch's last message and is not stored; the server gives the last
        stored message the ``Nats-Batch-Commit: 1`` header instead."""
        self._check_open()
        if self._last_subject is None:
            raise AtomicBatchUsageError("an empty batch cannot be committed: add messages first")
        marker = _Prepared(subject=self._last_subject, data=b"", headers=Headers())
        return await self._commit(marker, COMMIT_EOB)

    # -- sending ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._sending:
            raise AtomicBatchUsageError(
                f"batch {self.batch_id!r} is sending a message: its messages go one after "
                "another, each add awaited before the next"
            )
        if self._ended is not None:
            raise AtomicBatchUsageError(
                f"batch {self.batch_id!r} is {self._ended}: it takes no more messages; "
                "publish a new batch"
            )

    async def _commit(self, prepared: _Prepared, commit: str) -> PubAck:
        ack = await self._send(prepared, commit)
        if ack is None:
            raise DecodeError(f"the stream answered the commit of batch {self.batch_id!r} empty")
        if ack.batch is None:
            raise AtomicPublishUnsupported(
                f"the server stored the commit of batch {self.batch_id!r} as a single message: "
                "it does not support atomic batches (nats-server 2.12+)",
                ack,
            )
        return ack

    async def _send(self, prepared: _Prepared, commit: str | None) -> PubAck | None:
        seq = self._size + 1
        hdrs = prepared.headers.copy()
        hdrs.set(NATS_BATCH_ID, self.batch_id)
        hdrs.set(NATS_BATCH_SEQUENCE, str(seq))
        if commit is not None:
            hdrs.set(NATS_BATCH_COMMIT, commit)
        answered = commit is not None or seq == 1
        answered = answered or (self.ack_every is not None and seq % self.ack_every == 0)
        # Until the server's answer (or the publish) is through, the batch's state on the
        # server is unknown: an exception leaves the batch ended.
        self._ended = "failed (a message's outcome is unknown)"
        self._sending = True
        try:
            if answered:
                data = await self._request(prepared.subject, prepared.data, hdrs, seq)
            else:
                await self._nc.publish(prepared.subject, prepared.data, headers=hdrs)
                data = b""
            ack = parse_pub_ack(data) if data else None
        except (JetStreamAPIError, NoStreamForSubject):
            self._ended = "refused"
            raise
        finally:
            self._sending = False
        self._size = seq
        self._last_subject = prepared.subject
        if commit is not None:
            self._ended = "committed"
            return ack
        if ack is not None:
            self._ended = "stored as single messages"
            raise AtomicPublishUnsupported(
                f"the server stored message {seq} of batch {self.batch_id!r} on its own: it "
                "does not support atomic batches (nats-server 2.12+)",
                ack,
            )
        self._ended = None
        return None

    async def _request(self, subject: str, data: bytes, hdrs: Headers, seq: int) -> bytes:
        # Only the first message is retried: nothing of the batch can have reached a stream
        # then. Later ones, unanswered, would leave a gap.
        retries = _FIRST_MESSAGE_RETRIES if seq == 1 else 0
        while True:
            try:
                msg = await self._nc.request(subject, data, headers=hdrs, timeout=self._timeout)
            except NoRespondersError as exc:
                if retries == 0:
                    raise NoStreamForSubject(subject) from exc
                retries -= 1
                await trio.sleep(_RETRY_WAIT)
                continue
            return msg.data


async def publish_batch(
    nc: Connection,
    messages: Iterable[tuple[str, bytes, Headers | Mapping[str, str | list[str]] | None]],
    *,
    batch_id: str | None = None,
    ack_every: int | None = None,
    timeout: float = 5.0,
) -> PubAck:
    """Publish ``(subject, data, headers)`` messages as one atomic batch, the last one
    committing it; returns the batch's PubAck or raises the refusal. Every message is checked
    before the first is sent."""
    prepared = [_prepare(subject, data, headers) for subject, data, headers in messages]
    if not prepared:
        raise AtomicBatchUsageError("an empty batch cannot be committed: give messages")
    batch = AtomicBatch(nc, batch_id=batch_id, ack_every=ack_every, timeout=timeout)
    for message in prepared[:-1]:
        batch._check_open()
        await batch._send(message, None)
    batch._check_open()
    return await batch._commit(prepared[-1], COMMIT)
