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

from typing import Any

import trio

from headrace.actors.actor import Actor
from headrace.actors.policy import ActorFailed, Escalate, Restart, RestartPolicy

__all__ = ["ActorFailed", "Escalate", "Restart", "RestartPolicy", "supervise"]


async def supervise(
    actor: Actor[Any],
    policy: RestartPolicy,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``actor`` under ``policy`` until it stops or escalates (the task function for
    ``nursery.start``; it reports started once the actor first runs). The same as
    ``actor.start(nursery, policy)``: :meth:`Actor.lifetime` is the one way an actor runs."""
    await actor.lifetime(policy, task_status)
