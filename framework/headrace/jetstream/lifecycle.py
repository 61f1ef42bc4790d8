"""The consumer lifecycle actor: what a subscription does with the consumer when it ends.

A subscription either created its consumer or bound to one that existed (ADR-15). Ending it
deletes only what it created, and only when nobody else may be using it. The rule
(:class:`DeletePolicy` ``AUTO``), which also settles ADR-15's queue-group hazard:

- an ephemeral consumer this subscription created is deleted;
- a durable it created for a plain (non-queue) push subscription is deleted;
- a durable it created for a queue group is deleted only if, after this member's interest is
  gone, the server reports the consumer as not ``push_bound``: no other member is subscribed.
  The first member of a group may have created the durable, but while others are bound it stays;
- a durable pull consumer is never deleted: several processes share pull consumers by design
  (scaling out) and nothing tells one that it is the last. Set ``inactive_threshold`` to have
  the server remove it once unused, or use ``DeletePolicy.ALWAYS``.

``ALWAYS`` deletes whatever this subscription created; ``NEVER`` deletes nothing.

Draining (ADR-15 "Drain"): stop the flow (the subscription's own ``stop_delivery``), let the
user read what is buffered, wait until what was handed out is acked (up to the deadline), then
delete. A deletion failure during a drain is reported as a :class:`ConsumerDeleteFailed` event
(the drain itself succeeded); during an unsubscribe it is raised, as ADR-15 asks.
"""

from __future__ import annotations

import contextlib
import enum
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import trio

from headrace._trio import EventHub, either
from headrace.actors.actor import Actor, ActorState
from headrace.errors import NatsError
from headrace.jetstream.errors import ConsumerNotFound, JetStreamError
from headrace.jetstream.events import ConsumerDeleteFailed, JetStreamEvent
from headrace.jetstream.message import OutstandingAcks

if TYPE_CHECKING:
    from headrace.jetstream.api import JetStreamAPI
    from headrace.jetstream.consumer_config import ConsumerInfo


class DeletePolicy(enum.Enum):
    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


@attrs.frozen(slots=True)
class _End:
    drain: bool
    deadline: float
    done: trio.Event
    result: list[BaseException | None]
    #: Set by whoever carries the request out: the actor, or the caller when the actor ended
    #: without taking it.
    taken: list[bool] = attrs.field(factory=lambda: [False])


class ConsumerLifecycle(Actor[_End]):
    """Owns the decision and the act of deleting the subscription's consumer."""

    def __init__(
        self,
        js: JetStreamAPI,
        stream: str,
        consumer: str,
        *,
        created: bool,
        durable: bool,
        queue: str | None,
        pull: bool,
        policy: DeletePolicy,
        hub: EventHub[JetStreamEvent],
        stop_delivery: Callable[[bool, float], Awaitable[None]],
        acks: OutstandingAcks | None,
    ) -> None:
        super().__init__(f"consumer-lifecycle:{stream}/{consumer}", inbox_size=1)
        self.js = js
        self.stream = stream
        self.consumer = consumer
        self.created = created
        self.durable = durable
        self.queue = queue
        self.pull = pull
        self.policy = policy
        self._hub = hub
        self._stop_delivery = stop_delivery
        self._acks = acks
        self.deleted = False
        self._request: _End | None = None

    async def should_delete(self) -> bool:
        """Apply the deletion rule (see the module docs)."""
        if not self.created or self.policy is DeletePolicy.NEVER:
            return False
        if self.policy is DeletePolicy.ALWAYS or not self.durable:
            return True
        if self.pull:
            return False
        if self.queue is None:
            return True
        return not await self._other_members_bound()

    async def _other_members_bound(self) -> bool:
        """Whether the queue group's consumer still has interest once ours is gone
        (:func:`settled_push_bound`). Another member joining meanwhile is seen as bound, which
        keeps the consumer: the safe side of the race."""
        info = await settled_push_bound(self.js, self.stream, self.consumer)
        return info is not None and info.push_bound

    async def end(self, *, drain: bool, timeout: float = math.inf) -> None:
        """Ask the actor to end the subscription; returns when done (raises what unsubscribe
        must raise)."""
        request = self._request
        if request is None:
            # One end per subscription: a second caller (an unsubscribe during a drain) waits
            # for the first instead of queueing a request nobody would take.
            request = _End(drain, trio.current_time() + timeout, trio.Event(), [None])
            self._request = request
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                await self.send(request)  # closed: the actor has ended, see below
        await either(request.done, self._done)
        if not request.done.is_set() and not request.taken[0]:
            # The actor ended without taking the request: cancelled together with the code it
            # serves, which then ends the subscription from a shielded scope (the request may
            # even sit in the inbox, sent after the cancellation but before the actor saw it).
            # Carry it out here rather than wait for an actor that is gone.
            request.taken[0] = True
            try:
                request.result[0] = await self._end(request)
            finally:
                request.done.set()
        await request.done.wait()
        if request.result[0] is not None:
            raise request.result[0]

    async def run(self) -> None:
        request = await self.inbox.receive()
        request.taken[0] = True
        try:
            self.state = ActorState.DRAINING if request.drain else self.state
            request.result[0] = await self._end(request)
        finally:
            request.done.set()

    async def _end(self, request: _End) -> BaseException | None:
        """Stop, then delete if the rule says so. Never raises: an error is the result (a
        drain reports a failed delete as an event), so the actor itself never fails and the
        caller's own exception is never replaced by ours."""
        with trio.move_on_at(request.deadline):
            try:
                await self._stop_delivery(request.drain, request.deadline)
                if request.drain and self._acks is not None:
                    await self._acks.wait_all_acked()
            except (JetStreamError, NatsError):
                pass  # stopping ran into a closed or lost connection: deletion may still work
        try:
            if await self.should_delete():
                await self.js.delete_consumer(self.stream, self.consumer)
                self.deleted = True
        except ConsumerNotFound:
            self.deleted = True  # already gone: the goal is reached
        except (JetStreamError, NatsError) as exc:
            # JetStreamError includes DecodeError: the API answered with something that is
            # not its JSON (a proxy, a broken server), which must not fail the actor either.
            if request.drain:
                self._hub.emit(ConsumerDeleteFailed(self.stream, self.consumer, exc))
                return None
            return exc
        return None


async def settled_push_bound(js: JetStreamAPI, stream: str, consumer: str) -> ConsumerInfo | None:
    """The consumer's info once ``push_bound`` is false, or as last seen if it stays true for
    about half a second; ``None`` if the consumer does not exist.

    The server updates ``push_bound`` shortly after it processes an UNSUB, not with it: right
    after a subscription ended (ours, or the one before a re-subscribe), "bound" may only mean
    "not updated yet". So a "bound" answer is checked again a few times before it is believed.
    """
    with contextlib.suppress(NatsError):
        await js.nc.flush()
    wait = 0.02
    while True:
        try:
            info = await js.consumer_info(stream, consumer)
        except ConsumerNotFound:
            return None
        if not info.push_bound or wait > 0.5:  # asked 6 times over 0.62 s
            return info
        await trio.sleep(wait)
        wait *= 2
