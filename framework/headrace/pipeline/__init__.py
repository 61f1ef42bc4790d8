"""Pipelines: graphs of sources, operators and sinks, run as supervised actors.

A JetStream message is acked only after every record derived from it was committed by every
sink it reached (the ack tracker); cancelling a pipeline drains it. See docs/pipelines.md.
"""

from headrace.pipeline.ack_tracker import AckTracker, PoisonTerminated
from headrace.pipeline.batch import Batch, BatchPolicy
from headrace.pipeline.gc_tuning import GcSettings, restore_gc, tune_gc
from headrace.pipeline.graph import Node, Pipeline, PipelineError
from headrace.pipeline.publish_guard import DeadLetterRefused
from headrace.pipeline.record import Delivery, Record
from headrace.pipeline.runtime import PipelineRun, StageError
from headrace.pipeline.sink import Sink, SinkRunner
from headrace.pipeline.sink_retry import SinkOutage, SinkRetry
from headrace.pipeline.source import JetStreamSource
from headrace.pipeline.stats import PipelineStats

__all__ = [
    "AckTracker",
    "Batch",
    "BatchPolicy",
    "DeadLetterRefused",
    "Delivery",
    "GcSettings",
    "JetStreamSource",
    "Node",
    "Pipeline",
    "PipelineError",
    "PipelineRun",
    "PipelineStats",
    "PoisonTerminated",
    "Record",
    "Sink",
    "SinkOutage",
    "SinkRetry",
    "SinkRunner",
    "StageError",
    "restore_gc",
    "tune_gc",
]
