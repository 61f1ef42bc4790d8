"""Checkpointed subscriptions (Beckett's model, ../shared/specs/beckett-subscriptions.md):
per-entity order with failure isolation on a JetStream stream, state in a KV bucket.

So far the values and rules (no I/O): :mod:`.checkpoint` (a checkpoint and its transitions,
its KV key and stored form) and :mod:`.retry` (backoff with jitter, per-exception budgets).
The global stream consumer, the workers, reservation recovery and the operator commands are
still to come (issue 6; see NOTES.md).
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
from headrace.checkpoints.retry import GiveUp, Retry, RetryPolicy

__all__ = [
    "AlreadyReserved",
    "Checkpoint",
    "CheckpointError",
    "CheckpointId",
    "GiveUp",
    "InvalidCheckpoint",
    "Reservation",
    "Retry",
    "RetryPolicy",
    "Status",
]
