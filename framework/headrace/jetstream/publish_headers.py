"""What a JetStream publish sends and what it gets back, shared by every way of publishing.

:meth:`JetStreamAPI.publish <headrace.jetstream.JetStreamAPI.publish>` and the asynchronous
publisher (:mod:`headrace.jetstream.async_publish`) send the same headers for the same options
and read the stream's answer the same way: built here once, so that an option (a schedule, a
condition on other subjects' last sequence) means the same on both paths.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from headrace.jetstream.codec import DecodeError, from_json
from headrace.jetstream.errors import InvalidMessageSchedule, InvalidScheduleRollup, api_error
from headrace.jetstream.msg_ttl import NATS_TTL, MessageTTL, ttl_header
from headrace.jetstream.responses import PubAck
from headrace.jetstream.schedules import SCHEDULE_HEADER_PREFIX, MessageSchedule
from headrace.protocol.commands import check_subject
from headrace.protocol.headers import Headers


def publish_headers(
    headers: Headers | Mapping[str, str | list[str]] | None,
    *,
    msg_id: str | None = None,
    expected_stream: str | None = None,
    expected_last_seq: int | None = None,
    expected_last_subject_seq: int | None = None,
    expected_last_subject_seq_subject: str | None = None,
    expected_last_msg_id: str | None = None,
    ttl: MessageTTL | None = None,
    schedule: MessageSchedule | None = None,
    subject: str | None = None,
) -> Headers | None:
    """The headers of a JetStream publish to ``subject``: the caller's (a copy, so that a
    retry sends what was published whatever the caller changes afterwards) and the ``Nats-*``
    ones of its options (see :meth:`JetStreamAPI.publish`); ``None`` when there are none."""
    if headers is None:
        hdrs = Headers()
    else:
        hdrs = headers.copy() if isinstance(headers, Headers) else Headers(headers)
    if expected_last_subject_seq_subject is not None:
        if expected_last_subject_seq is None:
            raise ValueError(
                "expected_last_subject_seq_subject goes with expected_last_subject_seq"
            )
        check_subject(
            expected_last_subject_seq_subject,
            wildcards=True,
            what="expected_last_subject_seq_subject",
        )
    if schedule is not None:
        _add_schedule(hdrs, schedule, subject)
    for name, value in (
        ("Nats-Msg-Id", msg_id),
        ("Nats-Expected-Stream", expected_stream),
        ("Nats-Expected-Last-Sequence", expected_last_seq),
        ("Nats-Expected-Last-Subject-Sequence", expected_last_subject_seq),
        ("Nats-Expected-Last-Subject-Sequence-Subject", expected_last_subject_seq_subject),
        ("Nats-Expected-Last-Msg-Id", expected_last_msg_id),
        (NATS_TTL, None if ttl is None else ttl_header(ttl)),
    ):
        if value is not None:
            hdrs.set(name, str(value))
    return hdrs if len(hdrs) else None


def parse_pub_ack(data: bytes) -> PubAck:
    """A stream's answer to a publish: the :class:`PubAck`, or the typed error it carries
    (:func:`~headrace.jetstream.errors.api_error`); :class:`DecodeError` when it is neither."""
    try:
        answer = json.loads(data)
    except ValueError as exc:
        raise DecodeError(f"a stream answered a publish with {data[:80]!r}") from exc
    if not isinstance(answer, dict):
        raise DecodeError(f"a stream answered a publish with {answer!r:.80}")
    if "error" in answer:
        raise api_error(answer["error"])
    return from_json(PubAck, answer)


def _add_schedule(hdrs: Headers, schedule: MessageSchedule, subject: str | None) -> None:
    """The schedule's headers on a publish, refusing the caller's that would clash (the
    server would refuse them, or mix two schedules)."""
    for name in hdrs:
        if name.lower().startswith(SCHEDULE_HEADER_PREFIX.lower()):
            raise InvalidMessageSchedule(
                400, 10189, f"header {name!r} beside schedule=: give the schedule one way"
            )
    for rollup in hdrs.get_all("Nats-Rollup"):
        if rollup != "sub":
            raise InvalidScheduleRollup(
                400, 10192, f"a schedule message's Nats-Rollup must be 'sub', not {rollup!r}"
            )
    for name, value in schedule.headers(subject).items():
        hdrs.set(name, value)
