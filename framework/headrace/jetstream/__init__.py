"""JetStream client semantics as the NATS ADRs prescribe (ADR-15, ADR-37, ADR-13, ADR-17, ADR-8).

:class:`JetStream` is the API of one connection: streams, consumers, publish with PubAck,
message get. :class:`PullConsumer` fetches and consumes (ADR-37); messages are :class:`JsMsg`
with ack methods (ADR-15).
"""

from headrace.jetstream.ack_reply import AckMetadata, parse_ack_reply
from headrace.jetstream.consume import ConsumeBuffer, ConsumeEvent, ConsumeOptions
from headrace.jetstream.consumer_config import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    ReplayPolicy,
    SequenceInfo,
)
from headrace.jetstream.context import JetStream
from headrace.jetstream.errors import (
    BadRequest,
    ConsumerAlreadyExists,
    ConsumerConfigMismatch,
    ConsumerDeleted,
    ConsumerDoesNotExist,
    ConsumerIsPushBased,
    ConsumerNotFound,
    InvalidAckReply,
    JetStreamAPIError,
    JetStreamError,
    JetStreamNotEnabled,
    JetStreamUnavailable,
    MessageNotFound,
    NoStreamForSubject,
    NotAJetStreamMessage,
    PullStatusError,
    StreamAlreadyExists,
    StreamLookupError,
    StreamNotFound,
    StreamSubjectsOverlap,
    SubscribeError,
    WrongLastMsgId,
    WrongLastSequence,
)
from headrace.jetstream.events import (
    ConsumerDeleteFailed,
    ConsumerRecreated,
    FlowControlAnswered,
    GapDetected,
    HeartbeatsMissed,
    JetStreamEvent,
    PullWarning,
)
from headrace.jetstream.message import JsMsg
from headrace.jetstream.pull_consumer import PullConsumer
from headrace.jetstream.pull_request import PullRequest
from headrace.jetstream.responses import AccountInfo, PubAck
from headrace.jetstream.stored_message import StoredMessage
from headrace.jetstream.stream_config import (
    Compression,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamInfo,
    StreamState,
)

__all__ = [
    "AccountInfo",
    "AckMetadata",
    "AckPolicy",
    "BadRequest",
    "Compression",
    "ConsumeBuffer",
    "ConsumeEvent",
    "ConsumeOptions",
    "ConsumerAlreadyExists",
    "ConsumerConfig",
    "ConsumerConfigMismatch",
    "ConsumerDeleteFailed",
    "ConsumerDeleted",
    "ConsumerDoesNotExist",
    "ConsumerInfo",
    "ConsumerIsPushBased",
    "ConsumerNotFound",
    "ConsumerRecreated",
    "DeliverPolicy",
    "DiscardPolicy",
    "FlowControlAnswered",
    "GapDetected",
    "HeartbeatsMissed",
    "InvalidAckReply",
    "JetStream",
    "JetStreamAPIError",
    "JetStreamError",
    "JetStreamEvent",
    "JetStreamNotEnabled",
    "JetStreamUnavailable",
    "JsMsg",
    "MessageNotFound",
    "NoStreamForSubject",
    "NotAJetStreamMessage",
    "PubAck",
    "PullConsumer",
    "PullRequest",
    "PullStatusError",
    "PullWarning",
    "ReplayPolicy",
    "RetentionPolicy",
    "SequenceInfo",
    "StorageType",
    "StoredMessage",
    "StreamAlreadyExists",
    "StreamConfig",
    "StreamInfo",
    "StreamLookupError",
    "StreamNotFound",
    "StreamState",
    "StreamSubjectsOverlap",
    "SubscribeError",
    "WrongLastMsgId",
    "WrongLastSequence",
    "parse_ack_reply",
]
