"""A pull subscription: a :class:`PullConsumer` made by ADR-15's workflow, with a lifecycle.

It fetches and consumes like the consumer it wraps, and ends the ADR-15 way: ``unsubscribe``
stops and deletes what it created (by the lifecycle's rule, which keeps durable pull consumers:
they are shared), ``drain`` first stops requesting, lets running consumes deliver what was
already sent, and waits for outstanding acks.

Once ended (``unsubscribe``, ``drain``, or the end of its ``async with`` block), it takes no
more messages: ``fetch``, ``next`` and ``consume`` raise :class:`SubscriptionClosedError`.
A durable consumer outlives the subscription, so a pull sent then would still be served, and
its messages would sit unacked until ack_wait with nobody to process them. Consumes already
running end the way the ending asked (at once, or drained).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from headrace._trio import EventHub, EventWatcher
from headrace.actors.actor import Actor
from headrace.errors import SubscriptionClosedError
from headrace.jetstream.consume import ConsumeBuffer, ConsumeOptions
from headrace.jetstream.events import JetStreamEvent
from headrace.jetstream.lifecycle import ConsumerLifecycle, DeletePolicy
from headrace.jetstream.message import JsMsg, OutstandingAcks
from headrace.jetstream.pull_consumer import PullConsumer

if TYPE_CHECKING:
    from headrace.jetstream.api import JetStreamAPI
    from headrace.jetstream.subscribe import Bound


class PullSubscription:
    def __init__(self, js: JetStreamAPI, bound: Bound, delete_policy: DeletePolicy) -> None:
        info = bound.info
        self.consumer = PullConsumer(js, bound.stream, info.name, info)
        self.created = bound.created
        self._hub: EventHub[JetStreamEvent] = EventHub()
        self._acks = None if self.consumer.ack_none else OutstandingAcks()
        self.consumer.tracker = self._acks
        #: Why this subscription takes no more messages ("unsubscribed", ...), once it ended.
        self.ended: str | None = None
        self.lifecycle = ConsumerLifecycle(
            js,
            bound.stream,
            info.name,
            created=bound.created,
            durable=bool(info.config.durable_name),
            queue=None,
            pull=True,
            policy=delete_policy,
            hub=self._hub,
            stop_delivery=self._stop_delivery,
            acks=self._acks,
        )

    def __repr__(self) -> str:
        return f"<PullSubscription {self.consumer.stream}/{self.consumer.name}>"

    @property
    def actors(self) -> list[Actor[Any]]:
        return [self.lifecycle, *self.consumer.active]

    async def _start(self, nursery: trio.Nursery) -> None:
        await self.lifecycle.start(nursery)

    def events(self, buffer: int = 256) -> EventWatcher[JetStreamEvent]:
        """Lifecycle events (e.g. a failed delete after a drain); consume events are on each
        consume's own ``events()``."""
        return self._hub.watch(buffer)

    def _check_open(self) -> None:
        if self.ended is not None:
            raise SubscriptionClosedError(
                f"{self!r} has ended ({self.ended}): it pulls no more messages from consumer "
                f"{self.consumer.name!r}; subscribe again to pull"
            )

    async def fetch(self, max_messages: int | None = None, **kwargs: Any) -> list[JsMsg]:
        self._check_open()
        return await self.consumer.fetch(max_messages, **kwargs)

    async def next(self, **kwargs: Any) -> JsMsg | None:
        self._check_open()
        return await self.consumer.next(**kwargs)

    @asynccontextmanager
    async def consume(
        self, options: ConsumeOptions | None = None, **kwargs: Any
    ) -> AsyncIterator[ConsumeBuffer]:
        self._check_open()
        async with self.consumer.consume(options, **kwargs) as buffer:
            yield buffer

    async def _stop_delivery(self, drain: bool, deadline: float) -> None:
        buffers = list(self.consumer.active)
        if not drain:
            for buffer in buffers:
                buffer.close()
            return
        async with trio.open_nursery() as nursery:
            for buffer in buffers:
                nursery.start_soon(buffer.drain, max(deadline - trio.current_time(), 0.001))

    async def unsubscribe(self) -> None:
        self.ended = self.ended or "unsubscribed"
        if self.lifecycle.running:
            await self.lifecycle.end(drain=False)

    async def drain(self, timeout: float = 30.0) -> None:
        self.ended = self.ended or "drained"
        if self.lifecycle.running:
            await self.lifecycle.end(drain=True, timeout=timeout)

    def _close(self) -> None:
        self.ended = self.ended or "closed"
        self._hub.close()
