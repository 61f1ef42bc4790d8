"""A pull consumer handle (ADR-37 "Consumers"): fetch, next, consume, info, delete.

``fetch`` and ``next`` are one pull request each, on an inbox of their own (pull responses keep
the stream's subject, so they cannot share the request multiplexer's inbox, ADR-13), with a
client-side time limit a little longer than the server-side ``expires`` (ADR-37).
``consume`` is the consume buffer actor (:mod:`headrace.jetstream.consume`).

On a consumer with priority groups (ADR-42) both name a group, checked against the consumer's
configuration before anything is sent. The handle keeps the pin id of a ``pinned_client`` group
between calls (:attr:`PullConsumer.pin_id`), so that a fetch after a fetch, or a consume after
one, keeps the pin the server gave; ``unpin`` asks the server to move it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from headrace.actors.nursery import open_actor_nursery
from headrace.errors import NatsError, NoRespondersError
from headrace.jetstream.consume import ConsumeBuffer, ConsumeOptions
from headrace.jetstream.consumer_config import AckPolicy, ConsumerInfo
from headrace.jetstream.errors import (
    ConsumerNotFound,
    JetStreamError,
    JetStreamUnavailable,
    PriorityGroupError,
)
from headrace.jetstream.message import JsMsg, OutstandingAcks, wire_size
from headrace.jetstream.priority import (
    DEFAULT_PRIORITY_TIMEOUT,
    PriorityPolicy,
    PriorityPull,
    check_pull_fits,
    pin_id,
    priority_pull,
)
from headrace.jetstream.pull_flow import PullFlow, default_heartbeat
from headrace.jetstream.pull_request import BYTES_MODE_BATCH, msg_next_api
from headrace.jetstream.pull_status import pending_counts
from headrace.protocol.events import Msg

if TYPE_CHECKING:
    from headrace.jetstream.api import JetStreamAPI

#: Extra time the client waits beyond a request's ``expires`` for the server's 408.
CLIENT_MARGIN = 1.0
#: The least ``expires`` of a consume (ADR-37), but for a pin that lasts no longer.
MIN_EXPIRES = 1.0
DEFAULT_FETCH_EXPIRES = 30.0


class PullConsumer:
    """A pull consumer on ``stream`` named ``name``; ``info`` is the last known ConsumerInfo."""

    def __init__(self, js: JetStreamAPI, stream: str, name: str, info: ConsumerInfo) -> None:
        if info.config.is_push:
            from headrace.jetstream.errors import ConsumerConfigMismatch

            raise ConsumerConfigMismatch(
                f"consumer {name!r} on stream {stream!r} is push based (deliver subject "
                f"{info.config.deliver_subject!r}); subscribe to it instead of pulling"
            )
        self.js = js
        self.stream = stream
        self.name = name
        self.cached_info = info
        #: Counts messages handed out and not yet acked (set by a pull subscription's drain).
        self.tracker: OutstandingAcks | None = None
        #: Consume buffers running now (a pull subscription's drain drains them).
        self.active: set[ConsumeBuffer] = set()
        #: The pin id of the consumer's ``pinned_client`` group, as the server last handed it
        #: to this handle (``Nats-Pin-Id``); ``None`` while not pinned. Sent back by every pull.
        self.pin_id: str | None = None

    def __repr__(self) -> str:
        return f"<PullConsumer {self.stream}/{self.name}>"

    @property
    def ack_none(self) -> bool:
        return self.cached_info.config.ack_policy is AckPolicy.NONE

    async def info(self) -> ConsumerInfo:
        self.cached_info = await self.js.consumer_info(self.stream, self.name)
        return self.cached_info

    async def delete(self) -> None:
        await self.js.delete_consumer(self.stream, self.name)

    async def unpin(self, group: str) -> None:
        """Clear the pin of the ``pinned_client`` group ``group`` (ADR-42), whoever holds it:
        the server picks a new pinned client among the group's waiting pulls."""
        await self.js.unpin_consumer(self.stream, self.name, group)

    def _check_priority(self, pull: PriorityPull | None) -> None:
        """Refuse a pull that does not fit the consumer's priority groups, as known from its
        last info, before it is sent (typed, as the server's 400 would be)."""
        config = self.cached_info.config
        check_pull_fits(
            pull,
            config.priority_groups,
            config.priority_policy,
            stream=self.stream,
            consumer=self.name,
        )

    def _check_pin_renewed(self, expires: float) -> None:
        """A pinned client keeps its pin only by pulling again within ``priority_timeout``; an
        idle consume pulls again when its request expires, so that must come first. And
        ``expires`` is at least :data:`MIN_EXPIRES` (ADR-37), except on a pinned_client
        consumer whose pin lasts that long or less, which no such consume could keep (issue
        24: it could not be consumed at all)."""
        config = self.cached_info.config
        pinned = config.priority_policy == PriorityPolicy.PINNED_CLIENT
        timeout = config.priority_timeout or DEFAULT_PRIORITY_TIMEOUT
        if expires < MIN_EXPIRES and not (pinned and timeout <= MIN_EXPIRES):
            raise ValueError(
                f"consume expires must be at least {MIN_EXPIRES:g} second (ADR-37), not "
                f"{expires}; shorter only on a pinned_client consumer whose priority_timeout "
                f"is {MIN_EXPIRES:g} s or less"
            )
        if not pinned:
            return
        if expires >= timeout:
            raise PriorityGroupError(
                f"consume expires ({expires}s) must be shorter than the priority_timeout "
                f"({timeout}s) of pinned_client consumer {self.name!r} on stream "
                f"{self.stream!r}: the server drops a pin whose holder did not pull within "
                "it, and an idle consume pulls again only when its request expires (about "
                "half of the timeout is a good expires)"
            )

    # -- fetch and next -----------------------------------------------------------------------

    async def fetch(
        self,
        max_messages: int | None = None,
        *,
        max_bytes: int | None = None,
        expires: float = DEFAULT_FETCH_EXPIRES,
        no_wait: bool = False,
        idle_heartbeat: float | None = None,
        group: str | None = None,
        min_pending: int | None = None,
        min_ack_pending: int | None = None,
        priority: int | None = None,
    ) -> list[JsMsg]:
        """One pull request: up to ``max_messages`` messages (or ``max_bytes`` bytes).

        Returns when the batch is full or the request ends (the server's 404/408, or
        ``expires`` plus a margin on the client). With ``no_wait`` the server answers at once.
        Heartbeats are on by default for ``expires`` over 30 s (ADR-37); two missed end the
        fetch. Terminal statuses raise (:class:`ConsumerDeleted`, ...) unless messages came
        first, which are then returned; a 503 raises :class:`NoRespondersError`. With
        ``max_bytes``, a next message larger than that raises :class:`MessageTooLarge`.

        On a consumer with priority groups, ``group`` is required, with ``min_pending`` /
        ``min_ack_pending`` (overflow) or ``priority`` (prioritized) as its policy allows
        (:class:`PriorityPullRefused` otherwise). A ``pinned_client`` pull sends back the pin
        id of :attr:`pin_id`; a 423 (the pin moved on) forgets it and returns what came.
        """
        if max_messages is None and max_bytes is None:
            max_messages = 1
        if max_messages is not None and max_bytes is not None:
            raise ValueError("give max_messages or max_bytes, not both")
        pull = priority_pull(group, min_pending, min_ack_pending, priority)
        self._check_priority(pull)
        if idle_heartbeat is None and expires > 30 and not no_wait:
            idle_heartbeat = default_heartbeat(expires)
        bytes_mode = max_bytes is not None
        subject = self._next_subject
        flow = PullFlow(
            batch=max_messages if max_messages is not None else BYTES_MODE_BATCH,
            max_bytes=max_bytes,
            expires=None if no_wait else expires,
            heartbeat=idle_heartbeat,
            no_wait=no_wait,
            refill=False,
            stream=self.stream,
            consumer=self.name,
            subject=subject,
            priority=pull,
            pin_id=self.pin_id,
        )
        nc = self.js.nc
        inbox = nc.new_inbox()
        request = flow.pull(trio.current_time(), connected=True)
        assert request is not None  # a new flow asks once (it validated the request too)
        got: list[Msg] = []
        done = trio.Event()

        def on_batch(batch: list[Msg]) -> None:
            now = trio.current_time()
            flow.received(0, 0, now)  # any word from the server is activity
            for msg in batch:
                if done.is_set():  # (not flow.ended: what comes after an alarm is still kept)
                    return
                if msg.reply is not None:
                    got.append(msg)
                    if pull is not None and msg.raw_headers is not None:
                        found = pin_id(msg.raw_headers, msg.headers)
                        if found is not None:
                            flow.pinned(found)
                    if flow.received(1, wire_size(msg) if bytes_mode else 0, now) is not None:
                        done.set()
                    continue
                status = msg.status
                if status is None:
                    continue
                if flow.status(status, msg.description, *pending_counts(msg), now) is not None:
                    done.set()

        sub = nc.subscribe_nowait(inbox, handler=on_batch)
        try:
            await nc.publish(subject, request.encode(), reply=inbox)
            limit = (0 if no_wait else expires) + CLIENT_MARGIN
            with trio.move_on_after(limit):
                while not done.is_set():
                    with trio.move_on_at(flow.deadline(trio.current_time())):
                        await done.wait()
                    if not done.is_set() and flow.timer(trio.current_time()) is not None:
                        break  # heartbeats missed: the request is lost, conclude the fetch
        finally:
            if not nc.is_closed:
                await sub.unsubscribe()
        if pull is not None:
            self.pin_id = flow.pin_id  # the one it got, or None after a 423
        error = flow.error
        if error is not None and not got:
            if isinstance(error, NoRespondersError):
                raise await self._explain_no_responders(error)
            raise error
        ack_none, tracker = self.ack_none, self.tracker
        if tracker is not None and not ack_none:
            tracker.delivered(len(got))
        return [JsMsg(m, nc, ack_none, tracker) for m in got]

    async def _explain_no_responders(self, error: NoRespondersError) -> BaseException:
        """A pull nobody answered: say whether the consumer is gone or JetStream is not there."""
        try:
            await self.info()
        except ConsumerNotFound as exc:
            exc.__cause__ = error
            return exc
        except (JetStreamError, NatsError) as exc:
            exc.__cause__ = error
            return exc
        return JetStreamUnavailable(
            f"nothing served the pull request for consumer {self.name!r} on stream "
            f"{self.stream!r} although it exists: JetStream may be electing a leader; retry"
        )

    async def next(
        self,
        *,
        expires: float = DEFAULT_FETCH_EXPIRES,
        group: str | None = None,
        min_pending: int | None = None,
        min_ack_pending: int | None = None,
        priority: int | None = None,
    ) -> JsMsg | None:
        """One message, or ``None`` when none arrived before the request expired (the
        priority group settings as for :meth:`fetch`)."""
        batch = await self.fetch(
            1,
            expires=expires,
            group=group,
            min_pending=min_pending,
            min_ack_pending=min_ack_pending,
            priority=priority,
        )
        return batch[0] if batch else None

    @property
    def _next_subject(self) -> str:
        return self.js.api_subject(msg_next_api(self.stream, self.name))

    # -- consume ------------------------------------------------------------------------------

    @asynccontextmanager
    async def consume(
        self, options: ConsumeOptions | None = None, **kwargs: Any
    ) -> AsyncIterator[ConsumeBuffer]:
        """Consume continuously through a buffer refilled by pull requests (ADR-37).

        ``async with consumer.consume(max_messages=500) as messages:`` then ``async for msg in
        messages`` or ``await messages.next_batch()``. Keyword arguments are
        :class:`ConsumeOptions` fields. Leaving the block stops the buffer actor; call
        ``await messages.drain()`` first to read what was already sent.
        """
        opts = options if options is not None else ConsumeOptions(**kwargs)
        if options is not None and kwargs:
            raise TypeError("give options=ConsumeOptions(...) or keyword options, not both")
        self._check_priority(opts.priority_pull)
        self._check_pin_renewed(opts.expires)
        buffer = ConsumeBuffer(self, opts)
        async with open_actor_nursery() as nursery:
            await buffer.start(nursery)
            self.active.add(buffer)
            try:
                yield buffer
            finally:
                self.active.discard(buffer)
                buffer.close()
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await buffer.wait_stopped()
