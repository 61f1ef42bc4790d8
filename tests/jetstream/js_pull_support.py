"""Helpers for the pull consumer tests (``test_pull*.py``, ``test_consume*.py``).

- :func:`setup_pull`: a stream and a pull consumer on a real server.
- :func:`probed_consume`: a consume watched from outside (:class:`ConsumeProbe`: what the server
  sends its inbox, the buffer's counts after every task step), so tests wait for a buffer state
  as an event instead of sleeping.
- :class:`FakeJetStream`: a scripted server that speaks just enough of the protocol for a pull
  consumer, for exact status sequences a real server does not produce on demand.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import trio
import trio.testing
from headrace.jetstream import (
    AckPolicy,
    ConsumeBuffer,
    ConsumeOptions,
    ConsumerConfig,
    ConsumerInfo,
    JetStream,
    PullConsumer,
    StreamConfig,
)
from headrace.nats import Connection
from headrace.protocol.events import Msg

from tests.natspy_peer import consumer_info, wait_consumer

E = TypeVar("E")


async def setup_pull(
    js: JetStream,
    *,
    stream: str = "S",
    subjects: tuple[str, ...] = ("s.>",),
    consumer: str = "C",
    stream_kwargs: dict[str, Any] | None = None,
    **config: Any,
) -> PullConsumer:
    """Create ``stream`` (if needed) and a durable explicit-ack pull consumer on it."""
    try:
        await js.stream_info(stream)
    except Exception:
        await js.add_stream(
            StreamConfig(name=stream, subjects=list(subjects), **(stream_kwargs or {}))
        )
    config.setdefault("ack_policy", AckPolicy.EXPLICIT)
    await js.create_consumer(stream, ConsumerConfig(durable_name=consumer, **config))
    return await js.pull_consumer(stream, consumer)


async def publish_n(
    js: JetStream, n: int, subject: str = "s.x", payload: bytes = b"", start: int = 0
) -> list[int]:
    """Publish ``n`` messages whose data is their index (plus ``payload``); their stream seqs."""
    seqs = []
    for i in range(start, start + n):
        ack = await js.publish(subject, b"%d" % i + payload)
        seqs.append(ack.seq)
    return seqs


async def settle(timeout: float = 2) -> None:
    """Until every task is blocked (events already emitted have reached their watchers)."""
    with trio.fail_after(timeout):
        await trio.testing.wait_all_tasks_blocked()


def seq_of(msg: Any) -> int:
    return int(msg.metadata.stream_seq)


async def natspy_publish(natspy: Any, n: int, subject: str = "s.x", start: int = 0) -> None:
    """Publish ``n`` messages (data: their index) through nats-py, the independent peer."""

    async def go() -> None:
        js = natspy.nc.jetstream()
        for i in range(start, start + n):
            await js.publish(subject, b"%d" % i)

    await natspy.call(go)


async def consumer_state(natspy: Any, stream: str = "S", name: str = "C") -> Any:
    """Consumer info as nats-py (the independent peer) reads it."""
    return await consumer_info(natspy, stream, name)


async def poll_consumer(
    natspy: Any,
    predicate: Callable[[Any], bool],
    stream: str = "S",
    name: str = "C",
    timeout: float = 5.0,
) -> Any:
    """Consumer info once ``predicate(info)`` holds (polled: see ``wait_consumer``)."""
    return await wait_consumer(natspy, predicate, stream, name, timeout)


# -- watching a consume from outside -----------------------------------------------------------


class ConsumeProbe(trio.abc.Instrument):
    """Watches a real consume buffer from outside; nothing of the framework is replaced.

    - What the server sends to the consume's inbox, as the server copies it to a second
      subscription of the same connection, on all its inboxes (made before the consume starts,
      so nothing of its first request is missed): :attr:`statuses` and :attr:`user_msgs`.
    - The buffer's counts after every trio task step (a trio instrument; the counts change
      only in task steps): their maxima, for memory bound checks, and :meth:`wait_until`,
      woken in the step that makes its condition hold, instead of sleeping.

    Use it through :func:`probed_consume` (or :func:`watching`).
    """

    def __init__(self, nc: Connection) -> None:
        self.buffer: ConsumeBuffer | None = None
        #: (status, description) of every status message sent to the consume's inbox.
        self.statuses: list[tuple[int, str]] = []
        #: The user messages sent to the consume's inbox.
        self.user_msgs = 0
        self.max_buffered = 0
        self.max_pending_msgs = 0
        self.max_pending_bytes = 0
        self.max_buffered_bytes = 0
        self._early: list[Msg] = []  # inbox copies that came before the buffer was known
        self._waiters: list[tuple[Callable[[], bool], trio.Event]] = []
        self.sub = nc.subscribe_nowait(f"{nc.options.inbox_prefix}.>", handler=self._on_copies)

    def watch(self, buffer: ConsumeBuffer) -> None:
        self.buffer = buffer
        early, self._early = self._early, []
        self._on_copies(early)
        self.after_task_step(None)

    def _on_copies(self, batch: list[Msg]) -> None:
        """The server's copies of messages to the connection's inboxes (in its reader task)."""
        if self.buffer is None:
            self._early.extend(batch)
            return
        inbox = self.buffer.inbox_subject
        for msg in batch:
            if msg.subject != inbox:
                continue  # another inbox: a request's reply
            if msg.reply is not None:
                self.user_msgs += 1
            elif msg.status is not None:
                self.statuses.append((msg.status, msg.description))

    def after_task_step(self, task: Any) -> None:
        buffer = self.buffer
        if buffer is None:
            return
        self.max_buffered = max(self.max_buffered, buffer.buffered)
        self.max_pending_msgs = max(self.max_pending_msgs, buffer.pending_msgs)
        self.max_pending_bytes = max(self.max_pending_bytes, buffer.pending_bytes)
        self.max_buffered_bytes = max(self.max_buffered_bytes, buffer._buffered_bytes)
        for waiter in list(self._waiters):
            predicate, event = waiter
            if predicate():
                self._waiters.remove(waiter)
                event.set()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 5) -> None:
        """Until ``predicate()`` holds (checked after every task step)."""
        if predicate():
            return
        waiter = (predicate, trio.Event())
        self._waiters.append(waiter)
        try:
            with trio.fail_after(timeout):
                await waiter[1].wait()
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)


@asynccontextmanager
async def watching(nc: Connection) -> AsyncIterator[ConsumeProbe]:
    """A :class:`ConsumeProbe` on ``nc``, for a consume started in the block (a pipeline's,
    say): hand it the buffer with :meth:`ConsumeProbe.watch` once there is one."""
    probe = ConsumeProbe(nc)  # its SUB goes out before the consume's
    trio.lowlevel.add_instrument(probe)
    try:
        yield probe
    finally:
        trio.lowlevel.remove_instrument(probe)
        if not nc.is_closed:
            nc.unsubscribe_nowait(probe.sub)


@asynccontextmanager
async def probed_consume(
    consumer: PullConsumer, options: ConsumeOptions | None = None, **kwargs: Any
) -> AsyncIterator[tuple[ConsumeBuffer, ConsumeProbe]]:
    """``consumer.consume(options, **kwargs)``, watched by a :class:`ConsumeProbe`."""
    async with (
        watching(consumer.js.nc) as probe,
        consumer.consume(options, **kwargs) as messages,
    ):
        probe.watch(messages)
        yield messages, probe


# -- the scripted server ----------------------------------------------------------------------

FAKE_INFO = (
    b'INFO {"server_id":"FAKEJS","server_name":"fakejs","version":"2.10.0","headers":true,'
    b'"max_payload":1048576,"proto":1}\r\n'
)


@attrs.define
class PullReq:
    """One pull request as the fake server received it."""

    conn: int
    subject: str
    reply: str
    body: dict[str, Any]
    at: float

    @property
    def batch(self) -> int:
        return int(self.body.get("batch", 1))

    @property
    def max_bytes(self) -> int | None:
        return self.body.get("max_bytes")


class FakeJetStream:
    """A server for one pull consumer ``S``/``C``, driven by the test.

    It records pull requests (:attr:`requests`) and acks, answers PINGs, and sends what the
    test tells it to: user messages and status messages on a request's inbox. Connections
    after the first can be held back (:attr:`handshake_delay`) to make an outage of a chosen
    length; :meth:`drop` closes the current connection.
    """

    def __init__(self) -> None:
        self.requests: list[PullReq] = []
        self.acks: list[str] = []
        self.sids: dict[str, int] = {}
        self.connections = 0
        self.handshake_delay = 0.0
        self.stream_seq = 0
        #: Whether CONSUMER.INFO finds the consumer (the client asks after a 503).
        self.consumer_exists = True
        self.info_requests = 0
        self._stream: trio.SocketStream | None = None
        self._lock = trio.Lock()
        self._changed = trio.Event()

    # -- serving --------------------------------------------------------------------------

    async def start(self, nursery: trio.Nursery) -> str:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, self._handle, listeners)
        return f"nats://127.0.0.1:{listeners[0].socket.getsockname()[1]}"

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 5) -> None:
        with trio.fail_after(timeout):
            while not predicate():
                await self._changed.wait()

    async def request(self, index: int, timeout: float = 5) -> PullReq:
        """The ``index``-th pull request (0-based), waiting for it."""
        await self.wait_until(lambda: len(self.requests) > index, timeout)
        return self.requests[index]

    async def _handle(self, stream: trio.SocketStream) -> None:
        n = self.connections
        self.connections += 1
        if n > 0 and self.handshake_delay:
            await trio.sleep(self.handshake_delay)  # the outage: this connection waits
        try:
            await stream.send_all(FAKE_INFO)
            self._stream = stream
            self.sids = {}
            self._notify()
            buf = b""
            while True:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                buf = await self._process(stream, n, buf + chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            if self._stream is stream:
                self._stream = None
            self._notify()

    async def _process(self, stream: trio.SocketStream, n: int, buf: bytes) -> bytes:
        while True:
            eol = buf.find(b"\r\n")
            if eol < 0:
                return buf
            line = buf[:eol]
            parts = line.split()
            op = parts[0].upper() if parts else b""
            if op in (b"PUB", b"HPUB"):
                size = int(parts[-1])
                end = eol + 2 + size
                if len(buf) < end + 2:
                    return buf
                payload = buf[eol + 2 : end]
                buf = buf[end + 2 :]
                if op == b"HPUB":
                    payload = payload[int(parts[-2]) :]
                    reply = parts[2].decode() if len(parts) == 5 else None
                else:
                    reply = parts[2].decode() if len(parts) == 4 else None
                answer = self._on_pub(n, parts[1].decode(), reply, payload)
                if answer is not None:
                    async with self._lock:
                        await stream.send_all(answer)
                continue
            buf = buf[eol + 2 :]
            if op == b"PING":
                async with self._lock:
                    await stream.send_all(b"PONG\r\n")
            elif op == b"SUB":
                self.sids[parts[1].decode()] = int(parts[-1])
                self._notify()
            elif op == b"UNSUB":
                sid = int(parts[1])
                for subject, known in list(self.sids.items()):
                    if known == sid:
                        del self.sids[subject]
                self._notify()

    def _on_pub(self, n: int, subject: str, reply: str | None, payload: bytes) -> bytes | None:
        answer = None
        if subject.startswith("$JS.API.CONSUMER.MSG.NEXT."):
            body = json.loads(payload) if payload else {}
            assert reply is not None
            self.requests.append(PullReq(n, subject, reply, body, trio.current_time()))
        elif subject.startswith("$JS.ACK."):
            self.acks.append(subject)
        elif subject == "$JS.API.CONSUMER.INFO.S.C" and reply is not None:
            self.info_requests += 1
            answer = self._reply(reply, self._consumer_info())
        self._notify()
        return answer

    def _consumer_info(self) -> bytes:
        if not self.consumer_exists:
            error = {"code": 404, "err_code": 10014, "description": "consumer not found"}
            return json.dumps({"error": error}).encode()
        config = {"durable_name": "C", "ack_policy": "explicit"}
        return json.dumps({"stream_name": "S", "name": "C", "config": config}).encode()

    def _reply(self, reply: str, data: bytes) -> bytes | None:
        """A MSG to ``reply`` on whichever subscription covers it (the request inbox is a
        wildcard subscription)."""
        for subject, sid in self.sids.items():
            if subject == reply or (subject.endswith(".*") and reply.startswith(subject[:-1])):
                return f"MSG {reply} {sid} {len(data)}\r\n".encode() + data + b"\r\n"
        return None

    # -- sending --------------------------------------------------------------------------

    async def send(self, data: bytes) -> None:
        stream = self._stream
        assert stream is not None, "no client connected"
        async with self._lock:
            await stream.send_all(data)

    def user_msg(self, req: PullReq, data: bytes = b"x", subject: str = "s.x") -> bytes:
        """A user message for ``req``, with the next stream sequence."""
        self.stream_seq += 1
        seq = self.stream_seq
        reply = f"$JS.ACK.S.C.1.{seq}.{seq}.1700000000000000000.0"
        sid = self.sids[req.reply]
        return f"MSG {subject} {sid} {reply} {len(data)}\r\n".encode() + data + b"\r\n"

    def status(
        self, req: PullReq, code: int, description: str = "", headers: dict[str, Any] | None = None
    ) -> bytes:
        head = f"NATS/1.0 {code}" + (f" {description}" if description else "") + "\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()) + "\r\n"
        sid = self.sids[req.reply]
        raw = head.encode()
        return f"HMSG {req.reply} {sid} {len(raw)} {len(raw)}\r\n".encode() + raw + b"\r\n"

    async def send_msgs(self, req: PullReq, count: int, data: bytes = b"x") -> None:
        await self.send(b"".join(self.user_msg(req, data) for _ in range(count)))

    async def send_status(
        self, req: PullReq, code: int, description: str = "", **headers: Any
    ) -> None:
        hdrs = {k.replace("_", "-"): v for k, v in headers.items()}
        await self.send(self.status(req, code, description, hdrs))

    async def drop(self) -> None:
        stream = self._stream
        assert stream is not None
        self._stream = None
        await stream.aclose()


def fake_consumer(js: JetStream) -> PullConsumer:
    """A handle on the fake server's pull consumer, without a CONSUMER.INFO request."""
    info = ConsumerInfo(stream_name="S", name="C", config=ConsumerConfig(durable_name="C"))
    return PullConsumer(js, "S", "C", info)
