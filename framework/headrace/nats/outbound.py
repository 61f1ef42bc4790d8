"""The outbound buffer: everything queued for the socket, and the PINGs we owe answers to.

One writer task owns the socket (see :mod:`headrace.nats.connection`). Everyone else appends to
this buffer; the writer takes all of it in one piece and sends it with one ``send_all``, so a
burst of publishes or of acks costs one system call.

Limits:

- While connected, ``publish`` waits when more than ``high_water`` bytes are queued: a fast
  producer is slowed to the socket's pace instead of growing memory.
- While disconnected, publishes are kept up to ``reconnect_buffer`` bytes and sent after the
  reconnect; beyond that :class:`~headrace.errors.OutboundBufferFull` is raised and nothing of
  that call is queued (ADR-40 "disconnect buffer").

Control commands (PONG, SUB, UNSUB) bypass both limits; they are small and must not wait
behind data. When the connection is lost the queued bytes stay and are sent after the reconnect,
behind the re-sent SUBs: a stale PONG, a duplicate SUB or an UNSUB of a forgotten sid is
harmless to the server, and queued publishes are what the reconnect buffer is for.

PINGs are not put in the buffer. A flush registers a :class:`PongWaiter`; the writer appends
one ``PING`` after the data it takes when waiters are pending, and all of them are answered by
the PONG of that PING (PONGs come back in order).

A flush means "the server has processed everything queued before it", so a lost connection
must not turn it into a false success. Each take of data is numbered and each PONG confirms the
takes up to its PING. When the connection is lost with takes that no PONG confirmed, those
bytes may never have reached the server: every waiting flush fails with
:class:`~headrace.errors.ConnectionLostError`. When nothing unconfirmed was lost (for instance
a flush called while already disconnected), waiters are re-armed and pinged after the
reconnect, behind the buffered publishes they vouch for.

Every method that changes the buffer is protected from ``KeyboardInterrupt``: it is called from
the application's tasks too (publishes, acks), and a Ctrl-C raised halfway through would leave
the chunks, their size and the PING groups out of step.
"""

from __future__ import annotations

from collections import deque

import trio

from headrace.errors import ConnectionLostError, OutboundBufferFull
from headrace.protocol.commands import PING


class PongWaiter:
    """A flush waiting for the PONG that answers its PING."""

    __slots__ = ("error", "event")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.error: BaseException | None = None

    async def wait(self) -> None:
        await self.event.wait()
        if self.error is not None:
            raise self.error

    def _resolve(self, error: BaseException | None = None) -> None:
        if not self.event.is_set():
            self.error = error
            self.event.set()


class OutboundBuffer:
    """Bytes queued for the socket, with connected/disconnected limits, and PING bookkeeping."""

    def __init__(self, high_water: int, reconnect_buffer: int) -> None:
        self.high_water = high_water
        self.reconnect_buffer = reconnect_buffer
        self._chunks: list[bytes] = []
        self._size = 0
        self.connected = False
        #: Set when the connection closes for good: every later put raises it.
        self.closed_error: BaseException | None = None
        self._writer = trio.lowlevel.ParkingLot()
        self._space = trio.lowlevel.ParkingLot()
        # PING groups: waiters to ping for, and those whose PING went out, oldest first, with
        # the number of the take each PING ended.
        self._unsent: list[PongWaiter | None] = []
        self._sent: deque[tuple[int, list[PongWaiter | None]]] = deque()
        self._takes = 0  # takes of data on the current connection
        self._confirmed = 0  # takes a PONG has confirmed

    @property
    def size(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return bool(self._chunks) or bool(self._unsent)

    # -- producers ----------------------------------------------------------------------------

    @trio.lowlevel.enable_ki_protection
    def append(self, data: bytes) -> None:
        """Queue ``data`` now, whatever the limits (control commands)."""
        self._chunks.append(data)
        self._size += len(data)
        if self._writer:
            self._writer.unpark_all()

    @trio.lowlevel.enable_ki_protection
    def prepend(self, data: bytes) -> None:
        """Queue ``data`` before everything else (SUBs re-sent after a reconnect)."""
        self._chunks.insert(0, data)
        self._size += len(data)
        if self._writer:
            self._writer.unpark_all()

    @trio.lowlevel.enable_ki_protection
    def put_nowait(self, data: bytes) -> None:
        """Queue small data without waiting: over ``high_water`` while connected is allowed
        (the writer catches up), but the reconnect buffer bound holds while disconnected."""
        if self.closed_error is not None:
            raise self.closed_error
        if not self.connected and self._size + len(data) > self.reconnect_buffer:
            raise OutboundBufferFull(
                f"disconnected and the reconnect buffer is full ({self._size} of "
                f"{self.reconnect_buffer} bytes); this publish was not queued"
            )
        self.append(data)

    async def put(self, data: bytes) -> None:
        """Queue published data, waiting for room while connected, refusing when disconnected
        and the reconnect buffer is full."""
        while True:
            if self.closed_error is not None:
                raise self.closed_error
            if not self.connected:
                if self._size + len(data) > self.reconnect_buffer:
                    raise OutboundBufferFull(
                        f"disconnected and the reconnect buffer is full ({self._size} of "
                        f"{self.reconnect_buffer} bytes); this publish was not queued"
                    )
                break
            if self._size < self.high_water:
                break
            await self._space.park()
        self.append(data)

    @trio.lowlevel.enable_ki_protection
    def request_ping(self, waiter: PongWaiter | None) -> None:
        """Ask the writer to send a PING; ``waiter`` (if any) is resolved by its PONG."""
        self._unsent.append(waiter)
        if self._writer:
            self._writer.unpark_all()

    # -- the writer ---------------------------------------------------------------------------

    async def wait(self) -> None:
        """Wait until there is something to send."""
        while not self:
            await self._writer.park()

    @trio.lowlevel.enable_ki_protection
    def take(self) -> bytes:
        """Everything queued, plus one PING if any flush waits; the buffer is emptied."""
        chunks = self._chunks
        self._takes += 1
        if self._unsent:
            chunks.append(PING)
            self._sent.append((self._takes, self._unsent))
            self._unsent = []
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._size = 0
        if self._space:
            self._space.unpark_all()
        return data

    @trio.lowlevel.enable_ki_protection
    def pong(self) -> None:
        """A PONG arrived: it answers the oldest PING group."""
        if self._sent:
            self._confirmed, group = self._sent.popleft()
            for waiter in group:
                if waiter is not None:
                    waiter._resolve()

    # -- state changes ------------------------------------------------------------------------

    @trio.lowlevel.enable_ki_protection
    def set_connected(self, connected: bool) -> None:
        was_connected, self.connected = self.connected, connected
        if was_connected and not connected:
            waiters = [w for _, group in self._sent for w in group] + self._unsent
            self._sent.clear()
            self._unsent = []
            if self._takes > self._confirmed:
                lost = ConnectionLostError(
                    "the connection was lost before the server confirmed the flush; what was "
                    "published before it may not have arrived"
                )
                for waiter in waiters:
                    if waiter is not None:
                        waiter._resolve(lost)
            else:
                self._unsent = [w for w in waiters if w is not None]
            self._takes = self._confirmed = 0
        self._space.unpark_all()

    @trio.lowlevel.enable_ki_protection
    def close(self, error: BaseException) -> None:
        """Closed for good: fail waiting flushes and publishers, refuse everything after."""
        self.closed_error = error
        self.connected = False
        self.fail_waiters(error)

    @trio.lowlevel.enable_ki_protection
    def fail_waiters(self, error: BaseException) -> None:
        for group in [*(g for _, g in self._sent), self._unsent]:
            for waiter in group:
                if waiter is not None:
                    waiter._resolve(error)
        self._sent.clear()
        self._unsent = []
        self._space.unpark_all()
