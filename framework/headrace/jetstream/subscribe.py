"""ADR-15's subscribe workflow: from a subscribe call to a bound or created consumer.

The rules, in the order they are checked, each a :class:`SubscribeError` (or one of its
subclasses, or the name errors of rule 0) whose message says what to do:

0. every name must be usable in an API subject (:class:`InvalidNameError`), and the names of the
   consumer (``bind=``, ``durable=``, the config's ``durable_name`` and ``name``, and a queue
   group standing in for a durable) must agree (:class:`ConsumerNameConflict`): otherwise one
   would be looked up and another created;
1. a queue group with heartbeats or flow control in the config: the server would send those to
   random members;
2. neither a subject nor a stream: nothing to find the stream with;
3. a pull subscription with ack policy ``none`` or ``all``; a config whose ``filter_subject``
   or ``filter_subjects`` contradicts the subject (the library filters the consumer on the
   subject; the messages of another filter would reach a subscription to this subject);
4. no stream given: the one stream capturing the subject (:class:`StreamLookupError` for none or
   several);
5. a consumer name given: look it up. A missing bound consumer (``bind=``) is an error, except
   for pull subscriptions, which create it; a missing durable is created;
6. a queue group without a durable or bound name uses the queue name as the durable;
7. an existing consumer must match (:class:`ConsumerConfigMismatch`): pull vs push both ways,
   the filter subject, the deliver group rules (push bound without a group is a duplicate
   subscription; a group consumer joined without a queue; a queue on a consumer without a group;
   a different group), flow control or heartbeats over a queue, and no configuration drift
   (only the deliver subject may differ);
8. push: the NATS subscription is made before the consumer is created, so that for a durable
   the server sees the interest (the only way it can tell the durable is in use);
9. creating races with someone else's create (``ConsumerAlreadyExists``): look it up, check it
   as in 7, and move the NATS subscription to its deliver subject if that differs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from headrace.jetstream.consumer_config import AckPolicy, ConsumerConfig, ConsumerInfo
from headrace.jetstream.errors import (
    ConsumerAlreadyExists,
    ConsumerConfigMismatch,
    ConsumerNotFound,
    SubscribeError,
)
from headrace.jetstream.lifecycle import settled_push_bound
from headrace.jetstream.names import agreed_name, check_consumer, check_stream
from headrace.jetstream.push import Inlet

if TYPE_CHECKING:
    from headrace.jetstream.api import JetStreamAPI
    from headrace.nats.subscription import Subscription

# Fields whose difference from the server's is not drift: names are matched by lookup already,
# and the deliver subject is the one thing an existing consumer may change (ADR-15).
_NOT_DRIFT = {"name", "durable_name", "deliver_subject"}


def check_names(
    stream: str | None,
    durable: str | None,
    bind: str | None,
    config: ConsumerConfig,
) -> str | None:
    """Rule 0: the names are valid and agree; the consumer's name, if one is given."""
    if stream is not None:
        check_stream("stream", stream)
    if durable is not None:
        check_consumer("durable", durable)
    if bind is not None:
        check_consumer("bind", bind)
    return agreed_name(
        {
            "bind": bind,
            "durable": durable,
            "config.durable_name": config.durable_name,
            "config.name": config.name,
        }
    )


def check_filter(subject: str | None, config: ConsumerConfig) -> None:
    """Rule 3, second part: the library filters the consumer on the subscribed subject, so a
    config filter other than that subject contradicts it (ADR-15)."""
    if not subject:
        return
    if config.filter_subject is not None and config.filter_subject != subject:
        raise SubscribeError(
            f"the subscription is to {subject!r} but its config filters "
            f"{config.filter_subject!r}: the consumer is filtered on the subscribed subject, "
            "so leave filter_subject out (or subscribe to that subject)"
        )
    if config.filter_subjects is not None and config.filter_subjects != [subject]:
        raise SubscribeError(
            f"the subscription is to {subject!r} but its config filters "
            f"{config.filter_subjects!r}: to consume several subjects, subscribe without a "
            "subject (give the stream) and keep filter_subjects"
        )


def check_request(
    subject: str | None,
    stream: str | None,
    queue: str | None,
    config: ConsumerConfig,
    *,
    pull: bool,
    durable: str | None = None,
    bind: str | None = None,
) -> str | None:
    """Rules 0-3: mistakes visible before asking the server anything. Returns the name of
    the consumer to look up (the queue group's, for a push queue subscription naming none)."""
    name = check_names(stream, durable, bind, config)
    if name is None and queue is not None and not pull:
        # ADR-15: the queue group names the durable, so it must be a valid consumer name.
        name = check_consumer("queue", queue)
    if queue is not None and not pull:
        if config.idle_heartbeat:
            raise SubscribeError(
                f"queue group {queue!r} with idle_heartbeat: heartbeats are not supported over "
                "queue groups (the server would send them to a random member); drop one"
            )
        if config.flow_control:
            raise SubscribeError(
                f"queue group {queue!r} with flow_control: flow control is not supported over "
                "queue groups (the server would send requests to a random member); drop one"
            )
    if not subject and not stream:
        raise SubscribeError(
            "give a subject (to find the stream and filter the consumer) or a stream name"
        )
    if pull and config.ack_policy in (AckPolicy.NONE, AckPolicy.ALL):
        raise SubscribeError(
            f"pull subscriptions need ack policy 'explicit', not {config.ack_policy.value!r}: "
            "pull consumers deliver to whoever asks, so each message must be acked on its own"
        )
    check_filter(subject, config)
    return name


def check_existing(
    info: ConsumerInfo,
    *,
    subject: str | None,
    queue: str | None,
    config: ConsumerConfig,
    pull: bool,
) -> None:
    """Rule 7: an existing consumer must be what the subscription asks for."""
    where = f"consumer {info.name!r} on stream {info.stream_name!r}"
    cc = info.config
    if pull and cc.deliver_subject:
        raise ConsumerConfigMismatch(
            f"{where} is push based (deliver subject {cc.deliver_subject!r}); use subscribe() "
            "for it, or pull from another consumer"
        )
    if not pull and not cc.deliver_subject:
        raise ConsumerConfigMismatch(f"{where} is a pull consumer; use pull_subscribe() for it")
    if subject:
        filters = [f for f in [cc.filter_subject, *(cc.filter_subjects or [])] if f]
        if filters and subject not in filters:
            raise ConsumerConfigMismatch(
                f"{where} filters {', '.join(repr(f) for f in filters)}, not {subject!r}; "
                "subscribe with its filter subject or use another consumer"
            )
    if not pull:
        group = cc.deliver_group
        if queue is None:
            if group:
                raise ConsumerConfigMismatch(
                    f"{where} was created for queue group {group!r}; subscribe with "
                    f"queue={group!r} to join it"
                )
            if info.push_bound:
                raise ConsumerConfigMismatch(
                    f"{where} is already bound to a subscription (duplicate subscription); "
                    "a push consumer without a deliver group serves one subscriber"
                )
        else:
            if not group:
                raise ConsumerConfigMismatch(
                    f"{where} was created without a deliver group; it cannot be shared as "
                    f"queue group {queue!r}"
                )
            if group != queue:
                raise ConsumerConfigMismatch(
                    f"{where} was created for queue group {group!r}, not {queue!r}"
                )
            if cc.flow_control:
                raise ConsumerConfigMismatch(
                    f"{where} has flow control, which is not supported over queue groups"
                )
            if cc.idle_heartbeat:
                raise ConsumerConfigMismatch(
                    f"{where} has idle heartbeats, which are not supported over queue groups"
                )
    for name, wanted in config.set_fields().items():
        if name in _NOT_DRIFT:
            continue
        actual = getattr(cc, name)
        if not _same(name, wanted, actual):
            raise ConsumerConfigMismatch(
                f"{where} exists with {name}={actual!r}, not {wanted!r}: subscribing cannot "
                "change an existing consumer (only its deliver subject); update it, or use "
                "another consumer"
            )


def _same(name: str, wanted: Any, actual: Any) -> bool:
    """Whether a value the user set matches the server's, allowing for how the server reports
    configs: it omits false, zero and empty values, and adds its own ``_nats.*`` metadata."""
    if name == "metadata" and isinstance(wanted, dict):
        have = actual or {}
        return all(have.get(k) == v for k, v in wanted.items())
    if actual is None:
        return not wanted
    return bool(actual == wanted)


async def _lookup(js: JetStreamAPI, stream: str, name: str | None) -> ConsumerInfo | None:
    if not name:
        return None
    try:
        return await js.consumer_info(stream, name)
    except ConsumerNotFound:
        return None


@attrs.frozen(slots=True)
class Bound:
    """The outcome of the workflow: the stream, the consumer's info, whether we created it,
    and (push) the NATS subscription with its inlet."""

    stream: str
    info: ConsumerInfo
    created: bool
    sub: Subscription | None = None
    inlet: Inlet | None = None


async def bind_push(
    js: JetStreamAPI,
    subject: str | None,
    *,
    stream: str | None,
    durable: str | None,
    bind: str | None,
    queue: str | None,
    config: ConsumerConfig,
) -> Bound:
    """Rules 0-9 for a push subscription."""
    name = check_request(subject, stream, queue, config, pull=False, durable=durable, bind=bind)
    stream = stream or await js.find_stream(subject or "")
    info = await _lookup(js, stream, name)
    if info is not None and info.push_bound and queue is None and not info.config.deliver_group:
        # Maybe only the subscription before this one, still being forgotten by the server:
        # believed once it stays bound (else re-subscribing right after an unsubscribe failed
        # as a duplicate subscription about one time in thirty).
        info = await settled_push_bound(js, stream, info.name)
    if info is None and bind:
        raise ConsumerNotFound(
            404,
            10014,
            f"consumer {bind!r} not found on stream {stream!r}: create it, or subscribe "
            "without bind= to have one created",
        )
    nc = js.nc
    inlet = Inlet()
    if info is not None:
        check_existing(info, subject=subject, queue=queue, config=config, pull=False)
        assert info.config.deliver_subject
        sub = nc.subscribe_nowait(info.config.deliver_subject, queue=queue, handler=inlet)
        return Bound(stream, info, False, sub, inlet)
    deliver = config.deliver_subject or nc.new_inbox()
    # Rule 8: interest first, then the consumer.
    sub = nc.subscribe_nowait(deliver, queue=queue, handler=inlet)
    durable_name = durable or config.durable_name or (queue if not config.name else None)
    wanted = attrs.evolve(
        config,
        durable_name=durable_name,
        deliver_subject=deliver,
        deliver_group=queue,
        filter_subject=config.filter_subject
        or (subject if subject and not config.filter_subjects else None),
        ack_policy=config.ack_policy or AckPolicy.EXPLICIT,
    )
    try:
        info = await js.create_consumer(stream, wanted)
        return Bound(stream, info, True, sub, inlet)
    except ConsumerAlreadyExists:
        pass  # rule 9: someone created it between our lookup and our create
    except BaseException:
        await sub.unsubscribe()
        raise
    try:
        info = await js.consumer_info(stream, wanted.consumer_name or "")
        check_existing(info, subject=subject, queue=queue, config=config, pull=False)
    except BaseException:
        await sub.unsubscribe()
        raise
    if info.config.deliver_subject != deliver:
        await sub.unsubscribe()
        inlet = Inlet()
        assert info.config.deliver_subject
        sub = nc.subscribe_nowait(info.config.deliver_subject, queue=queue, handler=inlet)
    return Bound(stream, info, False, sub, inlet)


async def bind_pull(
    js: JetStreamAPI,
    subject: str | None,
    *,
    stream: str | None,
    durable: str | None,
    bind: str | None,
    config: ConsumerConfig,
) -> Bound:
    """Rules 0-7 and 9 for a pull subscription (a missing named consumer is created)."""
    name = check_request(subject, stream, None, config, pull=True, durable=durable, bind=bind)
    stream = stream or await js.find_stream(subject or "")
    info = await _lookup(js, stream, name)
    if info is not None:
        check_existing(info, subject=subject, queue=None, config=config, pull=True)
        return Bound(stream, info, False)
    wanted = attrs.evolve(
        config,
        # A durable unless only the config's name was given (a named ephemeral).
        durable_name=durable or config.durable_name or (name if not config.name else None),
        filter_subject=config.filter_subject
        or (subject if subject and not config.filter_subjects else None),
        ack_policy=config.ack_policy or AckPolicy.EXPLICIT,
    )
    try:
        return Bound(stream, await js.create_consumer(stream, wanted), True)
    except ConsumerAlreadyExists:
        info = await js.consumer_info(stream, wanted.consumer_name or "")
        check_existing(info, subject=subject, queue=None, config=config, pull=True)
        return Bound(stream, info, False)
