"""An in-memory stand-in for the server, under a pipeline's unchanged stages and ack tracker.

A pipeline run reaches the server through two narrow doors: its source stages consume through
the run's JetStream context (``PipelineRun(js=...)``: ``pull_subscribe``/``subscribe`` and the
consume buffer's ``next_batch``), and every ack, nak, term and +WPI is a publish to the
message's ``$JS.ACK`` reply subject through the connection the :class:`JsMsg` was made with
(``publish_nowait``, or ``write_nowait`` for a batch of acks). This module provides both doors
in memory, and nothing else of the server:

- :class:`MemoryConnection` takes those publishes, tells the ledger (what the test reads) and
  the consumer (which redelivers) what each one was;
- :class:`MemoryJetStream` holds streams of stored messages and hands each source a
  :class:`MemoryConsumer`, which delivers them with real ``$JS.ACK`` reply subjects (so the
  records carry stream, sequence and delivery count as from a server), redelivers a naked
  message with its delivery count + 1 once its nak delay has passed, and one not acked within
  the consumer's ``ack_wait`` (+WPI restarts that), and stops redelivering after the
  consumer's ``max_deliver``, as the server does;
- dead letters (the tracker's ``js.publish`` to the pipeline's ``dead_letter``) are recorded.

So the graph, the batchers, the sinks, their retries and bisection, the ack tracker with its
nak backoff and poison handling all run as they do against a server; no per-message code path
of the framework knows it is under test. What the server does that is not modelled here:
deliver policies other than "all", ``backoff``, flow control, heartbeats, consumer limits such
as ``max_ack_pending`` (the pipeline's own ``max_in_flight`` still applies), and the rest of the
JetStream API (a sink that uses its ``SinkContext.js`` gets :class:`NotInMemory`).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from headrace.actors.actor import ActorState
from headrace.checkpoints.subscription import subject_matches
from headrace.errors import HeadraceError, SubscriptionClosedError
from headrace.jetstream.ack_reply import parse_ack_reply
from headrace.jetstream.consumer_config import ConsumerConfig, ConsumerInfo
from headrace.jetstream.errors import InvalidAckReply
from headrace.jetstream.message import JsMsg
from headrace.protocol.events import Msg
from headrace.protocol.headers import Headers

DEFAULT_ACK_WAIT = 30.0


class NotInMemory(HeadraceError):
    """The server-less harness does not provide this part of the JetStream API: run the test
    with ``real=True``."""


#: Told of each ack publish: (the ``$JS.ACK`` reply subject, the payload).
AckListener = Callable[[str, bytes], None]


@attrs.frozen(slots=True)
class StoredMessage:
    """A message as a stream holds it."""

    stream: str
    seq: int
    subject: str
    data: bytes
    raw_headers: bytes | None
    timestamp_ns: int


class MemoryStreams:
    """Streams by name, each a list of stored messages (sequence ``i + 1`` at index ``i``);
    consumers are woken when one grows."""

    def __init__(self) -> None:
        self.streams: dict[str, list[StoredMessage]] = {}
        self._grown = trio.Event()

    def store(
        self, stream: str, subject: str, data: bytes, headers: Headers | None
    ) -> StoredMessage:
        messages = self.streams.setdefault(stream, [])
        raw = headers.encode() if headers else None
        stored = StoredMessage(stream, len(messages) + 1, subject, data, raw, time.time_ns())
        messages.append(stored)
        self._grown.set()
        self._grown = trio.Event()
        return stored

    @property
    def grown(self) -> trio.Event:
        """Set the next time a message is stored."""
        return self._grown


@attrs.define(slots=True)
class _Pending:
    """A delivered message the consumer waits to hear about."""

    stored: StoredMessage
    deadline: float  # when its ack wait runs out


class MemoryConsumer:
    """One consumer of a stream in memory: delivers, and redelivers as the server would.

    Messages are delivered when the source takes them (there is no buffer between: nothing
    waits in one to be kept alive). A message naked is redelivered after its delay, one whose
    ack wait ran out at once, ahead of messages never delivered (the server does the same);
    past ``max_deliver`` deliveries it is not delivered again.
    """

    def __init__(
        self, streams: MemoryStreams, stream: str, name: str, config: ConsumerConfig
    ) -> None:
        self.streams = streams
        self.stream = stream
        self.name = name
        self.config = config
        self.filters = tuple(config.filter_subjects or ()) or (
            (config.filter_subject,) if config.filter_subject else ()
        )
        self.ack_wait = config.ack_wait or DEFAULT_ACK_WAIT
        self.max_deliver = config.max_deliver if (config.max_deliver or 0) > 0 else None
        self.state = ActorState.RUNNING
        self.info = ConsumerInfo(stream_name=stream, name=name, config=config)
        self._next_index = 0  # the next stored message not looked at yet
        self._consumer_seq = 0
        self._delivered: dict[int, int] = {}  # stream seq -> deliveries so far
        self._pending: dict[int, _Pending] = {}
        self._redeliver: deque[StoredMessage] = deque()
        self._naked: dict[int, tuple[float, StoredMessage]] = {}  # seq -> (due, message)
        #: Sequences not delivered again because they reached ``max_deliver``.
        self.exhausted: list[int] = []
        self._changed = trio.Event()
        self._ended = False

    # -- delivering -------------------------------------------------------------------------

    def _selects(self, subject: str) -> bool:
        return not self.filters or any(subject_matches(f, subject) for f in self.filters)

    def _new_ready(self) -> StoredMessage | None:
        messages = self.streams.streams.get(self.stream, [])
        while self._next_index < len(messages):
            stored = messages[self._next_index]
            self._next_index += 1
            if self._selects(stored.subject):
                return stored
        return None

    def _num_pending(self) -> int:
        messages = self.streams.streams.get(self.stream, [])
        return sum(1 for m in messages[self._next_index :] if self._selects(m.subject))

    def take(self, conn: MemoryConnection, max_msgs: int | None) -> list[JsMsg]:
        """Deliver up to ``max_msgs`` messages now (redeliveries first); maybe none."""
        self._due(trio.current_time())
        taken: list[StoredMessage] = []
        while max_msgs is None or len(taken) < max_msgs:
            if self._redeliver:
                taken.append(self._redeliver.popleft())
                continue
            stored = self._new_ready()
            if stored is None:
                break
            taken.append(stored)
        now = trio.current_time()
        pending = self._num_pending()
        out = []
        for stored in taken:
            count = self._delivered.get(stored.seq, 0) + 1
            self._delivered[stored.seq] = count
            self._consumer_seq += 1
            self._pending[stored.seq] = _Pending(stored, now + self.ack_wait)
            reply = (
                f"$JS.ACK.{self.stream}.{self.name}.{count}.{stored.seq}."
                f"{self._consumer_seq}.{stored.timestamp_ns}.{pending}"
            )
            msg = Msg(stored.subject, 0, reply, stored.data, stored.raw_headers)
            out.append(JsMsg(msg, conn))  # type: ignore[arg-type]  # the ack door, in memory
        if taken:
            self._wake()
        return out

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _again(self, stored: StoredMessage) -> None:
        """Deliver ``stored`` again, unless it has had its ``max_deliver`` deliveries."""
        if self.max_deliver is not None and self._delivered[stored.seq] >= self.max_deliver:
            self.exhausted.append(stored.seq)
            return
        self._redeliver.append(stored)

    def _due(self, now: float) -> None:
        """Move naked messages whose delay passed, and pending ones whose ack wait ran out, to
        the redelivery queue."""
        for seq, (due, stored) in list(self._naked.items()):
            if due <= now:
                del self._naked[seq]
                self._again(stored)
        for seq, pending in list(self._pending.items()):
            if pending.deadline <= now:
                del self._pending[seq]
                self._again(pending.stored)

    def _next_due(self) -> float:
        times = [due for due, _ in self._naked.values()]
        times.extend(p.deadline for p in self._pending.values())
        return min(times, default=float("inf"))

    def ready(self) -> bool:
        self._due(trio.current_time())
        if self._redeliver:
            return True
        messages = self.streams.streams.get(self.stream, [])
        return any(self._selects(m.subject) for m in messages[self._next_index :])

    async def wait_ready(self) -> None:
        """Wait until a message can be delivered, or the consumer is drained."""
        while not self._ended and not self.ready():
            changed, grown = self._changed, self.streams.grown
            with trio.move_on_at(self._next_due()):
                async with trio.open_nursery() as nursery:

                    async def first(event: trio.Event) -> None:
                        await event.wait()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(first, changed)
                    nursery.start_soon(first, grown)

    def end(self) -> None:
        self._ended = True
        self._wake()

    @property
    def ended(self) -> bool:
        return self._ended

    # -- what the client sent ---------------------------------------------------------------

    def acked(self, seq: int, delivered: int, payload: bytes) -> None:
        """Apply an ack publish for the message at ``seq`` (delivery ``delivered``)."""
        pending = self._pending.get(seq)
        if pending is None or delivered != self._delivered.get(seq):
            return  # settled already, or an ack of an earlier delivery
        kind, delay = parse_ack(payload)
        if kind == "in_progress":
            pending.deadline = trio.current_time() + self.ack_wait
            return
        del self._pending[seq]
        if kind == "nak":
            self._naked[seq] = (trio.current_time() + (delay or 0.0), pending.stored)
        self._wake()


def parse_ack(payload: bytes) -> tuple[str, float | None]:
    """The kind of an ack payload (``ack``, ``nak``, ``term``, ``in_progress``) and a nak's
    delay in seconds."""
    if payload.startswith(b"-NAK"):
        rest = payload[4:].strip()
        delay = None
        if rest.startswith(b"{"):
            ns = json.loads(rest).get("delay")
            delay = ns / 1e9 if isinstance(ns, int | float) else None
        return "nak", delay
    if payload.startswith(b"+TERM"):
        return "term", None
    if payload.startswith(b"+WPI"):
        return "in_progress", None
    return "ack", None  # +ACK, and an empty payload (which the server takes as an ack)


class MemoryConnection:
    """The connection the run and its messages see: ack publishes go to the listeners and to
    the consumer they belong to; nothing else is sent anywhere."""

    actor_name = "connection (in memory)"
    actor_state = "running"

    def __init__(self) -> None:
        self.consumers: dict[tuple[str, str], MemoryConsumer] = {}
        self.listeners: list[AckListener] = []

    def publish_nowait(self, subject: str, payload: bytes = b"", reply: str | None = None) -> None:
        try:
            meta = parse_ack_reply(subject)
        except InvalidAckReply:
            raise NotInMemory(
                f"the in-memory connection only carries acks, not a publish to {subject!r}"
            ) from None
        for listener in self.listeners:
            listener(subject, payload)
        consumer = self.consumers.get((meta.stream, meta.consumer))
        if consumer is not None:
            consumer.acked(meta.stream_seq, meta.num_delivered, payload)

    def write_nowait(self, encoded: bytes, messages: int, payload_bytes: int = 0) -> None:
        """Encoded PUB commands (a batch of acks, ``ack_all``), taken apart again."""
        for subject, payload in split_pubs(encoded):
            self.publish_nowait(subject, payload)

    async def flush(self, timeout: float | None = None) -> None:
        await trio.lowlevel.checkpoint()

    def on_publish_denied(
        self, subject: str, callback: Callable[[Any], None]
    ) -> Callable[[], None]:
        """Nothing is refused in memory."""
        return lambda: None


def split_pubs(encoded: bytes) -> list[tuple[str, bytes]]:
    """``PUB <subject> <size>\\r\\n<payload>\\r\\n`` commands as (subject, payload) pairs."""
    found = []
    at = 0
    while at < len(encoded):
        end = encoded.index(b"\r\n", at)
        _, subject, size = encoded[at:end].split(b" ")
        start = end + 2
        payload = encoded[start : start + int(size)]
        found.append((subject.decode(), payload))
        at = start + int(size) + 2
    return found


class MemoryBuffer:
    """What a source stage consumes from (a consume buffer's ``next_batch`` and ``drain``)."""

    def __init__(self, consumer: MemoryConsumer, conn: MemoryConnection) -> None:
        self.consumer = consumer
        self.conn = conn
        self.name = f"memory-consumer:{consumer.stream}/{consumer.name}"

    @property
    def state(self) -> ActorState:
        return ActorState.STOPPED if self.consumer.ended else ActorState.RUNNING

    async def next_batch(self, max_msgs: int | None = None) -> list[JsMsg]:
        while True:
            await self.consumer.wait_ready()
            if self.consumer.ended:
                raise SubscriptionClosedError(f"{self.name} was drained")
            taken = self.consumer.take(self.conn, max_msgs)
            if taken:
                return taken

    async def drain(self, timeout: float | None = None) -> None:
        self.consumer.end()
        await trio.lowlevel.checkpoint()

    #: Nothing waits here with its ack wait running: a batch is made when it is taken.
    taken_since: float | None = None

    def keep_alive(self, arrived_before: float) -> int:
        return 0


class MemorySubscription:
    """A bound consumer, as ``pull_subscribe`` or ``subscribe`` gives it to a source."""

    def __init__(self, consumer: MemoryConsumer, conn: MemoryConnection) -> None:
        self.consumer = consumer
        self.buffer = MemoryBuffer(consumer, conn)
        self.actors: list[Any] = []

    @property
    def info(self) -> ConsumerInfo:  # a push subscription's
        return self.consumer.info

    @property
    def cached_info(self) -> ConsumerInfo:  # a pull consumer's (``sub.consumer.cached_info``)
        return self.consumer.info

    @asynccontextmanager
    async def consume(self, options: Any = None) -> AsyncIterator[MemoryBuffer]:
        yield self.buffer

    # A push source consumes the subscription itself.
    async def next_batch(self, max_msgs: int | None = None) -> list[JsMsg]:
        return await self.buffer.next_batch(max_msgs)

    async def drain(self, timeout: float | None = None) -> None:
        await self.buffer.drain(timeout)

    taken_since: float | None = None

    def keep_alive(self, arrived_before: float) -> int:
        return 0


@attrs.frozen(slots=True)
class PublishedMessage:
    """A message the pipeline published through its JetStream context (a dead letter)."""

    subject: str
    data: bytes
    headers: Headers


class MemoryJetStream:
    """The JetStream context of a run under test: binds each source to a
    :class:`MemoryConsumer`, keeps what the pipeline publishes (dead letters), and refuses the
    rest of the API with :class:`NotInMemory`."""

    def __init__(self, streams: MemoryStreams, conn: MemoryConnection) -> None:
        self.streams = streams
        self.conn = conn
        self.published: list[PublishedMessage] = []
        #: Told of each message the pipeline publishes.
        self.on_publish: Callable[[PublishedMessage], None] = lambda _message: None
        self._ephemeral = 0

    def _consumer(self, stream: str | None, durable: str | None, config: Any) -> MemoryConsumer:
        if stream is None:
            raise NotInMemory("a source under the in-memory harness names its stream")
        if durable is None:
            self._ephemeral += 1
            durable = f"EPHEMERAL{self._ephemeral}"
        key = (stream, durable)
        consumer = self.conn.consumers.get(key)
        if consumer is None:
            consumer = MemoryConsumer(self.streams, stream, durable, config or ConsumerConfig())
            self.conn.consumers[key] = consumer
        return consumer

    @asynccontextmanager
    async def pull_subscribe(
        self,
        subject: str | None = None,
        *,
        stream: str | None = None,
        durable: str | None = None,
        config: ConsumerConfig | None = None,
        **_: Any,
    ) -> AsyncIterator[Any]:
        yield _PullView(MemorySubscription(self._consumer(stream, durable, config), self.conn))

    @asynccontextmanager
    async def subscribe(
        self,
        subject: str | None = None,
        *,
        stream: str | None = None,
        durable: str | None = None,
        config: ConsumerConfig | None = None,
        **_: Any,
    ) -> AsyncIterator[MemorySubscription]:
        yield MemorySubscription(self._consumer(stream, durable, config), self.conn)

    async def find_stream(self, subject: str) -> str:
        """Every subject is stored somewhere in memory (a dead letter is kept in the ledger)."""
        await trio.lowlevel.checkpoint()
        return "MEMORY"

    async def publish(
        self, subject: str, data: bytes = b"", *, headers: Any = None, **_: Any
    ) -> None:
        await trio.lowlevel.checkpoint()
        message = PublishedMessage(subject, data, Headers(headers or {}))
        self.published.append(message)
        self.on_publish(message)

    def __getattr__(self, name: str) -> Any:
        raise NotInMemory(
            f"the in-memory harness has no JetStream {name!r}: a sink or operator that uses "
            "the JetStream API needs a real server (real=True)"
        )


class _PullView:
    """A pull subscription as the source sees it: ``consume`` and ``consumer.cached_info``."""

    def __init__(self, sub: MemorySubscription) -> None:
        self._sub = sub
        self.consumer = sub  # has ``cached_info``
        self.actors = sub.actors

    def consume(self, options: Any = None) -> Any:
        return self._sub.consume(options)
