"""Subscriptions: interest in a subject, and the messages that arrive for it.

A subscription is read as an async iterator (one message at a time) or in batches with
:meth:`Subscription.next_batch`, which is the fast path: every message the reader parsed for
this subscription in one socket read arrives together.

It ends in one of three ways, which :meth:`Subscription.wait_closed` reports (ADR-40 asks for
a close signal that does not throw): unsubscribed or drained by the user (iteration ends), the
connection closed (iteration ends; with an error if the close was not asked for), or the server
cancelled our interest, e.g. a permissions violation (iteration raises that typed error after
the messages already buffered).
"""

from __future__ import annotations

import math
from typing import Protocol

import trio

from headrace.errors import SubscriptionClosedError
from headrace.nats.delivery import DeliveryQueue, SlowConsumerPolicy
from headrace.protocol.events import Msg


class BatchHandler(Protocol):
    """An internal consumer called by the reader with each batch; it must not block."""

    def __call__(self, batch: list[Msg]) -> None: ...


class SubscriptionOwner(Protocol):
    """What a subscription asks of the connection that made it: the connection owns the SUB
    table and the socket, so ending or draining goes through it. Named here, and met by
    :class:`~headrace.nats.connection.Connection`, so that this module never imports that
    one: the connection makes subscriptions, not the other way round."""

    async def _unsubscribe(self, sub: Subscription, max_msgs: int | None) -> None: ...

    async def _drain_subscription(self, sub: Subscription, timeout: float | None) -> None: ...

    def _report_slow_consumer(self, sub: Subscription) -> None: ...

    def _forget(self, sub: Subscription) -> None: ...


class Subscription:
    """Interest in ``subject`` (optionally in a queue group) on one connection."""

    def __init__(
        self,
        conn: SubscriptionOwner,
        sid: int,
        subject: str,
        queue: str | None,
        *,
        max_pending_msgs: int,
        max_pending_bytes: int,
        policy: SlowConsumerPolicy,
        handler: BatchHandler | None = None,
    ) -> None:
        self._conn = conn
        self.sid = sid
        self.subject = subject
        self.queue = queue
        self._handler = handler
        self._queue = DeliveryQueue(max_pending_msgs, max_pending_bytes, policy)
        #: Messages the server sent to this subscription so far (dropped ones included).
        self.delivered = 0
        #: ``UNSUB <sid> <max>`` in force: the total after which the server stops sending.
        self.max_msgs: int | None = None
        self._closed = trio.Event()
        self._close_error: BaseException | None = None
        self._slow = False

    def __repr__(self) -> str:
        queue = f", queue={self.queue!r}" if self.queue else ""
        return f"<Subscription sid={self.sid} subject={self.subject!r}{queue}>"

    # -- reading ------------------------------------------------------------------------------

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Msg:
        try:
            return await self._queue.get()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    async def next_msg(self, timeout: float | None = None) -> Msg:
        """The next message; ``trio.TooSlowError`` after ``timeout`` seconds.

        Raises :class:`SubscriptionClosedError` once the subscription has ended and everything
        buffered was read, or the error that ended it.
        """
        with trio.fail_after(math.inf if timeout is None else timeout):
            try:
                return await self._queue.get()
            except trio.EndOfChannel:
                raise SubscriptionClosedError(f"{self!r} is closed") from None

    async def next_batch(self, max_msgs: int | None = None) -> list[Msg]:
        """Every buffered message (at most ``max_msgs``), waiting for at least one.

        Raises like :meth:`next_msg` once the subscription has ended and nothing is left.
        """
        try:
            return await self._queue.get_batch(max_msgs)
        except trio.EndOfChannel:
            raise SubscriptionClosedError(f"{self!r} is closed") from None

    @property
    def pending_msgs(self) -> int:
        """Messages received and not yet read."""
        return self._queue.pending_msgs

    @property
    def pending_bytes(self) -> int:
        return self._queue.pending_bytes

    @property
    def dropped(self) -> int:
        """Messages dropped because the consumer fell behind (``DROP`` policy)."""
        return self._queue.dropped

    @property
    def is_closed(self) -> bool:
        return self._closed.is_set()

    @property
    def error(self) -> BaseException | None:
        """Why the subscription ended, when it was not asked to."""
        return self._close_error

    async def wait_closed(self) -> BaseException | None:
        """Wait until no more messages will arrive; return the error that ended it, if any."""
        await self._closed.wait()
        return self._close_error

    # -- ending -------------------------------------------------------------------------------

    async def unsubscribe(self, max_msgs: int | None = None) -> None:
        """Stop now, or once ``max_msgs`` messages in total have been delivered.

        Messages already buffered can still be read after an immediate unsubscribe.
        """
        await self._conn._unsubscribe(self, max_msgs)

    async def drain(self, timeout: float | None = None) -> None:
        """Stop interest, wait for messages in flight, then for the consumer to read them all."""
        await self._conn._drain_subscription(self, timeout)

    # -- called by the connection -------------------------------------------------------------

    async def _deliver(self, batch: list[Msg]) -> int:
        """Hand over one batch from the reader; return how many messages were dropped.

        Applies the auto-unsubscribe limit and the slow consumer policy; waits only under
        ``BACKPRESSURE``.
        """
        queue = self._queue
        if self._handler is None and queue.policy is SlowConsumerPolicy.BACKPRESSURE:
            await queue.wait_room()  # first, so the limit below is the one in force after it
        limit = self.max_msgs
        done = False
        if limit is not None and limit - self.delivered <= len(batch):
            batch = batch[: max(limit - self.delivered, 0)]
            done = True
        dropped = 0
        if batch:
            if self._handler is not None:
                self._handler(batch)
            elif queue.policy is SlowConsumerPolicy.DROP:
                dropped = queue.put_nowait(batch)
            else:
                queue.put_all(batch)
            self.delivered += len(batch)
        if dropped:
            if not self._slow:
                self._slow = True
                self._conn._report_slow_consumer(self)
        elif self._slow:
            self._slow = False
        if done:
            self._conn._forget(self)
            self._finish(None)
        return dropped

    def _finish(self, error: BaseException | None) -> None:
        """No more messages will be added; the consumer reads what is left."""
        if self._closed.is_set():
            return
        self._close_error = error
        self._queue.close(error)
        self._closed.set()
