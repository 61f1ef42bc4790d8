"""The actor runtime: named trio tasks with bounded inboxes and observable state.

Generic (no NATS knowledge), so every layer above can build its parts as actors: the
connection supervisor, the JetStream heartbeat monitor and flow-control responder, the consume
buffer, and later the pipeline's operators, batchers and ack tracker.
"""

from headrace.actors.actor import Actor, ActorRef, ActorState, describe
from headrace.actors.nursery import open_actor_nursery
from headrace.actors.supervision import (
    ActorFailed,
    Escalate,
    Restart,
    RestartPolicy,
    supervise,
)

__all__ = [
    "Actor",
    "ActorFailed",
    "ActorRef",
    "ActorState",
    "Escalate",
    "Restart",
    "RestartPolicy",
    "describe",
    "open_actor_nursery",
    "supervise",
]
