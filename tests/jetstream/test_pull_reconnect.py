"""``consume()`` across server restarts, a consumer leader failover and a connection outage
(ADR-37 "Server reconnects", "Idle heartbeats"). Real servers; all slow.

Delivery is at least once: a message whose delivery or ack was lost in the outage comes back
after ``ack_wait`` (short here) and is acked again. The tests check that every published
stream sequence is received at least once and that the server's ack floor reaches the last
sequence, as nats-py (the independent peer) reads it. (A confirmed ``ack_sync`` is not the
criterion: an ack can be recorded while its confirmation is lost.)
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
from headrace.errors import HeadraceError
from headrace.jetstream import (
    HeartbeatsMissed,
    JetStream,
    PullWarning,
    StreamConfig,
)
from headrace.nats import Disconnected, Reconnected, connect

from tests.jetstream.js_pull_support import (
    ConsumeProbe,
    poll_consumer,
    probed_consume,
    seq_of,
    settle,
    setup_pull,
)
from tests.waiting import FAST, EventLog, next_event, once_placed

pytestmark = pytest.mark.slow


@attrs.define
class Ledger:
    """What was published (index -> stream seq) and what was received and confirmed acked."""

    total: int
    published: dict[int, int] = attrs.field(factory=dict)
    received: set[int] = attrs.field(factory=set)  # stream seqs, at least once
    deliveries: int = 0
    publish_retries: int = 0
    changed: trio.Event = attrs.field(factory=trio.Event)

    def note(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    @property
    def complete(self) -> bool:
        seqs = set(self.published.values())
        return len(self.published) == self.total and seqs <= self.received

    async def wait(self, predicate: Any, timeout: float) -> None:
        with trio.fail_after(timeout):
            while not predicate():
                await self.changed.wait()


async def publisher(js: JetStream, ledger: Ledger, indices: range) -> None:
    """Publish each index once, with a message id, retrying through outages: a retry after a
    lost PubAck is answered as a duplicate with the original sequence."""
    for i in indices:
        while True:
            try:
                ack = await js.publish("s.x", b"%d" % i, msg_id=f"m-{i}", timeout=2)
            except HeadraceError:
                ledger.publish_retries += 1
                await trio.sleep(0.05)  # pacing the retries while the stream is unavailable
                continue
            ledger.published[i] = ack.seq
            ledger.note()
            break


async def receive_all(messages: Any, ledger: Ledger) -> None:
    async for msg in messages:
        ledger.received.add(seq_of(msg))
        ledger.deliveries += 1
        try:
            await msg.ack()
        except HeadraceError:
            pass  # not even queued: redelivered after ack_wait, and acked then
        ledger.note()


async def wait_acked_up_to(natspy: Any, last: int, timeout: float = 20) -> Any:
    """The consumer info once its ack floor is ``last`` (acks of redeliveries may still be
    on their way, so this polls the server under a time limit)."""
    return await poll_consumer(
        natspy,
        lambda info: info.ack_floor.stream_seq == last and info.num_ack_pending == 0,
        timeout=timeout,
    )


async def test_consume_across_a_server_restart_loses_nothing(nats_server, natspy):
    total = 600
    ledger = Ledger(total)
    async with (
        connect(nats_server.url, **FAST) as nc,
        connect(nats_server.url, **FAST) as pub_nc,
        trio.open_nursery() as nursery,
    ):
        consumer = await setup_pull(JetStream(nc), ack_wait=2)
        opts = {"max_messages": 50, "expires": 2, "idle_heartbeat": 0.5}
        with nc.events() as conn_events:
            async with consumer.consume(**opts) as messages:
                nursery.start_soon(publisher, JetStream(pub_nc), ledger, range(total))
                nursery.start_soon(receive_all, messages, ledger)
                await ledger.wait(lambda: len(ledger.received) >= 150, timeout=15)
                assert len(ledger.published) < total  # publishing goes on through the restart
                await trio.to_thread.run_sync(nats_server.restart)
                await next_event(conn_events, Disconnected)
                await next_event(conn_events, Reconnected)
                await ledger.wait(lambda: ledger.complete, timeout=30)
                # Everything arrived; the acks of the last ones (and of redeliveries) land.
                await natspy.connect(nats_server.url)
                last = max(ledger.published.values())
                info = await wait_acked_up_to(natspy, last)
                nursery.cancel_scope.cancel()
    assert sorted(ledger.published.values()) == list(range(1, total + 1))  # one seq per index
    assert set(ledger.published.values()) <= ledger.received
    assert last == total
    assert info.num_pending == 0


async def _consumer_leader(js: JetStream) -> str:
    info = await js.consumer_info("S", "C")
    assert info.cluster is not None and info.cluster.leader
    return info.cluster.leader


@pytest.mark.parametrize("client_on", ["leader", "follower"])
async def test_consume_survives_the_consumer_leader_being_killed(nats_cluster, natspy, client_on):
    """Stream and consumer with 3 replicas. The node leading the consumer is killed while a
    consume runs, with the consuming client connected to that node (it reconnects as well)
    or to another one (only the leader changes: its waiting requests are lost silently and
    the heartbeat alarm is what brings a new request)."""
    total = 400
    ledger = Ledger(total)
    async with connect(nats_cluster.urls, **FAST) as admin:
        js = JetStream(admin, timeout=10)
        # A fresh cluster sometimes needs a moment more before it places an R3 stream.
        await once_placed(
            lambda: js.add_stream(StreamConfig(name="S", subjects=["s.>"], num_replicas=3))
        )
        await setup_pull(js, ack_wait=2)
        leader = await _consumer_leader(js)
    victim = int(leader.removeprefix("n"))
    others = [i for i in range(3) if i != victim]
    client_node = victim if client_on == "leader" else others[0]
    publisher_node = others[1]
    async with (
        connect(nats_cluster[client_node].url, **FAST) as nc,
        connect(nats_cluster[publisher_node].url, **FAST) as pub_nc,
        trio.open_nursery() as nursery,
    ):
        consumer = await JetStream(nc, timeout=10).pull_consumer("S", "C")
        pub_js = JetStream(pub_nc, timeout=10)
        await publisher(pub_js, ledger, range(200))
        opts = {"max_messages": 50, "expires": 2, "idle_heartbeat": 0.5}

        async def consume() -> None:
            async with consumer.consume(**opts) as messages:
                await receive_all(messages, ledger)

        nursery.start_soon(consume)
        await ledger.wait(lambda: len(ledger.received) >= 100, timeout=15)
        await trio.to_thread.run_sync(nats_cluster.kill_node, victim)
        nursery.start_soon(publisher, pub_js, ledger, range(200, total))
        await ledger.wait(lambda: ledger.complete, timeout=30)
        await natspy.connect(nats_cluster[others[0]].url)
        last = max(ledger.published.values())
        info = await wait_acked_up_to(natspy, last)
        nursery.cancel_scope.cancel()
    assert set(ledger.published.values()) <= ledger.received
    assert info.num_pending == 0
    assert info.cluster.leader != leader


async def test_outage_longer_than_the_heartbeat_alarm_raises_no_alarm(nats_server):
    """idle_heartbeat 0.25 s (alarm after 0.5 s). The server is down for 1.5 s: the timer is
    paused while disconnected (ADR-37), so no HeartbeatsMissed; on reconnect the consume
    pulls again at once (the restarted server forgot the old request) and gets new messages
    without waiting for an alarm."""
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        with nc.events() as conn_events:
            opts = {"max_messages": 10, "expires": 5, "idle_heartbeat": 0.25}
            async with (
                probed_consume(consumer, **opts) as (messages, probe),
                trio.open_nursery() as nursery,
            ):
                log = EventLog(messages.events())
                nursery.start_soon(log.run)
                # A live request: the server's heartbeats are coming. Whatever happened
                # before (see the heartbeat clock bug) is in the log once all tasks idle.
                await _heartbeats(probe, 2)
                await settle()
                alarms_before = len(log.of(HeartbeatsMissed))
                await trio.to_thread.run_sync(nats_server.stop)
                lost_at = trio.current_time()
                await next_event(conn_events, Disconnected)
                await trio.sleep(1.5)  # the outage, three times the alarm
                await trio.to_thread.run_sync(nats_server.start)
                await next_event(conn_events, Reconnected)
                back_at = trio.current_time()
                await js.publish("s.x", b"after")
                with trio.fail_after(2 * 0.25):  # sooner than an alarm could act
                    got = await messages.next_batch()
                assert [m.data for m in got] == [b"after"]
                assert back_at - lost_at >= 1.5
                assert len(log.of(HeartbeatsMissed)) == alarms_before
                for warning in log.of(PullWarning):  # nats-server says "409 Server Shutdown"
                    assert warning.status in (409, 503), warning
                nursery.cancel_scope.cancel()


async def _heartbeats(probe: ConsumeProbe, count: int) -> None:
    """Wait until the server has sent the consume ``count`` more heartbeats."""

    def beats() -> int:
        return sum(1 for status, _ in probe.statuses if status == 100)

    target = beats() + count
    await probe.wait_until(lambda: beats() >= target)
