"""Batched Direct Get (ADR-31, nats-server 2.11+): many stored messages for one request.

Two forms share one reply shape. A *batch* asks for up to ``batch`` messages from a sequence
or a time on, optionally of one subject (which may hold wildcards). A *multi-last* asks for the
last message of each subject matching a list (``multi_last``), optionally as the stream stood
at a sequence or a time (``up_to_seq`` / ``up_to_time``): a consistent read of many keys.

The server streams the messages to the reply subject without flow control, then ends with a
message with no body and the status ``204 EOB``. Its ``Nats-Num-Pending`` says how many matching
messages were not sent (a limit stopped the batch: ask again), ``Nats-Last-Sequence`` is the last
sent. Each message carries the same two headers, ``Nats-Last-Sequence`` naming the message
before it, so a message lost on the way (a slow subscription dropping) shows as a break in that
chain and is never silently missing. A multi-last EOB adds ``Nats-UpTo-Sequence``, the stream
sequence the read was taken at: the next page passes it back as ``up_to_seq`` (and the last
sequence plus one as ``seq``) so that every page sees the same moment.

Refusals arrive as statuses, not JSON: 404 nothing matched (an empty batch here, not an error),
408 a request the server cannot read, 413 a multi-last matching more than 1024 subjects (the
server counts the subjects, whatever ``batch`` says). A server before 2.11 answers the first
message alone, without ``Nats-Num-Pending``. This module is sans-IO: the request bodies, checked
before anything is sent, and :class:`DirectBatchReader`, which turns the replies into a
:class:`DirectBatch` or a typed error. The API client (``api.py``) sends the request, and
``direct_mux.py`` hands each reply to its request's reader.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from headrace.errors import NoRespondersError
from headrace.jetstream.codec import DecodeError
from headrace.jetstream.errors import JetStreamAPIError, JetStreamError, JetStreamUnavailable
from headrace.jetstream.stored_message import StoredMessage, from_direct_reply
from headrace.protocol.commands import check_subject
from headrace.protocol.events import Msg
from headrace.protocol.headers import read_header_block

#: The most subjects one multi-last request may match (nats-server's limit; 413 beyond).
MAX_MULTI_SUBJECTS = 1024

NUM_PENDING = "Nats-Num-Pending"
LAST_SEQUENCE = "Nats-Last-Sequence"
UP_TO_SEQUENCE = "Nats-UpTo-Sequence"


# -- errors ---------------------------------------------------------------------------------------


class DirectGetRefused(JetStreamAPIError):
    """The server refused a batched Direct Get with a status (``code``: 408 a request it could
    not read, 412 an API level it lacks, 5xx its own failure); nothing was returned."""

    def __init__(self, code: int, description: str, stream: str) -> None:
        super().__init__(
            code, 0, f"Direct Get on stream {stream!r} refused: {description or 'no reason'}"
        )
        self.stream = stream


class TooManySubjects(DirectGetRefused):
    """A multi-last request matched more than :data:`MAX_MULTI_SUBJECTS` subjects (the
    server's 413, whatever ``batch`` says): ask for fewer subjects or narrower patterns."""


class DirectGetNotAllowed(JetStreamUnavailable):
    """No Direct Get responder for a stream that exists: its ``allow_direct`` is off. Use the
    leader's message get (``get_msg``), or turn ``allow_direct`` on."""

    def __init__(self, stream: str) -> None:
        super().__init__(
            f"stream {stream!r} does not allow Direct Get (allow_direct is off): read it with "
            "get_msg(), or update the stream with allow_direct=True"
        )
        self.stream = stream


class BatchGetUnsupported(JetStreamError):
    """The server answered a batched Direct Get with one message and no ``Nats-Num-Pending``:
    it predates batches (nats-server 2.11). Nothing is returned rather than a partial batch."""


class DirectBatchBroken(JetStreamError):
    """A batch arrived with a gap (a message's ``Nats-Last-Sequence`` is not the sequence of
    the one before it): a message was lost on the way, usually dropped by a subscription over
    its pending limits. Nothing is returned rather than a batch with a hole; ask again, with a
    smaller ``batch`` or ``max_bytes``."""


# -- requests -------------------------------------------------------------------------------------


def _positive_or_none(_inst: object, attr: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{attr.name} must be a whole number of at least 1, not {value!r}")


def _aware(_inst: object, attr: attrs.Attribute[Any], value: dt.datetime | None) -> None:
    if value is not None and value.tzinfo is None:
        raise ValueError(f"{attr.name} must be an aware datetime (a time zone), not {value!r}")


def _rfc3339(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


@attrs.frozen(slots=True, kw_only=True)
class BatchGet:
    """A batch request: up to ``batch`` messages from ``seq`` (or ``start_time``) on, of
    ``subject`` (wildcards allowed; ``None``: any subject), at most about ``max_bytes`` of
    them (``None``: the server's limit, 64 MB by default). Without ``seq`` and ``start_time``
    the batch starts at the stream's first message."""

    batch: int = attrs.field(validator=_positive_or_none)
    subject: str | None = None
    seq: int | None = attrs.field(default=None, validator=_positive_or_none)
    start_time: dt.datetime | None = attrs.field(default=None, validator=_aware)
    max_bytes: int | None = attrs.field(default=None, validator=_positive_or_none)

    def __attrs_post_init__(self) -> None:
        if self.seq is not None and self.start_time is not None:
            raise ValueError("give seq or start_time, not both")
        if self.subject is not None:
            check_subject(self.subject, wildcards=True)

    def body(self) -> dict[str, Any]:
        """The request's JSON body (``seq`` 1 when no start is given, as ADR-31 defaults)."""
        body: dict[str, Any] = {"batch": self.batch}
        if self.start_time is not None:
            body["start_time"] = _rfc3339(self.start_time)
        else:
            body["seq"] = self.seq or 1
        if self.subject is not None:
            body["next_by_subj"] = self.subject
        if self.max_bytes is not None:
            body["max_bytes"] = self.max_bytes
        return body


def _subject_list(value: Sequence[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ValueError(f"subjects is a list of subjects, not one string: [{value!r}]?")
    return tuple(value)


@attrs.frozen(slots=True, kw_only=True)
class MultiLastGet:
    """A multi-last request: the last message of each subject matching ``subjects`` (wildcards
    allowed; at most :data:`MAX_MULTI_SUBJECTS` may match), as the stream stood at sequence
    ``up_to_seq`` or time ``up_to_time`` (``None``: now). ``batch`` and ``max_bytes`` cap one
    answer; ``seq`` skips the messages below it (the next page of an answer a cap cut)."""

    subjects: tuple[str, ...] = attrs.field(converter=_subject_list)
    up_to_seq: int | None = attrs.field(default=None, validator=_positive_or_none)
    up_to_time: dt.datetime | None = attrs.field(default=None, validator=_aware)
    batch: int | None = attrs.field(default=None, validator=_positive_or_none)
    max_bytes: int | None = attrs.field(default=None, validator=_positive_or_none)
    seq: int | None = attrs.field(default=None, validator=_positive_or_none)

    def __attrs_post_init__(self) -> None:
        if not self.subjects:
            raise ValueError("give at least one subject")
        for subject in self.subjects:
            check_subject(subject, wildcards=True)
        if self.up_to_seq is not None and self.up_to_time is not None:
            raise ValueError("give up_to_seq or up_to_time, not both")

    def body(self) -> dict[str, Any]:
        """The request's JSON body."""
        body: dict[str, Any] = {"multi_last": list(self.subjects)}
        if self.up_to_seq is not None:
            body["up_to_seq"] = self.up_to_seq
        if self.up_to_time is not None:
            body["up_to_time"] = _rfc3339(self.up_to_time)
        for name in ("batch", "max_bytes", "seq"):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        return body

    def next_page(self, page: DirectBatch) -> MultiLastGet:
        """The request for what ``page`` left pending: the same moment (its up-to sequence),
        from the sequence after its last message."""
        return attrs.evolve(
            self,
            up_to_seq=page.up_to_seq or self.up_to_seq,
            up_to_time=None if page.up_to_seq else self.up_to_time,
            seq=page.last_seq + 1,
        )


# -- replies --------------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class DirectBatch:
    """The answer to one batched Direct Get: ``messages`` in stream order; ``num_pending``,
    how many more matched but were not sent (a limit cut the answer: ask again from
    ``last_seq + 1``); ``last_seq``, the last message's sequence (0: none);
    ``up_to_seq``, for a multi-last, the stream sequence the read was taken at."""

    messages: tuple[StoredMessage, ...]
    num_pending: int = 0
    last_seq: int = 0
    up_to_seq: int | None = None

    @property
    def complete(self) -> bool:
        """True when nothing matching was left out."""
        return self.num_pending == 0


def _int_header(value: str | None, name: str) -> int:
    try:
        return int(value or "")
    except ValueError:
        raise DecodeError(f"a Direct Get batch had a malformed {name} header: {value!r}") from None


#: The server's six-line tail of one batched Direct Get reply's header block, split in C:
#: ``split_direct_tail(raw_headers)`` gives ``(at, subject, seq, previous, stamp)`` (where the
#: tail starts, ``Nats-Subject``, ``Nats-Sequence``, ``Nats-Last-Sequence``, and the time stamp
#: in Unix microseconds, or None for a form it does not read) for a block of exactly that
#: shape, else None (read it as :class:`DirectBatchReader` does). A reader that turns replies
#: straight into columns (the Spark source's tasks) saves most of its CPU with it. None itself
#: when headrace was built without a C compiler, or with ``HEADRACE_PURE_PYTHON=1`` set.
split_direct_tail: Callable[[bytes], tuple[int, bytes, int, int, int | None] | None] | None
try:
    from headrace.jetstream._direct_tail import split_tail as split_direct_tail
except ImportError:  # built without a C compiler
    split_direct_tail = None
if os.environ.get("HEADRACE_PURE_PYTHON"):
    split_direct_tail = None


class DirectBatchReader:
    """Reads the replies of one batched Direct Get: :meth:`feed` each message in order; it
    returns the :class:`DirectBatch` once the answer is complete, ``None`` before, and raises
    the typed error of a refusal, an old server or a gap."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self._messages: list[StoredMessage] = []
        self._previous = 0

    @property
    def received(self) -> int:
        """How many messages of the batch have come so far."""
        return len(self._messages)

    def feed(self, msg: Msg) -> DirectBatch | None:
        """Take the next reply: the finished batch at its end (or a 404: empty), else None."""
        if msg.raw_headers is None:
            raise DecodeError("a Direct Get batch answer had no headers")
        headers, status, description, _ = read_header_block(msg.raw_headers)
        if status is None:
            pending = headers.get(NUM_PENDING)
            if pending is None:
                raise BatchGetUnsupported(
                    f"stream {self.stream!r}: the server answered a batched Direct Get with a "
                    "single message; batches need nats-server 2.11 or later"
                )
            self._check_chain(headers.get_all(LAST_SEQUENCE))
            stored = from_direct_reply(msg.raw_headers, msg.data, self.stream, headers)
            self._messages.append(stored)
            self._previous = stored.seq
            return None
        if status == 204:
            self._check_chain(headers.get_all(LAST_SEQUENCE))
            up_to = headers.get(UP_TO_SEQUENCE)
            return DirectBatch(
                tuple(self._messages),
                num_pending=_int_header(headers.get(NUM_PENDING), NUM_PENDING),
                last_seq=self._previous,
                up_to_seq=_int_header(up_to, UP_TO_SEQUENCE) if up_to is not None else None,
            )
        if status == 404 and not self._messages:
            return DirectBatch(())
        if status == 503 and not msg.data:
            raise NoRespondersError(msg.subject)
        if status == 413:
            raise TooManySubjects(status, description or "too many subjects", self.stream)
        raise DirectGetRefused(status, description, self.stream)

    def _check_chain(self, values: Sequence[str]) -> None:
        # The server's value is the last of the name (a stored message may carry its own).
        said = _int_header(values[-1] if values else None, LAST_SEQUENCE)
        if said != self._previous:
            raise DirectBatchBroken(
                f"stream {self.stream!r}: a Direct Get batch lost messages between sequence "
                f"{self._previous} and {said} on the way; ask again with a smaller batch"
            )
