"""Consumer pause and resume (nats-server 2.11+): the configuration field, the API calls, the
typed refusals, and what a consume does on a paused consumer.

The rules without a server first, then against a real nats-server (2.15 in the venv). nats-py
knows the pause API, so it is the independent peer both ways: it reads the pause headrace set
(the raw ``pause_until`` of the consumer's configuration) and sets one headrace reads. The
consume test watches the consume from outside (``probed_consume``, js_pull_support.py) to wait
for the server's heartbeats and expiries as events: the consumer stays paused across several of
them, the buffer gets no message and raises no alarm, and after the resume it gets every message
once.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest
import trio
from headrace.jetstream import (
    AckPolicy,
    ConsumeOptions,
    ConsumerConfig,
    ConsumerNotFound,
    ConsumerPause,
    HeartbeatsMissed,
    InvalidPauseUntil,
    JetStream,
    StreamConfig,
    StreamNotFound,
)
from headrace.jetstream.codec import format_time, from_json, parse_time, to_json
from headrace.jetstream.pause import INDEFINITELY, pause_deadline
from headrace.nats import connect

from tests.jetstream.js_pull_support import natspy_publish, probed_consume, seq_of
from tests.waiting import FAST, EventLog

NOW = dt.datetime(2026, 1, 31, 12, 0, 0, tzinfo=dt.UTC)


def later(seconds: float) -> dt.datetime:
    """A time ``seconds`` from now, to the microsecond (what the wire keeps)."""
    return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)


async def add_stream(js: JetStream) -> None:
    await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))


async def raw_config(natspy: Any, name: str = "C") -> dict[str, Any]:
    """The consumer's configuration as nats-py reads it (its own JSON model)."""

    async def go() -> dict[str, Any]:
        info = await natspy.nc.jetstream().consumer_info("S", name)
        return {"pause_until": info.config.pause_until, "paused": info.paused}

    return await natspy.call(go)


# -- without a server -------------------------------------------------------------------------


def test_naive_pause_until_is_refused_in_the_config():
    with pytest.raises(InvalidPauseUntil, match="no timezone") as caught:
        ConsumerConfig(durable_name="C", pause_until=dt.datetime(2030, 1, 1))
    assert isinstance(caught.value, ValueError)
    with pytest.raises(InvalidPauseUntil):
        text: Any = "2030-01-01T00:00:00Z"  # a string is not a time
        ConsumerConfig(durable_name="C", pause_until=text)


def test_pause_until_goes_out_as_rfc3339_and_comes_back_aware():
    config = ConsumerConfig(durable_name="C", pause_until=NOW + dt.timedelta(microseconds=5))
    wire = to_json(config)
    assert wire["pause_until"] == "2026-01-31T12:00:00.000005Z"
    assert from_json(ConsumerConfig, wire).pause_until == config.pause_until
    # Another zone is the same moment, sent in UTC.
    east = NOW.astimezone(dt.timezone(dt.timedelta(hours=2)))
    assert to_json(ConsumerConfig(pause_until=east))["pause_until"] == "2026-01-31T12:00:00.000000Z"


@pytest.mark.parametrize(
    ("until", "expected"),
    [
        (None, INDEFINITELY),
        (NOW, NOW),
        (90, NOW + dt.timedelta(seconds=90)),
        (0.5, NOW + dt.timedelta(seconds=0.5)),
        (dt.timedelta(minutes=2), NOW + dt.timedelta(minutes=2)),
        (0, NOW),
        (1e300, INDEFINITELY),
    ],
)
def test_pause_deadline_from_each_form(until, expected):
    assert pause_deadline(until, now=NOW) == expected


@pytest.mark.parametrize(
    "until",
    [
        -1,
        -0.001,
        dt.timedelta(seconds=-5),
        math.inf,
        math.nan,
        True,
        "10s",
        dt.datetime(2030, 1, 1),
    ],
)
def test_pause_deadline_refuses_bad_input(until):
    with pytest.raises(InvalidPauseUntil):
        pause_deadline(until, now=NOW)


def test_the_answer_reads_gos_zero_time_as_no_time():
    answer = from_json(
        ConsumerPause,
        {"paused": False, "pause_until": "0001-01-01T00:00:00Z", "type": "x"},
    )
    assert answer == ConsumerPause(paused=False)
    assert answer.extra == {"type": "x"}
    paused = from_json(
        ConsumerPause,
        {"paused": True, "pause_until": format_time(NOW), "pause_remaining": 1_500_000_000},
    )
    assert (paused.paused, paused.pause_until, paused.pause_remaining) == (True, NOW, 1.5)


# -- against a real server --------------------------------------------------------------------


async def test_pause_round_trips_and_nats_py_agrees(nats_server, natspy):
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await add_stream(js)
        await js.create_consumer("S", ConsumerConfig(durable_name="C"))
        until = later(60)
        answer = await js.pause_consumer("S", "C", until)
        assert answer.paused is True
        assert answer.pause_until == until
        assert answer.pause_remaining is not None and 0 < answer.pause_remaining <= 60
        info = await js.consumer_info("S", "C")
        assert info.paused is True and info.config.pause_until == until
        assert info.pause_remaining is not None and 0 < info.pause_remaining <= 60
        raw = await raw_config(natspy)
        assert raw["paused"] is True
        assert parse_time(raw["pause_until"]) == until
        # A pause nats-py sets is what headrace reads.
        other = later(120).replace(microsecond=0)

        async def natspy_pause() -> Any:
            return await natspy.nc.jetstream().pause_consumer("S", "C", format_time(other))

        assert (await natspy.call(natspy_pause)).paused is True
        info = await js.consumer_info("S", "C")
        assert info.paused is True and info.config.pause_until == other
        # Resume: no time; the answer and the info say so, for nats-py too.
        resumed = await js.resume_consumer("S", "C")
        assert resumed.paused is False and resumed.pause_until is None
        info = await js.consumer_info("S", "C")
        assert not info.paused and not info.pause_remaining
        assert not (await raw_config(natspy))["paused"]
        # Resuming what is not paused is harmless.
        assert (await js.resume_consumer("S", "C")).paused is False


async def test_pause_in_seconds_and_indefinitely(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await add_stream(js)
        await js.create_consumer("S", ConsumerConfig(durable_name="C"))
        before = dt.datetime.now(dt.UTC)
        answer = await js.pause_consumer("S", "C", 30)
        assert answer.paused and answer.pause_until is not None
        assert before + dt.timedelta(seconds=30) <= answer.pause_until
        assert answer.pause_until <= dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30)
        forever = await js.pause_consumer("S", "C")
        assert forever.paused and forever.pause_until == INDEFINITELY
        assert (await js.consumer_info("S", "C")).paused is True


async def test_a_time_already_past_resumes_rather_than_fails(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await add_stream(js)
        await js.create_consumer("S", ConsumerConfig(durable_name="C"))
        await js.pause_consumer("S", "C", 60)
        answer = await js.pause_consumer("S", "C", later(-60))
        assert answer.paused is False
        assert not (await js.consumer_info("S", "C")).paused
        # Created with a time already past: created, and not paused.
        created = await js.create_consumer(
            "S", ConsumerConfig(durable_name="P", pause_until=later(-60))
        )
        assert not created.paused


async def test_a_consumer_created_paused_is_paused(nats_server, natspy):
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await add_stream(js)
        until = later(60)
        created = await js.create_consumer("S", ConsumerConfig(durable_name="C", pause_until=until))
        assert created.paused is True and created.config.pause_until == until
        assert parse_time((await raw_config(natspy))["pause_until"]) == until
        # Binding again without pause_until is no drift (ADR-15): the pause is state.
        async with js.pull_subscribe(stream="S", durable="C"):
            pass


async def test_refusals_are_typed(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await add_stream(js)
        await js.create_consumer("S", ConsumerConfig(durable_name="C"))
        with pytest.raises(ConsumerNotFound):
            await js.pause_consumer("S", "NOPE", 10)
        with pytest.raises(ConsumerNotFound):
            await js.resume_consumer("S", "NOPE")
        with pytest.raises(StreamNotFound):
            await js.pause_consumer("NOPE", "C", 10)
        # Refused before sending: the consumer stays as it was.
        for bad in (dt.datetime(2030, 1, 1), -5):
            with pytest.raises(InvalidPauseUntil):
                await js.pause_consumer("S", "C", bad)  # type: ignore[arg-type]
        assert not (await js.consumer_info("S", "C")).paused


@pytest.mark.slow  # 2.3 s or more of timers: the full suite runs it
async def test_consume_on_a_paused_consumer_waits_then_gets_everything_once(nats_server, natspy):
    """Paused across several heartbeats and two expiries: no message, no alarm, the pulls
    renewed; resumed: every message, once."""
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await add_stream(js)
        await js.create_consumer(
            "S",
            ConsumerConfig(durable_name="C", ack_policy=AckPolicy.EXPLICIT, pause_until=later(60)),
        )
        await natspy_publish(natspy, 20)
        consumer = await js.pull_consumer("S", "C")
        options = ConsumeOptions(max_messages=8, expires=1.0, idle_heartbeat=0.25)
        async with (
            probed_consume(consumer, options) as (messages, probe),
            trio.open_nursery() as nursery,
        ):
            log = EventLog(messages.events())
            nursery.start_soon(log.run)

            def statuses(code: int) -> int:
                return sum(1 for status, _ in probe.statuses if status == code)

            # Two requests expired (408) and were renewed, with heartbeats in between.
            await probe.wait_until(lambda: statuses(408) >= 2 and statuses(100) >= 4, 10)
            assert probe.user_msgs == 0 and messages.buffered == 0
            assert log.of(HeartbeatsMissed) == []
            assert messages.requests_sent >= 3
            await js.resume_consumer("S", "C")
            seqs: list[int] = []
            with trio.fail_after(10):
                while len(seqs) < 20:
                    for msg in await messages.next_batch():
                        seqs.append(seq_of(msg))
                        await msg.ack_sync()
            assert seqs == list(range(1, 21))
            assert log.of(HeartbeatsMissed) == []
            nursery.cancel_scope.cancel()
        info = await js.consumer_info("S", "C")
        assert info.num_pending == 0 and info.num_ack_pending == 0
        assert info.num_redelivered == 0
