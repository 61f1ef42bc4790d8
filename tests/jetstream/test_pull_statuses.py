"""Exact pull status sequences (ADR-37 "Status handling", "Idle heartbeats", pending counts),
played by a scripted server (``FakeJetStream``): a real server does not produce them on demand.

The fake records the pull request bodies, so the tests check what the client asks for, not
only what it hands to the user. ``nc.flush()`` is the "nothing more was sent" check: the fake
reads in order, so once the PONG is back it has seen every request published before the PING.

Tests that are not about heartbeats turn the heartbeat alarm off (``NO_ALARM``), so the
heartbeat clock bug pinned by ``test_a_new_request_starts_the_heartbeat_clock`` does not
blur what they check.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from headrace.jetstream import (
    ConsumerDeleted,
    ConsumerIsPushBased,
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
from js_pull_support import (
    FakeJetStream,
    fake_consumer,
    settle,
    use_probe,
)
from waiting import FAST, EventLog, next_event

#: Heartbeat alarm after 10^6 heartbeat intervals: never, within a test.
NO_ALARM: dict[str, Any] = {"heartbeat_alarm_factor": 1e6}


@pytest.fixture(autouse=True)
def _probe(monkeypatch):
    use_probe(monkeypatch)


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


# -- consume: pending counts ------------------------------------------------------------------


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
            assert len(await take(messages, 3)) == 3
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


async def test_bytes_mode_a_message_too_large_for_the_rest_waits_for_more_room():
    """409 Message Size Exceeds MaxBytes with 600 bytes left: the next message is larger than
    600. Asking for the same 600 again would be refused at once, in a loop (issue 11): the
    next request waits until the reader made room for more than that."""
    async with fake_js() as (fake, nc, consumer):
        opts = {"max_bytes": 1000, "expires": 5, "idle_heartbeat": 1, **NO_ALARM}
        async with consumer.consume(**opts) as messages:
            r0 = await fake.request(0)
            frames = [fake.user_msg(r0, b"d" * 150) for _ in range(2)]
            await fake.send(b"".join(frames))
            used = sum(len(b"s.x") + len(f.split(b" ")[3]) + 150 for f in frames)
            await fake.send_status(
                r0,
                409,
                "Message Size Exceeds MaxBytes",
                Nats_Pending_Messages=BYTES_MODE_BATCH - 2,
                Nats_Pending_Bytes=1000 - used,
            )
            for _ in range(3):
                await nc.flush()
            assert len(fake.requests) == 1  # not the same refused request again
            assert messages.pending_bytes == used  # the refused bytes are no longer owed
            assert len(await take(messages, 2)) == 2
            r1 = await fake.request(1)
            assert r1.max_bytes == 1000  # the whole budget: more than was refused
            await fake.send_msgs(r1, 1, b"L" * 700)  # larger than the 1000 - used refused
            assert len(await take(messages, 1)) == 1


@pytest.mark.parametrize(
    ("code", "description"),
    [
        (404, "No Messages"),
        (408, "Request Timeout"),
        (409, "Message Size Exceeds MaxBytes"),
        (408, "Interest Expired"),
        (423, "Nats-Wrong-Pin-Id"),
        (409, "Batch Completed"),
    ],
)
async def test_quiet_statuses_end_the_request_without_telling_the_user(code, description):
    async with fake_js() as (fake, nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 1, **NO_ALARM}
        async with consumer.consume(**opts) as messages, trio.open_nursery() as nursery:
            log = EventLog(messages.events())
            nursery.start_soon(log.run)
            r0 = await fake.request(0)
            await fake.send_msgs(r0, 4)
            await fake.send_status(
                r0, code, description, Nats_Pending_Messages=6, Nats_Pending_Bytes=0
            )
            r1 = await fake.request(1)
            assert r1.batch == 6
            got = await take(messages, 4)
            assert all(m.reply.startswith("$JS.ACK.") for m in got)
            await fake.send_msgs(r1, 1)  # still consuming
            assert len(await take(messages, 1)) == 1
            await nc.flush()
            assert log.events == []
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "description",
    [
        "Exceeded MaxRequestBatch of 5",
        "Exceeded MaxRequestExpires of 1s",
        "Exceeded MaxRequestMaxBytes of 100",
        "Exceeded MaxWaiting",
        # Servers before 2.10, for a pull whose batch exceeds max_ack_pending (issue 24: it
        # ended the consume as an unknown status).
        "Exceeded MaxAckPending",
        "Server Shutdown",
    ],
)
async def test_409_limit_statuses_are_warnings_not_errors(description):
    async with fake_js() as (fake, _nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 1, **NO_ALARM}
        async with consumer.consume(**opts) as messages, trio.open_nursery() as nursery:
            log = EventLog(messages.events())
            nursery.start_soon(log.run)
            r0 = await fake.request(0)
            await fake.send_status(r0, 409, description)
            warning = await log.wait_for(PullWarning)
            assert (warning.consumer, warning.status, warning.description) == (
                "C",
                409,
                description,
            )
            # Not terminal: the consume goes on and delivers what comes.
            await fake.send_msgs(r0, 2)
            assert len(await take(messages, 2)) == 2
            assert log.of(HeartbeatsMissed) == []
            nursery.cancel_scope.cancel()


async def test_after_a_limit_warning_one_new_request_follows_shortly():
    """A refused request (409 Exceeded MaxWaiting) will not bring its messages: the consume
    stops counting them and asks again a quarter second later, once: not at once (the server
    would refuse it the same way), not in a loop, and not only after a heartbeat alarm."""
    async with fake_js() as (fake, _nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 1, **NO_ALARM}
        async with consumer.consume(**opts) as messages, trio.open_nursery() as nursery:
            log = EventLog(messages.events())
            nursery.start_soon(log.run)
            r0 = await fake.request(0)
            await fake.send_status(r0, 409, "Exceeded MaxWaiting")
            await log.wait_for(PullWarning)
            refused_at = trio.current_time()
            again = await fake.request(1)
            assert 0.2 <= again.at - refused_at < 0.6, again.at - refused_at
            assert again.batch == 10  # the refused 10 are no longer counted as owed
            await settle()
            assert len(fake.requests) == 2  # one retry, not a loop
            await fake.send_msgs(again, 2)
            assert len(await take(messages, 2)) == 2
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("code", "description", "error"),
    [
        (400, "Bad Request", PullStatusError),
        (418, "I'm a teapot", PullStatusError),
        # ADR-15 "Unknown Error Statuses", as docs/jetstream.md says: a 409 the client does
        # not know is an error too (it was only a warning, and the consume went on).
        (409, "Something New", PullStatusError),
        (409, "Consumer Deleted", ConsumerDeleted),
        (409, "Consumer is push based", ConsumerIsPushBased),
    ],
)
async def test_terminal_statuses_end_iteration_after_the_buffered_messages(
    code, description, error
):
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


async def test_heartbeats_reset_the_timer():
    """idle_heartbeat 0.5 s: the alarm is due after 1 s of silence. Heartbeats every 0.15 s
    for 1.8 s keep it quiet: no alarm, no new request. (0.85 s of margin for a loaded
    machine's scheduling: 0.45 s was once not enough in CI.)"""
    async with fake_js() as (fake, nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 0.5}
        async with consumer.consume(**opts) as messages, trio.open_nursery() as nursery:
            log = EventLog(messages.events())
            nursery.start_soon(log.run)
            r0 = await fake.request(0)
            await fake.send_status(r0, 100, "Idle Heartbeat")
            await nc.flush()
            await settle()  # what came before is in the log
            alarms = len(log.of(HeartbeatsMissed))
            requests = len(fake.requests)
            for _ in range(12):
                await trio.sleep(0.15)  # the server's pace, not a wait for a condition
                await fake.send_status(r0, 100, "Idle Heartbeat")
            await nc.flush()
            assert len(fake.requests) == requests
            await settle()
            assert len(log.of(HeartbeatsMissed)) == alarms
            assert messages.buffered == 0 and not messages._ended
            nursery.cancel_scope.cancel()


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


async def test_a_new_request_starts_the_heartbeat_clock():
    """The first request: nothing is due before 2 x 0.5 s, so 0.5 s of silence is no alarm
    and no second request."""
    async with fake_js() as (fake, nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 0.5}
        async with consumer.consume(**opts) as messages, trio.open_nursery() as nursery:
            log = EventLog(messages.events())
            nursery.start_soon(log.run)
            await fake.request(0)
            await trio.sleep(0.5)  # silence shorter than the alarm (1 s)
            await nc.flush()
            assert log.of(HeartbeatsMissed) == []
            assert len(fake.requests) == 1
            nursery.cancel_scope.cancel()


async def test_a_request_after_a_quiet_full_buffer_starts_the_heartbeat_clock():
    """The buffer was full and the server quiet (rightly: nothing was owed) for longer than
    the alarm. The reader then takes everything, which sends a request: its clock starts
    then, not at the last message received."""
    async with fake_js() as (fake, nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 0.5}
        async with consumer.consume(**opts) as messages, trio.open_nursery() as nursery:
            log = EventLog(messages.events())
            nursery.start_soon(log.run)
            r0 = await fake.request(0)
            await fake.send_msgs(r0, 10)
            await messages.wait_until(lambda: messages.buffered == 10)
            await trio.sleep(1.1)  # the reader is busy elsewhere; nothing is owed
            await settle()
            alarms = len(log.of(HeartbeatsMissed))
            assert len(await take(messages, 10)) == 10
            await nc.flush()
            count = len(fake.requests)
            await trio.sleep(0.5)  # shorter than the alarm (1 s), counted from the new request
            await nc.flush()
            assert len(fake.requests) == count
            await settle()
            assert len(log.of(HeartbeatsMissed)) == alarms
            nursery.cancel_scope.cancel()


async def test_one_new_request_per_heartbeat_alarm():
    """After an alarm the new request gets its own 1 s: a server that stays silent for
    0.5 s more sees exactly one new request, not a flood."""
    async with fake_js() as (fake, nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 0.5}
        async with consumer.consume(**opts) as messages, trio.open_nursery() as nursery:
            log = EventLog(messages.events())
            nursery.start_soon(log.run)
            r0 = await fake.request(0)
            await fake.send_msgs(r0, 3)
            assert len(await take(messages, 3)) == 3
            await nc.flush()
            await settle()
            alarms = len(log.of(HeartbeatsMissed))
            count = len(fake.requests)
            await log.wait_for(HeartbeatsMissed, count=alarms + 1)
            await fake.request(count)
            await trio.sleep(0.5)  # shorter than the new request's alarm (1 s)
            await nc.flush()
            assert len(fake.requests) == count + 1
            assert len(log.of(HeartbeatsMissed)) == alarms + 1
            nursery.cancel_scope.cancel()


# -- consume: 503 and connection loss ---------------------------------------------------------


async def test_503_is_a_warning_and_the_pull_is_retried_a_second_later():
    async with fake_js() as (fake, nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 1, **NO_ALARM}
        async with consumer.consume(**opts) as messages, trio.open_nursery() as nursery:
            log = EventLog(messages.events())
            nursery.start_soon(log.run)
            req = await fake.request(0)
            await fake.send_status(req, 503)
            warning = await log.wait_for(PullWarning)
            assert warning.status == 503 and warning.description == "No Responders"
            answered = trio.current_time()
            retry = await fake.request(1)
            assert 0.9 <= retry.at - answered < 1.6, retry.at - answered
            assert retry.batch == 10  # nothing was delivered: the whole buffer again
            await nc.flush()
            assert len(fake.requests) == 2  # one retry, not a loop
            await fake.send_msgs(fake.requests[-1], 2)
            assert len(await take(messages, 2)) == 2
            nursery.cancel_scope.cancel()


async def test_503_for_a_deleted_consumer_ends_the_consume():
    """A deleted consumer's pull requests get no responder (503) too: retrying would wait
    forever, so the retry asks for consumer info first and ends the consume if it is gone."""
    async with fake_js() as (fake, _nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 1, **NO_ALARM}
        async with consumer.consume(**opts) as messages:
            req = await fake.request(0)
            await fake.send_msgs(req, 2)
            fake.consumer_exists = False
            await fake.send_status(req, 503)
            with trio.fail_after(5):
                assert len(await take(messages, 2)) == 2  # what came first is still read
                with pytest.raises(ConsumerDeleted, match="no longer exists"):
                    await messages.next_batch()
            assert fake.info_requests == 1
            assert len(fake.requests) == 1  # no pull after learning it is gone


async def test_leadership_change_resets_pending_and_pulls_at_once():
    """409 Leadership Change: the old leader's waiting requests are gone. The consume counts
    only what it holds and asks again at once, not after a heartbeat alarm."""
    async with fake_js() as (fake, _nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 1, **NO_ALARM}
        async with consumer.consume(**opts) as messages:
            r0 = await fake.request(0)
            await fake.send_msgs(r0, 3)
            await fake.send_status(r0, 409, "Leadership Change")
            r1 = await fake.request(1, timeout=1)
            # 3 buffered and untaken count as pending; the rest of the buffer is asked again.
            assert r1.batch == 7
            assert len(await take(messages, 3)) == 3


class StepCounter(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


@pytest.mark.slow
async def test_503_then_a_disconnect_does_not_spin():
    """A 503 sets a retry time 1 s ahead; the connection is lost before it and comes back
    after it. While disconnected the consume must idle, not spin on the past retry time
    (it did, some 18,000 task steps in half a second, before da5a392)."""
    async with fake_js(connect_timeout=5) as (fake, nc, consumer):
        opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 1, **NO_ALARM}
        with nc.events() as conn_events:
            async with consumer.consume(**opts) as messages:
                r0 = await fake.request(0)
                fake.handshake_delay = 1.8  # the next connection comes up 1.8 s later
                await fake.send_status(r0, 503)
                await fake.drop()
                await next_event(conn_events, Disconnected)
                await trio.sleep(1.1)  # past the retry time, still disconnected
                counter = StepCounter()
                trio.lowlevel.add_instrument(counter)
                try:
                    await trio.sleep(0.4)
                finally:
                    trio.lowlevel.remove_instrument(counter)
                # Idle: the control loop wakes once per heartbeat interval, the reconnect
                # waits for the server's INFO. A few dozen task steps at most.
                assert counter.steps < 200, f"{counter.steps} task steps in 0.4 s"
                await next_event(conn_events, Reconnected)
                retry = await fake.request(1)
                assert retry.conn == 1
                assert messages.buffered == 0


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
                await messages.wait_until(lambda: messages.buffered == 5)
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
        ([("msgs", 2), (408, "Request Timeout")], 2),
        ([(100, "Idle Heartbeat"), ("msgs", 1), (404, "No Messages")], 1),
        ([(409, "Message Size Exceeds MaxBytes")], 0),
        ([(409, "Exceeded MaxWaiting")], 0),
        ([(409, "Something New")], PullStatusError),
        ([("msgs", 1), (409, "Something New")], 1),
        ([(409, "Consumer Deleted")], ConsumerDeleted),
        ([("msgs", 2), (409, "Consumer Deleted")], 2),
        ([(409, "Consumer is push based")], ConsumerIsPushBased),
        ([(400, "Bad Request")], PullStatusError),
        ([(503, "")], JetStreamUnavailable),
    ],
)
async def test_fetch_status_sequences(script, outcome):
    """What fetch returns or raises for each sequence; statuses never come back as messages."""
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


async def test_fetch_heartbeats_keep_it_alive_and_silence_ends_it():
    async with fake_js() as (fake, _nc, consumer):
        result: list[Any] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _collect(consumer, result))
            req = await fake.request(0)
            start = trio.current_time()
            for _ in range(8):  # 1.2 s of heartbeats every 0.15 s; the alarm would be 0.6 s
                await trio.sleep(0.15)
                await fake.send_status(req, 100, "Idle Heartbeat")
            await fake.send_msgs(req, 1)
        assert len(result[0]) == 1
        assert trio.current_time() - start >= 1.2
        # Now a server that says nothing: two missed heartbeats end the fetch, early.
        result.clear()
        start = trio.current_time()
        await _collect(consumer, result)
        assert result == [[]]
        assert 0.6 <= trio.current_time() - start < 2.5  # not the expiry (3 s)


async def _collect(consumer: PullConsumer, result: list[Any]) -> None:
    result.append(await consumer.fetch(1, expires=3, idle_heartbeat=0.3))


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
