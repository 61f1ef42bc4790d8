"""The actor primitive: a named trio task with a bounded inbox and an observable state.

An actor is started in a nursery (so its lifetime is a scope in the caller's task tree), is
addressed by its inbox, and reports what it is doing through :attr:`Actor.state`. A full inbox is
backpressure: :meth:`Actor.send` waits, :meth:`Actor.tell` says no. Everything here is generic
and knows nothing of NATS, which is why it sits below the connection layer.

There is one way to run an actor, :meth:`Actor.start` (``supervise`` is the same for
``nursery.start``): without a policy, its error propagates as raised (the JetStream layer's
actors, whose errors are the caller's); with one (supervision.py), it is restarted or escalates
as :class:`~headrace.actors.policy.ActorFailed`. Its state and inbox change in this module
only.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from typing import Generic, TypeVar

import trio

from headrace.actors.policy import ActorFailed, Restart, RestartPolicy

M = TypeVar("M")


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` is a cancellation: ``Cancelled``, or a group of nothing else (what a
    nursery inside a cancelled scope raises)."""
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(is_cancellation(e) for e in exc.exceptions)
    return False


class ActorState(enum.Enum):
    """What an actor is doing, for progress views and health checks."""

    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


class Actor(Generic[M]):
    """Base class: subclasses implement :meth:`run`, reading :attr:`inbox` as they need.

    ``inbox_size`` bounds the inbox (``0`` makes every send a rendezvous).
    """

    def __init__(self, name: str, inbox_size: int | float = 64) -> None:
        if not name:
            raise ValueError("an actor needs a name")
        self.name = name
        self._send, self.inbox = trio.open_memory_channel[M](inbox_size)
        self.state = ActorState.STARTING
        self.error: BaseException | None = None
        #: Times the supervisor restarted this actor.
        self.restarts = 0
        self._scope: trio.CancelScope | None = None
        self._done = trio.Event()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self.state.value}>"

    async def run(self) -> None:
        """The actor's loop; returning ends it (STOPPED), raising fails it (FAILED)."""
        raise NotImplementedError

    async def start(self, nursery: trio.Nursery, policy: RestartPolicy | None = None) -> None:
        """Start in ``nursery``; returns once the actor is RUNNING. ``policy``: what a failure
        does (supervision.py); None: the error propagates as raised, nothing restarts."""
        await nursery.start(self.lifetime, policy)

    # Protected from KeyboardInterrupt, with all it calls: trio hands a Ctrl-C to the
    # application's main task instead (supervision.py, shutdown.py).
    @trio.lowlevel.enable_ki_protection
    async def lifetime(
        self,
        policy: RestartPolicy | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The actor's whole life, as a task function (:meth:`start`, ``supervise``): run,
        and on failure restart or escalate by ``policy``. However it ends (stopped, failed,
        cancelled, even during a restart's backoff), the inbox then refuses messages and
        :meth:`wait_stopped` returns."""
        try:
            await self._run_under(policy, task_status)
        finally:
            if self.state in (ActorState.RUNNING, ActorState.RESTARTING, ActorState.STARTING):
                self.state = ActorState.STOPPED
            self._send.close()
            self._done.set()

    async def _run_under(
        self, policy: RestartPolicy | None, task_status: trio.TaskStatus[None]
    ) -> None:
        failures: deque[float] = deque()
        started = False
        with trio.CancelScope() as scope:
            self._scope = scope
            while True:
                self.state = ActorState.RUNNING
                if not started:
                    started = True
                    task_status.started()
                try:
                    await self.run()
                except BaseException as exc:
                    if is_cancellation(exc):
                        self.state = ActorState.STOPPED
                        raise
                    self.state = ActorState.FAILED
                    if not isinstance(exc, Exception):
                        raise
                    self.error = exc
                    if policy is None:
                        raise
                    if not isinstance(policy, Restart) or not self._may_restart(
                        policy, exc, failures
                    ):
                        raise ActorFailed(self.name, exc, self.restarts) from exc
                    self.restarts += 1
                    self.state = ActorState.RESTARTING
                    await trio.sleep(policy.delay(self.restarts))
                    continue
                self.state = ActorState.STOPPED
                return

    @staticmethod
    def _may_restart(policy: Restart, exc: Exception, failures: deque[float]) -> bool:
        """Whether ``policy`` restarts after ``exc``: not past the restart budget, not for an
        error that says a restart cannot help."""
        if getattr(exc, "restartable", True) is False:
            return False
        now = trio.current_time()
        failures.append(now)
        while failures and failures[0] < now - policy.within:
            failures.popleft()
        return len(failures) <= policy.max_restarts

    def tell(self, message: M) -> bool:
        """Put ``message`` in the inbox if there is room; ``False`` if full or stopped."""
        try:
            self._send.send_nowait(message)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True

    async def send(self, message: M) -> None:
        """Put ``message`` in the inbox, waiting for room (backpressure)."""
        await self._send.send(message)

    def stop(self) -> None:
        """Cancel the actor's task; :meth:`wait_stopped` returns once it has ended."""
        if self._scope is not None:
            self._scope.cancel()
        else:
            self.state = ActorState.STOPPED
            self._done.set()

    async def wait_stopped(self, timeout: float = math.inf) -> None:
        with trio.move_on_after(timeout):
            await self._done.wait()

    @property
    def running(self) -> bool:
        return self.state in (ActorState.RUNNING, ActorState.DRAINING)

    @property
    def ref(self) -> ActorRef[M]:
        """The address of this actor: what others hold to send it messages."""
        return ActorRef(self)


class ActorRef(Generic[M]):
    """A reference to an actor: its name and state, and a way to reach its inbox. Holders of
    a reference cannot call into the actor, only send it messages."""

    __slots__ = ("_actor",)

    def __init__(self, actor: Actor[M]) -> None:
        self._actor = actor

    def __repr__(self) -> str:
        return f"ActorRef({self._actor.name!r})"

    @property
    def name(self) -> str:
        return self._actor.name

    @property
    def state(self) -> ActorState:
        return self._actor.state

    def tell(self, message: M) -> bool:
        return self._actor.tell(message)

    async def send(self, message: M) -> None:
        await self._actor.send(message)


def describe(actors: list[Actor[object]] | list[Actor[M]]) -> list[tuple[str, str]]:
    """(name, state) of each actor, for listings."""
    return [(a.name, a.state.value) for a in actors]
