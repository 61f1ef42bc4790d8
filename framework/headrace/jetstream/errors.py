"""JetStream errors: API errors keeping the server's codes, and the client-side rule errors.

An API error carries ``code`` (HTTP-like), ``err_code`` (the server's stable identifier, see
nats-server's errors.json) and ``description``. The common ones have their own class, so
``except ConsumerNotFound`` works without comparing numbers.

A class stands for the err_codes it declares (``err_codes = (10059,)``), and declaring them is
all it takes: :func:`api_error`'s table is built from the classes as they are defined, and no
two classes may declare one code. A subclass that declares none (``KeyTTLDisabled``, a
``MessageTTLDisabled`` raised by KV) inherits the codes to say what it answers, and is not in
the table.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from headrace.errors import HeadraceError


class JetStreamError(HeadraceError):
    """Base of every JetStream error."""


#: err_code -> the class that declares it, filled as the classes are defined.
_BY_CODE: dict[int, type[JetStreamAPIError]] = {}


class JetStreamAPIError(JetStreamError):
    """The JetStream API answered with an error."""

    #: The err_codes this class stands for: the ones a class declares in its own body put it
    #: in :func:`api_error`'s table.
    err_codes: ClassVar[tuple[int, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for code in vars(cls).get("err_codes", ()):
            known = _BY_CODE.setdefault(code, cls)
            if known is not cls:
                raise TypeError(f"err_code {code} of {cls.__name__} is {known.__name__}'s already")

    def __init__(self, code: int, err_code: int, description: str) -> None:
        super().__init__(f"{description} (code {code}, err_code {err_code})")
        self.code = code
        self.err_code = err_code
        self.description = description


class BadRequest(JetStreamAPIError):
    err_codes = (10003,)


class JetStreamNotEnabled(JetStreamAPIError):
    err_codes = (10076, 10039)


class StreamNotFound(JetStreamAPIError):
    err_codes = (10059,)


class StreamAlreadyExists(JetStreamAPIError):
    """A stream of that name exists with a different configuration."""

    err_codes = (10058,)


class StreamSubjectsOverlap(JetStreamAPIError):
    err_codes = (10065,)


class ConsumerNotFound(JetStreamAPIError):
    err_codes = (10014,)


class ConsumerDoesNotExist(ConsumerNotFound):
    """An update (action ``update``) named a consumer that does not exist."""

    err_codes = (10149,)


class ConsumerAlreadyExists(JetStreamAPIError):
    """A create (action ``create``) named a consumer that exists with another configuration."""

    err_codes = (10148, 10013, 10105)


class MessageNotFound(JetStreamAPIError):
    err_codes = (10037,)


class WrongLastSequence(JetStreamAPIError):
    """An expected-last-sequence (or subject sequence) header did not match the stream.

    10164 is the replicated streams' form: another conditional write on the subject was in
    flight. Either way the write was refused; read again and retry.
    """

    err_codes = (10071, 10164)


class WrongLastMsgId(JetStreamAPIError):
    err_codes = (10070,)


class MessageTTLDisabled(JetStreamAPIError):
    """A publish with a per-message TTL (``Nats-TTL``, ADR-43) to a stream without
    ``allow_msg_ttl`` (the server's 10166). Nothing was stored. Turn the stream's
    ``allow_msg_ttl`` on (a stream update may turn it on, never off), or publish without
    ``ttl``."""

    err_codes = (10166,)


class InvalidMessageTTL(JetStreamAPIError, ValueError):
    """A per-message TTL (ADR-43) the server refuses (its 10165): not whole seconds nor a
    duration string, below one second, or ``0``. Nothing was stored. The client refuses such a
    ``ttl`` before anything is sent, with the ``err_code`` the server would answer."""

    err_codes = (10165,)


class PriorityGroupError(JetStreamError, ValueError):
    """A consumer's priority groups (ADR-42) used in a way they do not allow: a configuration
    the server refuses, a pull that does not fit the consumer's group and policy, or consume
    settings that would lose a pin. The subclasses say which; the message says what to do."""


class PriorityGroupConfigError(PriorityGroupError, JetStreamAPIError):
    """A consumer configuration with priority groups that the server refuses (a policy
    without a group, a group without a policy, a bad group name, ``priority_timeout`` without
    a policy, groups on a push consumer). ``ConsumerConfig`` refuses these before anything is
    sent, with the ``err_code`` the server would answer."""

    err_codes = (10159, 10161, 10162, 10178, 10196, 10197)


class PriorityGroupNotFound(PriorityGroupError, JetStreamAPIError):
    """The consumer has no priority group of that name (an unpin of an unknown group)."""

    err_codes = (10160,)


class InvalidConsumerReset(JetStreamAPIError):
    """A consumer reset (nats-server 2.14+) the server refuses: a sequence below where the
    consumer's deliver policy starts (``DeliverByStartSequence``, ``DeliverByStartTime``), or
    any sequence on a consumer of another deliver policy (``DeliverNew``, ``DeliverLast``,
    ...), which can only be reset to its ack floor."""

    err_codes = (10204,)


class InvalidPauseUntil(JetStreamError, ValueError):
    """A consumer pause (nats-server 2.11+) the client refuses before sending it: a naive
    ``datetime`` (no timezone: no moment on the server's clock), a negative or non-finite
    number of seconds, or something that is no time at all."""


class AtomicPublishError(JetStreamAPIError):
    """The server refused an atomic batch publish (ADR-50, nats-server 2.12+), or a stream
    configuration for one. A refused batch is abandoned whole: none of its messages is stored.
    The subclasses say why."""


class AtomicPublishDisabled(AtomicPublishError):
    """The stream does not have ``allow_atomic`` (10174): turn it on with a stream update (a
    mirror cannot have it), or publish the messages one by one."""

    err_codes = (10174,)


class AtomicBatchSequenceMissing(AtomicPublishError):
    """A message with ``Nats-Batch-Id`` but no ``Nats-Batch-Sequence`` (10175)."""

    err_codes = (10175,)


class AtomicBatchIncomplete(AtomicPublishError):
    """The batch has a gap, does not start at sequence 1, or is no longer known to the server
    (10176): it abandons a batch that has had no message for its batch timeout (10 s by
    default), or that one of the stream's checks refused. Publish the whole batch again."""

    err_codes = (10176,)


class AtomicUnsupportedHeader(AtomicPublishError, ValueError):
    """A header a batch may not carry (10177); ``Nats-Expected-Last-Msg-Id`` is the one the
    server names. The client refuses it before anything is sent, with this ``err_code``."""

    err_codes = (10177,)


class InvalidBatchId(AtomicPublishError, ValueError):
    """A batch id the server refuses (10179): longer than 64 characters, or empty. The client
    refuses it before anything is sent, with this ``err_code``."""

    err_codes = (10179,)


class AtomicPublishOnMirror(AtomicPublishError):
    """A mirror stream with ``allow_atomic`` (10198): a mirror only copies its origin."""

    err_codes = (10198,)


class AtomicBatchTooLarge(AtomicPublishError):
    """The batch has more messages than the server allows in one (10199; 1000 unless the
    server's ``jetstream.limits.batch.max_msgs`` says otherwise). Split it."""

    err_codes = (10199,)


class InvalidBatchCommit(AtomicPublishError):
    """A ``Nats-Batch-Commit`` value other than ``1`` or ``eob`` (10200)."""

    err_codes = (10200,)


class AtomicBatchDuplicateMessage(AtomicPublishError):
    """A ``Nats-Msg-Id`` of the batch repeats one earlier in the batch or one still in the
    stream's duplicate window (10201). Unlike a single publish, the duplicate is not answered
    as such: the whole batch is refused."""

    err_codes = (10201,)


class AtomicBatchTooManyInflight(AtomicPublishError):
    """The stream (50 by default) or the server (1000) has as many open batches as it allows
    (10210, code 429): commit or let others time out, then start this batch again."""

    err_codes = (10210,)


class AtomicBatchUsageError(JetStreamError, ValueError):
    """An :class:`~headrace.jetstream.AtomicBatch` used in a way it does not allow: a message
    after the batch was committed or refused, a commit of an empty batch, headers that are the
    batch's own (``Nats-Batch-*``). Nothing is sent for the call that raised it."""


class _StoredPubAck(Protocol):
    """What a :class:`~headrace.jetstream.PubAck` says of a stored message, as
    :class:`AtomicPublishUnsupported` keeps it (the answers' models are built with the codec,
    whose ``DecodeError`` is one of these errors: this module does not import them)."""

    @property
    def stream(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def duplicate(self) -> bool: ...
    @property
    def domain(self) -> str | None: ...


class AtomicPublishUnsupported(JetStreamError):
    """The server answered the first message of a batch with a plain PubAck: it does not know
    atomic batches (ADR-50 needs nats-server 2.12+) and stored that message on its own.
    ``ack`` is that PubAck; nothing else of the batch was sent."""

    def __init__(self, message: str, ack: _StoredPubAck) -> None:
        super().__init__(message)
        self.ack = ack


# -- message schedules (ADR-51; headrace.jetstream.schedules) ----------------------------------


class MessageScheduleError(JetStreamAPIError):
    """The server refused a message schedule (ADR-51), or the client did, knowing it would.
    Nothing was stored."""


class MessageSchedulesDisabled(MessageScheduleError):
    """A schedule published to a stream without ``allow_msg_schedules`` (10188). A stream
    update may turn it on (never off again); a mirror or a sourced stream cannot have it."""

    err_codes = (10188,)


class MessageSchedulesNotAllowed(MessageScheduleError):
    """A stream configuration with ``allow_msg_schedules`` and a mirror (10186) or sources
    (10187): schedules produce messages, which a stream that copies another may not. Put the
    schedules in the origin stream."""

    err_codes = (10186, 10187)


class InvalidMessageSchedule(MessageScheduleError, ValueError):
    """A schedule the server refuses for what it says; the subclasses say which header."""


class InvalidSchedulePattern(InvalidMessageSchedule):
    """``Nats-Schedule`` is no schedule (10189): an ``@at`` time without an offset, an
    ``@every`` under a second or not a Go duration, a cron expression without six fields, a
    field out of range, one that never matches (``0 0 0 30 2 *``) or a time zone on anything
    but cron."""

    err_codes = (10189,)


class InvalidScheduleTarget(InvalidMessageSchedule):
    """``Nats-Schedule-Target`` is missing, not a literal subject, the schedule's own subject,
    or no subject of the stream (10190)."""

    err_codes = (10190,)


class InvalidScheduleTTL(InvalidMessageSchedule):
    """``Nats-Schedule-TTL`` is no per-message TTL (10191; the rules of ADR-43's ``Nats-TTL``).
    A valid one on a stream without ``allow_msg_ttl`` is
    :class:`~headrace.jetstream.errors.MessageTTLDisabled` (10166)."""

    err_codes = (10191,)


class InvalidScheduleRollup(InvalidMessageSchedule):
    """``Nats-Schedule-Rollup`` other than ``sub``, or a schedule message whose own
    ``Nats-Rollup`` is other than ``sub`` (10192)."""

    err_codes = (10192,)


class InvalidScheduleSource(InvalidMessageSchedule):
    """``Nats-Schedule-Source`` is not a literal subject of the stream, or is the target or
    the schedule's own subject (10203)."""

    err_codes = (10203,)


class InvalidScheduler(InvalidMessageSchedule):
    """A publish with ``Nats-Scheduler`` that is no stop of a schedule (10212): without
    ``Nats-Schedule-Next: purge``, with another ``Nats-Schedule-Next``, naming its own subject,
    or naming a subject whose last message is no schedule."""

    err_codes = (10212,)


class InvalidScheduleTimeZone(InvalidMessageSchedule):
    """``Nats-Schedule-Time-Zone`` is empty or names no zone the server's time zone database
    has (10223; nats-server 2.14+). Fixed offsets (``+02:00``) are no zone."""

    err_codes = (10223,)


#: The schedule refusals of :func:`api_error`'s table, in the order they are defined.
SCHEDULE_ERRORS: tuple[type[MessageScheduleError], ...] = tuple(
    dict.fromkeys(cls for cls in _BY_CODE.values() if issubclass(cls, MessageScheduleError))
)


def api_error(error: Any) -> JetStreamAPIError:
    """The typed exception for the ``error`` object of an API response."""
    if not isinstance(error, dict):
        return JetStreamAPIError(0, 0, f"malformed API error: {error!r}")
    code = error.get("code", 0)
    err_code = error.get("err_code", 0)
    description = str(error.get("description", "unknown error"))
    cls = _BY_CODE.get(err_code, JetStreamAPIError) if isinstance(err_code, int) else None
    return (cls or JetStreamAPIError)(
        code if isinstance(code, int) else 0,
        err_code if isinstance(err_code, int) else 0,
        description,
    )


class JetStreamUnavailable(JetStreamError):
    """Nothing answered on the JetStream API: JetStream is off for this account or server, the
    domain or API prefix is wrong, or the cluster has no quorum right now."""


class NoStreamForSubject(JetStreamError):
    """A JetStream publish reached no stream: no stream captures that subject."""

    def __init__(self, subject: str) -> None:
        super().__init__(
            f"no stream captures subject {subject!r}; create a stream with that subject, or "
            "publish to a subject a stream listens on"
        )
        self.subject = subject


class InvalidAckReply(JetStreamError, ValueError):
    """A reply subject that is not a valid ``$JS.ACK`` subject (ADR-15)."""


class NotAJetStreamMessage(JetStreamError):
    """Acking a message that did not come from a JetStream consumer (no ``$JS.ACK`` reply)."""


class InvalidNameError(JetStreamError, ValueError):
    """A stream or consumer name that cannot be used: it is empty, or has whitespace, ``.``,
    ``*``, ``>``, a path separator or a control character.

    Names are part of API subjects (``$JS.API.STREAM.INFO.<stream>``), so such a name would
    address another subject, or none, and the call would wait out its timeout; it is refused
    before anything is sent. ``argument`` names the argument that carried it.
    """

    def __init__(self, kind: str, argument: str, name: object) -> None:
        super().__init__(
            f"invalid {kind} name {name!r} (argument {argument!r}): a {kind} name must be "
            "non-empty, without whitespace, '.', '*', '>', path separators or control characters"
        )
        self.kind = kind
        self.argument = argument
        self.name = name


class InvalidConfigValue(JetStreamError, ValueError):
    """A stream or consumer configuration field with a value the server would refuse or
    misread (a negative limit, a replica count out of range, a subject with whitespace,
    metadata that is not text to text). Refused when the config is built, before anything is
    sent; ``field`` names the field, as the API spells it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class ConsumerNameConflict(JetStreamError, ValueError):
    """Two names given for one consumer disagree: ``name`` and ``durable_name`` of a
    ``ConsumerConfig``, or a subscribe call's ``durable=`` / ``bind=`` and the config's names.

    Only one can be meant. A create put ``durable_name`` into the API subject and made that
    consumer without a word about ``name``; a subscription looked one up and created another.
    The call is refused before anything is sent.
    """


class SubscribeError(JetStreamError, ValueError):
    """A subscription request that breaks a rule of ADR-15's subscribe workflow; the message
    says which and what to do instead."""


class StreamLookupError(SubscribeError):
    """No stream, or more than one, captures the subscription's subject."""


class ConsumerConfigMismatch(SubscribeError):
    """An existing consumer does not match what the subscription asks for (type, deliver
    group, filter subject, or configuration drift)."""


class PullStatusError(JetStreamError):
    """A pull request ended with a status that is an error (ADR-37 status handling)."""

    def __init__(self, status: int, description: str, message: str | None = None) -> None:
        super().__init__(message or f"pull request failed: {status} {description}")
        self.status = status
        self.description = description


class PriorityPullRefused(PriorityGroupError, PullStatusError):
    """A pull that does not fit the consumer's priority groups (ADR-42): the server answered
    400 (or the client saw it coming from the consumer's configuration and sent nothing).
    Pulling again the same way is refused the same way, so a consume ends with it."""


class PriorityGroupMissing(PriorityPullRefused):
    """The consumer has priority groups and the pull named none: give ``group``."""


class UnknownPriorityGroup(PriorityPullRefused):
    """The pull named a group the consumer does not have (or the consumer has none, which
    the server would ignore, delivering as if no group were asked for)."""


class PriorityPolicyMismatch(PriorityPullRefused):
    """The pull asked for what another policy does: ``min_pending``/``min_ack_pending`` on a
    consumer that is not ``overflow``, an ``id`` on one that is not ``pinned_client``, or a
    ``priority`` on one that is not ``prioritized``."""


class PushStatusError(JetStreamError):
    """A push subscription received an error status (ADR-15 "Miscellaneous Error Statuses")."""

    def __init__(self, status: int, description: str) -> None:
        super().__init__(f"the push consumer sent status {status} {description!r}")
        self.status = status
        self.description = description


class ConsumerDeleted(PullStatusError):
    """409 Consumer Deleted: the consumer went away while we were pulling from it."""


class ConsumerIsPushBased(PullStatusError):
    """409 Consumer is push based: pull requests were sent to a push consumer."""


class MessageTooLarge(PullStatusError):
    """409 Message Size Exceeds MaxBytes to a request that asked for the whole ``max_bytes``:
    the consumer's next message is larger than a pull may ever take, so pulling again would be
    refused the same way at once, for ever. ``stream``, ``consumer`` and ``max_bytes`` say
    which limit; raise it (or pull by message count) to get the message."""

    def __init__(self, description: str, stream: str, consumer: str, max_bytes: int) -> None:
        super().__init__(
            409,
            description,
            f"the next message of consumer {consumer!r} on stream {stream!r} is larger than "
            f"max_bytes ({max_bytes} bytes, counting subject, reply, headers and payload): it "
            "can never be pulled with that limit; raise max_bytes or pull by max_messages",
        )
        self.stream = stream
        self.consumer = consumer
        self.max_bytes = max_bytes


class AckRefused(JetStreamError):
    """The server refuses this connection's acks for a consumer: publishing to its ``$JS.ACK``
    subjects is a permissions violation. Nothing acked would ever count, so every message would
    come back after ack_wait, for ever. ``subject`` is the refused ack subject; the
    :class:`~headrace.errors.PermissionViolation` is the ``__cause__``.
    """

    restartable = False  # a restart would be refused the same way

    def __init__(self, stream: str, consumer: str, subject: str) -> None:
        super().__init__(
            f"the server refuses acks for consumer {consumer!r} on stream {stream!r} "
            f"(permissions violation for publish to {subject!r}): allow this user to publish "
            f"to '$JS.ACK.{stream}.{consumer}.>'"
        )
        self.stream = stream
        self.consumer = consumer
        self.subject = subject
