"""Pipeline sources: where records come from.

:class:`JetStreamSource` describes a JetStream consumer: the stream, a durable name (or an
ephemeral consumer), filter subjects, pull (default) or push, and the consume options. At run
time the source actor binds or creates the consumer through ADR-15's workflow and turns each
batch of messages into records.

A pull source on a consumer with priority groups (ADR-42) names its group with
``priority_group``; ``min_pending``/``min_ack_pending`` make it an ``overflow`` worker that
takes messages only when the others fall behind, ``priority`` orders it under
``prioritized``; under ``pinned_client`` the source is the pinned worker or a hot standby,
as the server decides (docs/scaling.md).
"""

from __future__ import annotations

from typing import Any

import attrs

from headrace.jetstream.consume import ConsumeOptions
from headrace.jetstream.consumer_config import AckPolicy, ConsumerConfig, DeliverPolicy
from headrace.jetstream.errors import PriorityGroupError
from headrace.jetstream.lifecycle import DeletePolicy
from headrace.jetstream.priority import (
    DEFAULT_PRIORITY_TIMEOUT,
    PriorityPolicy,
    check_pull_fits,
    priority_pull,
)


def _subjects(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


@attrs.frozen(slots=True, kw_only=True)
class JetStreamSource:
    """A JetStream consumer as a pipeline source.

    ``durable`` names a durable consumer (created if missing, shared by every copy of the
    pipeline: they scale out on it); without it the consumer is ephemeral. ``filter_subjects``
    restricts it; ``config`` adds consumer settings (``ack_wait``, ``max_ack_pending``, ...).
    ``pull`` (default) consumes with ADR-37 consume; ``pull=False`` subscribes to a push
    consumer. ``consume`` sets the consume buffer (pull only).

    ``priority_group`` (pull only) is the consumer's priority group every pull names, with
    ``min_pending`` and ``min_ack_pending`` (``overflow``) or ``priority`` (``prioritized``);
    the consumer's groups and policy go in ``config`` (``priority_groups``,
    ``priority_policy``, ``priority_timeout``) when this source creates it.

    ``start``: where a durable this source creates starts (``DeliverPolicy.NEW``: the
    messages stored from then on), when one that exists should go on from where it is
    (``headrace run --deliver``). ``config.deliver_policy`` is different: a durable that
    exists must have been made with it. The two cannot be given together.
    """

    stream: str
    durable: str | None = None
    filter_subjects: tuple[str, ...] = attrs.field(default=(), converter=_subjects)
    pull: bool = True
    config: ConsumerConfig = attrs.field(factory=ConsumerConfig)
    consume: ConsumeOptions = attrs.field(factory=ConsumeOptions)
    delete_policy: DeletePolicy = DeletePolicy.AUTO
    priority_group: str | None = None
    min_pending: int | None = None
    min_ack_pending: int | None = None
    priority: int | None = None
    start: DeliverPolicy | None = attrs.field(
        default=None, converter=attrs.converters.optional(DeliverPolicy)
    )

    def __attrs_post_init__(self) -> None:
        self._check_priority()
        if self.start is not None:
            if self.config.deliver_policy is not None:
                raise ValueError(
                    "give start (for a consumer this source creates) or "
                    "config.deliver_policy (which an existing one must match), not both"
                )
            if self.start in (DeliverPolicy.BY_START_SEQUENCE, DeliverPolicy.BY_START_TIME):
                raise ValueError(
                    f"start={self.start}: needs a sequence or a time; give it in config "
                    "(deliver_policy, opt_start_seq or opt_start_time)"
                )
        if self.config.ack_policy not in (None, AckPolicy.EXPLICIT):
            raise ValueError(
                "a pipeline source needs ack policy 'explicit' (the default): records are acked "
                "one message at a time, after their sinks committed them"
            )
        if self.config.deliver_subject:
            raise ValueError("leave deliver_subject unset; a push source picks its own inbox")

    def _check_priority(self) -> None:
        pull = priority_pull(
            self.priority_group, self.min_pending, self.min_ack_pending, self.priority
        )
        if pull is not None and not self.pull:
            raise PriorityGroupError("priority groups are for pull consumers: leave pull=True")
        if pull is not None and self.consume.priority_pull is not None:
            raise PriorityGroupError(
                "give the priority group as priority_group=..., or in consume=ConsumeOptions"
                "(group=...), not both"
            )
        if self.config.priority_policy is not None and self.pull:
            # The source creates the consumer with these groups: check the fit now, not at run.
            check_pull_fits(
                pull or self.consume.priority_pull,
                self.config.priority_groups,
                self.config.priority_policy,
                stream=self.stream,
                consumer=self.durable or "(ephemeral)",
            )
            timeout = self.config.priority_timeout or DEFAULT_PRIORITY_TIMEOUT
            pinned = self.config.priority_policy == PriorityPolicy.PINNED_CLIENT
            if pinned and self.consume.expires >= timeout:
                raise PriorityGroupError(
                    f"consume expires ({self.consume.expires}s) must be shorter than "
                    f"priority_timeout ({timeout}s): an idle worker renews its pin only when "
                    "its pull expires (about half of the timeout is a good expires)"
                )

    def consume_options(self) -> ConsumeOptions:
        """The consume buffer's options, with this source's priority group."""
        if self.priority_group is None:
            return self.consume
        return attrs.evolve(
            self.consume,
            group=self.priority_group,
            min_pending=self.min_pending,
            min_ack_pending=self.min_ack_pending,
            priority=self.priority,
        )

    def consumer_config(self) -> ConsumerConfig:
        """The consumer configuration this source asks for."""
        filters = list(self.filter_subjects)
        updates: dict[str, Any] = {"ack_policy": AckPolicy.EXPLICIT}
        if len(filters) == 1:
            updates["filter_subject"] = filters[0]
        elif filters:
            updates["filter_subjects"] = filters
        return attrs.evolve(self.config, **updates)

    def describe(self) -> str:
        kind = "pull" if self.pull else "push"
        name = self.durable or "ephemeral"
        return f"{self.stream}/{name} ({kind})"
