"""The JetStream context (ADR-37's JetStreamContext): the API client and the subscriptions.

:class:`JetStream` is :class:`JetStreamAPI` (the API requests: streams,
consumers, publish, stored messages) plus the factory of what reads messages: a handle on a
pull consumer, ADR-15's push and pull subscriptions, ordered consumers (ADR-17). The split keeps
the imports one way: the modules that run a subscription need only the API requests and name
:class:`JetStreamAPI`; only this module, which makes them, imports them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

import trio

from headrace.actors.nursery import open_actor_nursery
from headrace.errors import ConnectionClosedError, NatsError
from headrace.jetstream.api import JetStreamAPI
from headrace.jetstream.async_publish import (
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_PENDING_BYTES,
    DEFAULT_RETRY_ATTEMPTS,
    DEFAULT_RETRY_WAIT,
    AsyncPublisher,
    open_async_publisher,
)
from headrace.jetstream.consumer_config import ConsumerConfig
from headrace.jetstream.errors import JetStreamError, SubscribeError
from headrace.jetstream.lifecycle import DeletePolicy
from headrace.jetstream.names import check_consumer, check_stream
from headrace.jetstream.ordered import OrderedSubscription
from headrace.jetstream.ordered_pull import OrderedConsumer, OrderedConsumerConfig, ordered_consumer
from headrace.jetstream.pull_consumer import PullConsumer
from headrace.jetstream.pull_subscription import PullSubscription
from headrace.jetstream.push import PushSubscription
from headrace.jetstream.subscribe import bind_pull, bind_push


class JetStream(JetStreamAPI):
    """The JetStream API of one connection, and the subscriptions made on it.

    ``domain`` selects a JetStream domain (``$JS.<domain>.API``); ``api_prefix`` replaces the
    prefix altogether (for imports across accounts); give at most one. ``timeout`` is the
    default time limit of each API call, in seconds. The API requests (streams, consumers,
    publish, stored messages) are :class:`JetStreamAPI`'s.
    """

    def async_publisher(
        self,
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        timeout: float | None = None,
        retry_attempts: int = DEFAULT_RETRY_ATTEMPTS,
        retry_wait: float = DEFAULT_RETRY_WAIT,
    ) -> AbstractAsyncContextManager[AsyncPublisher]:
        """Publish with many PubAcks in flight: ``async with js.async_publisher() as pub``,
        then ``pending = await pub.publish(...)`` and, when wanted, ``await pending.ack()``
        (:mod:`headrace.jetstream.async_publish`). At most ``max_pending`` PubAcks are
        outstanding, for at most ``max_pending_bytes`` of messages (headers and payloads);
        each must come within ``timeout`` seconds (default: this context's);
        "no responders" is retried as :meth:`publish` does. Leaving the block waits for
        every PubAck and raises :class:`AsyncPublishFailed` for failures nobody awaited."""
        return open_async_publisher(
            self.nc,
            max_pending=max_pending,
            max_pending_bytes=max_pending_bytes,
            timeout=self.timeout if timeout is None else timeout,
            retry_attempts=retry_attempts,
            retry_wait=retry_wait,
        )

    async def ordered_consumer(
        self, stream: str, config: OrderedConsumerConfig | None = None, **kwargs: Any
    ) -> OrderedConsumer:
        """A pull-based ordered consumer of ``stream``: fetch, fetch by bytes, no-wait fetch
        and next, in stream order, exactly once (:mod:`headrace.jetstream.ordered_pull`)."""
        return await ordered_consumer(self, stream, config, **kwargs)

    async def pull_consumer(self, stream: str, name: str) -> PullConsumer:
        """A handle on the existing pull consumer ``stream``/``name`` (ADR-37 getConsumer)."""
        check_stream("stream", stream)
        check_consumer("name", name)
        return PullConsumer(self, stream, name, await self.consumer_info(stream, name))

    # -- subscriptions (ADR-15 workflow) ------------------------------------------------------

    @asynccontextmanager
    async def subscribe(
        self,
        subject: str | None = None,
        *,
        stream: str | None = None,
        durable: str | None = None,
        bind: str | None = None,
        queue: str | None = None,
        config: ConsumerConfig | None = None,
        ordered: bool = False,
        delete_policy: DeletePolicy = DeletePolicy.AUTO,
        heartbeat_factor: float = 3.0,
        max_pending_msgs: int = 64 * 1024,
        max_pending_bytes: int = 64 * 1024 * 1024,
    ) -> AsyncIterator[PushSubscription]:
        """Subscribe to a push consumer, created or bound by ADR-15's workflow.

        ``durable`` names a durable to create or reuse; ``bind`` names an existing consumer
        that must exist; ``queue`` joins a queue group (its name is the durable if none is
        given). ``ordered=True`` makes an ordered consumer (ADR-17). The subscription's actors
        run until the block ends, which unsubscribes (see :class:`DeletePolicy`).
        """
        cfg = config or ConsumerConfig()
        # Checked before anything exists on the server, so a bad argument leaks nothing.
        if heartbeat_factor < 1:
            raise ValueError(f"heartbeat_factor must be at least 1, not {heartbeat_factor}")
        if max_pending_msgs < 1 or max_pending_bytes < 1:
            raise ValueError("max_pending_msgs and max_pending_bytes must be at least 1")
        sub: PushSubscription
        if ordered:
            if durable or bind or queue:
                raise SubscribeError(
                    "an ordered consumer is ephemeral and private: no durable, bind or queue"
                )
            sub = await OrderedSubscription.create(
                self, subject, stream=stream, config=cfg, heartbeat_factor=heartbeat_factor
            )
        else:
            bound = await bind_push(
                self,
                subject,
                stream=stream,
                durable=durable,
                bind=bind,
                queue=queue,
                config=cfg,
            )
            sub = PushSubscription(
                self,
                bound.stream,
                bound.info,
                queue=queue,
                created=bound.created,
                delete_policy=delete_policy,
                heartbeat_factor=heartbeat_factor,
                max_pending_msgs=max_pending_msgs,
                max_pending_bytes=max_pending_bytes,
            )
            assert bound.sub is not None and bound.inlet is not None
            sub._attach(bound.sub, bound.inlet)
        async with _running(sub):
            yield sub

    @asynccontextmanager
    async def pull_subscribe(
        self,
        subject: str | None = None,
        *,
        stream: str | None = None,
        durable: str | None = None,
        bind: str | None = None,
        config: ConsumerConfig | None = None,
        delete_policy: DeletePolicy = DeletePolicy.AUTO,
    ) -> AsyncIterator[PullSubscription]:
        """A pull subscription by ADR-15's workflow (a missing named consumer is created)."""
        bound = await bind_pull(
            self,
            subject,
            stream=stream,
            durable=durable,
            bind=bind,
            config=config or ConsumerConfig(),
        )
        sub = PullSubscription(self, bound, delete_policy)
        async with _running(sub):
            yield sub


class _Subscription(Protocol):
    async def _start(self, nursery: trio.Nursery) -> None: ...
    async def unsubscribe(self) -> None: ...
    def _close(self) -> None: ...


@asynccontextmanager
async def _running(sub: _Subscription) -> AsyncIterator[None]:
    """Run a subscription's actors for the ``async with`` block, then end it (ADR-15
    unsubscribe: delete what it should). When the block raised, a failure to delete is not
    allowed to hide that error; otherwise it is raised."""
    async with open_actor_nursery() as nursery:
        await sub._start(nursery)
        try:
            yield
        except BaseException:
            with trio.CancelScope(shield=True), contextlib.suppress(JetStreamError, NatsError):
                await sub.unsubscribe()
            raise
        else:
            with trio.CancelScope(shield=True):
                try:
                    await sub.unsubscribe()
                except ConnectionClosedError:
                    pass  # nothing to delete with; an ephemeral expires on the server anyway
        finally:
            sub._close()
