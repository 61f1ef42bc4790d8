"""A running pipeline paused and resumed (``PipelineRun.pause``/``resume``, nats-server 2.11+).

The pause is the consumer's, on the server: the run keeps running, its source's pulls wait.
The test holds the pause across several idle heartbeats and two pull expiries, counted as the
server sends them (its copies of what it sends the source's consume, watched from outside, so
the wait is an event, not a sleep), and checks that nothing was delivered meanwhile and that
nothing took the silence of deliveries for a dead server. nats-py, the independent peer,
publishes and reads the consumer's state: paused with the messages pending, then everything
acked once.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from headrace.jetstream import ConsumeBuffer, ConsumeOptions, HeartbeatsMissed, InvalidPauseUntil
from headrace.pipeline import BatchPolicy, PipelineEnded
from headrace.sinks import MemorySink

from tests.jetstream.js_pull_support import ConsumeProbe, watching
from tests.pipeline.pipe_support import (
    FAST,
    add_stream,
    connect,
    consumer_info,
    fast_pipeline,
    publish,
    source,
    wait_consumer,
)
from tests.waiting import EventLog

SMALL = BatchPolicy(max_messages=10, max_age=0.05)
#: Short pulls and heartbeats, so that "several heartbeats and expiries" is a few seconds.
QUICK = ConsumeOptions(max_messages=8, expires=1.0, idle_heartbeat=0.25)


@pytest.fixture
async def peer(nats_server, natspy):
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    return natspy


@pytest.mark.slow  # 2.3 s or more of timers: the full suite runs it
async def test_paused_pipeline_waits_alive_and_resumed_delivers_each_once(nats_server, peer):
    await publish(peer, 10)
    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source(consume=QUICK)).sink(sink, batch=SMALL)
    async with (
        connect(nats_server.url, **FAST) as nc,
        watching(nc) as probe,
        pipe.running(nc) as run,
    ):
        await sink.wait_for(10)
        buffer = run.sources[0].messages
        assert isinstance(buffer, ConsumeBuffer)
        probe.watch(buffer)
        log = EventLog(buffer.events())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(log.run)
            await pause_and_resume(run, probe, peer, sink)
            nursery.cancel_scope.cancel()
        assert log.of(HeartbeatsMissed) == []
    assert sink.keys == [("S", seq) for seq in range(1, 26)]
    assert sink.values == [b"%d" % i for i in range(25)]
    info = await consumer_info(peer)
    assert not info.paused and info.num_redelivered == 0


async def pause_and_resume(run: Any, probe: ConsumeProbe, peer: Any, sink: Any) -> None:
    answers = await run.pause()
    assert list(answers) == [run.sources[0].node.name]
    assert all(a.paused for a in answers.values())
    await publish(peer, 15, start=10)

    def count(code: int) -> int:
        """The statuses ``code`` the server sent the source's consume."""
        return sum(1 for status, _ in probe.statuses if status == code)

    hb, expired = count(100), count(408)
    # Paused across at least four heartbeats (two alarm periods) and two expiries.
    await probe.wait_until(lambda: count(100) >= hb + 4 and count(408) >= expired + 2, timeout=15)
    assert len(sink.records) == 10
    assert run.stats.messages_in == 10
    info = await consumer_info(peer)
    assert info.paused is True and info.num_pending == 15
    assert run.errors == []
    assert all(state == "running" for state in run.states().values()), run.states()
    await run.resume()
    await sink.wait_for(25)
    await wait_consumer(peer, lambda i: i.ack_floor.stream_seq == 25 and not i.num_ack_pending)


async def test_pause_checks_its_time_first_and_needs_a_live_run(nats_server, peer):
    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source()).sink(sink, batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc:
        async with pipe.running(nc) as run:
            await run.wait_bound()
            with pytest.raises(InvalidPauseUntil):
                await run.pause(-1)
            assert not (await consumer_info(peer)).paused
            answers = await run.pause(30)
            assert all(a.paused and a.pause_remaining for a in answers.values())
        # The pause is the consumer's: it outlasts the run.
        assert (await consumer_info(peer)).paused
        with pytest.raises(PipelineEnded):
            await run.resume()
