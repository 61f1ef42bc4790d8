"""The JetStream API client: the requests of ADR-37's JetStreamContext over one connection.

Every call is a request on ``<prefix>.<API subject>`` with a JSON body, answered with JSON or
an ``error`` object (raised as the typed :mod:`headrace.jetstream.errors`). The prefix is
``$JS.API``, ``$JS.<domain>.API`` for a domain, or whatever an account import needs.

This is the lower half of :class:`~headrace.jetstream.JetStream`: the account, stream and
consumer requests, publish and the stored-message reads. The subscriptions made on top of it
(pull consumers, ADR-15 subscribe, ordered consumers) are in :mod:`headrace.jetstream.context`.
The modules that run a subscription (its lifecycle, its push actors, the consume buffer) need
only these requests, so they name this class and never the context: they stay below it.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from headrace.errors import NoRespondersError, RequestTimeout
from headrace.jetstream.atomic_batch import AtomicBatch, publish_batch
from headrace.jetstream.codec import DecodeError, format_time, from_json, parse_time, to_json
from headrace.jetstream.consumer_config import ConsumerConfig, ConsumerInfo, DeliverPolicy
from headrace.jetstream.direct_batch import (
    BatchGet,
    DirectBatch,
    DirectBatchReader,
    DirectGetNotAllowed,
    MultiLastGet,
)
from headrace.jetstream.direct_mux import DirectBatchMux
from headrace.jetstream.errors import (
    InvalidConsumerReset,
    JetStreamUnavailable,
    MessageNotFound,
    NoStreamForSubject,
    StreamLookupError,
    StreamNotFound,
    api_error,
)
from headrace.jetstream.msg_ttl import MessageTTL
from headrace.jetstream.names import agreed_name, check_consumer, check_stream
from headrace.jetstream.pause import ConsumerPause, PauseUntil, pause_api, pause_deadline
from headrace.jetstream.priority import check_group_name, unpin_api
from headrace.jetstream.publish_headers import parse_pub_ack, publish_headers
from headrace.jetstream.reset import ConsumerReset, reset_api, reset_body
from headrace.jetstream.responses import AccountInfo, PubAck
from headrace.jetstream.schedules import MessageSchedule
from headrace.jetstream.stored_message import StoredMessage, from_direct_reply
from headrace.jetstream.stream_config import StreamConfig, StreamInfo
from headrace.jetstream.trace import ClientTrace
from headrace.nats.connection import Connection
from headrace.nats.inbox import PendingRequest, unique_token
from headrace.protocol.commands import check_subject
from headrace.protocol.events import Msg
from headrace.protocol.headers import Headers, read_header_block

DEFAULT_API_PREFIX = "$JS.API"


#: One encoder for request bodies (``json.dumps`` with separators makes a new one per call).
_COMPACT = json.JSONEncoder(separators=(",", ":"))


class JetStreamAPI:
    """The JetStream API of one connection: account, streams, consumers, publish, stored
    messages. :class:`~headrace.jetstream.JetStream` is this plus the subscriptions; a
    function that only manages streams or consumers or publishes can ask for this.

    ``domain`` selects a JetStream domain (``$JS.<domain>.API``); ``api_prefix`` replaces the
    prefix altogether (for imports across accounts); give at most one. ``timeout`` is the
    default time limit of each API call, in seconds.
    """

    def __init__(
        self,
        nc: Connection,
        *,
        domain: str | None = None,
        api_prefix: str | None = None,
        timeout: float = 5.0,
        trace: ClientTrace | None = None,
    ) -> None:
        if domain is not None and api_prefix is not None:
            raise ValueError("give a JetStream domain or an API prefix, not both")
        if domain is not None:
            check_subject(domain, what="JetStream domain")
            prefix = f"$JS.{domain}.API"
        else:
            # "" is refused as domain="" is (it was the default prefix, silently: issue 24).
            prefix = (DEFAULT_API_PREFIX if api_prefix is None else api_prefix).rstrip(".")
            check_subject(prefix, what="JetStream API prefix")
        self.nc = nc
        self.domain = domain
        self.prefix = prefix
        self.timeout = timeout
        #: Hooks called around every API request (:mod:`headrace.jetstream.trace`).
        self.trace = trace
        self._batch_mux: DirectBatchMux | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} prefix={self.prefix!r}>"

    def api_subject(self, suffix: str) -> str:
        return f"{self.prefix}.{suffix}"

    async def api_request(
        self,
        suffix: str,
        body: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        wildcards: bool = False,
    ) -> dict[str, Any]:
        """One API call: the decoded answer, or the typed error it carried. ``wildcards``: the
        subject carries a filter that may have ``*`` or ``>`` tokens."""
        data = json.dumps(body, separators=(",", ":")).encode() if body is not None else b""
        subject = self.api_subject(suffix)
        trace = self.trace
        if trace is not None and trace.request_sent is not None:
            trace.request_sent(subject, data)
        try:
            msg = await self.nc.request(
                subject,
                data,
                timeout=self.timeout if timeout is None else timeout,
                wildcards=wildcards,
            )
        except NoRespondersError as exc:
            raise JetStreamUnavailable(
                f"nothing answered on {self.api_subject(suffix)!r}: is JetStream enabled for "
                "this account and server, and are the domain and API prefix right?"
            ) from exc
        if trace is not None and trace.response_received is not None:
            trace.response_received(subject, msg)
        try:
            answer = json.loads(msg.data)
        except ValueError as exc:
            raise DecodeError(f"the JetStream API sent invalid JSON: {msg.data[:80]!r}") from exc
        if not isinstance(answer, dict):
            raise DecodeError(f"the JetStream API sent {type(answer).__name__}, not an object")
        if "error" in answer:
            raise api_error(answer["error"])
        return answer

    # -- account ------------------------------------------------------------------------------

    async def account_info(self) -> AccountInfo:
        return from_json(AccountInfo, await self.api_request("INFO"))

    # -- streams ------------------------------------------------------------------------------

    async def add_stream(self, config: StreamConfig) -> StreamInfo:
        answer = await self.api_request(f"STREAM.CREATE.{config.name}", to_json(config))
        return from_json(StreamInfo, answer)

    async def update_stream(self, config: StreamConfig) -> StreamInfo:
        answer = await self.api_request(f"STREAM.UPDATE.{config.name}", to_json(config))
        return from_json(StreamInfo, answer)

    async def create_or_update_stream(self, config: StreamConfig) -> StreamInfo:
        """Update the stream, or create it if there is none (nats.go's CreateOrUpdateStream):
        a deployment's one call whether or not it ran before. What an update may not change
        is refused as by :meth:`update_stream`."""
        try:
            return await self.update_stream(config)
        except StreamNotFound:
            return await self.add_stream(config)

    async def stream_info(
        self, name: str, *, subjects_filter: str | None = None, deleted_details: bool = False
    ) -> StreamInfo:
        """A stream's configuration and state. ``subjects_filter`` (a subject, wildcards
        allowed) fills ``state.subjects`` with the messages of each matching subject: every
        one of them, page after page (a response holds up to 100,000 subjects; past that the
        rest was dropped without a sign, issue 24). ``deleted_details`` fills
        ``state.deleted`` with the deleted sequences."""
        check_stream("name", name)
        body: dict[str, Any] = {}
        if subjects_filter:
            check_subject(subjects_filter, wildcards=True, what="subjects_filter")
            body["subjects_filter"] = subjects_filter
        if deleted_details:
            body["deleted_details"] = True
        suffix = f"STREAM.INFO.{name}"
        answer = await self.api_request(suffix, body or None)
        if subjects_filter:
            subjects: dict[str, int] = dict(answer.get("state", {}).get("subjects") or {})
            total = int(answer.get("total") or len(subjects))
            while len(subjects) < total:
                page = await self.api_request(suffix, {**body, "offset": len(subjects)})
                more = (page.get("state") or {}).get("subjects") or {}
                if not more:
                    break  # (the stream lost subjects meanwhile)
                subjects.update(more)
                total = int(page.get("total") or total)
            answer.setdefault("state", {})["subjects"] = subjects
        return from_json(StreamInfo, answer)

    async def delete_stream(self, name: str) -> None:
        check_stream("name", name)
        await self.api_request(f"STREAM.DELETE.{name}")

    async def purge_stream(
        self,
        name: str,
        *,
        subject: str | None = None,
        seq: int | None = None,
        keep: int | None = None,
    ) -> int:
        """Remove messages (all, or those of ``subject``, below ``seq``, or all but ``keep``);
        return how many were removed."""
        check_stream("name", name)
        if seq is not None and keep is not None:
            raise ValueError("give seq or keep, not both")
        body = {k: v for k, v in (("filter", subject), ("seq", seq), ("keep", keep)) if v}
        answer = await self.api_request(f"STREAM.PURGE.{name}", body or None)
        return int(answer.get("purged", 0))

    async def _paged(self, suffix: str, key: str, body: dict[str, Any]) -> AsyncIterator[Any]:
        offset = 0
        while True:
            answer = await self.api_request(suffix, {**body, "offset": offset})
            items = answer.get(key) or []
            for item in items:
                yield item
            offset += len(items)
            if not items or offset >= int(answer.get("total", 0)):
                return

    async def streams(self, *, subject: str | None = None) -> AsyncIterator[StreamInfo]:
        """Every stream (optionally only those capturing ``subject``), page by page."""
        body = {"subject": subject} if subject else {}
        async for item in self._paged("STREAM.LIST", "streams", body):
            yield from_json(StreamInfo, item)

    async def stream_names(self, *, subject: str | None = None) -> list[str]:
        """Names of every stream, or of those whose subjects overlap ``subject`` (ADR-15)."""
        body = {"subject": subject} if subject else {}
        return [str(n) async for n in self._paged("STREAM.NAMES", "streams", body)]

    async def find_stream(self, subject: str) -> str:
        """The one stream capturing ``subject`` (ADR-15 stream lookup). An invalid subject is
        :class:`~headrace.errors.InvalidSubjectError` before anything is sent (``FOO.>.123``
        was looked up and said to be captured by no stream, issue 24); wildcards are fine."""
        check_subject(subject, wildcards=True)
        names = await self.stream_names(subject=subject)
        if not names:
            raise StreamLookupError(
                f"no stream captures subject {subject!r}: create one, or name the stream"
            )
        if len(names) > 1:
            raise StreamLookupError(
                f"several streams capture subject {subject!r} ({', '.join(sorted(names))}): "
                "name the stream to use"
            )
        return names[0]

    # -- consumers ----------------------------------------------------------------------------

    async def _upsert_consumer(
        self, stream: str, config: ConsumerConfig, action: str
    ) -> ConsumerInfo:
        """Create or update through the subject nats.go sends and accounts scope permissions
        by (issue 24: ephemerals went to the legacy ``CONSUMER.CREATE.<stream>``, and no
        create named its filter): ``CONSUMER.CREATE.<stream>.<name>``, with ``.<filter>``
        appended for a consumer of one filter subject. An ephemeral gets a generated name
        (it stays ephemeral: no ``durable_name``)."""
        check_stream("stream", stream)
        name = agreed_name({"config.name": config.name, "config.durable_name": config.durable_name})
        if not name:
            name = unique_token()
            config = attrs.evolve(config, name=name)
        suffix = f"CONSUMER.CREATE.{stream}.{name}"
        if config.filter_subject and not config.filter_subjects:
            check_subject(config.filter_subject, wildcards=True, what="filter_subject")
            suffix += f".{config.filter_subject}"
        body: dict[str, Any] = {"stream_name": stream, "config": to_json(config)}
        if action:
            body["action"] = action
        return from_json(ConsumerInfo, await self.api_request(suffix, body, wildcards=True))

    async def create_consumer(self, stream: str, config: ConsumerConfig) -> ConsumerInfo:
        """Create; :class:`ConsumerAlreadyExists` if it exists with another configuration."""
        return await self._upsert_consumer(stream, config, "create")

    async def update_consumer(self, stream: str, config: ConsumerConfig) -> ConsumerInfo:
        """Update; :class:`ConsumerDoesNotExist` if there is no such consumer."""
        if not config.consumer_name:
            raise ValueError("updating a consumer needs its name (name or durable_name)")
        return await self._upsert_consumer(stream, config, "update")

    async def create_or_update_consumer(self, stream: str, config: ConsumerConfig) -> ConsumerInfo:
        return await self._upsert_consumer(stream, config, "")

    async def consumer_info(self, stream: str, name: str) -> ConsumerInfo:
        check_stream("stream", stream)
        check_consumer("name", name)
        return from_json(ConsumerInfo, await self.api_request(f"CONSUMER.INFO.{stream}.{name}"))

    async def delete_consumer(self, stream: str, name: str) -> None:
        check_stream("stream", stream)
        check_consumer("name", name)
        await self.api_request(f"CONSUMER.DELETE.{stream}.{name}")

    async def unpin_consumer(self, stream: str, name: str, group: str) -> None:
        """Clear the pin of a ``pinned_client`` priority group (ADR-42): the server picks a
        new pinned client among the group's waiting pulls, and the old one's next pull with
        the old id is answered 423. :class:`PriorityGroupNotFound` if the consumer has no such
        group (on other policies the server accepts it and nothing changes)."""
        check_stream("stream", stream)
        check_consumer("name", name)
        check_group_name(group)
        await self.api_request(unpin_api(stream, name), {"group": group})

    async def pause_consumer(
        self, stream: str, name: str, until: PauseUntil | None = None
    ) -> ConsumerPause:
        """Pause a consumer (nats-server 2.11+) until ``until``: an aware datetime, a timedelta
        or seconds from now, or ``None`` for :data:`~headrace.jetstream.pause.INDEFINITELY`.
        Its clients get nothing meanwhile (their pulls wait, heartbeats go on). A time
        already past resumes it. :class:`InvalidPauseUntil` for a naive datetime or a
        negative interval (nothing sent); :class:`ConsumerNotFound` /
        :class:`StreamNotFound` as the server answers."""
        check_stream("stream", stream)
        check_consumer("name", name)
        deadline = pause_deadline(until)
        answer = await self.api_request(
            pause_api(stream, name), {"pause_until": format_time(deadline)}
        )
        return from_json(ConsumerPause, answer)

    async def resume_consumer(self, stream: str, name: str) -> ConsumerPause:
        """Resume a paused consumer now (a pause call without a time); harmless on one that
        is not paused. The answer says ``paused=False``."""
        check_stream("stream", stream)
        check_consumer("name", name)
        return from_json(ConsumerPause, await self.api_request(pause_api(stream, name)))

    async def reset_consumer(
        self, stream: str, name: str, seq: int | None = None, *, to_start: bool = False
    ) -> ConsumerReset:
        """Start a consumer over (nats-server 2.14+, ``headrace.jetstream.reset``): from its
        ack floor, from stream sequence ``seq``, or (``to_start``) from where its deliver
        policy starts: the stream's first message (``all``) or ``opt_start_seq``
        (``by_start_sequence``); :class:`InvalidConsumerReset` for the policies whose start is
        no stream sequence (``new``, ``last``, ``last_per_subject``, ``by_start_time``: give
        ``seq``). Every delivery it waited on an ack for is
        forgotten, and the stream is delivered again from there in order.
        :class:`InvalidConsumerReset` for a sequence its deliver policy does not allow;
        :class:`ConsumerNotFound` / :class:`StreamNotFound` for a consumer that is not there
        (the call is answered by the consumer itself, so nothing answers then: the info
        request after the timeout says which); :class:`RequestTimeout` from a server too old
        to know the call (:func:`~headrace.jetstream.reset.supports_reset` tells by its
        version)."""
        check_stream("stream", stream)
        check_consumer("name", name)
        if to_start:
            if seq is not None:
                raise ValueError("give seq or to_start, not both")
            seq = await self._start_of(stream, name)
        try:
            answer = await self.api_request(reset_api(stream, name), reset_body(seq))
        except RequestTimeout:
            await self.consumer_info(stream, name)  # ConsumerNotFound, StreamNotFound
            raise
        reset_seq = answer.get("reset_seq")
        if isinstance(reset_seq, bool) or not isinstance(reset_seq, int):
            raise DecodeError(f"a consumer reset's answer has no reset_seq: {answer!r:.120}")
        return ConsumerReset(reset_seq, from_json(ConsumerInfo, answer))

    async def _start_of(self, stream: str, name: str) -> int:
        """The stream sequence a consumer's deliver policy starts at (see reset_consumer)."""
        config = (await self.consumer_info(stream, name)).config
        policy = config.deliver_policy or DeliverPolicy.ALL
        if policy is DeliverPolicy.ALL:
            return max(1, (await self.stream_info(stream)).state.first_seq)
        if policy is DeliverPolicy.BY_START_SEQUENCE and config.opt_start_seq:
            return config.opt_start_seq
        raise InvalidConsumerReset(
            400,
            InvalidConsumerReset.err_codes[0],
            f"consumer {name!r} delivers by {policy}: its start is no stream sequence to "
            "reset to; give seq=",
        )

    async def consumers(self, stream: str) -> AsyncIterator[ConsumerInfo]:
        check_stream("stream", stream)
        async for item in self._paged(f"CONSUMER.LIST.{stream}", "consumers", {}):
            yield from_json(ConsumerInfo, item)

    async def consumer_names(self, stream: str) -> list[str]:
        check_stream("stream", stream)
        return [str(n) async for n in self._paged(f"CONSUMER.NAMES.{stream}", "consumers", {})]

    # -- publishing ---------------------------------------------------------------------------

    async def publish(
        self,
        subject: str,
        data: bytes = b"",
        *,
        headers: Headers | Mapping[str, str | list[str]] | None = None,
        msg_id: str | None = None,
        expected_stream: str | None = None,
        expected_last_seq: int | None = None,
        expected_last_subject_seq: int | None = None,
        expected_last_subject_seq_subject: str | None = None,
        expected_last_msg_id: str | None = None,
        ttl: MessageTTL | None = None,
        schedule: MessageSchedule | None = None,
        timeout: float | None = None,
        retry_attempts: int = 2,
        retry_wait: float = 0.25,
    ) -> PubAck:
        """Publish to a stream and wait for its acknowledgement.

        ``msg_id`` de-duplicates within the stream's duplicate window (``PubAck.duplicate``);
        the ``expected_*`` arguments make the write conditional (:class:`WrongLastSequence`);
        ``expected_last_subject_seq_subject`` (a subject, wildcards allowed) makes
        ``expected_last_subject_seq`` the last sequence of the subjects matching it rather
        than of ``subject`` (``Nats-Expected-Last-Subject-Sequence-Subject``).
        ``ttl`` (ADR-43: seconds, a timedelta, a duration string such as ``"1h30m"``, or
        ``"never"``) is how long the stream keeps this message, sent as ``Nats-TTL``: checked
        before sending (:class:`InvalidMessageTTL`), refused by a stream without
        ``allow_msg_ttl`` (:class:`MessageTTLDisabled`).
        ``schedule`` (ADR-51, :mod:`headrace.jetstream.schedules`; the stream needs
        ``allow_msg_schedules``) makes this message a schedule: the server publishes ``data``
        (and the other headers) to ``schedule.target`` at its times. ``subject`` names the
        schedule (one per subject: publishing again replaces it), and ``msg_id``, ``ttl``
        and ``expected_*`` apply to the schedule message itself.
        Nobody answering is retried ``retry_attempts`` times, ``retry_wait`` seconds apart (as
        the Go client does): a stream just created, or electing a leader, answers a moment later.
        """
        hdrs = publish_headers(
            headers,
            msg_id=msg_id,
            expected_stream=expected_stream,
            expected_last_seq=expected_last_seq,
            expected_last_subject_seq=expected_last_subject_seq,
            expected_last_subject_seq_subject=expected_last_subject_seq_subject,
            expected_last_msg_id=expected_last_msg_id,
            ttl=ttl,
            schedule=schedule,
            subject=subject,
        )
        attempt = 0
        while True:
            try:
                msg = await self.nc.request(
                    subject,
                    data,
                    headers=hdrs,
                    timeout=self.timeout if timeout is None else timeout,
                )
                break
            except NoRespondersError as exc:
                if attempt >= retry_attempts:
                    raise NoStreamForSubject(subject) from exc
                attempt += 1
                await trio.sleep(retry_wait)
        return parse_pub_ack(msg.data)

    def atomic_batch(
        self,
        *,
        batch_id: str | None = None,
        ack_every: int | None = None,
        timeout: float | None = None,
    ) -> AtomicBatch:
        """A new atomic batch (ADR-50): ``await batch.add(...)`` its messages, then
        ``await batch.commit(...)``; the stream (``allow_atomic``) stores all or none of them.
        See :class:`~headrace.jetstream.AtomicBatch`."""
        return AtomicBatch(
            self.nc,
            batch_id=batch_id,
            ack_every=ack_every,
            timeout=self.timeout if timeout is None else timeout,
        )

    async def publish_batch(
        self,
        messages: Iterable[tuple[str, bytes, Headers | Mapping[str, str | list[str]] | None]],
        *,
        batch_id: str | None = None,
        ack_every: int | None = None,
        timeout: float | None = None,
    ) -> PubAck:
        """Publish ``(subject, data, headers)`` messages as one atomic batch (ADR-50) and return
        its PubAck (``batch``, ``count``), or raise the refusal (an
        :class:`~headrace.jetstream.AtomicPublishError`); a refused batch stored nothing."""
        return await publish_batch(
            self.nc,
            messages,
            batch_id=batch_id,
            ack_every=ack_every,
            timeout=self.timeout if timeout is None else timeout,
        )

    # -- reading stored messages --------------------------------------------------------------

    async def get_msg(
        self,
        stream: str,
        seq: int | None = None,
        *,
        last_by_subject: str | None = None,
        next_by_subject: str | None = None,
    ) -> StoredMessage:
        """A message by sequence, the last of a subject, or the next of a subject from ``seq``,
        through the stream leader (``STREAM.MSG.GET``)."""
        check_stream("stream", stream)
        body = _get_body(seq, last_by_subject, next_by_subject)
        answer = await self.api_request(f"STREAM.MSG.GET.{stream}", body)
        raw = answer.get("message")
        if not isinstance(raw, dict):
            raise DecodeError(f"STREAM.MSG.GET answered without a message: {answer!r}")
        hdrs = base64.b64decode(raw["hdrs"]) if raw.get("hdrs") else None
        return StoredMessage(
            stream=stream,
            subject=str(raw.get("subject", "")),
            seq=int(raw.get("seq", 0)),
            data=base64.b64decode(raw.get("data") or b""),
            raw_headers=hdrs,
            time=parse_time(raw["time"]) if raw.get("time") else None,
        )

    async def direct_get(
        self,
        stream: str,
        seq: int | None = None,
        *,
        last_by_subject: str | None = None,
        next_by_subject: str | None = None,
        timeout: float | None = None,
    ) -> StoredMessage:
        """The same through any replica (ADR-31 Direct Get; the stream needs ``allow_direct``).

        The last message of a subject uses the subject-appended form, which needs no body.
        """
        subject, data = self._direct_get_request(stream, seq, last_by_subject, next_by_subject)
        try:
            msg = await self.nc.request(
                subject, data, timeout=self.timeout if timeout is None else timeout
            )
        except NoRespondersError as exc:
            raise _no_direct_get(stream) from exc
        return _direct_get_answer(msg, stream)

    def direct_get_soon(
        self,
        stream: str,
        seq: int | None = None,
        *,
        next_by_subject: str | None = None,
        timeout: float | None = None,
    ) -> PendingDirectGet:
        """:meth:`direct_get`, sent now and awaited later (:meth:`PendingDirectGet.result`,
        or :meth:`PendingDirectGet.abandon`): a read sent alongside another request without
        a task of its own."""
        subject, data = self._direct_get_request(stream, seq, None, next_by_subject)
        pending = self.nc.request_soon(
            subject, data, timeout=self.timeout if timeout is None else timeout
        )
        return PendingDirectGet(pending, stream)

    def _direct_get_request(
        self,
        stream: str,
        seq: int | None,
        last_by_subject: str | None,
        next_by_subject: str | None,
    ) -> tuple[str, bytes]:
        check_stream("stream", stream)
        if last_by_subject is not None and seq is None and next_by_subject is None:
            # A wildcard (the last message of any subject matching it, as get_msg and the
            # server allow: it was refused here, issue 24) cannot be in the subject-appended
            # form's subject: it goes in the body instead.
            check_subject(last_by_subject, wildcards=True, what="last_by_subject")
            if "*" not in last_by_subject and ">" not in last_by_subject:
                return self.api_subject(f"DIRECT.GET.{stream}.{last_by_subject}"), b""
        body = _get_body(seq, last_by_subject, next_by_subject)
        subject = self.api_subject(f"DIRECT.GET.{stream}")
        return subject, _COMPACT.encode(body).encode()

    async def direct_get_batch(
        self,
        stream: str,
        batch: int,
        *,
        subject: str | None = None,
        seq: int | None = None,
        start_time: dt.datetime | None = None,
        max_bytes: int | None = None,
        timeout: float | None = None,
    ) -> DirectBatch:
        """Up to ``batch`` messages of ``subject`` (wildcards allowed; ``None``: any) from
        ``seq`` or ``start_time`` on (the first message if neither), in one request (ADR-31
        batched Direct Get, nats-server 2.11+). See :class:`~headrace.jetstream.BatchGet`;
        ``DirectBatch.num_pending`` says how many more there are."""
        request = BatchGet(
            batch=batch, subject=subject, seq=seq, start_time=start_time, max_bytes=max_bytes
        )
        return await self.direct_get_many(stream, request, timeout=timeout)

    async def direct_get_last_for(
        self,
        stream: str,
        subjects: Sequence[str],
        *,
        up_to_seq: int | None = None,
        up_to_time: dt.datetime | None = None,
        batch: int | None = None,
        max_bytes: int | None = None,
        timeout: float | None = None,
    ) -> DirectBatch:
        """The last message of each subject matching ``subjects`` (wildcards allowed, at most
        1024 matching: :class:`~headrace.jetstream.TooManySubjects` beyond), as the stream
        stood at ``up_to_seq`` or ``up_to_time`` (``None``: now), in one request (ADR-31
        multi-last). A ``batch`` or ``max_bytes`` cap may leave some pending: ask for the rest
        with ``direct_get_many(stream, request.next_page(page))``."""
        request = MultiLastGet(
            subjects=subjects,
            up_to_seq=up_to_seq,
            up_to_time=up_to_time,
            batch=batch,
            max_bytes=max_bytes,
        )
        return await self.direct_get_many(stream, request, timeout=timeout)

    async def direct_get_many(
        self,
        stream: str,
        request: BatchGet | MultiLastGet,
        *,
        timeout: float | None = None,
        reader: DirectBatchReader | None = None,
    ) -> DirectBatch:
        """Send one batched Direct Get and read its answer up to the end-of-batch status.

        ``reader`` replaces the default :class:`~headrace.jetstream.DirectBatchReader` (one
        for this request only): a subclass may keep the messages its own way, as the Spark
        plugin's reader does, turning them into columns without a ``StoredMessage`` each.

        Typed failures: :class:`~headrace.jetstream.DirectGetNotAllowed` (the stream has no
        ``allow_direct``), :class:`StreamNotFound`, :class:`~headrace.jetstream.TooManySubjects`,
        :class:`~headrace.jetstream.DirectGetRefused`,
        :class:`~headrace.jetstream.BatchGetUnsupported` (a server before 2.11),
        :class:`~headrace.jetstream.DirectBatchBroken` (a message lost on the way),
        :class:`~headrace.errors.RequestTimeout`. Nothing matching is an empty batch.
        """
        check_stream("stream", stream)
        limit = self.timeout if timeout is None else timeout
        mux = self._direct_mux()
        reply, waiting = mux.register(reader if reader is not None else DirectBatchReader(stream))
        data = json.dumps(request.body(), separators=(",", ":")).encode()
        try:
            with trio.move_on_after(limit):
                await self.nc.publish(self.api_subject(f"DIRECT.GET.{stream}"), data, reply=reply)
                await waiting.done.wait()
                if isinstance(waiting.result, NoRespondersError):
                    await self._no_direct_responder(stream)
                if isinstance(waiting.result, Exception):
                    raise waiting.result
                assert waiting.result is not None
                return waiting.result
        finally:
            mux.unregister(reply)
        came = waiting.reader.received
        hint = (
            f" ({came} messages came, no end-of-batch: through an account import, the export "
            "of $JS.API.> must allow several responses, response_type: stream)"
            if came
            else ""
        )
        raise RequestTimeout(
            f"the Direct Get batch of stream {stream!r} did not end within {limit}s{hint}"
        )

    def _direct_mux(self) -> DirectBatchMux:
        """The shared inbox of this context's batched Direct Gets, subscribed on first use."""
        mux = self._batch_mux
        if mux is None or mux.sub is None or mux.sub.is_closed:
            mux = DirectBatchMux(self.nc.options.inbox_prefix)
            mux.sub = self.nc.subscribe_nowait(mux.subject, handler=mux.on_batch)
            self._batch_mux = mux
        return mux

    async def _no_direct_responder(self, stream: str) -> None:
        """Nobody answered a Direct Get: say why (raises :class:`StreamNotFound`,
        :class:`~headrace.jetstream.DirectGetNotAllowed` or :class:`JetStreamUnavailable`)."""
        info = await self.stream_info(stream)
        if not info.config.allow_direct:
            raise DirectGetNotAllowed(stream)
        raise JetStreamUnavailable(
            f"no Direct Get responder for stream {stream!r} yet (allow_direct is on): a stream "
            "just created or updated gets its responders a moment later"
        )

    async def delete_msg(self, stream: str, seq: int, *, erase: bool = False) -> None:
        """Delete one message; ``erase`` overwrites its storage too."""
        check_stream("stream", stream)
        body = {"seq": seq, "no_erase": not erase}
        await self.api_request(f"STREAM.MSG.DELETE.{stream}", body)


def _get_body(
    seq: int | None, last_by_subject: str | None, next_by_subject: str | None
) -> dict[str, Any]:
    if last_by_subject is not None and (seq is not None or next_by_subject is not None):
        raise ValueError("last_by_subject cannot be combined with seq or next_by_subject")
    if seq is None and last_by_subject is None and next_by_subject is None:
        raise ValueError("give seq, last_by_subject or next_by_subject")
    body: dict[str, Any] = {}
    if seq is not None:
        body["seq"] = seq
    if last_by_subject is not None:
        body["last_by_subj"] = last_by_subject
    if next_by_subject is not None:
        body["next_by_subj"] = next_by_subject
    return body


class PendingDirectGet:
    """A Direct Get already sent (:meth:`JetStreamAPI.direct_get_soon`)."""

    __slots__ = ("_pending", "_stream")

    def __init__(self, pending: PendingRequest, stream: str) -> None:
        self._pending = pending
        self._stream = stream

    async def result(self) -> StoredMessage:
        """The stored message, or what :meth:`JetStreamAPI.direct_get` raises."""
        try:
            msg = await self._pending.reply()
        except NoRespondersError as exc:
            raise _no_direct_get(self._stream) from exc
        return _direct_get_answer(msg, self._stream)

    def abandon(self) -> None:
        self._pending.abandon()


def _no_direct_get(stream: str) -> JetStreamUnavailable:
    return JetStreamUnavailable(
        f"no Direct Get responder for stream {stream!r}: does it exist, with allow_direct set?"
    )


def _direct_get_answer(msg: Msg, stream: str) -> StoredMessage:
    if msg.raw_headers is None:
        raise DecodeError("a Direct Get answer had no Nats-Sequence header")
    # The answer's block is the stored message's own with the server's appended, and the
    # stored part is whatever its publisher sent: read it leniently, and leave reporting
    # what could not be read to the StoredMessage (once, naming the stored message, not
    # this answer's inbox).
    hdrs, status, description, _ = read_header_block(msg.raw_headers)
    if status == 404:
        raise MessageNotFound(404, 10037, description or "message not found")
    if status is not None:
        raise api_error({"code": status, "err_code": 0, "description": description})
    return from_direct_reply(msg.raw_headers, msg.data, stream, hdrs)
