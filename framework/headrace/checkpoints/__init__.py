"""Checkpointed subscriptions (Beckett's model, ../shared/specs/beckett-subscriptions.md):
per-entity order with failure isolation on a JetStream stream, state in a KV bucket.

So far: :mod:`.checkpoint` (a checkpoint and its transitions, its KV key and stored form),
:mod:`.retry` (backoff with jitter, per-exception budgets), :mod:`.store` (checkpoints in a KV
bucket, every change a compare-and-set), :mod:`.subscription` (subscriptions and groups: which
messages make work for which entity stream) and :mod:`.global_consumer` (reads the stream per
group and raises checkpoint versions). The workers, reservation recovery, operator commands,
benchmark and docs are still to come (issue 6; see NOTES.md).
"""

from __future__ import annotations

from headrace.checkpoints.checkpoint import (
    AlreadyReserved,
    Checkpoint,
    CheckpointError,
    CheckpointId,
    InvalidCheckpoint,
    Reservation,
    Status,
)
from headrace.checkpoints.global_consumer import GlobalConsumer
from headrace.checkpoints.retry import GiveUp, Retry, RetryPolicy
from headrace.checkpoints.store import CheckpointContention, CheckpointStore, Stored
from headrace.checkpoints.subscription import Subscription, SubscriptionGroup

__all__ = [
    "AlreadyReserved",
    "Checkpoint",
    "CheckpointContention",
    "CheckpointError",
    "CheckpointId",
    "CheckpointStore",
    "GiveUp",
    "GlobalConsumer",
    "InvalidCheckpoint",
    "Reservation",
    "Retry",
    "RetryPolicy",
    "Status",
    "Stored",
    "Subscription",
    "SubscriptionGroup",
]
