"""Message schedules (ADR-51) against a real nats-server 2.15: the headers a
:class:`MessageSchedule` makes, what the server does with them, and what it refuses.

Schedules are published with the plain ``js.publish(subject, data, headers=...)``; the
produced messages are read with an ordered consumer on the targets. Every wait is on a message
the server publishes: the firings themselves, or a one-off schedule used as the server's own
clock where a test needs time to pass (a schedule that stopped must not fire again).
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
from headrace.jetstream import (
    JetStream,
    JetStreamAPIError,
    JsMsg,
    MessageNotFound,
    MessageTTLDisabled,
    StreamConfig,
    StreamSource,
)
from headrace.jetstream.errors import (
    InvalidMessageSchedule,
    InvalidSchedulePattern,
    InvalidScheduler,
    InvalidScheduleRollup,
    InvalidScheduleSource,
    InvalidScheduleTarget,
    InvalidScheduleTimeZone,
    InvalidScheduleTTL,
    MessageScheduleError,
    MessageSchedulesDisabled,
    MessageSchedulesNotAllowed,
)
from headrace.jetstream.schedules import (
    NATS_SCHEDULE_NEXT,
    NATS_SCHEDULER,
    PREDEFINED,
    PURGE,
    MessageSchedule,
    stop_headers,
)
from headrace.nats import connect

TIMEOUT = 10
STREAM = "SCHED"


def _in(seconds: float) -> dt.datetime:
    return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)


# -- the headers ----------------------------------------------------------------------------------


def test_at_is_rfc3339_in_utc() -> None:
    plus2 = dt.timezone(dt.timedelta(hours=2))
    when = dt.datetime(2030, 1, 1, 2, 0, tzinfo=plus2)
    assert MessageSchedule.at(when, target="out.a").headers() == {
        "Nats-Schedule": "@at 2030-01-01T00:00:00Z",
        "Nats-Schedule-Target": "out.a",
    }
    fraction = dt.datetime(2030, 1, 1, 0, 0, 0, 500000, tzinfo=dt.UTC)
    assert MessageSchedule.at(fraction, target="o").pattern == "@at 2030-01-01T00:00:00.500000Z"
    assert MessageSchedule.at(when, target="o").kind == "at"


@pytest.mark.parametrize(
    ("interval", "pattern"),
    [
        (1, "@every 1s"),
        (1.5, "@every 1500ms"),
        (90, "@every 90s"),
        (3600, "@every 1h"),
        (dt.timedelta(minutes=2), "@every 2m"),
        (dt.timedelta(seconds=1, microseconds=5), "@every 1000005us"),
        ("1m30s", "@every 1m30s"),
        ("1.5s", "@every 1.5s"),
        ("45", "@every 45s"),
    ],
)
def test_every_forms(interval: Any, pattern: str) -> None:
    schedule = MessageSchedule.every(interval, target="out.a")
    assert (schedule.pattern, schedule.kind) == (pattern, "every")


def test_cron_headers_with_every_option() -> None:
    schedule = MessageSchedule.cron(
        "0 30 9 * * mon-fri",
        target="out.report",
        time_zone="Europe/Amsterdam",
        ttl=dt.timedelta(minutes=5),
        source="sensors.temp",
        rollup=True,
    )
    assert schedule.kind == "cron"
    assert schedule.headers("sched.report") == {
        "Nats-Schedule": "0 30 9 * * mon-fri",
        "Nats-Schedule-Target": "out.report",
        "Nats-Schedule-Source": "sensors.temp",
        "Nats-Schedule-TTL": "300",
        "Nats-Schedule-Time-Zone": "Europe/Amsterdam",
        "Nats-Schedule-Rollup": "sub",
    }
    assert MessageSchedule.cron("@hourly", target="o", ttl="never").ttl == "never"


@pytest.mark.parametrize(
    "expression",
    [
        "* * * * * *",
        "*/5 * * ? JAN-mar Mon-Fri",
        "0 0 0 1,15 * 5",
        "5/10 0-30/2 8-11 * * sun",
        *sorted(PREDEFINED),
    ],
)
def test_cron_accepts(expression: str) -> None:
    assert MessageSchedule.cron(expression, target="o").pattern == expression


def test_rollup_is_a_flag() -> None:
    with pytest.raises(InvalidScheduleRollup):
        MessageSchedule.cron("@hourly", target="o", rollup="all")  # type: ignore[arg-type]


def test_stop_headers() -> None:
    assert stop_headers("sched.a", "sched.cancelled") == {
        NATS_SCHEDULE_NEXT: PURGE,
        NATS_SCHEDULER: "sched.a",
    }
    with pytest.raises(InvalidScheduler):
        stop_headers("sched.a", "sched.a")
    with pytest.raises(InvalidScheduler):
        stop_headers("sched.*")


def test_a_schedule_is_a_frozen_value() -> None:
    a = MessageSchedule.every(60, target="o")
    assert a == MessageSchedule("@every 1m", target="o")
    with pytest.raises(AttributeError):
        a.target = "p"  # type: ignore[misc]


# -- refused before sending -----------------------------------------------------------------------

#: What the client refuses, and the raw headers with which the server refuses the same thing:
#: (name, the client's call, the headers sent raw on sched.x, the class both raise).
REFUSED: list[tuple[str, Callable[[], object], dict[str, str], type[MessageScheduleError]]] = [
    (
        "naive @at",
        lambda: MessageSchedule.at(dt.datetime(2030, 1, 1), target="out.a"),
        {"Nats-Schedule": "@at 2030-01-01T00:00:00", "Nats-Schedule-Target": "out.a"},
        InvalidSchedulePattern,
    ),
    (
        "interval under a second",
        lambda: MessageSchedule.every(0.5, target="out.a"),
        {"Nats-Schedule": "@every 500ms", "Nats-Schedule-Target": "out.a"},
        InvalidSchedulePattern,
    ),
    (
        "interval without a unit",
        lambda: MessageSchedule("@every 5", target="out.a"),
        {"Nats-Schedule": "@every 5", "Nats-Schedule-Target": "out.a"},
        InvalidSchedulePattern,
    ),
    (
        "five cron fields",
        lambda: MessageSchedule.cron("* * * * *", target="out.a"),
        {"Nats-Schedule": "* * * * *", "Nats-Schedule-Target": "out.a"},
        InvalidSchedulePattern,
    ),
    (
        "day of week 7",
        lambda: MessageSchedule.cron("0 0 0 * * 7", target="out.a"),
        {"Nats-Schedule": "0 0 0 * * 7", "Nats-Schedule-Target": "out.a"},
        InvalidSchedulePattern,
    ),
    (
        "a step of 0",
        lambda: MessageSchedule.cron("*/0 * * * * *", target="out.a"),
        {"Nats-Schedule": "*/0 * * * * *", "Nats-Schedule-Target": "out.a"},
        InvalidSchedulePattern,
    ),
    (
        "predefined in capitals",
        lambda: MessageSchedule.cron("@HOURLY", target="out.a"),
        {"Nats-Schedule": "@HOURLY", "Nats-Schedule-Target": "out.a"},
        InvalidSchedulePattern,
    ),
    (
        "a time zone on @every",
        lambda: MessageSchedule("@every 1s", target="out.a", time_zone="Europe/Amsterdam"),
        {
            "Nats-Schedule": "@every 1s",
            "Nats-Schedule-Target": "out.a",
            "Nats-Schedule-Time-Zone": "Europe/Amsterdam",
        },
        InvalidSchedulePattern,
    ),
    (
        "an unknown time zone",
        lambda: MessageSchedule.cron("@hourly", target="out.a", time_zone="Mars/Olympus"),
        {
            "Nats-Schedule": "@hourly",
            "Nats-Schedule-Target": "out.a",
            "Nats-Schedule-Time-Zone": "Mars/Olympus",
        },
        InvalidScheduleTimeZone,
    ),
    (
        "a fixed offset for a time zone",
        lambda: MessageSchedule.cron("@hourly", target="out.a", time_zone="+02:00"),
        {
            "Nats-Schedule": "@hourly",
            "Nats-Schedule-Target": "out.a",
            "Nats-Schedule-Time-Zone": "+02:00",
        },
        InvalidScheduleTimeZone,
    ),
    (
        "an empty time zone",
        lambda: MessageSchedule.cron("@hourly", target="out.a", time_zone=""),
        {
            "Nats-Schedule": "@hourly",
            "Nats-Schedule-Target": "out.a",
            "Nats-Schedule-Time-Zone": "",
        },
        InvalidScheduleTimeZone,
    ),
    (
        "a wildcard target",
        lambda: MessageSchedule.cron("@hourly", target="out.*"),
        {"Nats-Schedule": "@hourly", "Nats-Schedule-Target": "out.*"},
        InvalidScheduleTarget,
    ),
    (
        "an empty target",
        lambda: MessageSchedule.cron("@hourly", target=""),
        {"Nats-Schedule": "@hourly", "Nats-Schedule-Target": ""},
        InvalidScheduleTarget,
    ),
    (
        "the schedule's own subject as target",
        lambda: MessageSchedule.cron("@hourly", target="sched.x").headers("sched.x"),
        {"Nats-Schedule": "@hourly", "Nats-Schedule-Target": "sched.x"},
        InvalidScheduleTarget,
    ),
    (
        "a TTL under a second",
        lambda: MessageSchedule.cron("@hourly", target="out.a", ttl=0.5),
        {"Nats-Schedule": "@hourly", "Nats-Schedule-Target": "out.a", "Nats-Schedule-TTL": "500ms"},
        InvalidScheduleTTL,
    ),
    (
        "the target as source",
        lambda: MessageSchedule.cron("@hourly", target="out.a", source="out.a"),
        {
            "Nats-Schedule": "@hourly",
            "Nats-Schedule-Target": "out.a",
            "Nats-Schedule-Source": "out.a",
        },
        InvalidScheduleSource,
    ),
    (
        "a wildcard source",
        lambda: MessageSchedule.cron("@hourly", target="out.a", source="out.>"),
        {
            "Nats-Schedule": "@hourly",
            "Nats-Schedule-Target": "out.a",
            "Nats-Schedule-Source": "out.>",
        },
        InvalidScheduleSource,
    ),
    (
        "a stop on its own subject",
        lambda: stop_headers("sched.x", "sched.x"),
        {"Nats-Schedule-Next": "purge", "Nats-Scheduler": "sched.x"},
        InvalidScheduler,
    ),
]


@pytest.mark.parametrize(
    ("build", "cls"), [(c[1], c[3]) for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_refused_before_sending(
    build: Callable[[], object], cls: type[MessageScheduleError]
) -> None:
    with pytest.raises(cls) as caught:
        build()
    assert caught.value.err_code == cls.err_codes[0]
    assert isinstance(caught.value, InvalidMessageSchedule)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    "build",
    [
        lambda: MessageSchedule.every(0, target="o"),
        lambda: MessageSchedule.every(-1, target="o"),
        lambda: MessageSchedule.every(float("inf"), target="o"),
        lambda: MessageSchedule.every(float("nan"), target="o"),
        lambda: MessageSchedule.every("1d", target="o"),
        lambda: MessageSchedule.every(True, target="o"),
        lambda: MessageSchedule.at("2030-01-01T00:00:00Z", target="o"),  # type: ignore[arg-type]
        lambda: MessageSchedule("", target="o"),
        lambda: MessageSchedule("@at 2030-02-30T00:00:00Z", target="o"),
        lambda: MessageSchedule.cron("@every 1s", target="o"),
        lambda: MessageSchedule.cron("60 * * * * *", target="o"),
        lambda: MessageSchedule.cron("0 0 0 0 * *", target="o"),
        lambda: MessageSchedule.cron("5-1 * * * * *", target="o"),
        lambda: MessageSchedule.cron("x * * * * *", target="o"),
        lambda: MessageSchedule.cron("* * * * * * *", target="o"),
    ],
)
def test_bad_patterns_refused(build: Callable[[], object]) -> None:
    with pytest.raises(InvalidSchedulePattern):
        build()


# -- against the server ---------------------------------------------------------------------------


async def _stream(js: JetStream, **config: Any) -> None:
    info = await js.add_stream(
        StreamConfig(name=STREAM, subjects=["sched.>", "out.>"], allow_msg_schedules=True, **config)
    )
    assert info.config.allow_msg_schedules is True
    # ADR-51: a schedule message is a subject rollup, so the server turns roll-ups on.
    assert info.config.allow_rollup_hdrs is True


async def _until(sub: AsyncIterator[JsMsg], subject: str, seen: list[JsMsg]) -> JsMsg:
    """The next message on ``subject``; every message read on the way goes to ``seen``."""
    with trio.fail_after(TIMEOUT):
        async for msg in sub:
            seen.append(msg)
            if msg.subject == subject:
                return msg
    raise AssertionError("the subscription ended")


def _header(msg: JsMsg, name: str) -> str:
    assert msg.headers is not None, f"{msg.subject} has no headers"
    return msg.headers[name]


async def _subjects(js: JetStream) -> dict[str, int]:
    info = await js.stream_info(STREAM, subjects_filter=">")
    return dict(info.state.subjects or {})


async def test_at_publishes_once_and_is_removed(nats_server):
    """A one-off fires at its time, once, with the schedule's body and the caller's headers
    (not the schedule message's Nats-Msg-Id and Nats-TTL); firing removes the schedule."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js, allow_msg_ttl=True)
        async with js.subscribe("out.>", stream=STREAM, ordered=True) as sub:
            when = _in(1)
            schedule = MessageSchedule.at(when, target="out.orders")
            ack = await js.publish(
                "sched.order-1",
                b"order 1",
                headers={"X-Order": "1"},
                schedule=schedule,
                msg_id="order-1",
                ttl=3600,
            )
            stored = await js.get_msg(STREAM, ack.seq)
            assert stored.headers is not None and stored.headers.get("Nats-Schedule")
            produced = await _until(sub, "out.orders", [])
        assert produced.data == b"order 1"
        assert produced.metadata.timestamp >= when - dt.timedelta(milliseconds=500)
        headers = produced.headers
        assert headers is not None
        assert headers.get("X-Order") == "1"
        assert headers.get(NATS_SCHEDULER) == "sched.order-1"
        assert headers.get(NATS_SCHEDULE_NEXT) == PURGE
        for name in ("Nats-Schedule", "Nats-Schedule-Target", "Nats-Msg-Id", "Nats-TTL"):
            assert headers.get(name) is None, name
        # Gone with the firing: it cannot fire again.
        with pytest.raises(MessageNotFound):
            await js.get_msg(STREAM, ack.seq)
        assert await _subjects(js) == {"out.orders": 1}


@pytest.mark.slow  # about 4 s of firings: two, then two seconds of none
async def test_every_repeats_until_purged(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        seen: list[JsMsg] = []
        async with js.subscribe("out.>", stream=STREAM, ordered=True) as sub:
            await js.publish(
                "sched.tick", b"tick", headers=MessageSchedule.every(1, target="out.tick").headers()
            )
            first = await _until(sub, "out.tick", seen)
            second = await _until(sub, "out.tick", seen)
            nexts = [
                dt.datetime.fromisoformat(_header(m, NATS_SCHEDULE_NEXT)) for m in (first, second)
            ]
            assert nexts[1] - nexts[0] >= dt.timedelta(seconds=1)
            assert second.data == b"tick"

            assert await js.purge_stream(STREAM, subject="sched.tick") == 1
            before = len(seen)
            # The server's clock: a live schedule of 1 s would fire twice before this one does.
            await js.publish(
                "sched.clock", b"", headers=MessageSchedule.at(_in(2), target="out.clock").headers()
            )
            await _until(sub, "out.clock", seen)
        after = [m for m in seen[before:] if m.subject == "out.tick"]
        assert len(after) <= 1  # one firing may have been on its way as the purge came
        assert "sched.tick" not in await _subjects(js)


async def test_cron_every_second_in_a_time_zone_with_source_and_rollup(nats_server):
    """Six-field cron (seconds first) fires; a time zone shows in the next firing's offset;
    ``source`` publishes the sampled subject's last message; ``rollup`` marks each produced
    message a subject rollup. Deleting or purging the schedule message stops it."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        await js.publish("out.reading", b"21.5", headers={"X-Unit": "C"})
        seen: list[JsMsg] = []
        async with js.subscribe("out.>", stream=STREAM, ordered=True) as sub:
            tokyo = MessageSchedule.cron(
                "* * * * * *", target="out.tokyo", time_zone="Asia/Tokyo", rollup=True
            )
            tokyo_ack = await js.publish("sched.tokyo", b"konnichiwa", headers=tokyo.headers())
            sampled = MessageSchedule.cron(
                "* * * * * *", target="out.sampled", source="out.reading"
            )
            await js.publish("sched.sample", b"fallback", headers=sampled.headers())
            first = await _until(sub, "out.tokyo", seen)
            sample = next((m for m in seen if m.subject == "out.sampled"), None)
            sample = sample or await _until(sub, "out.sampled", seen)
        assert first.data == b"konnichiwa"
        assert first.headers is not None
        assert first.headers.get("Nats-Rollup") == "sub"
        assert first.headers[NATS_SCHEDULE_NEXT].endswith("+09:00")
        assert sample.data == b"21.5"
        assert sample.headers is not None and sample.headers.get("X-Unit") == "C"
        assert sample.headers.get(NATS_SCHEDULER) == "sched.sample"

        await js.delete_msg(STREAM, tokyo_ack.seq)
        assert await js.purge_stream(STREAM, subject="sched.sample") == 1
        subjects = await _subjects(js)
        assert "sched.tokyo" not in subjects and "sched.sample" not in subjects


async def test_ttl_of_produced_messages(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js, allow_msg_ttl=True)
        async with js.subscribe("out.>", stream=STREAM, ordered=True) as sub:
            now = MessageSchedule.at(_in(0), target="out.brief", ttl=dt.timedelta(minutes=5))
            await js.publish("sched.brief", b"soon gone", headers=now.headers())
            produced = await _until(sub, "out.brief", [])
        assert produced.headers is not None and produced.headers.get("Nats-TTL") == "300"
        stored = await js.get_msg(STREAM, produced.metadata.stream_seq)
        assert stored.headers is not None and stored.headers.get("Nats-TTL") == "300"


async def test_ttl_needs_allow_msg_ttl(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        schedule = MessageSchedule.cron("@hourly", target="out.a", ttl=60)
        with pytest.raises(MessageTTLDisabled):
            await js.publish("sched.a", b"", headers=schedule.headers())


async def test_stop_headers_stop_a_schedule_in_the_same_write(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        later = MessageSchedule.at(_in(3600), target="out.orders")
        await js.publish("sched.order-2", b"order 2", headers=later.headers())
        cancelled = await js.publish(
            "sched.cancelled", b"order 2", headers=stop_headers("sched.order-2", "sched.cancelled")
        )
        assert await _subjects(js) == {"sched.cancelled": 1}
        assert (await js.get_msg(STREAM, cancelled.seq)).data == b"order 2"
        # A stop naming a subject whose last message is no schedule is refused.
        await js.publish("out.plain", b"")
        with pytest.raises(InvalidScheduler):
            await js.publish("sched.c2", b"", headers=stop_headers("out.plain"))


async def test_server_refuses_what_the_client_refuses(nats_server):
    """Each of REFUSED, sent raw, is refused by the server as the same class, err_code and
    all; what the client lets through, the server takes."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js, allow_msg_ttl=True)
        for name, build, raw, cls in REFUSED:
            with pytest.raises(cls) as client:
                build()
            with pytest.raises(cls) as server:
                await js.publish("sched.x", b"", headers=raw)
            assert server.value.err_code == client.value.err_code, name
        accepted = [
            MessageSchedule.at(_in(3600), target="out.a", ttl="never"),
            MessageSchedule.every("1m30s", target="out.a"),
            MessageSchedule.cron("*/5 * * ? JAN-mar Mon-Fri", target="out.a", source="out.b"),
            *(MessageSchedule.cron(p, target="out.a") for p in sorted(PREDEFINED)),
            *(
                MessageSchedule.cron("@daily", target="out.a", time_zone=zone)
                for zone in ("UTC", "Local", "Europe/Amsterdam", "America/New_York")
            ),
        ]
        for schedule in accepted:
            await js.publish("sched.x", b"", headers=schedule.headers("sched.x"))
        assert await _subjects(js) == {"sched.x": 1}  # each schedule replaced the one before


async def test_refusals_only_the_server_can_make(nats_server):
    """What depends on the stream: its subjects, its settings, what is stored."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        await js.add_stream(StreamConfig(name="PLAIN", subjects=["plain.>"]))
        hourly = MessageSchedule.cron("@hourly", target="out.a")
        cases: list[tuple[str, dict[str, str], type[JetStreamAPIError]]] = [
            (
                "plain.s",
                MessageSchedule.cron("@hourly", target="plain.t").headers(),
                MessageSchedulesDisabled,
            ),
            (
                "sched.s",
                MessageSchedule.cron("@hourly", target="elsewhere").headers(),
                InvalidScheduleTarget,
            ),
            (
                "sched.s",
                MessageSchedule.cron("@hourly", target="out.a", source="elsewhere").headers(),
                InvalidScheduleSource,
            ),
            (
                "sched.s",
                MessageSchedule.cron("0 0 0 30 2 *", target="out.a").headers(),
                InvalidSchedulePattern,
            ),
            ("sched.s", {**hourly.headers(), "Nats-Schedule-Rollup": "all"}, InvalidScheduleRollup),
            ("sched.s", {**hourly.headers(), "Nats-Rollup": "all"}, InvalidScheduleRollup),
            ("sched.s", {"Nats-Scheduler": "sched.other"}, InvalidScheduler),
        ]
        for subject, headers, cls in cases:
            with pytest.raises(cls):
                await js.publish(subject, b"", headers=headers)
        assert await _subjects(js) == {}

        # A stream update turns schedules on, never off (10052).
        plain = (await js.stream_info("PLAIN")).config
        plain.allow_msg_schedules = True
        assert (await js.update_stream(plain)).config.allow_msg_schedules is True
        plain.allow_msg_schedules = False
        with pytest.raises(JetStreamAPIError) as off:
            await js.update_stream(plain)
        assert off.value.err_code == 10052

        with pytest.raises(MessageSchedulesNotAllowed) as mirror:
            await js.add_stream(
                StreamConfig(name="M", mirror=StreamSource(name=STREAM), allow_msg_schedules=True)
            )
        assert mirror.value.err_code == 10186
        with pytest.raises(MessageSchedulesNotAllowed) as sourced:
            await js.add_stream(
                StreamConfig(
                    name="S2", sources=[StreamSource(name=STREAM)], allow_msg_schedules=True
                )
            )
        assert sourced.value.err_code == 10187


#: Pieces of cron fields and Go durations, right and wrong, for the parity test.
_CRON_ATOMS = ["0", "5", "59", "60", "7", "12", "13", "*", "?", "-", "/", ",", "mon", "JAN", "x"]
_NUMBERS = ["0", "1", "5", "90", ".5", "1.5", "2.", "+1", "-1", "\u0661"]
_UNITS = ["s", "ms", "m", "h", "us", "\u00b5s", "ns", "d", ""]


async def test_client_and_server_judge_patterns_alike(nats_server):
    """Random cron fields and intervals (a fixed seed): the client refuses exactly what the
    server refuses. One field at a time: a day and a month together can make a date that
    never comes (``30 2``), which only the server, looking for the next firing, refuses."""
    rng = random.Random(51)

    def cron() -> str:
        fields = ["*"] * 6
        fields[rng.randrange(6)] = "".join(rng.choices(_CRON_ATOMS, k=rng.randint(1, 4)))
        return " ".join(fields)

    def every() -> str:
        parts = (rng.choice(_NUMBERS) + rng.choice(_UNITS) for _ in range(rng.randint(1, 3)))
        return "@every " + "".join(parts)

    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        for pattern in [cron() for _ in range(250)] + [every() for _ in range(250)]:
            try:
                MessageSchedule(pattern, target="out.a")
                client = "accepted"
            except InvalidSchedulePattern:
                client = "refused"
            headers = {"Nats-Schedule": pattern, "Nats-Schedule-Target": "out.a"}
            try:
                await js.publish("sched.fuzz", b"", headers=headers)
                server = "accepted"
            except InvalidSchedulePattern:
                server = "refused"
            assert client == server, pattern


async def test_publish_refuses_schedule_headers_beside_a_schedule(nats_server):
    """``publish(schedule=...)`` sets the schedule's headers; the caller's own schedule
    headers, or a rollup other than ``sub``, would clash: refused before sending."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        schedule = MessageSchedule.every(5, target="out.x")
        with pytest.raises(InvalidMessageSchedule, match="give the schedule one way"):
            await js.publish("sched.a", b"", headers={"Nats-Schedule-TTL": "5s"}, schedule=schedule)
        with pytest.raises(InvalidScheduleRollup):
            await js.publish("sched.a", b"", headers={"Nats-Rollup": "all"}, schedule=schedule)
        with pytest.raises(InvalidScheduleTarget):
            await js.publish("out.x", b"", schedule=schedule)  # targets its own subject
        assert await _subjects(js) == {}
        await js.publish("sched.a", b"", headers={"Nats-Rollup": "sub"}, schedule=schedule)
        assert await _subjects(js) == {"sched.a": 1}
