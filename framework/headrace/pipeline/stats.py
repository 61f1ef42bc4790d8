"""Counters of a running pipeline, for progress views, health and metrics.

Plain attributes updated in place by the pipeline's actors (one thread, no locks); read them
at any time. ``snapshot()`` gives a dict for logs and metrics.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.define(slots=True)
class PipelineStats:
    messages_in: int = 0  # JetStream messages taken from the sources
    redeliveries: int = 0  # of those, delivered more than once
    records_out: int = 0  # records handed to sinks
    dropped: int = 0  # records a filter dropped (acked when dropped)
    batches_committed: int = 0
    #: Sink writes that failed (each is retried, or its bad records isolated).
    batches_failed: int = 0
    #: Pauses before writing a failed batch again.
    sink_retries: int = 0
    #: Sinks in a run of failures right now (no write has succeeded since the first).
    retrying: int = 0
    acks: int = 0
    naks: int = 0
    terms: int = 0
    dead_lettered: int = 0
    #: Poison messages terminated with no dead-letter copy (no ``dead_letter`` set).
    terminated_unkept: int = 0
    in_progress: int = 0  # +WPI sent for slow commits
    errors: int = 0  # operator and sink failures
    commit_seconds_total: float = 0.0
    commit_seconds_last: float = 0.0
    #: Messages the consumer still has for us (num_pending from the last message's metadata).
    lag: int = 0
    #: Deliveries taken and not yet acked, naked or terminated.
    ack_pending: int = 0

    def snapshot(self) -> dict[str, Any]:
        return attrs.asdict(self)
