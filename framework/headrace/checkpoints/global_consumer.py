"""The global stream consumer: reads the stream once per subscription group and turns messages
into work, raising each affected checkpoint's version (Beckett's model).

It reads with a durable pull consumer (``checkpoints_<group>``), so its ack floor is the
group's global checkpoint: a batch is acked only after every checkpoint it touches was written,
and a crash in between re-reads the batch, which raises the same versions again (harmless:
versions only go up). One write per checkpoint per batch, each a compare-and-set
(store.py), so it never undoes a worker's position or reservation.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from headrace.checkpoints.checkpoint import Checkpoint
from headrace.checkpoints.store import CheckpointStore
from headrace.checkpoints.subscription import SubscriptionGroup, versions
from headrace.jetstream import AckPolicy, ConsumerConfig, JetStream
from headrace.jetstream.message import JsMsg, ack_all


def durable_name(group: str) -> str:
    return f"checkpoints_{group}"


@attrs.define(slots=True)
class GlobalConsumer:
    """Reads ``stream`` for ``group`` into ``store``; :meth:`run` until cancelled."""

    js: JetStream
    stream: str
    group: SubscriptionGroup
    store: CheckpointStore
    batch: int = 1000
    #: Longest wait for a batch to fill: a quiet stream's messages become work this soon.
    max_wait: float = 0.5
    #: Messages read, and checkpoint writes made, since start.
    messages: int = 0
    writes: int = 0

    async def ensure_consumer(self) -> None:
        await self.js.create_or_update_consumer(
            self.stream,
            ConsumerConfig(
                durable_name=durable_name(self.group.name), ack_policy=AckPolicy.EXPLICIT
            ),
        )

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.ensure_consumer()
        consumer = await self.js.pull_consumer(self.stream, durable_name(self.group.name))
        task_status.started()
        while True:
            msgs = await consumer.fetch(self.batch, expires=self.max_wait)
            if msgs:
                await self.apply(msgs)

    async def apply(self, msgs: list[JsMsg]) -> None:
        """Raise the versions a batch implies, then ack it."""
        header = self.group.type_header
        seen = versions(
            self.group,
            (
                (m.subject, m.headers.get(header) if m.headers else None, m.metadata.stream_seq)
                for m in msgs
            ),
        )
        for cid, version in seen.items():
            await self.store.change(cid, _raise_to(version), create=True)
        self.writes += len(seen)
        self.messages += len(msgs)
        ack_all(msgs)


def _raise_to(version: int) -> Callable[[Checkpoint], Checkpoint]:
    return lambda cp: cp.seen(version)
