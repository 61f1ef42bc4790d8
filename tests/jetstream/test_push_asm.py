"""Automatic status management of push subscriptions (ADR-15 "ASM", ADR-9 heartbeats).

Real servers for the heartbeat alarm, flow control, gaps from dropped deliveries and domains; a
scripted fake server (:class:`FakePushServer`) only for exact status sequences a real server
does not produce on demand (stalled-consumer headers, a heartbeat claiming more deliveries).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import pytest
import trio
import trio.lowlevel
import trio.testing
from headrace.jetstream import (
    AckPolicy,
    ConsumerConfig,
    FlowControlAnswered,
    GapDetected,
    HeartbeatsMissed,
    JetStream,
    StreamConfig,
)
from headrace.jetstream.errors import PushStatusError
from headrace.jetstream.events import MessagesDropped
from headrace.nats import Disconnected, EventWatcher, Reconnected, connect

from tests.waiting import FAST, EventLog, next_event, no_event

E = TypeVar("E")


@pytest.fixture
async def js(nats_server) -> AsyncIterator[JetStream]:
    async with connect(nats_server.url, **FAST) as nc:
        jsc = JetStream(nc)
        await jsc.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        yield jsc


async def wait_delivered(js: JetStream, consumer: str, count: int) -> None:
    """Ask the server until the consumer has delivered ``count`` messages."""
    with trio.fail_after(10):
        while (await js.consumer_info("S", consumer)).delivered.consumer_seq < count:  # noqa: ASYNC110
            await trio.sleep(0.01)  # no event for it: ask again, without a busy loop


async def publish_fast(js: JetStream, count: int, payload: bytes = b"", start: int = 0) -> None:
    """``count`` messages to the stream: plain publishes, the last one acked; the stream
    stores a connection's messages in order, so its ack means all are stored."""
    nc = js.nc
    for i in range(start, start + count - 1):
        await nc.publish("s.x", b"%d:" % i + payload)
    ack = await js.publish("s.x", b"%d:" % (start + count - 1) + payload)
    assert ack.seq == start + count


# -- heartbeats -------------------------------------------------------------------------------


@pytest.mark.slow  # a few seconds of timers: the full suite runs it
@pytest.mark.parametrize("factor", [3.0, 6.0])
async def test_heartbeat_alarm_after_factor_intervals_of_silence(js, factor):
    # Not the server's minimum (0.1 s): at 3 x 0.1 a stall of 0.2 s on a loaded machine
    # would look like missed heartbeats.
    hb = 0.25
    cfg = ConsumerConfig(idle_heartbeat=hb)
    async with js.subscribe("s.x", config=cfg, heartbeat_factor=factor) as sub:
        assert sub.heartbeat is not None and sub.heartbeat.factor == factor
        with sub.events() as events:
            # Heartbeats arrive every interval: no alarm over more than the alarm window.
            await no_event(events, HeartbeatsMissed, factor * hb + 2 * hb)
            # The consumer goes away: no more heartbeats.
            await js.delete_consumer("S", sub.consumer)
            deleted_at = trio.current_time()
            alarm = await next_event(events, HeartbeatsMissed)
            after = trio.current_time() - deleted_at
        assert alarm.consumer == sub.consumer
        limit = factor * hb
        assert limit <= alarm.silence < limit + 0.5
        # The last heartbeat came at most one interval before the deletion.
        assert limit - hb - 0.1 <= after < limit + 0.5
        assert sub.heartbeat.alarms == 1


@pytest.mark.slow
async def test_heartbeat_monitor_pauses_while_disconnected(nats_server):
    """An outage longer than the alarm window raises no alarm; after the reconnect heartbeats
    of the (file-stored, durable) consumer resume, and the monitor works again."""
    hb = 0.2
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        cfg = ConsumerConfig(idle_heartbeat=hb)
        async with js.subscribe("s.x", durable="hb", config=cfg) as sub:
            monitor = sub.heartbeat
            assert monitor is not None
            with sub.events() as events, nc.events() as conn_events:
                await trio.to_thread.run_sync(nats_server.stop)
                await next_event(conn_events, Disconnected)
                await trio.testing.wait_all_tasks_blocked()  # the monitor has seen it too
                assert monitor.paused
                await no_event(events, HeartbeatsMissed, 6 * hb)  # twice the window
                await trio.to_thread.run_sync(nats_server.start)
                await next_event(conn_events, Reconnected)
                await no_event(events, HeartbeatsMissed, 6 * hb)  # heartbeats resumed
                assert not monitor.paused and monitor.alarms == 0
                await js.delete_consumer("S", "hb")
                alarm = await next_event(events, HeartbeatsMissed)
                assert alarm.silence >= 3 * hb


# -- flow control ------------------------------------------------------------------------------


async def test_flow_control_is_answered_as_the_reader_reaches_it(js, natspy, nats_server):
    """A 20 MB stream through a flow-controlled consumer: while nobody reads, nothing is
    answered and the server holds back; reading answers every request (seen by an independent
    peer subscribed to the flow-control subjects) and every message arrives, in order."""
    n = 20_000
    await publish_fast(js, n, b"x" * 1024)
    peer = await natspy.connect(nats_server.url)
    answers = await natspy.call(peer.subscribe, "$JS.FC.>")
    await natspy.call(peer.flush)

    async def answers_so_far() -> int:
        """What the peer has received: our flush, then the peer's, order the deliveries."""
        await js.nc.flush()
        await natspy.call(peer.flush)
        return int(answers.pending_msgs)

    cfg = ConsumerConfig(flow_control=True, idle_heartbeat=1.0, ack_policy=AckPolicy.NONE)
    async with js.subscribe("s.x", config=cfg) as sub, trio.open_nursery() as nursery:
        log = EventLog(sub.events())
        nursery.start_soon(log.run)
        # Not reading: the server stops at its flow control window, unanswered.
        await wait_delivered(js, sub.consumer, 1)
        await trio.sleep(0.3)  # the observation period of an absence check
        held = (await js.consumer_info("S", sub.consumer)).delivered.consumer_seq
        assert 0 < held < n
        assert await answers_so_far() == 0
        assert log.of(FlowControlAnswered) == []
        # A slow reader: small batches, yielding between them.
        got: list[int] = []
        with trio.fail_after(20):
            while len(got) < n:
                for msg in await sub.next_batch(50):
                    got.append(msg.metadata.stream_seq)
                await trio.lowlevel.checkpoint()
        assert got == list(range(1, n + 1))
        await trio.testing.wait_all_tasks_blocked()
        answered = log.of(FlowControlAnswered)
        assert answered, "no flow control request was answered"
        assert all(not a.stalled and a.consumer == sub.consumer for a in answered)
        subjects = [a.subject for a in answered]
        assert len(set(subjects)) == len(subjects)
        assert await answers_so_far() == len(subjects)
        seen = [(await natspy.call(answers.next_msg, timeout=5)) for _ in subjects]
        assert [m.subject for m in seen] == subjects
        assert all(m.data == b"" for m in seen)
        assert log.of(MessagesDropped) == []
        info = await js.consumer_info("S", sub.consumer)
        assert info.delivered.stream_seq == n and info.num_pending == 0
        nursery.cancel_scope.cancel()


# -- gaps ---------------------------------------------------------------------------------------


async def drop_deliveries(js: JetStream, sub: Any, events: EventWatcher[Any], n: int) -> list[Any]:
    """Publish ``n`` messages while nobody reads a subscription whose buffer holds 10: most
    deliveries are dropped. Return what the buffer kept (consumer seqs 1..10)."""
    await publish_fast(js, n)
    dropped = await next_event(events, MessagesDropped)
    assert dropped.consumer == sub.consumer and dropped.dropped > 0
    await wait_delivered(js, sub.consumer, n)
    kept = await sub.next_batch()
    assert [m.metadata.consumer_seq for m in kept] == list(range(1, 11))
    return kept


async def test_gap_from_the_ack_reply_after_dropped_deliveries(js):
    cfg = ConsumerConfig(ack_policy=AckPolicy.NONE)  # no redeliveries to fill the hole
    async with js.subscribe("s.x", config=cfg, max_pending_msgs=10) as sub:
        with sub.events() as events:
            await drop_deliveries(js, sub, events, 200)
            await js.publish("s.x", b"after")
            msg = await sub.next_msg(timeout=5)
            assert msg.data == b"after" and msg.metadata.consumer_seq == 201
            gap = await next_event(events, GapDetected)
        assert (gap.consumer, gap.last, gap.received, gap.last_stream_seq) == (
            sub.consumer,
            10,
            201,
            10,
        )


async def test_gap_from_a_heartbeat_after_dropped_deliveries(js):
    """Deliveries dropped, then silence: the next heartbeat's Nats-Last-Consumer reveals it."""
    cfg = ConsumerConfig(ack_policy=AckPolicy.NONE, idle_heartbeat=0.1)
    async with js.subscribe("s.x", config=cfg, max_pending_msgs=10) as sub:
        with sub.events() as events:
            await drop_deliveries(js, sub, events, 200)

            async def reader() -> None:  # heartbeats are looked at as the reader reaches them
                async for msg in sub:
                    pytest.fail(f"unexpected {msg!r}")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                gap = await next_event(events, GapDetected)
                nursery.cancel_scope.cancel()
        assert (gap.last, gap.received, gap.last_stream_seq) == (10, 200, 10)


async def test_no_gap_detection_for_queue_subscriptions(js):
    cfg = ConsumerConfig(ack_policy=AckPolicy.NONE)
    async with js.subscribe("s.x", queue="q", config=cfg, max_pending_msgs=10) as sub:
        assert sub.gaps is None
        with sub.events() as events:
            log = EventLog(sub.events())
            async with trio.open_nursery() as nursery:
                nursery.start_soon(log.run)
                await drop_deliveries(js, sub, events, 200)
                await js.publish("s.x", b"after")
                msg = await sub.next_msg(timeout=5)
                assert msg.metadata.consumer_seq == 201  # the same hole as above
                await trio.testing.wait_all_tasks_blocked()
                assert log.of(GapDetected) == []
                nursery.cancel_scope.cancel()


# -- domains ------------------------------------------------------------------------------------


async def test_push_subscription_in_a_jetstream_domain(nats_server_factory, tmp_path):
    store = json.dumps(str(tmp_path / "js"))
    server = nats_server_factory(
        jetstream=False, extra_config=f"jetstream {{\n  store_dir: {store}\n  domain: hub\n}}\n"
    )
    async with connect(server.url) as nc:
        js = JetStream(nc, domain="hub")
        assert js.prefix == "$JS.hub.API"
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        async with js.subscribe("s.x", durable="d") as sub:
            await js.publish("s.x", b"in the hub")
            msg = await sub.next_msg(timeout=5)
            meta = msg.metadata
            assert (meta.stream, meta.consumer, meta.stream_seq) == ("S", "d", 1)
            # nats-server 2.15 still sends v1 (9 token) ack replies to a local subscriber, so
            # the domain is not in them; a v2 reply names it (see the scripted test below).
            assert meta.domain in (None, "hub")
            await msg.ack_sync(timeout=5)
            assert (await js.consumer_info("S", "d")).num_ack_pending == 0
        # Gap detection reads the v2 ack reply the same way.
        cfg = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=None)
        async with js.subscribe("s.x", config=cfg, max_pending_msgs=10) as sub:
            with sub.events() as events:
                first = await sub.next_msg(timeout=5)  # the message published above
                assert first.metadata.stream_seq == 1
                await publish_fast(js, 100, start=1)
                await next_event(events, MessagesDropped)
                await wait_delivered(js, sub.consumer, 101)
                kept = await sub.next_batch()
                assert [m.metadata.consumer_seq for m in kept] == list(range(2, 12))
                await js.publish("s.x", b"after")
                msg = await sub.next_msg(timeout=5)
                assert msg.metadata.consumer_seq == 102
                gap = await next_event(events, GapDetected)
                assert (gap.last, gap.received) == (11, 102)


# -- exact status sequences from a scripted server ----------------------------------------------

FAKE_INFO = (
    b'INFO {"server_id":"FAKEPUSH","server_name":"fakepush","version":"2.10.0","headers":true,'
    b'"max_payload":1048576,"proto":1}\r\n'
)
DELIVER = "dlv.C"


def _matches(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


class FakePushServer:
    """Serves one push consumer ``S``/``C`` (deliver subject ``dlv.C``): answers its
    CONSUMER.INFO, records every publish, and sends what the test scripts."""

    def __init__(self, **config: Any) -> None:
        self.config = {"durable_name": "C", "deliver_subject": DELIVER, **config}
        self.subs: dict[int, str] = {}
        self.pubs: list[tuple[str, bytes]] = []
        self._stream: trio.SocketStream | None = None
        self._changed = trio.Event()

    async def start(self, nursery: trio.Nursery) -> str:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, self._handle, listeners)
        return f"nats://127.0.0.1:{listeners[0].socket.getsockname()[1]}"

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 5) -> None:
        with trio.fail_after(timeout):
            while not predicate():
                await self._changed.wait()

    def published(self, subject: str) -> list[bytes]:
        return [data for s, data in self.pubs if s == subject]

    async def _handle(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        await stream.send_all(FAKE_INFO)
        buf = b""
        try:
            while True:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                buf = await self._process(buf + chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return

    async def _process(self, buf: bytes) -> bytes:
        while (eol := buf.find(b"\r\n")) >= 0:
            parts = buf[:eol].split()
            op = parts[0].upper() if parts else b""
            if op in (b"PUB", b"HPUB"):
                end = eol + 2 + int(parts[-1])
                if len(buf) < end + 2:
                    return buf
                payload = buf[eol + 2 : end]
                if op == b"HPUB":
                    payload = payload[int(parts[-2]) :]
                reply = parts[2].decode() if len(parts) == (5 if op == b"HPUB" else 4) else None
                buf = buf[end + 2 :]
                await self._on_pub(parts[1].decode(), reply, payload)
                continue
            buf = buf[eol + 2 :]
            if op == b"PING":
                await self.send(b"PONG\r\n")
            elif op == b"SUB":
                self.subs[int(parts[-1])] = parts[1].decode()
            elif op == b"UNSUB":
                self.subs.pop(int(parts[1]), None)
            self._notify()
        return buf

    def sid(self, subject: str) -> int:
        for sid, pattern in self.subs.items():
            if _matches(pattern, subject):
                return sid
        raise AssertionError(f"the client has no subscription for {subject!r}")

    async def _on_pub(self, subject: str, reply: str | None, payload: bytes) -> None:
        self.pubs.append((subject, payload))
        if subject == "$JS.API.CONSUMER.INFO.S.C" and reply is not None:
            info = {
                "type": "io.nats.jetstream.api.v1.consumer_info_response",
                "stream_name": "S",
                "name": "C",
                "config": self.config,
                "delivered": {"consumer_seq": 0, "stream_seq": 0},
                "ack_floor": {"consumer_seq": 0, "stream_seq": 0},
                "push_bound": False,
            }
            data = json.dumps(info).encode()
            await self.send(
                b"MSG %s %d %d\r\n%s\r\n" % (reply.encode(), self.sid(reply), len(data), data)
            )
        self._notify()

    async def send(self, data: bytes) -> None:
        assert self._stream is not None
        await self._stream.send_all(data)

    def msg(
        self, cseq: int, sseq: int | None = None, data: bytes = b"m", domain: str | None = None
    ) -> bytes:
        reply = f"$JS.ACK.S.C.1.{sseq or cseq}.{cseq}.1700000000000000000.0"
        if domain is not None:  # v2: domain and account hash inserted, a random token appended
            reply = reply.replace("$JS.ACK.", f"$JS.ACK.{domain}.ACCHASH.") + ".r4nd0m"
        return b"MSG s.x %d %s %d\r\n%s\r\n" % (self.sid(DELIVER), reply.encode(), len(data), data)

    def status(self, code: str, reply: str | None = None, **headers: Any) -> bytes:
        head = f"NATS/1.0 {code}\r\n"
        head += "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        raw = head.encode()
        dest = f"{DELIVER} {self.sid(DELIVER)}" + (f" {reply}" if reply else "")
        return f"HMSG {dest} {len(raw)} {len(raw)}\r\n".encode() + raw + b"\r\n"

    def heartbeat(self, last_consumer: int = 0, **headers: Any) -> bytes:
        return self.status(
            "100 Idle Heartbeat",
            Nats_Last_Consumer=last_consumer,
            Nats_Last_Stream=last_consumer,
            **headers,
        )


async def test_stalled_heartbeat_is_answered_once_per_subject():
    """ADR-15: heartbeats name a missed flow control subject in Nats-Consumer-Stalled; the
    client answers it as a flow control request, once per subject, even when several
    heartbeats, or the request itself and a heartbeat, carry it."""
    fake = FakePushServer(idle_heartbeat=60_000_000_000, flow_control=True)
    async with trio.open_nursery() as nursery:
        url = await fake.start(nursery)
        async with connect(url) as nc:
            js = JetStream(nc)
            async with js.subscribe(stream="S", bind="C") as sub:
                log = EventLog(sub.events())
                nursery.start_soon(log.run)

                async def reader() -> None:
                    async for msg in sub:
                        pytest.fail(f"unexpected {msg!r}")

                nursery.start_soon(reader)
                await fake.wait_until(lambda: DELIVER in fake.subs.values())
                a, b, c = "$JS.FC.S.C.aaa", "$JS.FC.S.C.bbb", "$JS.FC.S.C.ccc"
                await fake.send(
                    fake.heartbeat(Nats_Consumer_Stalled=a)
                    + fake.heartbeat(Nats_Consumer_Stalled=a)
                    + fake.status("100 FlowControl Request", reply=c)
                    + fake.heartbeat(Nats_Consumer_Stalled=c)
                    + fake.heartbeat(Nats_Consumer_Stalled=b)
                )
                await fake.wait_until(lambda: bool(fake.published(b)))
                await nc.flush()
                assert fake.published(a) == [b""]
                assert fake.published(c) == [b""]
                assert fake.published(b) == [b""]
                await trio.testing.wait_all_tasks_blocked()
                answered = [(e.subject, e.stalled) for e in log.of(FlowControlAnswered)]
                assert answered == [(a, True), (c, False), (b, True)]
            nursery.cancel_scope.cancel()


async def test_gap_from_a_heartbeat_claiming_more_deliveries():
    fake = FakePushServer(idle_heartbeat=60_000_000_000)
    async with trio.open_nursery() as nursery:
        url = await fake.start(nursery)
        async with connect(url) as nc, JetStream(nc).subscribe(stream="S", bind="C") as sub:
            log = EventLog(sub.events())
            nursery.start_soon(log.run)
            await fake.wait_until(lambda: DELIVER in fake.subs.values())
            got: list[int] = []

            async def step(data: bytes, count: int) -> None:
                """Send, then read until ``count`` messages in all arrived, then settle."""
                await fake.send(data)
                while len(got) < count:
                    got.extend(m.metadata.consumer_seq for m in await sub.next_batch(1))
                await trio.testing.wait_all_tasks_blocked()

            await step(fake.msg(1), 1)
            await step(fake.msg(2), 2)
            assert log.of(GapDetected) == []
            # The heartbeat says 5 were delivered; we saw 2.
            await fake.send(fake.heartbeat(5) + fake.heartbeat(5))
            await step(fake.msg(6), 3)
            await step(fake.msg(8), 4)
            assert got == [1, 2, 6, 8]
            gaps = [
                (g.consumer, g.last, g.received, g.last_stream_seq) for g in log.of(GapDetected)
            ]
            # One gap for the heartbeat (the second says nothing new), none for 5 -> 6.
            assert gaps == [("C", 2, 5, 2), ("C", 6, 8, 6)]
        nursery.cancel_scope.cancel()


async def test_gap_detection_with_v2_domain_ack_replies():
    fake = FakePushServer()
    async with trio.open_nursery() as nursery:
        url = await fake.start(nursery)
        async with connect(url) as nc, JetStream(nc).subscribe(stream="S", bind="C") as sub:
            log = EventLog(sub.events())
            nursery.start_soon(log.run)
            await fake.wait_until(lambda: DELIVER in fake.subs.values())
            seen = []
            for cseq in (1, 2, 4):
                await fake.send(fake.msg(cseq, sseq=10 + cseq, domain="hub"))
                msg = await sub.next_msg(timeout=5)
                seen.append((msg.metadata.domain, msg.metadata.consumer_seq))
            assert seen == [("hub", 1), ("hub", 2), ("hub", 4)]
            await trio.testing.wait_all_tasks_blocked()
            gaps = [(g.last, g.received, g.last_stream_seq) for g in log.of(GapDetected)]
            assert gaps == [(2, 4, 12)]
        nursery.cancel_scope.cancel()


async def test_no_false_gap_when_messages_and_their_heartbeat_share_a_batch():
    fake = FakePushServer(idle_heartbeat=60_000_000_000)
    async with trio.open_nursery() as nursery:
        url = await fake.start(nursery)
        async with connect(url) as nc, JetStream(nc).subscribe(stream="S", bind="C") as sub:
            log = EventLog(sub.events())
            nursery.start_soon(log.run)
            await fake.wait_until(lambda: DELIVER in fake.subs.values())
            # Two messages and a heartbeat that agrees with them, in one write.
            await fake.send(fake.msg(1) + fake.msg(2) + fake.heartbeat(2))
            await nc.flush()  # the PONG comes after them: they are buffered now
            batch = await sub.next_batch()
            assert [m.metadata.consumer_seq for m in batch] == [1, 2]
            await trio.testing.wait_all_tasks_blocked()
            assert log.of(GapDetected) == []
        nursery.cancel_scope.cancel()


async def test_no_false_gap_on_a_real_server_when_a_heartbeat_is_buffered(js, natspy, nats_server):
    """Five messages, then an idle heartbeat saying five were delivered, both buffered before
    the user reads. An independent peer on the deliver subject sees the heartbeat; a flush
    after that guarantees ours is buffered too."""
    await publish_fast(js, 5)
    cfg = ConsumerConfig(idle_heartbeat=0.1, ack_policy=AckPolicy.NONE)
    async with js.subscribe("s.x", config=cfg) as sub:
        assert sub._sub is not None
        deliver = sub._sub.subject
        log = EventLog(sub.events())
        peer = await natspy.connect(nats_server.url)
        heartbeat = await natspy.call(peer.subscribe, deliver)

        async def wait_heartbeat() -> None:
            while True:
                msg = await heartbeat.next_msg(timeout=10)
                if msg.headers and msg.headers.get("Nats-Last-Consumer") == "5":
                    return

        await natspy.call(wait_heartbeat)
        await js.nc.flush()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(log.run)
            batch = await sub.next_batch()
            assert [m.metadata.consumer_seq for m in batch] == [1, 2, 3, 4, 5]
            await trio.testing.wait_all_tasks_blocked()
            assert log.of(GapDetected) == []
            nursery.cancel_scope.cancel()


async def test_error_status_on_a_push_subscription_is_raised():
    fake = FakePushServer()
    async with trio.open_nursery() as nursery:
        url = await fake.start(nursery)
        async with connect(url) as nc, JetStream(nc).subscribe(stream="S", bind="C") as sub:
            await fake.wait_until(lambda: DELIVER in fake.subs.values())
            await fake.send(fake.msg(1) + fake.status("409 Consumer Deleted"))
            assert (await sub.next_msg(timeout=5)).metadata.consumer_seq == 1
            with pytest.raises(PushStatusError, match="409") as caught:
                await sub.next_msg(timeout=5)
            assert caught.value.status == 409
        nursery.cancel_scope.cancel()


# -- purged streams ---------------------------------------------------------------------------


async def test_purge_is_not_a_gap_but_lost_deliveries_after_it_are(js):
    """A purge removes messages not yet delivered: stream sequences jump, consumer sequences
    do not (they count deliveries), so the gap detector stays quiet. Deliveries lost after the
    purge are still caught."""
    cfg = ConsumerConfig(max_ack_pending=5, idle_heartbeat=0.1)
    async with js.subscribe("s.x", config=cfg, max_pending_msgs=10) as sub:
        with sub.events() as events:
            await publish_fast(js, 50)
            first = await sub.next_batch(5)
            while len(first) < 5:
                first += await sub.next_batch(5 - len(first))
            assert [m.metadata.consumer_seq for m in first] == [1, 2, 3, 4, 5]
            assert await js.purge_stream("S") == 50  # 45 of them never delivered
            for msg in first:
                await msg.ack()
            for i in range(3):
                await js.publish("s.x", b"after-%d" % i)
            after = []
            while len(after) < 3:
                after += await sub.next_batch()
            metas = [m.metadata for m in after]
            assert [m.consumer_seq for m in metas] == [6, 7, 8]
            assert [m.stream_seq for m in metas] == [51, 52, 53]
            for msg in after:
                await msg.ack()
            # Heartbeats follow (Nats-Last-Stream 53, Nats-Last-Consumer 8): still no gap.
            await no_event(events, GapDetected, 0.5)
            assert sub.gaps is not None and sub.gaps.gaps == 0
            assert sub.gaps.last_consumer == 8
    # Lost deliveries on a purged stream are still gaps.
    cfg = ConsumerConfig(ack_policy=AckPolicy.NONE)
    async with js.subscribe("s.x", config=cfg, max_pending_msgs=10) as sub:
        with sub.events() as events:
            for i in range(199):
                await js.nc.publish("s.x", b"%d" % i)
            assert (await js.publish("s.x", b"199")).seq == 253  # 3 after the purge, 200 more
            await next_event(events, MessagesDropped)
            await wait_delivered(js, sub.consumer, 203)  # 3 after the purge, then 200
            kept = await sub.next_batch()
            await js.publish("s.x", b"last")
            while True:
                msg = await sub.next_msg(timeout=5)
                if msg.data == b"last":
                    break
            gap = await next_event(events, GapDetected)
            assert gap.last == kept[-1].metadata.consumer_seq and gap.received == 204


async def test_ordered_consumer_reads_across_a_purge_in_order(js):
    async with js.subscribe("s.x", ordered=True) as sub:
        await publish_fast(js, 20)
        seen = []
        while len(seen) < 20:
            seen += [m.metadata.stream_seq for m in await sub.next_batch()]
        assert seen == list(range(1, 21))
        await js.purge_stream("S")
        for i in range(5):
            await js.publish("s.x", b"%d" % i)
        after = []
        while len(after) < 5:
            after += [m.metadata.stream_seq for m in await sub.next_batch()]
        assert after == [21, 22, 23, 24, 25]
        assert sub.recreated == 0  # a purge is not a gap: the same consumer goes on
