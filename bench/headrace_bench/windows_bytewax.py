"""The Bytewax side of ``headrace bench windows``: per-user counts of clicks in one-minute
tumbling windows of event time, written as a Bytewax (0.21) user would write it with nats-py.

Imported only by that benchmark's Bytewax child process (``bytewax`` and ``nats`` are imported
here at the top, as in a user's flow module).

The source: Bytewax has no NATS connector, so this is the custom source a user writes, a
:class:`~bytewax.inputs.DynamicSource` (the durable consumer keeps the position on the server,
so the partition has no resume state of its own, and every worker could pull from the same
durable). Its partition runs nats-py on an asyncio loop of its own: ``pull_subscribe`` on the
durable, then per ``next_batch`` one ``fetch(FETCH)`` (what is there, up to a second's wait) and
``await msg.ack()`` for each message, **when fetched**, before Bytewax has counted them: a crash
loses the events acked but not yet in an emitted window (at most once; Bytewax's recovery,
not enabled here, snapshots its own state but cannot un-ack). The partition ends the input
(``StopIteration``) once it has read ``stop_after`` messages, or after ``idle`` seconds with
none (then the counts come out short, and the benchmark says so); ``close`` drains the
connection, so the last acks reach the server.

The flow: ``op.input`` -> ``op.map(json.loads)`` -> ``count_window`` (which keys the clicks by
user with ``op.key_on`` and counts with ``fold_window``) with an ``EventClock`` on the click's
``ts`` waiting 30 s (``wait_for_system_duration``) and a ``TumblingWindower`` of 60 s aligned to
the epoch; the windows' counts and the late clicks each into a ``TestingSink`` (a list).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import bytewax.operators as op
import nats  # type: ignore[import-not-found,unused-ignore]
from bytewax.dataflow import Dataflow
from bytewax.inputs import DynamicSource, StatelessSourcePartition
from bytewax.operators.windowing import EventClock, TumblingWindower, count_window
from bytewax.testing import TestingSink
from nats.js.api import ConsumerConfig  # type: ignore[import-not-found,unused-ignore]

#: Messages per ``fetch`` (the batch size of Bytewax's own Kafka source, ``batch_size=1000``).
FETCH = 1000
#: How long one ``fetch`` waits for messages before ``next_batch`` returns nothing.
FETCH_TIMEOUT = 1.0
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class JetStreamPartition(StatelessSourcePartition[bytes]):
    """One worker's reader of the durable pull consumer (see the module docs)."""

    def __init__(
        self,
        url: str,
        stream: str,
        subjects: str,
        durable: str,
        *,
        fetch: int,
        stop_after: int,
        idle: float,
        max_ack_pending: int,
        read: list[int],
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._read = read  # [messages read so far], shared with the source (for the report)
        self._fetch_size = fetch
        self._left = stop_after
        self._idle = idle
        self._last_message = time.monotonic()
        self._nc: Any = self._loop.run_until_complete(nats.connect(url))
        config = ConsumerConfig(max_ack_pending=max_ack_pending)
        self._sub: Any = self._loop.run_until_complete(
            self._nc.jetstream().pull_subscribe(
                subjects, durable=durable, stream=stream, config=config
            )
        )

    def next_batch(self) -> list[bytes]:
        if self._left <= 0 or time.monotonic() - self._last_message > self._idle:
            raise StopIteration
        data = self._loop.run_until_complete(self._fetch(min(self._fetch_size, self._left)))
        if data:
            self._left -= len(data)
            self._read[0] += len(data)
            self._last_message = time.monotonic()
        return data

    async def _fetch(self, batch: int) -> list[bytes]:
        try:
            msgs = await self._sub.fetch(batch, timeout=FETCH_TIMEOUT)
        except TimeoutError:  # nats.errors.TimeoutError: nothing came within the timeout
            return []
        for msg in msgs:
            await msg.ack()  # acked when fetched (at most once: see the module docs)
        return [msg.data for msg in msgs]

    def close(self) -> None:
        self._loop.run_until_complete(self._nc.drain())  # the last acks are flushed
        self._loop.close()


class JetStreamSource(DynamicSource[bytes]):
    """A durable pull consumer of ``stream`` as a Bytewax input (see the module docs)."""

    def __init__(self, url: str, stream: str, subjects: str, durable: str, **options: Any) -> None:
        self.url, self.stream, self.subjects, self.durable = url, stream, subjects, durable
        self.options = options
        #: Messages read by this process's partitions so far.
        self.read = [0]

    def build(self, step_id: str, worker_index: int, worker_count: int) -> JetStreamPartition:
        return JetStreamPartition(
            self.url, self.stream, self.subjects, self.durable, read=self.read, **self.options
        )


def user_of(click: dict[str, Any]) -> str:
    return str(click["user"])


def click_time(click: dict[str, Any]) -> datetime:
    return datetime.fromtimestamp(click["ts"], tz=UTC)


def flow(
    source: JetStreamSource,
    *,
    window: timedelta,
    lateness: timedelta,
    counts: list[Any],
    late: list[Any],
) -> Dataflow:
    """The dataflow: counts per (user, window) into ``counts`` as ``(user, (window_id,
    count))``, where window ``k`` starts at ``EPOCH + k * window``; late clicks into
    ``late``."""
    dataflow = Dataflow("clicks_per_minute")
    raw = op.input("clicks", dataflow, source)
    clicks = op.map("decode", raw, json.loads)
    clock = EventClock(ts_getter=click_time, wait_for_system_duration=lateness)
    windower = TumblingWindower(length=window, align_to=EPOCH)
    windows = count_window("per_minute", clicks, clock, windower, key=user_of)
    op.output("counts", windows.down, TestingSink(counts))
    op.output("late", windows.late, TestingSink(late))
    return dataflow
