"""Supervision: what happens when an actor's run loop raises.

Each actor runs under a policy:

- :class:`Restart` (one-for-one): run the same actor again, after an exponential backoff, as
  long as it has not failed more than ``max_restarts`` times within ``within`` seconds; past
  that, escalate. The actor object (and its inbox, with whatever is queued in it) survives a
  restart, so an actor's ``run`` must be written to start over from its own state.
- :class:`Escalate`: no restart; the error propagates at once.

Escalating re-raises the actor's original error into the nursery the actor runs in, which
cancels its siblings: for a pipeline, the whole pipeline stops with that error.

An error whose class says ``restartable = False`` escalates under any policy: running the actor
again cannot change the answer (an output that belongs to another pipeline), and a restart
would only hide it behind a restart budget.

A supervised actor, and all it calls, is protected from ``KeyboardInterrupt``
(``trio.lowlevel.enable_ki_protection``): trio hands a Ctrl-C to the application's main task
instead, whose cancellation stops a pipeline by draining it. Raised inside an actor, it failed
that actor alone: its inbox closed, the actor feeding it failed on the closed inbox, and the
pipeline stopped without a drain, with that error instead of the interrupt.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import attrs
import trio

from headrace.actors.actor import Actor, ActorState, is_cancellation


@attrs.frozen(slots=True, kw_only=True)
class Restart:
    """Restart on failure, with exponential backoff, at most ``max_restarts`` in ``within``
    seconds."""

    max_restarts: int = attrs.field(default=3, validator=attrs.validators.ge(0))
    within: float = attrs.field(default=60.0, validator=attrs.validators.gt(0))
    backoff: float = attrs.field(default=0.1, validator=attrs.validators.ge(0))
    backoff_max: float = attrs.field(default=5.0, validator=attrs.validators.ge(0))

    def delay(self, restarts: int) -> float:
        """Seconds to wait before restart number ``restarts`` (1 for the first)."""
        return float(min(self.backoff_max, self.backoff * 2 ** min(restarts - 1, 30)))


@attrs.frozen(slots=True)
class Escalate:
    """Do not restart: the first failure stops whatever the actor runs in."""


RestartPolicy = Restart | Escalate


class ActorFailed(Exception):
    """Raised in place of an actor's error when it escalates out of a restart policy, naming
    the actor; ``__cause__`` is the original error."""

    def __init__(self, actor: str, error: BaseException, restarts: int) -> None:
        suffix = f" after {restarts} restarts" if restarts else ""
        super().__init__(f"actor {actor!r} failed{suffix}: {error!r}")
        self.actor = actor
        self.error = error
        self.restarts = restarts


@trio.lowlevel.enable_ki_protection
async def supervise(
    actor: Actor[Any],
    policy: RestartPolicy,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``actor`` under ``policy`` until it stops or escalates (the task function for
    ``nursery.start``; it reports started once the actor first runs)."""
    failures: deque[float] = deque()
    try:
        await _supervised(actor, policy, task_status, failures)
    finally:
        # However it ended (stopped, escalated, cancelled, even during a restart backoff), the
        # actor is done: its inbox refuses messages, and whoever waits for it is released.
        if actor.state in (ActorState.RUNNING, ActorState.RESTARTING, ActorState.STARTING):
            actor.state = ActorState.STOPPED
        actor._send.close()
        actor._done.set()


async def _supervised(
    actor: Actor[Any],
    policy: RestartPolicy,
    task_status: trio.TaskStatus[None],
    failures: deque[float],
) -> None:
    restarts = 0
    started = False
    with trio.CancelScope() as scope:
        actor._scope = scope
        while True:
            actor.state = ActorState.RUNNING
            if not started:
                started = True
                task_status.started()
            try:
                await actor.run()
            except BaseException as exc:
                if is_cancellation(exc) or not isinstance(exc, Exception):
                    actor.state = ActorState.STOPPED if is_cancellation(exc) else ActorState.FAILED
                    actor._done.set()
                    raise
                actor.error = exc
                now = trio.current_time()
                failures.append(now)
                while failures and failures[0] < now - getattr(policy, "within", math.inf):
                    failures.popleft()
                if (
                    isinstance(policy, Escalate)
                    or len(failures) > policy.max_restarts
                    or getattr(exc, "restartable", True) is False
                ):
                    actor.state = ActorState.FAILED
                    actor._done.set()
                    raise ActorFailed(actor.name, exc, restarts) from exc
                restarts += 1
                actor.restarts = restarts
                actor.state = ActorState.RESTARTING
                await trio.sleep(policy.delay(restarts))
                continue
            actor.state = ActorState.STOPPED
            actor._done.set()
            return
