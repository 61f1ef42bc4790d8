"""A message delivered again while the pipeline still holds it is not taken again.

When a +WPI comes too late (a host starved of CPU, a loop held up past ``ack_wait``), the
server delivers held messages again. Taken again, each went through the pipeline a second
time, was kept alive a second time and reached its sink twice: work that made the next
keep-alives later still (issue 23: 86,641 deliveries and 1.29 M keep-alives for 10,000
messages). Here the loop is held up, for real, for longer than the ack wait while a failing
batch is held; the server's redeliveries must answer for the held messages, not become a
second batch.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import pytest
import trio
from headrace.jetstream import ConsumerConfig
from headrace.pipeline import Batch, BatchPolicy, SinkRetry
from headrace.sinks import MemorySink

from tests.pipeline.pipe_support import (
    add_stream,
    connect,
    fast_pipeline,
    publish,
    source,
    wait_consumer,
)

N = 500
ACK_WAIT = 1.0


class Down(Exception):
    transient = True  # an outage: retried whole, never split


class StallingSink(MemorySink):
    """Its first write holds the event loop up for 1.5 ack waits, then fails (as does the
    second): the batch stays held through the stall and the retries. Every record it is
    handed is counted, written or not."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0
        self.handed: collections.Counter[int] = collections.Counter()
        self.redelivered_seen = trio.Event()

    async def write_batch(self, batch: Batch) -> None:
        self.attempts += 1
        self.handed.update(r.delivery.msg.metadata.stream_seq for r in batch.records)
        if self.attempts == 1:
            # The loop held up on purpose: no +WPI can go out meanwhile.
            time.sleep(1.5 * ACK_WAIT)  # noqa: ASYNC251
        if self.attempts <= 2:
            raise Down("the sink is down")
        await super().write_batch(batch)


@pytest.mark.slow  # a loop held up for 1.5 s, then two retries
async def test_redeliveries_of_held_messages_are_not_taken_again(
    nats_server: Any, natspy: Any
) -> None:
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    await publish(natspy, N)
    sink = StallingSink()
    pipe = fast_pipeline("held", sink_retry=SinkRetry(backoff=1.0))
    spec = source(config=ConsumerConfig(ack_wait=ACK_WAIT, max_ack_pending=4 * N))
    # One batch of all N; room for N more in the pipeline (max_in_flight is twice the batch),
    # so redeliveries would be taken while the batch is held.
    pipe.source(spec).sink(sink, name="out", batch=BatchPolicy(max_messages=N, max_age=0.2))
    async with connect(nats_server.url) as nc, pipe.running(nc) as run:
        with trio.fail_after(30):
            await run.wait_caught_up()
        info = await wait_consumer(
            natspy, lambda i: i.ack_floor.stream_seq == N and i.num_ack_pending == 0
        )
        stats = run.stats
    # (Deliveries in all, by the consumer's sequence.)
    assert info.delivered.consumer_seq > N, "the stall caused no redelivery: proves nothing"
    # The redeliveries answered for the held messages: none reached the sink a second time
    # (three attempts of the one batch), none was taken as a new message.
    assert sink.attempts == 3
    assert set(sink.handed.values()) == {3} and len(sink.handed) == N
    assert sorted(r.delivery.msg.metadata.stream_seq for r in sink.records) == list(range(1, N + 1))
    assert stats.messages_in == N and stats.redelivered_held > 0, stats
    # Acked through the newest delivery: the written records carry it.
    assert max(r.delivery.msg.metadata.num_delivered for r in sink.records) > 1
    assert stats.acks == N


@pytest.mark.slow
async def test_records_a_sink_skips_as_committed_are_counted_apart(
    nats_server: Any, natspy: Any, tmp_path: Any
) -> None:
    """Issue 23: redeliveries a sink skipped as committed were counted in ``records_out``
    (81,000 for 80,000 rows) and in nothing else. A second consumer reads the stream again
    into the same output: every record is skipped, none is out."""
    from headrace.sinks import JsonlSink

    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    await publish(natspy, 100)
    out = tmp_path / "out"
    for durable, written, skipped in (("first", 100, 0), ("second", 0, 100)):
        pipe = fast_pipeline("again")
        pipe.source(source(durable=durable)).sink(
            JsonlSink(out, fsync=False), name="lake", batch=BatchPolicy(max_messages=30)
        )
        async with connect(nats_server.url) as nc, pipe.running(nc) as run:
            with trio.fail_after(30):
                stats = await run.wait_caught_up()
        assert (stats.records_out, stats.records_skipped) == (written, skipped), durable
        assert stats.acks == 100 and stats.commit_last_sink == "lake"
