"""Pipelines: graphs of sources, operators and sinks, run as supervised actors.

A JetStream message is acked only after every record derived from it was committed by every
sink it reached (the ack tracker, keeping its books in the ack ledger); cancelling a pipeline
drains it. See docs/pipelines.md.

The route of a message, top to bottom (docs/architecture.md section 3 has the whole path):

1. ``SourceStage._pump`` (stages.py) asks ``AckTracker.wait_room`` how many it may take, takes
   that many from its consume buffer, and reports them: ``admit`` makes a ``Delivery`` and a
   ``Record`` per message (record.py).
2. Operator stages run on whole lists and report facts only: ``failed`` (nak, poison),
   ``release`` (dropped by a filter), ``expanded`` (a flat_map made several), ``forked`` (a
   stage fanned out to several).
3. ``BatcherStage`` cuts batches between messages; ``SinkStage`` writes them through its
   ``BatchCommitter`` (sink_retry.py: retries, bisection) and reports ``committed`` or
   ``failed``.
4. The tracker (ack_tracker.py) hands each report to its ``AckLedger`` (ack_ledger.py, no I/O:
   no socket, no trio, the time passed in), which alone changes a delivery's state and answers
   what to send: when a delivery's last record is settled, the message to ack (one
   ``ack_all`` per batch), or to nak with its delay, or the delivery made poison, which waits
   in the ledger until the tracker's task has copied it to the dead letter and terminated it.
   The tracker sends what the ledger answers. Its task scans for +WPI, sends those the ledger
   finds due, and asks each pull source (through the ``keep_alive`` callable it was given,
   nothing more) to do so for what still waits in its buffer.

Acks flow one way: stages tell the tracker what happened; nothing but the ledger changes a
delivery's state or the counts.
"""

from headrace.pipeline.ack_tracker import AckTracker, PoisonTerminated
from headrace.pipeline.batch import Batch, BatchPolicy
from headrace.pipeline.caught_up import CatchUpMark, CatchUpTimeout, NotCaughtUp
from headrace.pipeline.errors import PipelineEnded, PipelineError
from headrace.pipeline.gc_tuning import GcSettings, restore_gc, tune_gc
from headrace.pipeline.graph import Pipeline, run_until_caught_up
from headrace.pipeline.keyed import KeyedStream, StateSpec
from headrace.pipeline.lookup import LookupMissing, LookupSpec
from headrace.pipeline.nodes import Node
from headrace.pipeline.partitioning import Partitioning
from headrace.pipeline.partitions import PartitionRuns, partition_graph, run_partitioned
from headrace.pipeline.publish_guard import DeadLetterRefused
from headrace.pipeline.record import Delivery, Record
from headrace.pipeline.runtime import PipelineRun, StageError
from headrace.pipeline.sink import (
    RecordsRejected,
    Sink,
    SinkContext,
    SinkError,
    SinkNotOpen,
    SinkUnavailable,
    failure_kind,
)
from headrace.pipeline.sink_retry import SinkOutage, SinkRetry, SinkStuck
from headrace.pipeline.sink_runner import SinkRunner
from headrace.pipeline.source import JetStreamSource
from headrace.pipeline.stateful import StateStats
from headrace.pipeline.stats import PipelineStats

__all__ = [
    "AckTracker",
    "Batch",
    "BatchPolicy",
    "CatchUpMark",
    "CatchUpTimeout",
    "DeadLetterRefused",
    "Delivery",
    "GcSettings",
    "JetStreamSource",
    "KeyedStream",
    "LookupMissing",
    "LookupSpec",
    "Node",
    "NotCaughtUp",
    "PartitionRuns",
    "Partitioning",
    "Pipeline",
    "PipelineEnded",
    "PipelineError",
    "PipelineRun",
    "PipelineStats",
    "PoisonTerminated",
    "Record",
    "RecordsRejected",
    "Sink",
    "SinkContext",
    "SinkError",
    "SinkNotOpen",
    "SinkOutage",
    "SinkRetry",
    "SinkRunner",
    "SinkStuck",
    "SinkUnavailable",
    "StageError",
    "StateSpec",
    "StateStats",
    "failure_kind",
    "partition_graph",
    "restore_gc",
    "run_partitioned",
    "run_until_caught_up",
    "tune_gc",
]
