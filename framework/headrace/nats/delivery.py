"""The bounded buffer between the connection's reader and a subscription's consumer.

The reader hands over every message of a socket read for one subscription as one batch; the
consumer takes one message or a batch. Bounds are in messages and in bytes (payload plus header
block). What happens when they are hit is the subscription's :class:`SlowConsumerPolicy`:

``DROP``
    Keep what fits, drop the rest and count it (the connection reports a
    :class:`~headrace.nats.events.SlowConsumer` event). Other subscriptions are unaffected.
    This is core NATS semantics and the default.
``BACKPRESSURE``
    The reader waits until there is room, so the socket stops being read and TCP pushes back to
    the server. Nothing is dropped, but *every* subscription on the connection waits, PONGs
    included, and a server whose ``write_deadline`` passes closes the connection as a slow
    consumer. Use it where the flow is already bounded (a JetStream pull consumer asks only
    for what fits) or on a dedicated connection.

A batch is accepted whole when it starts below the bounds, so the buffer can exceed them by at
most one socket read.
"""

from __future__ import annotations

import enum
from collections import deque

import trio

from headrace.protocol.events import Msg, messages_size


class SlowConsumerPolicy(enum.Enum):
    """What a subscription does when its consumer falls behind (see module docs)."""

    DROP = "drop"
    BACKPRESSURE = "backpressure"


class DeliveryQueue:
    """A FIFO of messages with message and byte bounds, one consumer side, one producer side."""

    __slots__ = (
        "_bytes",
        "_closed",
        "_error",
        "_getters",
        "_interrupted",
        "_items",
        "_putters",
        "dropped",
        "max_bytes",
        "max_msgs",
        "policy",
    )

    def __init__(self, max_msgs: int, max_bytes: int, policy: SlowConsumerPolicy) -> None:
        if max_msgs < 1 or max_bytes < 1:
            raise ValueError("pending limits must be at least 1 message and 1 byte")
        self.max_msgs = max_msgs
        self.max_bytes = max_bytes
        self.policy = policy
        self._items: deque[Msg] = deque()
        self._bytes = 0
        self._getters = trio.lowlevel.ParkingLot()
        self._putters = trio.lowlevel.ParkingLot()
        self._closed = False
        self._error: BaseException | None = None
        self._interrupted = False
        self.dropped = 0

    @property
    def pending_msgs(self) -> int:
        return len(self._items)

    @property
    def pending_bytes(self) -> int:
        return self._bytes

    @property
    def closed(self) -> bool:
        return self._closed

    def _full(self) -> bool:
        return len(self._items) >= self.max_msgs or self._bytes >= self.max_bytes

    # -- producer -----------------------------------------------------------------------------

    def put_nowait(self, batch: list[Msg]) -> int:
        """Add what fits of ``batch`` (``DROP`` policy); return how many were dropped."""
        if self._closed:
            return 0
        room = self.max_msgs - len(self._items)
        accepted = batch if room >= len(batch) else batch[: max(room, 0)]
        size = 0
        if accepted:
            budget = self.max_bytes - self._bytes
            for i, msg in enumerate(accepted):
                size += msg.size
                if size > budget:
                    size -= msg.size
                    accepted = accepted[:i]
                    break
        dropped = len(batch) - len(accepted)
        if accepted:
            self._items.extend(accepted)
            self._bytes += size
            self._getters.unpark_all()
        self.dropped += dropped
        return dropped

    async def wait_room(self) -> None:
        """Wait while the buffer is full (``BACKPRESSURE``); return at once once closed."""
        while self._full() and not self._closed:
            await self._putters.park()

    def put_all(self, batch: list[Msg]) -> None:
        """Add all of ``batch`` regardless of the bounds (after :meth:`wait_room`)."""
        if self._closed:
            return
        self._items.extend(batch)
        self._bytes += messages_size(batch)
        self._getters.unpark_all()

    # -- consumer -----------------------------------------------------------------------------

    def _end(self) -> Msg:
        if self._error is not None:
            raise self._error
        raise trio.EndOfChannel

    async def get(self) -> Msg:
        """The next message; ``trio.EndOfChannel`` (or the close error) once closed and empty."""
        while not self._items:
            if self._closed:
                self._end()
            await self._getters.park()
        msg = self._items.popleft()
        self._bytes -= msg.size
        if self._putters:
            self._putters.unpark_all()
        return msg

    def interrupt(self) -> None:
        """Make a waiting (or the next) :meth:`get_batch` return an empty list at once, so its
        caller can act on something other than messages."""
        self._interrupted = True
        self._getters.unpark_all()

    async def get_batch(self, max_msgs: int | None = None) -> list[Msg]:
        """Every buffered message (up to ``max_msgs``), waiting for at least one; an empty list
        after :meth:`interrupt`."""
        while not self._items:
            if self._closed:
                self._end()
            if self._interrupted:
                self._interrupted = False
                return []
            await self._getters.park()
        items = self._items
        if max_msgs is None or max_msgs >= len(items):
            batch = list(items)
            items.clear()
            self._bytes = 0
        else:
            batch = [items.popleft() for _ in range(max_msgs)]
            self._bytes -= messages_size(batch)
        if self._putters:
            self._putters.unpark_all()
        return batch

    def get_nowait(self) -> Msg:
        if not self._items:
            if self._closed:
                self._end()
            raise trio.WouldBlock
        msg = self._items.popleft()
        self._bytes -= msg.size
        if self._putters:
            self._putters.unpark_all()
        return msg

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self, error: BaseException | None = None) -> None:
        """No more puts; getters drain what is buffered, then end (or raise ``error``)."""
        if self._closed:
            return
        self._closed = True
        self._error = error
        self._getters.unpark_all()
        self._putters.unpark_all()

    def discard(self) -> int:
        """Drop everything buffered (a hard close); return how many messages were dropped."""
        n = len(self._items)
        self._items.clear()
        self._bytes = 0
        self._putters.unpark_all()
        return n

    async def wait_empty(self) -> None:
        """Return once the consumer has taken everything (used by drain)."""
        while self._items:
            await self._putters.park()
