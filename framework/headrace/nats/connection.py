"""The connection supervisor actor: one NATS connection, kept alive across server failures.

:func:`connect` is an async context manager. Its tasks live in a nursery inside the caller's
``async with``, so the connection is part of the caller's task tree: leaving the block closes
it, and nothing outlives it.

Inside, one supervisor task owns the socket. Per live connection (a *session*) it runs three
tasks that end together:

- the reader: ``receive_some`` into the sans-IO parser; messages grouped per subscription and
  handed over one batch per read; PING, PONG, INFO and -ERR handled in place;
- the writer: the only task that writes, sending everything queued in one ``send_all``;
- the pinger: a PING every ``ping_interval``; ``max_pings_out`` unanswered ones end the session.

When a session ends without being asked to, the supervisor reports ``Disconnected``, walks the
server pool with jittered exponential backoff (first pass immediate, ADR-40), and on success
re-sends CONNECT, then every SUB, then what was published meanwhile, before ``Reconnected``.

What to say and what the server's words mean is not decided here: one sans-IO
:class:`~headrace.protocol.session.ClientSession` per connection owns the handshake, the merged
INFO, the PINGs outstanding, the SUB table and its replay, and the meaning of ``-ERR``; which
server to dial next, when, and when to give up is :class:`~headrace.nats.redial.Redial`'s (also
sans-IO); :func:`~headrace.nats.dial.dial` moves the handshake's bytes over TCP and TLS. This
module is the driver: it owns the clock, the tasks, the live socket, the outbound buffer and
the user-facing API, and acts on the session's notices.

The supervisor and session tasks, and the calls that change the connection's state in several
steps (queueing, subscribing, terminating), are protected from ``KeyboardInterrupt``
(``trio.lowlevel.enable_ki_protection``): trio then delivers a Ctrl-C to the application's main
task at its next checkpoint instead of raising it here. Raised in the writer, it ended the
connection under a pipeline that was about to drain: its acks were never sent, and the drain
waited out its timeout.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio

from headrace._trio import BodyError, EventHub, EventWatcher
from headrace._version import __version__
from headrace.errors import (
    ConnectionClosedError,
    ConnectionLostError,
    DrainTimeout,
    FlushTimeout,
    NatsError,
    NoServersError,
    PermissionViolation,
    ProtocolError,
    RequestTimeout,
)
from headrace.nats.auth import Credentials
from headrace.nats.delivery import SlowConsumerPolicy
from headrace.nats.dial import DIAL_ERRORS, Transport, dial
from headrace.nats.events import (
    Closed,
    Connected,
    ConnectionEvent,
    Disconnected,
    LameDuck,
    Reconnected,
    ServerErrorEvent,
    ServersDiscovered,
    SlowConsumer,
    Status,
)
from headrace.nats.inbox import PendingRequest, RequestMux, answer, new_inbox
from headrace.nats.options import DEFAULT_URL, ConnectOptions
from headrace.nats.outbound import OutboundBuffer, PongWaiter
from headrace.nats.redial import Dial, GiveUp, Redial, fatal_on_first_connect
from headrace.nats.servers import PoolEntry, ServerAddress, ServerPool
from headrace.nats.statistics import Statistics
from headrace.nats.subscription import BatchHandler, Subscription
from headrace.protocol.commands import encode_hpub, encode_pub
from headrace.protocol.events import Event, Msg, ServerInfo
from headrace.protocol.headers import Headers, encode_header_block
from headrace.protocol.session import (
    ClientSession,
    InfoChanged,
    Notice,
    PongReceived,
    SendNow,
    ServerErrorReport,
    SessionConfig,
)


class _ReconnectRequested(Exception):
    """Ends a session on purpose (``reconnect()``); not an error the user sees."""


class Connection:
    """A NATS connection. Create it with :func:`connect`; see the module docs."""

    def __init__(self, options: ConnectOptions) -> None:
        self._opts = options
        self._pool = ServerPool(
            options.servers,
            randomize=not options.dont_randomize,
            use_discovered=not options.ignore_discovered_servers,
        )
        self._redial = Redial(
            self._pool,
            max_attempts=options.max_reconnect_attempts,
            wait=options.reconnect_wait,
            wait_max=options.reconnect_wait_max,
            jitter=options.reconnect_jitter,
            custom=options.reconnect_delay,
        )
        self._out = OutboundBuffer(options.write_buffer_size, options.reconnect_buffer_size)
        self._hub: EventHub[ConnectionEvent] = EventHub()
        # Every protocol decision (handshake, INFO, PING accounting, the SUB table, -ERR) is
        # the sans-IO session's; this class does the I/O and the trio side.
        self._session: ClientSession[Subscription] = ClientSession(
            SessionConfig(
                version=__version__,
                ping_interval=options.ping_interval,
                max_pings_out=options.max_pings_out,
                pedantic=options.pedantic,
                echo=not options.no_echo,
                name=options.name,
            )
        )
        #: The session's SUB table, read here to route messages (changed only through it).
        self._subs: dict[int, Subscription] = self._session.subs
        self._status = Status.CONNECTING  # of the link: CONNECTING/CONNECTED/RECONNECTING/CLOSED
        self._draining = False
        self._connected = trio.Event()
        self._closed = trio.Event()
        self._close_error: BaseException | None = None
        self._transport: Transport | None = None
        self._last_info: ServerInfo | None = None
        self._last_address: ServerAddress | None = None
        self._session_scope: trio.CancelScope | None = None
        self._session_error: BaseException | None = None
        self._supervisor_scope = trio.CancelScope()
        self._supervisor_done = trio.Event()
        self._mux: RequestMux | None = None
        self._publish_denied: list[tuple[str, Callable[[PermissionViolation], None]]] = []
        self._ever_connected = False
        self.stats = Statistics()

    # -- state --------------------------------------------------------------------------------

    @property
    def options(self) -> ConnectOptions:
        return self._opts

    @property
    def status(self) -> Status:
        """``DRAINING`` from :meth:`drain` until closed, whatever reconnects happen meanwhile."""
        if self._draining and self._status is not Status.CLOSED:
            return Status.DRAINING
        return self._status

    #: The connection's name as an actor, in pipeline graphs and progress views.
    actor_name = "connection-supervisor"

    @property
    def actor_state(self) -> str:
        """The supervisor's state in actor terms: running, restarting (reconnecting),
        draining, stopped (closed as asked) or failed (closed after an error)."""
        status = self.status
        if status is Status.CLOSED:
            return "failed" if self._close_error is not None else "stopped"
        return {
            Status.CONNECTING: "starting",
            Status.CONNECTED: "running",
            Status.RECONNECTING: "restarting",
            Status.DRAINING: "draining",
        }[status]

    @property
    def is_connected(self) -> bool:
        return self._transport is not None and self._status is Status.CONNECTED

    @property
    def is_closed(self) -> bool:
        return self._status is Status.CLOSED

    @property
    def server_info(self) -> ServerInfo | None:
        """INFO of the server we are (or were last) connected to."""
        return self._transport.info if self._transport is not None else self._last_info

    @property
    def connected_server(self) -> ServerAddress | None:
        t = self._transport
        return t.entry.address if t is not None and self.is_connected else None

    @property
    def servers(self) -> list[ServerAddress]:
        """The server pool: configured servers and those learned from INFO."""
        return [e.address for e in self._pool.entries]

    @property
    def max_payload(self) -> int | None:
        info = self.server_info
        return info.max_payload if info is not None else None

    @property
    def last_error(self) -> BaseException | None:
        """Why the connection closed, when it was not asked to."""
        return self._close_error

    def events(self, buffer: int = 256) -> EventWatcher[ConnectionEvent]:
        """A new watcher of connection events (use ``with``, iterate with ``async for``)."""
        return self._hub.watch(buffer)

    async def wait_connected(self) -> None:
        """Return once connected (at once if connected now); raise if the connection closes."""
        while not self.is_connected:
            if self.is_closed:
                raise self._closed_error()
            async with trio.open_nursery() as nursery:

                async def closed(scope: trio.CancelScope = nursery.cancel_scope) -> None:
                    await self._closed.wait()
                    scope.cancel()

                nursery.start_soon(closed)
                await self._connected.wait()
                nursery.cancel_scope.cancel()

    def new_inbox(self) -> str:
        return new_inbox(self._opts.inbox_prefix)

    def _closed_error(self) -> ConnectionClosedError:
        err = ConnectionClosedError(
            "the connection is closed"
            + (f" after: {self._close_error}" if self._close_error else "")
        )
        err.__cause__ = self._close_error
        return err

    def _check_open(self) -> None:
        if self._status is Status.CLOSED:
            raise self._closed_error()

    # -- publishing ---------------------------------------------------------------------------

    async def publish(
        self,
        subject: str,
        data: bytes = b"",
        *,
        reply: str | None = None,
        headers: Headers | Mapping[str, str | list[str]] | None = None,
        wildcards: bool = False,
    ) -> None:
        """Queue a message for ``subject``.

        Returns once queued, not once sent: use :meth:`flush` to know the server has it. While
        disconnected, messages are kept (``reconnect_buffer_size``) and sent after the
        reconnect; :class:`~headrace.errors.OutboundBufferFull` when that is full. A subject
        with ``*`` or ``>`` tokens is refused unless ``wildcards`` (for an API subject that
        carries a filter, such as JetStream's consumer create: the server takes it).
        """
        self._check_open()
        max_payload = self.max_payload
        if headers is None:
            cmd = encode_pub(subject, data, reply, max_payload=max_payload, wildcards=wildcards)
            size = len(data)
        else:
            hdrs = headers if isinstance(headers, Headers) else Headers(headers)
            block = encode_header_block(hdrs)
            cmd = encode_hpub(
                subject, block, data, reply, max_payload=max_payload, wildcards=wildcards
            )
            size = len(block) + len(data)
        await self._out.put(cmd)
        self.stats.out_msgs += 1
        self.stats.out_bytes += size

    @trio.lowlevel.enable_ki_protection
    def publish_nowait(self, subject: str, data: bytes = b"", reply: str | None = None) -> None:
        """Queue a small message at once, without a checkpoint and without validation.

        For subjects that came from the server (``$JS.ACK`` replies) or that the library built
        (pull requests), where a checkpoint per message would cost more than the message: it
        may exceed ``write_buffer_size`` (the writer catches up), but while disconnected the
        reconnect buffer bound still holds (:class:`~headrace.errors.OutboundBufferFull`).
        User data belongs in :meth:`publish`.
        """
        self._check_open()
        self._out.put_nowait(encode_pub(subject, data, reply, check=False))
        self.stats.out_msgs += 1
        self.stats.out_bytes += len(data)

    @trio.lowlevel.enable_ki_protection
    def write_nowait(self, encoded: bytes, messages: int, payload_bytes: int = 0) -> None:
        """Queue ``messages`` already encoded PUB commands, like :meth:`publish_nowait` (no
        validation, reconnect bound honoured). For callers that encode a whole batch at once,
        such as acking a batch of JetStream messages; ``payload_bytes`` is what their payloads
        add up to (for ``stats.out_bytes``)."""
        self._check_open()
        self._out.put_nowait(encoded)
        self.stats.out_msgs += messages
        self.stats.out_bytes += payload_bytes

    def on_publish_denied(
        self, prefix: str, callback: Callable[[PermissionViolation], None]
    ) -> Callable[[], None]:
        """Call ``callback`` with every permissions violation the server reports for a publish
        to a subject starting with ``prefix``; returns the function that stops it.

        A refused publish is not answered: the server sends ``-ERR`` naming the subject and
        drops the message. For publishes nobody waits on (acks, say) this is the only way the
        publisher can learn of it; the same error also goes to every ``events()`` watcher as a
        :class:`ServerErrorEvent`, where a busy watcher may miss it. The callback runs in the
        reader task: it must not block, and should not raise.
        """
        entry = (prefix, callback)
        self._publish_denied.append(entry)

        def remove() -> None:
            if entry in self._publish_denied:
                self._publish_denied.remove(entry)

        return remove

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until the server has processed everything queued before this call.

        Implemented as a PING whose PONG comes back after the server read all that preceded
        it. Raises :class:`~headrace.errors.FlushTimeout` after ``timeout`` seconds (default
        ``request_timeout``).
        """
        self._check_open()
        waiter = PongWaiter()
        self._out.request_ping(waiter)
        limit = self._opts.request_timeout if timeout is None else timeout
        with trio.move_on_after(limit):
            await waiter.wait()
            return
        raise FlushTimeout(f"the server did not answer a flush within {limit}s")

    # -- subscribing --------------------------------------------------------------------------

    async def subscribe(
        self,
        subject: str,
        *,
        queue: str | None = None,
        max_pending_msgs: int | None = None,
        max_pending_bytes: int | None = None,
        slow_consumer: SlowConsumerPolicy | None = None,
    ) -> Subscription:
        """Subscribe to ``subject`` (wildcards allowed), optionally in a queue group.

        Pending limits and the slow consumer policy default to the connection's options.
        """
        return self.subscribe_nowait(
            subject,
            queue=queue,
            max_pending_msgs=max_pending_msgs,
            max_pending_bytes=max_pending_bytes,
            slow_consumer=slow_consumer,
        )

    @trio.lowlevel.enable_ki_protection
    def subscribe_nowait(
        self,
        subject: str,
        *,
        queue: str | None = None,
        max_pending_msgs: int | None = None,
        max_pending_bytes: int | None = None,
        slow_consumer: SlowConsumerPolicy | None = None,
        handler: BatchHandler | None = None,
    ) -> Subscription:
        """:meth:`subscribe` without a checkpoint; ``handler`` makes an internal subscription
        whose batches go straight to a non-blocking function instead of a buffer."""
        self._check_open()
        if self._draining and handler is None:
            raise NatsError("the connection is draining; no new subscriptions")
        opts = self._opts
        sid = self._session.next_sid(subject, queue)  # validates before anything changes
        sub = Subscription(
            self,
            sid,
            subject,
            queue,
            max_pending_msgs=max_pending_msgs or opts.pending_msgs_limit,
            max_pending_bytes=max_pending_bytes or opts.pending_bytes_limit,
            policy=slow_consumer or opts.slow_consumer_policy,
            handler=handler,
        )
        cmd = self._session.add(sub)
        if cmd is not None:
            self._out.append(cmd)
        # else: the SUB goes out with all the others when the connection is (re)established.
        return sub

    @property
    def subscriptions(self) -> list[Subscription]:
        return list(self._subs.values())

    async def _unsubscribe(self, sub: Subscription, max_msgs: int | None) -> None:
        if max_msgs is not None and max_msgs > sub.delivered:
            sub.max_msgs = max_msgs
            cmd = self._session.limit(sub.sid, max_msgs)
        else:
            cmd = self._session.unsubscribe(sub.sid)
            sub._finish(None)
        if cmd is not None:
            self._out.append(cmd)

    def unsubscribe_nowait(self, sub: Subscription) -> None:
        """Unsubscribe at once, without a checkpoint (for code that cannot await: a
        subscription's own cleanup). Nothing is sent once the connection is closed."""
        if sub.is_closed:
            return
        cmd = self._session.unsubscribe(sub.sid)
        sub._finish(None)
        if cmd is not None and not self.is_closed:
            self._out.append(cmd)

    def _forget(self, sub: Subscription) -> None:
        self._session.forget(sub.sid)

    async def _drain_subscription(self, sub: Subscription, timeout: float | None) -> None:
        limit = self._opts.drain_timeout if timeout is None else timeout
        try:
            with trio.move_on_after(limit) as scope:
                if sub.sid in self._subs and not self.is_closed:
                    # Not re-sent if a reconnect happens meanwhile.
                    cmd = self._session.stop_replay(sub.sid)
                    if cmd is not None:
                        self._out.append(cmd)
                    # The server handles the UNSUB before the PING: once the PONG is back,
                    # every message it will send for this sid has been routed to the buffer.
                    # If the connection is lost instead, nothing more can come either (the
                    # sid is not re-sent), so the drain goes on with what arrived.
                    try:
                        await self.flush(limit)
                    except ConnectionLostError:
                        pass
                self._forget(sub)
                sub._finish(None)
                await sub._queue.wait_empty()
        finally:
            # Whatever happened (timeout, cancellation, a closed connection), the subscription
            # is over: nobody may be left waiting on it.
            self._forget(sub)
            sub._finish(None)
        if scope.cancelled_caught:
            unread = sub._queue.discard()
            raise DrainTimeout(
                f"{sub!r} was not drained within {limit}s; {unread} messages were not read",
                unread,
            )

    def _report_slow_consumer(self, sub: Subscription) -> None:
        self._hub.emit(SlowConsumer(sub.sid, sub.subject, sub.dropped))

    # -- requests -----------------------------------------------------------------------------

    def _request_mux(self) -> RequestMux:
        if self._mux is None:
            mux = RequestMux(self._opts.inbox_prefix)
            mux.sid = self.subscribe_nowait(mux.subject, handler=mux.on_batch).sid
            self._mux = mux
        return self._mux

    async def request(
        self,
        subject: str,
        data: bytes = b"",
        *,
        headers: Headers | Mapping[str, str | list[str]] | None = None,
        timeout: float | None = None,
        wildcards: bool = False,
    ) -> Msg:
        """Publish a request and wait for the first reply.

        :class:`~headrace.errors.NoRespondersError` when nobody listens on ``subject``,
        :class:`~headrace.errors.RequestTimeout` after ``timeout`` (default ``request_timeout``).
        ``wildcards`` as for :meth:`publish`.
        """
        mux = self._request_mux()
        reply, slot = mux.register(subject)
        limit = self._opts.request_timeout if timeout is None else timeout
        try:
            with trio.move_on_after(limit):
                await self.publish(subject, data, reply=reply, headers=headers, wildcards=wildcards)
                await slot.event.wait()
                return answer(slot, subject)
            raise RequestTimeout(f"no reply to the request on {subject!r} within {limit}s")
        finally:
            mux.unregister(reply)

    @trio.lowlevel.enable_ki_protection
    def request_soon(
        self, subject: str, data: bytes = b"", *, timeout: float | None = None
    ) -> PendingRequest:
        """Queue a request now, without a checkpoint, and wait for its reply later
        (:meth:`PendingRequest.reply`, or :meth:`PendingRequest.abandon` it). Like
        :meth:`publish_nowait`, it may exceed ``write_buffer_size``: for small requests the
        library makes (a Direct Get sent alongside a KV write), not for user data."""
        self._check_open()
        limit = self._opts.request_timeout if timeout is None else timeout
        pending = PendingRequest(self._request_mux(), subject, limit)
        try:
            self._out.put_nowait(
                encode_pub(subject, data, pending.reply_subject, max_payload=self.max_payload)
            )
        except BaseException:
            pending.abandon()
            raise
        self.stats.out_msgs += 1
        self.stats.out_bytes += len(data)
        return pending

    # -- the supervisor -----------------------------------------------------------------------

    async def _open(self, entry: PoolEntry) -> Transport:
        self._redial.dialing(entry, trio.current_time())
        return await dial(entry, self._opts, self._session, self.stats)

    async def _connect_initial(self) -> Transport:
        """Each server once; refused credentials or TLS end it at once (see ``redial``)."""
        errors: dict[str, BaseException] = {}
        for _ in range(len(self._pool)):
            entry = self._pool.next()
            try:
                return await self._open(entry)
            except DIAL_ERRORS as exc:
                if fatal_on_first_connect(exc):
                    raise
                entry.last_error = exc
                errors[str(entry.address)] = exc
        detail = "; ".join(f"{url}: {exc}" for url, exc in errors.items())
        raise NoServersError(f"could not connect to any server ({detail})", errors)

    @trio.lowlevel.enable_ki_protection
    async def _supervise(
        self,
        transport: Transport | None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        if transport is None:
            task_status.started()
            task_status = trio.TASK_STATUS_IGNORED
        try:
            with self._supervisor_scope:
                while True:
                    if transport is None:
                        transport = await self._reconnect()
                        if transport is None:
                            return
                    error = await self._run_session(transport, task_status)
                    task_status = trio.TASK_STATUS_IGNORED
                    self._redial.lost(transport.entry)
                    transport = None
                    if self.is_closed:
                        return
                    if isinstance(error, _ReconnectRequested):
                        error = None
                    address = self._last_address
                    assert address is not None
                    self._status = Status.RECONNECTING
                    self._connected = trio.Event()
                    self._hub.emit(Disconnected(address, error))
                    if not self._opts.allow_reconnect:
                        self._terminate(error or ConnectionClosedError("disconnected"))
                        return
        finally:
            self._supervisor_done.set()

    async def _reconnect(self) -> Transport | None:
        """Dial what :class:`~headrace.nats.redial.Redial` says, when it says, until a server
        takes us or it gives up (then close)."""
        redial = self._redial
        while True:
            step = redial.next()
            if type(step) is GiveUp:
                self._terminate(step.error)
                return None
            assert type(step) is Dial
            await trio.sleep_until(step.at)
            try:
                return await self._open(step.entry)
            except DIAL_ERRORS as exc:
                redial.failed(step.entry, exc)

    async def _run_session(
        self, t: Transport, task_status: trio.TaskStatus[None]
    ) -> BaseException | None:
        """Run reader, writer and pinger on ``t`` until one fails or we are told to stop."""
        self._transport = t
        self._last_address = t.entry.address
        self._last_info = t.info
        self._session_error = None
        self._redial.connected(t.entry)
        # Synchronously, so that no subscribe() can slip between the snapshot and the switch:
        # every SUB first, then what was queued while we were away.
        resubs = self._session.established()
        if resubs:
            self._out.prepend(resubs)
        self._out.set_connected(True)
        self._status = Status.CONNECTED
        self.stats.connects += 1
        if self._ever_connected:
            self.stats.reconnects += 1
            self._hub.emit(Reconnected(t.entry.address))
        else:
            self._ever_connected = True
            self._hub.emit(Connected(t.entry.address))
        self._connected.set()
        # The handshake INFO may already list the cluster or announce lame duck mode.
        self._on_info(t.info)
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                self._session_scope = nursery.cancel_scope
                nursery.start_soon(self._guard, self._reader, t)
                nursery.start_soon(self._guard, self._writer, t)
                nursery.start_soon(self._guard, self._pinger)
        finally:
            self._session_scope = None
            self._session.connection_lost()
            self._out.set_connected(False)
            self._transport = None
            await trio.aclose_forcefully(t.stream)
        return self._session_error

    @trio.lowlevel.enable_ki_protection
    async def _guard(self, fn: Any, *args: Any) -> None:
        """Run a session task; its failure (or its end) ends the session."""
        try:
            await fn(*args)
        except Exception as exc:
            if self._session_error is None:
                self._session_error = exc
        if self._session_scope is not None:
            self._session_scope.cancel()

    # -- session tasks ------------------------------------------------------------------------

    @trio.lowlevel.enable_ki_protection
    async def _reader(self, t: Transport) -> None:
        stream, parser, stats = t.stream, t.parser, self.stats
        read_size = self._opts.read_size
        # Message bytes as the server counts them: the parser sums them as it reads the sizes
        # (this transport's parser counts from zero; the statistics span every transport).
        base = stats.in_bytes
        stats.in_bytes = base + parser.message_bytes  # what arrived with the handshake's PONG
        if t.leftover:
            await self._dispatch(t.leftover)
            t.leftover = []
        while True:
            data = await stream.receive_some(read_size)
            if not data:
                raise ConnectionResetError(f"{t.entry.address} closed the connection")
            stats.in_wire_bytes += len(data)
            try:
                events = parser.feed(data)
            except ProtocolError as exc:
                stats.in_bytes = base + parser.message_bytes
                await self._dispatch(list(exc.events))  # type: ignore[arg-type]
                raise
            stats.in_bytes = base + parser.message_bytes
            await self._dispatch(events)

    async def _dispatch(self, events: list[Event]) -> None:
        """Route messages to subscriptions, one batch per run of the same sid; handle the rest."""
        batch: list[Msg] = []
        sid = -1
        for event in events:
            if type(event) is Msg:
                if event.sid == sid:
                    batch.append(event)
                    continue
                if batch:
                    await self._route(sid, batch)
                sid = event.sid
                batch = [event]
                continue
            if batch:
                await self._route(sid, batch)
                batch = []
                sid = -1
            self._control(event)
        if batch:
            await self._route(sid, batch)

    async def _route(self, sid: int, batch: list[Msg]) -> None:
        stats = self.stats
        stats.in_msgs += len(batch)
        sub = self._subs.get(sid)
        if sub is not None:
            await sub._deliver(batch)

    def _control(self, event: Event) -> None:
        notice = self._session.receive(event)
        if notice is not None:
            self._act(notice)

    def _act(self, notice: Notice) -> None:
        """Do what the session asks after a control event of the reader's."""
        if type(notice) is SendNow:
            self._out.append(notice.data)
        elif type(notice) is PongReceived:
            self._out.pong()
        elif type(notice) is InfoChanged:
            self._on_info(notice.info)
        elif isinstance(notice, ServerErrorReport):
            self._on_server_error(notice)

    def _on_info(self, info: ServerInfo) -> None:
        t = self._transport
        if t is None:
            return
        t.info = info
        self._last_info = info
        added = self._pool.add_discovered(info.connect_urls, source=t.entry)
        if added:
            self._hub.emit(ServersDiscovered(tuple(added)))
        if info.lame_duck_mode:
            self._hub.emit(LameDuck(t.entry.address))

    def _on_server_error(self, report: ServerErrorReport[Subscription]) -> None:
        error = report.error
        self._hub.emit(ServerErrorEvent(error))
        if isinstance(error, PermissionViolation):
            mux = self._mux
            ended = report.ended
            if ended is not None:
                # The server dropped our interest (the session took it out of its table).
                ended._finish(error)
                if mux is not None and ended.sid == mux.sid:
                    # The shared inbox is gone: fail its requests, make a new one next.
                    mux.fail(error)
                    self._mux = None
            elif error.operation != "subscription":
                if error.operation == "publish":
                    for prefix, callback in list(self._publish_denied):
                        if error.subject.startswith(prefix):
                            callback(error)
                if mux is not None:
                    if error.operation == "reply":
                        mux.fail_reply(error, error.subject)
                    else:
                        mux.fail(error, error.subject)
            return
        if report.terminal:
            raise error

    @trio.lowlevel.enable_ki_protection
    async def _writer(self, t: Transport) -> None:
        out, stream, stats = self._out, t.stream, self.stats
        while True:
            await out.wait()
            data = out.take()
            await stream.send_all(data)
            stats.out_wire_bytes += len(data)
            stats.writes += 1

    @trio.lowlevel.enable_ki_protection
    async def _pinger(self) -> None:
        opts = self._opts
        session = self._session
        while True:
            await trio.sleep(opts.ping_interval)
            session.ping_due(trio.current_time())  # raises once the connection is stale
            self._out.request_ping(None)

    # -- ending -------------------------------------------------------------------------------

    @trio.lowlevel.enable_ki_protection
    def _terminate(self, error: BaseException | None) -> None:
        """Close for good: everything waiting learns why; nothing blocks."""
        if self._status is Status.CLOSED:
            return
        self._status = Status.CLOSED
        self._close_error = error
        self._supervisor_scope.cancel()
        closed = self._closed_error()
        self._out.close(closed)
        for sub in self._session.close():
            sub._finish(None if error is None else closed)
        if self._mux is not None:
            self._mux.fail(closed)
        self._closed.set()
        self._hub.emit(Closed(error))
        self._hub.close()

    async def close(self) -> None:
        """Send what is queued (best effort, within ``connect_timeout``), then close.

        Subscriptions end (their iteration stops after what is buffered); waiting requests and
        flushes fail with :class:`~headrace.errors.ConnectionClosedError`.
        """
        if self._status is Status.CLOSED:
            await self._supervisor_done.wait()
            return
        with trio.CancelScope(shield=True):
            if self.is_connected:
                # Also when the buffer is empty: the writer may be inside send_all with bytes
                # it took, and only a PONG says they arrived.
                with trio.move_on_after(self._opts.connect_timeout):
                    try:
                        await self.flush(self._opts.connect_timeout)
                    except NatsError:
                        pass  # lost or timed out: we close anyway, as asked
            self._terminate(None)
            await self._supervisor_done.wait()

    async def drain(self, timeout: float | None = None) -> None:
        """Stop every subscription, let subscribers read what is buffered, flush, close.

        New subscriptions are refused while draining; publishing (and requests) still work
        until the end. Raises :class:`~headrace.errors.DrainTimeout` when subscribers did not
        read everything within ``timeout`` (default ``drain_timeout``); the connection is
        closed either way.
        """
        self._check_open()
        if self._draining:
            raise NatsError("the connection is already draining")
        limit = self._opts.drain_timeout if timeout is None else timeout
        deadline = trio.current_time() + limit
        self._draining = True
        errors: list[BaseException] = []
        try:
            async with trio.open_nursery() as nursery:
                for sub in list(self._subs.values()):
                    if sub._handler is None:
                        nursery.start_soon(self._drain_one, sub, limit, errors)
            try:
                await self.flush(max(deadline - trio.current_time(), 0.001))
            except (FlushTimeout, ConnectionLostError) as exc:
                errors.append(exc)
        finally:
            await self.close()
        if errors:
            raise errors[0]

    async def _drain_one(
        self, sub: Subscription, limit: float, errors: list[BaseException]
    ) -> None:
        try:
            await self._drain_subscription(sub, limit)
        except NatsError as exc:
            errors.append(exc)

    async def reconnect(self) -> None:
        """Drop the current connection and go through the reconnect process (ADR-40
        on-demand reconnect): subscriptions are re-sent, queued publishes kept."""
        self._check_open()
        if self._session_scope is not None and self._session_error is None:
            self._session_error = _ReconnectRequested()
            self._session_scope.cancel()

    def set_server_pool(self, servers: list[str]) -> None:
        """Use exactly ``servers`` for future reconnects (ADR-40 custom server pool)."""
        self._pool.replace(servers)


@asynccontextmanager
async def connect(
    servers: str | list[str] | tuple[str, ...] = DEFAULT_URL,
    *,
    options: ConnectOptions | None = None,
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
    nkey_seed: str | None = None,
    creds_file: str | None = None,
    **kwargs: Any,
) -> AsyncIterator[Connection]:
    """Connect to NATS for the duration of the ``async with`` block.

    ``servers`` is one URL or a list; keyword arguments are :class:`ConnectOptions` fields,
    plus the credential shorthands ``user``/``password``, ``token``, ``nkey_seed`` (a seed or
    a file holding one) and ``creds_file``. Or pass a complete ``options``.

    Raises :class:`~headrace.errors.AuthorizationError` for rejected credentials,
    :class:`~headrace.errors.TLSError` for TLS failures, and
    :class:`~headrace.errors.NoServersError` when no server could be reached.
    """
    if options is None:
        creds = Credentials(
            user=user, password=password, token=token, nkey_seed=nkey_seed, creds_file=creds_file
        )
        options = ConnectOptions(
            servers=(servers,) if isinstance(servers, str) else tuple(servers),
            credentials=creds,
            **kwargs,
        )
    elif kwargs or any(v is not None for v in (user, password, token, nkey_seed, creds_file)):
        raise TypeError("give either options=ConnectOptions(...) or keyword options, not both")
    conn = Connection(options)
    # The first connection is made outside the nursery, and the body's own exception is kept
    # out of it too, so the caller sees typed errors as raised, not wrapped in an
    # ExceptionGroup. Failures of the connection's own tasks still propagate, as they should.
    transport: Transport | None = None
    if not options.retry_on_failed_connect:
        transport = await conn._connect_initial()
    body = BodyError()
    async with trio.open_nursery() as nursery:
        try:
            # Returns with the first session active, so the body can publish at once.
            await nursery.start(conn._supervise, transport)
        except BaseException:
            if transport is not None and conn._transport is None:
                await trio.aclose_forcefully(transport.stream)
            raise
        try:
            with body:
                yield conn
        finally:
            await conn.close()
    body.reraise()


__all__ = ["Connection", "Statistics", "connect"]
