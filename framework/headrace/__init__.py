"""headrace: stream pipelines from structured-concurrency actors on trio.

This is the front door: what a pipeline author needs first. ::

    import headrace

    pipe = headrace.Pipeline("orders")
    pipe.source(headrace.JetStreamSource(stream="ORDERS", durable="lake")).sink(
        headrace.JsonlSink("out"), batch=headrace.BatchPolicy(1000)
    )
    async with headrace.connect("nats://localhost:4222") as nc:
        await headrace.run_until_signal(pipe, nc)

and the base classes of the errors (``HeadraceError``, ``NatsError``, ``JetStreamError``,
``SinkError``, ...), so that ``except headrace.JetStreamError`` needs no other import. Leaf
errors (``StreamNotFound``, ``KeyNotFound``, ``ConnectionClosedError``, ...) stay in their
packages, as do the rest of the names, each package with its own ``__all__``:
``headrace.nats`` (the connection), ``headrace.jetstream`` (JetStream, KV),
``headrace.pipeline``, ``headrace.sinks``, ``headrace.commits``, ``headrace.checkpoints`` and
``headrace.actors``. What an ``__init__`` exports is public; the modules inside the packages are
internal (docs/architecture.md, "Public and internal").

The pipeline and sink names are loaded on first use, so ``import headrace`` (and so
``headrace --help``) does not pay for the pipeline runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from headrace._version import __version__
from headrace.commits import CommitError, OutputConflict
from headrace.errors import (
    HeadraceError,
    HeadraceWarning,
    NatsError,
    NatsTimeoutError,
    ProtocolError,
    ServerError,
)
from headrace.jetstream import (
    ConsumerConfig,
    JetStream,
    JetStreamAPIError,
    JetStreamError,
    JsMsg,
    KeyValueError,
    StreamConfig,
)
from headrace.nats import (
    Connection,
    ConnectOptions,
    connect,
)
from headrace.protocol import (
    Headers,
    Msg,
)
from headrace.shutdown import (
    Shutdown,
    StopReason,
    run_until_signal,
)

if TYPE_CHECKING:
    from headrace.checkpoints import CheckpointError
    from headrace.pipeline import (
        Batch,
        BatchPolicy,
        JetStreamSource,
        Node,
        Pipeline,
        PipelineError,
        PipelineRun,
        Record,
        RecordsRejected,
        Sink,
        SinkContext,
        SinkError,
        SinkRetry,
        SinkUnavailable,
    )
    from headrace.sinks import (
        JsonlSink,
        MemorySink,
        StdoutSink,
    )
    from headrace.state import (
        SessionWindow,
        SlidingWindow,
        StateError,
        TumblingWindow,
        WindowResult,
        count,
    )

#: Loaded on first use (importing the pipeline runtime costs about 30 ms).
_LAZY: dict[str, str] = {
    "Batch": "headrace.pipeline",
    "BatchPolicy": "headrace.pipeline",
    "JetStreamSource": "headrace.pipeline",
    "Node": "headrace.pipeline",
    "Pipeline": "headrace.pipeline",
    "PipelineError": "headrace.pipeline",
    "PipelineRun": "headrace.pipeline",
    "Record": "headrace.pipeline",
    "RecordsRejected": "headrace.pipeline",
    "Sink": "headrace.pipeline",
    "SinkContext": "headrace.pipeline",
    "SinkError": "headrace.pipeline",
    "SinkRetry": "headrace.pipeline",
    "SinkUnavailable": "headrace.pipeline",
    "JsonlSink": "headrace.sinks",
    "MemorySink": "headrace.sinks",
    "StdoutSink": "headrace.sinks",
    "CheckpointError": "headrace.checkpoints",
    "SessionWindow": "headrace.state",
    "SlidingWindow": "headrace.state",
    "StateError": "headrace.state",
    "TumblingWindow": "headrace.state",
    "WindowResult": "headrace.state",
    "count": "headrace.state",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # the next lookup is a plain one
        return value
    raise AttributeError(f"module 'headrace' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "Batch",
    "BatchPolicy",
    "CheckpointError",
    "CommitError",
    "ConnectOptions",
    "Connection",
    "ConsumerConfig",
    "Headers",
    "HeadraceError",
    "HeadraceWarning",
    "JetStream",
    "JetStreamAPIError",
    "JetStreamError",
    "JetStreamSource",
    "JsMsg",
    "JsonlSink",
    "KeyValueError",
    "MemorySink",
    "Msg",
    "NatsError",
    "NatsTimeoutError",
    "Node",
    "OutputConflict",
    "Pipeline",
    "PipelineError",
    "PipelineRun",
    "ProtocolError",
    "Record",
    "RecordsRejected",
    "ServerError",
    "SessionWindow",
    "Shutdown",
    "Sink",
    "SinkContext",
    "SinkError",
    "SinkRetry",
    "SinkUnavailable",
    "SlidingWindow",
    "StateError",
    "StdoutSink",
    "StopReason",
    "StreamConfig",
    "TumblingWindow",
    "WindowResult",
    "__version__",
    "connect",
    "count",
    "run_until_signal",
]
