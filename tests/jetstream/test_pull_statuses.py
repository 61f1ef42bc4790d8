"""What only a socket shows of the pull statuses (ADR-37 "Status handling", "Idle
heartbeats", pending counts), played by a scripted server (``FakeJetStream``): a real server
does not produce them on demand.

What each status, heartbeat and retry *decides* is the sans-IO pull flow's, tested without a
socket in ``test_pull_flow.py``. Here: the frames reach the flow (pending-count headers, byte
counts, request bodies, one inbox), its decisions reach the user (the events, the typed errors,
a fetch's result), and the connection's state reaches it (nothing sent while disconnected).

The fake records the pull request bodies, so the tests check what the client asks for, not
only what it hands to the user. ``nc.flush()`` is the "nothing more was sent" check: the fake
reads in order, so once the PONG is back it has seen every request published before the PING
(and the client has read everything the fake sent before the PONG).

Tests that are not about heartbeats turn the heartbeat alarm off (``NO_ALARM``): what they
check does not depend on the alarm's timing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from headrace.jetstream import (
    ConsumerDeleted,
    HeartbeatsMissed,
    JetStream,
    JetStreamUnavailable,
    PullConsumer,
    PullStatusError,
    PullWarning,
)
from headrace.jetstream.pull_consumer import CLIENT_MARGIN
from headrace.jetstream.pull_request import BYTES_MODE_BATCH
from headrace.nats import Connection, Disconnected, Reconnected, connect

from tests.jetstream.js_pull_support import FakeJetStream, fake_consumer, settle
from tests.waiting import FAST, EventLog, next_event

#: Heartbeat alarm after 10^6 heartbeat intervals: never, within a test.
NO_ALARM: dict[str, Any] = {"heartbeat_alarm_factor": 1e6}


@asynccontextmanager
async def fake_js(**options: Any) -> AsyncIterator[tuple[FakeJetStream, Connection, PullConsumer]]:
    async with trio.open_nursery() as nursery:
        fake = FakeJetStream()
        url = await fake.start(nursery)
        async with connect(url, **{**FAST, **options}) as nc:
            yield fake, nc, fake_consumer(JetStream(nc))
        nursery.cancel_scope.cancel()


async def take(messages: Any, count: int) -> list[Any]:
    got: list[Any] = []
    with trio.fail_after(5):
        while len(got) < count:
            got += await messages.next_batch(count - len(got))
    return got


# -- consume: what the frames bring, what the user gets ---------------------------------------


async def test_408_with_pending_counts_requests_exactly_what_is_missing():
    async with fake_js() as (fake, nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 1, **NO_ALARM}
        async with consumer.consume(**opts) as messages:
            r0 = await fake.request(0)
            assert r0.subject == "$JS.API.CONSUMER.MSG.NEXT.S.C"
            assert r0.body == {"batch": 10, "expires": 5_000_000_000, "idle_heartbeat": 10**9}
            await fake.send_msgs(r0, 3)
            # The request ends with 7 of its 10 undelivered; 3 wait unread in the buffer.
            await fake.send_status(
                r0, 408, "Request Timeout", Nats_Pending_Messages=7, Nats_Pending_Bytes=0
            )
            r1 = await fake.request(1)
            assert r1.batch == 7 and r1.reply == r0.reply  # one inbox for every request
            got = await take(messages, 3)
            assert all(m.reply.startswith("$JS.ACK.") for m in got)  # the status is not one
            assert messages.buffered == 0
            await nc.flush()
            assert len(fake.requests) == 2  # 7 pending: above the threshold (5)
            await fake.send_msgs(r1, 2)
            assert len(await take(messages, 2)) == 2
            r2 = await fake.request(2)  # 5 pending: at the threshold
            assert r2.batch == 5
            await nc.flush()
            assert len(fake.requests) == 3


@pytest.mark.parametrize(
    "subject",
    [
        "s.x",
        "s.gr\u00fc\u00dfe",
    ],
)
async def test_bytes_mode_pending_bytes_from_the_status_headers(subject):
    async with fake_js() as (fake, nc, consumer):
        opts = {"max_bytes": 1000, "expires": 5, "idle_heartbeat": 1, **NO_ALARM}
        async with consumer.consume(**opts) as messages:
            r0 = await fake.request(0)
            assert r0.body == {
                "batch": BYTES_MODE_BATCH,
                "max_bytes": 1000,
                "expires": 5_000_000_000,
                "idle_heartbeat": 10**9,
            }
            frames = [fake.user_msg(r0, b"d" * 100, subject=subject) for _ in range(2)]
            await fake.send(b"".join(frames))
            # The server counts subject + reply + payload in bytes; the client must too.
            sizes = [len(subject.encode()) + len(f.split(b" ")[3]) + 100 for f in frames]
            used = sum(sizes)
            await fake.send_status(
                r0,
                408,
                "Request Timeout",
                Nats_Pending_Messages=BYTES_MODE_BATCH - 2,
                Nats_Pending_Bytes=1000 - used,
            )
            r1 = await fake.request(1)
            assert r1.batch == BYTES_MODE_BATCH
            assert r1.max_bytes == 1000 - used  # exactly the room left in the buffer
            got = await take(messages, 2)
            assert [m.size for m in got] == sizes
            await nc.flush()
            assert len(fake.requests) == 2  # 1000 - used pending: above half the budget
            assert messages.pending_bytes == 1000 - used


async def test_after_a_limit_warning_one_new_request_follows_shortly():
    """A refused request (409 Exceeded MaxWaiting) reaches the user as a PullWarning, and
    the consume goes on: a quarter second later (the control loop wakes for the retry time,
    not only at its next heartbeat check) exactly one new request, whose messages arrive."""
    async with fake_js() as (fake, _nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 1, **NO_ALARM}
        async with consumer.consume(**opts) as messages, trio.open_nursery() as nursery:
            log = EventLog(messages.events())
            nursery.start_soon(log.run)
            r0 = await fake.request(0)
            await fake.send_status(r0, 409, "Exceeded MaxWaiting")
            warning = await log.wait_for(PullWarning)
            assert (warning.consumer, warning.status, warning.description) == (
                "C",
                409,
                "Exceeded MaxWaiting",
            )
            refused_at = trio.current_time()
            again = await fake.request(1)
            assert 0.2 <= again.at - refused_at < 0.6, again.at - refused_at
            assert again.batch == 10  # the refused 10 are no longer counted as owed
            await settle()
            assert len(fake.requests) == 2  # one retry, not a loop
            await fake.send_msgs(again, 2)
            assert len(await take(messages, 2)) == 2
            assert log.of(HeartbeatsMissed) == []
            nursery.cancel_scope.cancel()


async def test_a_terminal_status_ends_iteration_after_the_buffered_messages():
    """The flow's error is what the reader gets, exactly, once the messages that came before
    are read; no request follows and the inbox goes. (Which status ends with which error:
    ``test_pull_flow.py``.) A 409 no server sends today, as ADR-15 expects one day."""
    code, description, error = 409, "Something New", PullStatusError
    async with fake_js() as (fake, nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 1, **NO_ALARM}
        async with consumer.consume(**opts) as messages:
            r0 = await fake.request(0)
            await fake.send_msgs(r0, 2)
            await fake.send_status(r0, code, description)
            seen: list[Any] = []
            with trio.fail_after(5), pytest.raises(error) as caught:
                async for msg in messages:
                    seen.append(msg)
            assert type(caught.value) is error
            assert caught.value.status == code and caught.value.description == description
            assert len(seen) == 2
            await nc.flush()
            assert len(fake.requests) == 1  # no retry after a terminal status
        await nc.flush()
        assert r0.reply not in fake.sids  # the consume's inbox was unsubscribed


# -- consume: heartbeats ----------------------------------------------------------------------


async def test_missing_heartbeats_raise_an_alarm_then_a_new_request():
    async with fake_js() as (fake, nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 0.2}
        async with consumer.consume(**opts) as messages, trio.open_nursery() as nursery:
            log = EventLog(messages.events())
            nursery.start_soon(log.run)
            r0 = await fake.request(0)
            last_word = trio.current_time()
            await fake.send_msgs(r0, 3)  # 7 still owed
            assert len(await take(messages, 3)) == 3
            await nc.flush()
            await settle()  # what came before is in the log
            count = len(fake.requests)
            # The server goes silent (a lost request, a leader change...).
            alarm = await log.wait_for(HeartbeatsMissed, count=len(log.of(HeartbeatsMissed)) + 1)
            alarm_at = log.times(HeartbeatsMissed)[-1]
            assert alarm.consumer == "C"
            assert 0.4 <= alarm_at - last_word < 0.8
            assert 0.4 <= alarm.silence < 0.8
            fresh = await fake.request(count)
            assert fresh.at >= alarm_at
            assert fresh.batch == 10  # pending was reset: the lost request is forgotten
            await fake.send_msgs(fresh, 2)
            assert len(await take(messages, 2)) == 2
            nursery.cancel_scope.cancel()


# -- consume: 503 and connection loss ---------------------------------------------------------


@pytest.mark.slow
async def test_503_warns_then_checks_the_consumer_before_pulling_again():
    """A 503 reaches the user as a PullWarning; a second later the consume asks for consumer
    info before it pulls again. While the consumer exists, it pulls (the whole buffer). A
    deleted consumer's pulls get no responder either: then the consume ends with
    ConsumerDeleted, after what came first, without another pull."""
    async with fake_js() as (fake, _nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 1, **NO_ALARM}
        async with consumer.consume(**opts) as messages, trio.open_nursery() as nursery:
            log = EventLog(messages.events())
            nursery.start_soon(log.run)
            req = await fake.request(0)
            await fake.send_status(req, 503)
            warning = await log.wait_for(PullWarning)
            assert (warning.consumer, warning.status, warning.description) == (
                "C",
                503,
                "No Responders",
            )
            answered = trio.current_time()
            retry = await fake.request(1)
            assert 0.9 <= retry.at - answered < 1.6, retry.at - answered
            assert fake.info_requests == 1  # asked before pulling
            assert retry.batch == 10  # nothing was delivered: the whole buffer again
            await fake.send_msgs(retry, 2)
            fake.consumer_exists = False
            await fake.send_status(retry, 503)
            with trio.fail_after(5):
                assert len(await take(messages, 2)) == 2  # what came first is still read
                with pytest.raises(ConsumerDeleted, match="no longer exists"):
                    await messages.next_batch()
            assert fake.info_requests == 2
            assert len(fake.requests) == 2  # no pull after learning it is gone
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "let_consume_see_it",
    [
        True,
        False,
    ],
    ids=["consume-saw-the-disconnect", "take-right-after-the-disconnect"],
)
async def test_disconnect_pauses_heartbeats_and_requests(let_consume_see_it):
    """A request is outstanding when the connection drops for 0.7 s (the alarm is 0.4 s).
    No alarm during the outage, no request while disconnected even though the reader empties
    the buffer, and on reconnect exactly one new request for the whole buffer (ADR-37 rev 2:
    reset pending, pull again, no consumer info check)."""
    async with fake_js(connect_timeout=5) as (fake, nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 0.2}
        with nc.events() as conn_events:
            async with consumer.consume(**opts) as messages, trio.open_nursery() as nursery:
                log = EventLog(messages.events())
                nursery.start_soon(log.run)
                r0 = await fake.request(0)
                await fake.send_msgs(r0, 5)  # 5 of 10: the request is still outstanding
                await nc.flush()  # the 5 were read before the PONG
                assert messages.buffered == 5
                await settle()  # what came before is in the log
                alarms = len(log.of(HeartbeatsMissed))
                fake.handshake_delay = 0.7
                await fake.drop()
                lost_at = trio.current_time()
                await next_event(conn_events, Disconnected)
                if let_consume_see_it:
                    # Let the consume take in the Disconnected event first.
                    await settle()
                assert len(await take(messages, 5)) == 5  # would pull, if connected
                await next_event(conn_events, Reconnected)
                back_at = trio.current_time()
                assert back_at - lost_at >= 0.65
                await fake.wait_until(lambda: any(r.conn == 1 for r in fake.requests))
                await nc.flush()
                fresh = next(r for r in fake.requests if r.conn == 1)
                on_new_connection = [r for r in fake.requests if r.conn == 1]
                assert on_new_connection == [fresh]  # nothing queued during the outage
                assert fresh.batch == 10
                await settle()
                assert len(log.of(HeartbeatsMissed)) == alarms
                await fake.send_msgs(fresh, 3)
                assert len(await take(messages, 3)) == 3
                nursery.cancel_scope.cancel()


# -- fetch --------------------------------------------------------------------------------------


async def test_fetch_request_bodies():
    async with fake_js() as (fake, _nc, consumer):
        calls = [
            (
                {"max_messages": 5, "expires": 2, "idle_heartbeat": 0.5},
                {"batch": 5, "expires": 2_000_000_000, "idle_heartbeat": 500_000_000},
            ),
            (
                {"max_bytes": 500, "expires": 1},
                {"batch": BYTES_MODE_BATCH, "max_bytes": 500, "expires": 10**9},
            ),
            ({"max_messages": 3, "no_wait": True}, {"batch": 3, "no_wait": True}),
            # Over 30 s, heartbeats are on by default (ADR-37): half the expiry, at most 30 s.
            (
                {"max_messages": 1, "expires": 40},
                {"batch": 1, "expires": 40 * 10**9, "idle_heartbeat": 20 * 10**9},
            ),
        ]
        for i, (kwargs, body) in enumerate(calls):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda kw=kwargs: consumer.fetch(**kw))
                req = await fake.request(i)
                assert req.body == body
                await fake.send_status(req, 404, "No Messages")


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ([(100, "Idle Heartbeat"), ("msgs", 1), (404, "No Messages")], 1),
        # Messages that came before an error are returned, not lost to it.
        ([("msgs", 1), (409, "Something New")], 1),
        ([(409, "Consumer Deleted")], ConsumerDeleted),
        # Explained by a consumer info request: the consumer exists, JetStream did not answer.
        ([(503, "")], JetStreamUnavailable),
    ],
)
async def test_fetch_status_sequences(script, outcome):
    """What fetch returns or raises, from the flow's end (which status ends a fetch and how:
    ``test_pull_flow.py``); statuses never come back as messages."""
    async with fake_js() as (fake, nc, consumer):
        result: list[Any] = []

        async def fetch() -> None:
            try:
                result.append(await consumer.fetch(5, expires=5))
            except Exception as exc:
                result.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fetch)
            req = await fake.request(0)
            start = trio.current_time()
            for step, arg in script:
                if step == "msgs":
                    await fake.send_msgs(req, arg)
                else:
                    await fake.send_status(req, step, arg, Nats_Pending_Messages=5)
        assert trio.current_time() - start < 1  # the status ended it, not the client's limit
        (got,) = result
        if isinstance(outcome, int):
            assert isinstance(got, list), got
            assert len(got) == outcome
            assert all(m.reply.startswith("$JS.ACK.") for m in got)
        else:
            assert type(got) is outcome, got
        await nc.flush()
        assert req.reply not in fake.sids  # the fetch's inbox is gone


@pytest.mark.slow
async def test_fetch_gives_up_on_the_client_a_little_after_expires():
    """A request the server never answers (lost): fetch returns after expires plus the
    client margin, with what it has (ADR-37: client-side timeout larger than expires)."""
    async with fake_js() as (fake, _nc, consumer):
        start = trio.current_time()
        assert await consumer.fetch(3, expires=0.2) == []
        elapsed = trio.current_time() - start
        assert 0.2 + CLIENT_MARGIN <= elapsed < 0.2 + CLIENT_MARGIN + 1.0
        assert len(fake.requests) == 1
