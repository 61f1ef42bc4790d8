"""Checkpointed subscriptions (Beckett's model; docs/checkpoints.md):
per-entity order with failure isolation on a JetStream stream, state in a KV bucket.

So far: :mod:`.checkpoint` (a checkpoint and its transitions, its KV key and stored form),
:mod:`.retry` (backoff with jitter, per-exception budgets), :mod:`.store` (checkpoints in a KV
bucket, every change a compare-and-set), :mod:`.stream_check` (streams refused because
they drop events before they are handled), :mod:`.subscription` (subscriptions and groups: which
messages make work for which entity stream), :mod:`.global_consumer` (reads the stream per
group and raises checkpoint versions) and :mod:`.worker` (reserves lagging or due checkpoints
and dispatches each entity's messages in order; expired reservations are taken over) with
:mod:`.fencing` (renewing a reservation while a handler runs, fencing a stale holder) and
:mod:`.backlog` (the checkpoints with work, fed by a KV watch rather than polls).
:mod:`.operators` has the views and actions behind ``headrace checkpoints``. docs/checkpoints.md
describes the model; NOTES.md what is left.
"""

from __future__ import annotations

from headrace.checkpoints import operators
from headrace.checkpoints.checkpoint import (
    AlreadyReserved,
    Checkpoint,
    CheckpointError,
    CheckpointId,
    CheckpointMoved,
    InvalidCheckpoint,
    Reservation,
    ReservationLost,
    Status,
)
from headrace.checkpoints.fencing import HandlerContext
from headrace.checkpoints.global_consumer import GlobalConsumer
from headrace.checkpoints.retry import GiveUp, Retry, RetryPolicy
from headrace.checkpoints.store import CheckpointContention, CheckpointStore, Stored
from headrace.checkpoints.stream_check import (
    MissingEvents,
    StreamLimitWarning,
    UnsafeStream,
    check_stream,
)
from headrace.checkpoints.subscription import Subscription, SubscriptionGroup
from headrace.checkpoints.worker import CheckpointWorkers

__all__ = [
    "AlreadyReserved",
    "Checkpoint",
    "CheckpointContention",
    "CheckpointError",
    "CheckpointId",
    "CheckpointMoved",
    "CheckpointStore",
    "CheckpointWorkers",
    "GiveUp",
    "GlobalConsumer",
    "HandlerContext",
    "InvalidCheckpoint",
    "MissingEvents",
    "Reservation",
    "ReservationLost",
    "Retry",
    "RetryPolicy",
    "Status",
    "Stored",
    "StreamLimitWarning",
    "Subscription",
    "SubscriptionGroup",
    "UnsafeStream",
    "check_stream",
    "operators",
]
