"""Pipeline sources: where records come from.

:class:`JetStreamSource` describes a JetStream consumer: the stream, a durable name (or an
ephemeral consumer), filter subjects, pull (default) or push, and the consume options. At run
time the source actor binds or creates the consumer through ADR-15's workflow and turns each
batch of messages into records.
"""

from __future__ import annotations

from typing import Any

import attrs

from headrace.jetstream.consume import ConsumeOptions
from headrace.jetstream.consumer_config import AckPolicy, ConsumerConfig
from headrace.jetstream.lifecycle import DeletePolicy


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
    """

    stream: str
    durable: str | None = None
    filter_subjects: tuple[str, ...] = attrs.field(default=(), converter=_subjects)
    pull: bool = True
    config: ConsumerConfig = attrs.field(factory=ConsumerConfig)
    consume: ConsumeOptions = attrs.field(factory=ConsumeOptions)
    delete_policy: DeletePolicy = DeletePolicy.AUTO

    def __attrs_post_init__(self) -> None:
        if self.config.ack_policy not in (None, AckPolicy.EXPLICIT):
            raise ValueError(
                "a pipeline source needs ack policy 'explicit' (the default): records are acked "
                "one message at a time, after their sinks committed them"
            )
        if self.config.deliver_subject:
            raise ValueError("leave deliver_subject unset; a push source picks its own inbox")

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
