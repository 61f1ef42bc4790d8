"""headrace: stream pipelines from structured-concurrency actors on trio.

This is the front door: what a pipeline author needs first. ::

    import headrace

    pipe = headrace.Pipeline("orders")
    pipe.source(headrace.JetStreamSource(stream="ORDERS", durable="lake")).sink(
        headrace.JsonlSink("out"), batch=headrace.BatchPolicy(1000)
    )
    async with headrace.connect("nats://localhost:4222") as nc:
        await headrace.run_until_signal(pipe, nc)

and every error base class, so that ``except headrace.HeadraceError`` (or a narrower one)
needs no other import. The rest is in the sub-packages, each with its own ``__all__``:
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
from headrace.actors import ActorFailed
from headrace.commits import (
    CommitContention,
    CommitError,
    CommitStateMissing,
    CommitStateUnavailable,
    CorruptCommitState,
    OutputConflict,
    OutputOwned,
    StreamRecreated,
)
from headrace.errors import (
    AuthorizationError,
    ConnectionClosedError,
    ConnectionLostError,
    ConnectTimeout,
    ControlLineTooLong,
    DrainTimeout,
    FlushTimeout,
    HeadraceError,
    HeadraceWarning,
    InvalidHeaderError,
    InvalidSubjectError,
    MalformedHeaderWarning,
    MaxPayloadExceeded,
    NatsError,
    NatsTimeoutError,
    NoRespondersError,
    NoServersError,
    OutboundBufferFull,
    PermissionViolation,
    ProtocolError,
    RequestTimeout,
    ServerError,
    StaleConnectionError,
    SubscriptionClosedError,
    TLSError,
)
from headrace.jetstream import (
    BadRequest,
    BucketExists,
    BucketNotFound,
    ConsumerAlreadyExists,
    ConsumerConfig,
    ConsumerConfigMismatch,
    ConsumerDeleted,
    ConsumerDoesNotExist,
    ConsumerIsPushBased,
    ConsumerNameConflict,
    ConsumerNotFound,
    InvalidAckReply,
    InvalidBucketName,
    InvalidKey,
    InvalidNameError,
    JetStream,
    JetStreamAPIError,
    JetStreamError,
    JetStreamNotEnabled,
    JetStreamUnavailable,
    JsMsg,
    KeyExists,
    KeyNotFound,
    KeyValueError,
    MessageNotFound,
    NoStreamForSubject,
    NotAJetStreamMessage,
    PullStatusError,
    PushStatusError,
    StreamAlreadyExists,
    StreamConfig,
    StreamLookupError,
    StreamNotFound,
    StreamSubjectsOverlap,
    SubscribeError,
    WrongLastMsgId,
    WrongLastSequence,
    WrongRevision,
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
    from headrace.checkpoints import (
        CheckpointError,
    )
    from headrace.pipeline import (
        Batch,
        BatchPolicy,
        DeadLetterRefused,
        JetStreamSource,
        Node,
        Pipeline,
        PipelineError,
        PipelineRun,
        PoisonTerminated,
        Record,
        RecordsRejected,
        Sink,
        SinkContext,
        SinkError,
        SinkOutage,
        SinkRetry,
    )
    from headrace.sinks import (
        JsonlSink,
        MemorySink,
        StdoutSink,
    )
    from headrace.state import (
        LateRecord,
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
    "DeadLetterRefused": "headrace.pipeline",
    "JetStreamSource": "headrace.pipeline",
    "Node": "headrace.pipeline",
    "Pipeline": "headrace.pipeline",
    "PipelineError": "headrace.pipeline",
    "PipelineRun": "headrace.pipeline",
    "PoisonTerminated": "headrace.pipeline",
    "Record": "headrace.pipeline",
    "RecordsRejected": "headrace.pipeline",
    "Sink": "headrace.pipeline",
    "SinkContext": "headrace.pipeline",
    "SinkError": "headrace.pipeline",
    "SinkOutage": "headrace.pipeline",
    "SinkRetry": "headrace.pipeline",
    "JsonlSink": "headrace.sinks",
    "MemorySink": "headrace.sinks",
    "StdoutSink": "headrace.sinks",
    "CheckpointError": "headrace.checkpoints",
    "LateRecord": "headrace.state",
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
    "ActorFailed",
    "AuthorizationError",
    "BadRequest",
    "Batch",
    "BatchPolicy",
    "BucketExists",
    "BucketNotFound",
    "CheckpointError",
    "CommitContention",
    "CommitError",
    "CommitStateMissing",
    "CommitStateUnavailable",
    "ConnectOptions",
    "ConnectTimeout",
    "Connection",
    "ConnectionClosedError",
    "ConnectionLostError",
    "ConsumerAlreadyExists",
    "ConsumerConfig",
    "ConsumerConfigMismatch",
    "ConsumerDeleted",
    "ConsumerDoesNotExist",
    "ConsumerIsPushBased",
    "ConsumerNameConflict",
    "ConsumerNotFound",
    "ControlLineTooLong",
    "CorruptCommitState",
    "DeadLetterRefused",
    "DrainTimeout",
    "FlushTimeout",
    "Headers",
    "HeadraceError",
    "HeadraceWarning",
    "InvalidAckReply",
    "InvalidBucketName",
    "InvalidHeaderError",
    "InvalidKey",
    "InvalidNameError",
    "InvalidSubjectError",
    "JetStream",
    "JetStreamAPIError",
    "JetStreamError",
    "JetStreamNotEnabled",
    "JetStreamSource",
    "JetStreamUnavailable",
    "JsMsg",
    "JsonlSink",
    "KeyExists",
    "KeyNotFound",
    "KeyValueError",
    "LateRecord",
    "MalformedHeaderWarning",
    "MaxPayloadExceeded",
    "MemorySink",
    "MessageNotFound",
    "Msg",
    "NatsError",
    "NatsTimeoutError",
    "NoRespondersError",
    "NoServersError",
    "NoStreamForSubject",
    "Node",
    "NotAJetStreamMessage",
    "OutboundBufferFull",
    "OutputConflict",
    "OutputOwned",
    "PermissionViolation",
    "Pipeline",
    "PipelineError",
    "PipelineRun",
    "PoisonTerminated",
    "ProtocolError",
    "PullStatusError",
    "PushStatusError",
    "Record",
    "RecordsRejected",
    "RequestTimeout",
    "ServerError",
    "SessionWindow",
    "Shutdown",
    "Sink",
    "SinkContext",
    "SinkError",
    "SinkOutage",
    "SinkRetry",
    "SlidingWindow",
    "StaleConnectionError",
    "StateError",
    "StdoutSink",
    "StopReason",
    "StreamAlreadyExists",
    "StreamConfig",
    "StreamLookupError",
    "StreamNotFound",
    "StreamRecreated",
    "StreamSubjectsOverlap",
    "SubscribeError",
    "SubscriptionClosedError",
    "TLSError",
    "TumblingWindow",
    "WindowResult",
    "WrongLastMsgId",
    "WrongLastSequence",
    "WrongRevision",
    "__version__",
    "connect",
    "count",
    "run_until_signal",
]
