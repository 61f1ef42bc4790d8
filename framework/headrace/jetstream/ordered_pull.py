"""The pull-based ordered consumer: a stream's messages in order, exactly once, by fetch.

nats.go's ``OrderedConsumer`` (its ``jetstream`` package) reads a stream the way ADR-17's push
ordered consumer does, but by pulling: each call asks for what the caller wants now, so a
reader sets its own pace with ``fetch``, ``fetch`` by bytes, a no-wait fetch or ``next``.
Underneath is an ephemeral pull consumer (ack policy none, one delivery per message, memory
storage, one replica, removed by the server after ``inactive_threshold`` of disuse). The
handle checks every delivery's consumer sequence against the one before. When it finds a gap,
or the consumer is gone (``409 Consumer Deleted`` from a pull, or a pull that nobody
serves), it replaces the consumer with a new one that starts after the last message handed
out, so the caller sees neither a hole nor a repeat. A deleted consumer is noticed from the
status of the pull that was waiting on it, at once, not after missed heartbeats.

Consumers are named ``<name_prefix>_<n>`` (``n`` counting the replacements from 1), so an
operator can tell them apart in ``consumer ls``; the prefix is random unless given.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import attrs
import trio

from headrace.errors import ConnectionLostError, NatsTimeoutError, NoRespondersError
from headrace.jetstream.consumer_config import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    ReplayPolicy,
)
from headrace.jetstream.errors import (
    ConsumerDeleted,
    ConsumerNotFound,
    JetStreamUnavailable,
    SubscribeError,
)
from headrace.jetstream.events import ConsumerRecreated
from headrace.jetstream.message import JsMsg
from headrace.jetstream.names import check_consumer, check_stream
from headrace.jetstream.pull_consumer import DEFAULT_FETCH_EXPIRES, PullConsumer
from headrace.nats.inbox import unique_token

if TYPE_CHECKING:
    from headrace.jetstream.api import JetStreamAPI

#: How long the server keeps an ordered consumer nobody pulls from (nats.go's default).
DEFAULT_INACTIVE_THRESHOLD = 300.0
#: Replacements in a row (no message handed out in between) before a read gives up.
MAX_RESETS = 10


@attrs.frozen(slots=True, kw_only=True)
class OrderedConsumerConfig:
    """What an ordered consumer reads: ``filter_subjects`` (all of the stream if empty), from
    where (``deliver_policy``, ``opt_start_seq``, ``opt_start_time``), how
    (``replay_policy``, ``headers_only``), and its consumers' ``name_prefix`` and
    ``inactive_threshold``."""

    filter_subjects: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    deliver_policy: DeliverPolicy = attrs.field(default=DeliverPolicy.ALL, converter=DeliverPolicy)
    opt_start_seq: int | None = None
    opt_start_time: dt.datetime | None = None
    replay_policy: ReplayPolicy | None = attrs.field(
        default=None, converter=attrs.converters.optional(ReplayPolicy)
    )
    headers_only: bool | None = None
    inactive_threshold: float = DEFAULT_INACTIVE_THRESHOLD
    name_prefix: str | None = attrs.field(default=None)
    metadata: dict[str, str] | None = attrs.field(default=None, hash=False)

    @name_prefix.validator
    def _check_prefix(self, _attr: attrs.Attribute[Any], value: str | None) -> None:
        if value is not None:
            check_consumer("name_prefix", value)


class OrderedConsumer:
    """Made by ``await js.ordered_consumer(stream, ...)``; see the module docs. ``delete()``
    removes its current consumer (the server removes an unused one by itself too)."""

    def __init__(self, js: JetStreamAPI, stream: str, config: OrderedConsumerConfig) -> None:
        self.js = js
        self.stream = stream
        self.config = config
        self.name_prefix = config.name_prefix or unique_token()
        #: Replacements so far; the current consumer is ``<name_prefix>_<serial>``.
        self.serial = 0
        #: Stream sequence of the last message handed out (0: none yet).
        self.last_stream_seq = 0
        self._last_consumer_seq = 0
        self._consumer: PullConsumer | None = None
        #: Set when a read found a gap after handing out what came before it: the next read
        #: replaces the consumer first.
        self._stale: str | None = None
        #: Reasons of the replacements so far, newest last (also :class:`ConsumerRecreated`).
        self.resets: list[ConsumerRecreated] = []

    def __repr__(self) -> str:
        return f"<OrderedConsumer {self.stream}/{self.name_prefix}_{self.serial}>"

    @property
    def consumer_name(self) -> str | None:
        """The current consumer's name (None before the first read)."""
        return self._consumer.name if self._consumer is not None else None

    # -- reading ------------------------------------------------------------------------------

    async def fetch(
        self,
        max_messages: int = 1,
        *,
        expires: float = DEFAULT_FETCH_EXPIRES,
        no_wait: bool = False,
    ) -> list[JsMsg]:
        """Up to ``max_messages`` next messages in order (fewer when ``expires`` runs out, or
        at once with ``no_wait``); ``[]`` when none came."""
        if max_messages < 1:
            raise ValueError(f"max_messages must be at least 1, not {max_messages}")
        return await self._read(max_messages=max_messages, expires=expires, no_wait=no_wait)

    async def fetch_bytes(
        self,
        max_bytes: int,
        *,
        expires: float = DEFAULT_FETCH_EXPIRES,
        no_wait: bool = False,
    ) -> list[JsMsg]:
        """The next messages in order, up to ``max_bytes`` bytes."""
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, not {max_bytes}")
        return await self._read(max_bytes=max_bytes, expires=expires, no_wait=no_wait)

    async def next(self, *, expires: float = DEFAULT_FETCH_EXPIRES) -> JsMsg | None:
        """The next message in order, or None if none came within ``expires``."""
        got = await self.fetch(1, expires=expires)
        return got[0] if got else None

    async def delete(self) -> None:
        """Remove the current consumer now (it is not reused: a later read makes another)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                await consumer.delete()
            except ConsumerNotFound:
                pass

    async def _read(self, **pull: Any) -> list[JsMsg]:
        resets = 0
        if self._stale is not None:
            reason, self._stale = self._stale, None
            resets = await self._replace(reason, resets)
        while True:
            if self._consumer is None:
                await self._create()
            assert self._consumer is not None
            try:
                got = await self._consumer.fetch(**pull)
            except (ConsumerDeleted, ConsumerNotFound, NoRespondersError) as exc:
                # Gone (deleted, expired after inactive_threshold, lost with a server): at
                # once from the pull's status, not after missed heartbeats.
                resets = await self._replace(f"{type(exc).__name__}: {exc}", resets)
                continue
            ordered = self._in_order(got)
            if ordered is not None:
                return ordered
            resets = await self._replace(self._gap(got[0].metadata.consumer_seq), resets)
            # (What came before the gap was handed out: the new consumer starts after it.)

    def _in_order(self, got: list[JsMsg]) -> list[JsMsg] | None:
        """``got`` if each message follows the one before (consumer sequence + 1, a first
        delivery); else the messages before the first that does not, if any, or None."""
        out: list[JsMsg] = []
        for msg in got:
            meta = msg.metadata
            if meta.consumer_seq != self._last_consumer_seq + 1 or meta.num_delivered != 1:
                if out:
                    self._stale = self._gap(meta.consumer_seq)
                return out or None
            self._last_consumer_seq = meta.consumer_seq
            self.last_stream_seq = meta.stream_seq
            out.append(msg)
        return out

    def _gap(self, consumer_seq: int) -> str:
        return f"gap: consumer sequence {consumer_seq} after {self._last_consumer_seq}"

    async def _replace(self, reason: str, resets: int) -> int:
        resets += 1
        if resets > MAX_RESETS:
            raise SubscribeError(
                f"{self!r}: its consumer was replaced {MAX_RESETS} times in a row without a "
                f"message in between; last: {reason}"
            )
        old = self._consumer
        await self.delete()
        await self._create()
        assert self._consumer is not None
        event = ConsumerRecreated(
            old.name if old is not None else "",
            self._consumer.name,
            self.last_stream_seq + 1 if self.last_stream_seq else 0,
            reason,
        )
        self.resets.append(event)
        return resets

    async def _create(self) -> None:
        """A new consumer, starting after the last message handed out (or as configured)."""
        self.serial += 1
        config = self._consumer_config()
        wait = 0.1
        while True:
            try:
                info = await self.js.create_consumer(self.stream, config)
                break
            except (JetStreamUnavailable, NatsTimeoutError, ConnectionLostError):
                # JetStream not reachable yet (a restart, an election): keep trying, as
                # ADR-17 asks of an ordered consumer, with a growing pause.
                await trio.sleep(wait)
                wait = min(wait * 2, 2.0)
        self._consumer = PullConsumer(self.js, self.stream, info.name, info)
        self._last_consumer_seq = 0

    def _consumer_config(self) -> ConsumerConfig:
        cfg = self.config
        filters = list(cfg.filter_subjects)
        policy, start_seq, start_time = cfg.deliver_policy, cfg.opt_start_seq, cfg.opt_start_time
        if self.last_stream_seq:
            policy, start_seq, start_time = (
                DeliverPolicy.BY_START_SEQUENCE,
                self.last_stream_seq + 1,
                None,
            )
        return ConsumerConfig(
            name=f"{self.name_prefix}_{self.serial}",
            deliver_policy=policy,
            opt_start_seq=start_seq,
            opt_start_time=start_time,
            ack_policy=AckPolicy.NONE,
            max_deliver=1,
            replay_policy=cfg.replay_policy,
            headers_only=cfg.headers_only,
            inactive_threshold=cfg.inactive_threshold,
            num_replicas=1,
            mem_storage=True,
            metadata=cfg.metadata,
            filter_subject=filters[0] if len(filters) == 1 else None,
            filter_subjects=filters if len(filters) > 1 else None,
        )


async def ordered_consumer(
    js: JetStreamAPI, stream: str, config: OrderedConsumerConfig | None = None, **kwargs: Any
) -> OrderedConsumer:
    """A pull-based ordered consumer of ``stream`` (keyword arguments: the fields of
    :class:`OrderedConsumerConfig`). Its first consumer is made at once, so a missing stream
    is said here."""
    check_stream("stream", stream)
    if config is not None and kwargs:
        raise TypeError("give config=OrderedConsumerConfig(...) or keyword arguments, not both")
    consumer = OrderedConsumer(js, stream, config or OrderedConsumerConfig(**kwargs))
    await consumer._create()
    return consumer
