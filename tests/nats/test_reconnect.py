"""Keeping the connection alive: server restarts, stale connections, lame duck mode, cluster
failover with discovered servers, the reconnect buffer, and malformed frames. Real servers
throughout; a fake server only for frames a real server never sends."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
import trio
import trio.testing
from headrace.errors import (
    ConnectionClosedError,
    ConnectionLostError,
    OutboundBufferFull,
    ProtocolError,
    StaleConnectionError,
)
from headrace.nats import (
    Closed,
    Disconnected,
    LameDuck,
    Reconnected,
    ServersDiscovered,
    Status,
    connect,
)

from tests.servers import NatsCluster, user_password_auth
from tests.waiting import FAST, next_event

E = TypeVar("E")


async def test_server_restart_resubscribes_and_loses_nothing_accepted(nats_server):
    """Publish and subscribe on one connection while the server restarts: every message whose
    flush succeeded arrives; rounds whose flush was interrupted are the only uncertain ones."""
    async with connect(nats_server.url, **FAST) as nc, trio.open_nursery() as nursery:
        with nc.events() as events:
            sub = await nc.subscribe("restart.>")
            await nc.flush()
            accepted: set[int] = set()
            uncertain: set[int] = set()
            received: set[int] = set()
            restarted = trio.Event()
            flowing = trio.Event()  # some rounds were confirmed before the restart

            async def publisher() -> None:
                i = 0
                while not restarted.is_set() or i % 50:
                    start = i
                    for _ in range(50):
                        await nc.publish(f"restart.{i % 7}", b"%d" % i)
                        i += 1
                    try:
                        await nc.flush(timeout=15)
                    except ConnectionLostError:
                        uncertain.update(range(start, i))
                    else:
                        accepted.update(range(start, i))
                        if len(accepted) >= 200:
                            flowing.set()
                    await trio.sleep(0.005)  # pacing, so the restart lands mid-stream
                await nc.flush(timeout=15)

            after_seen = trio.Event()

            async def consumer() -> None:
                async for msg in sub:
                    received.add(int(msg.data))
                    if msg.data == b"-1":
                        after_seen.set()

            nursery.start_soon(consumer)
            async with trio.open_nursery() as pub_nursery:
                pub_nursery.start_soon(publisher)
                with trio.fail_after(10):
                    await flowing.wait()
                await trio.to_thread.run_sync(nats_server.restart)
                lost = await next_event(events, Disconnected)
                assert lost.server.port == nats_server.port
                await next_event(events, Reconnected)
                restarted.set()
            # Published after the reconnect on the re-sent subscription: it arrives.
            await nc.publish("restart.after", b"-1")
            await nc.flush(timeout=5)
            with trio.fail_after(5):
                await after_seen.wait()
            missing = accepted - received
            assert not missing, f"{len(missing)} accepted messages lost, e.g. {sorted(missing)[:5]}"
            assert len(accepted) > 100
            assert nc.stats.reconnects == 1 and nc.status is Status.CONNECTED
            nursery.cancel_scope.cancel()


async def test_publishes_while_disconnected_are_buffered_and_sent(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        with nc.events() as events:
            sub = await nc.subscribe("buffered")
            await nc.flush()
            await trio.to_thread.run_sync(nats_server.stop)
            await next_event(events, Disconnected)
            assert nc.status is Status.RECONNECTING
            for i in range(100):
                await nc.publish("buffered", b"%d" % i)  # returns at once: kept in the buffer
            flushed = trio.Event()
            async with trio.open_nursery() as nursery:

                async def flush_after_reconnect() -> None:
                    await nc.flush(timeout=15)  # pinged after the buffer is sent
                    flushed.set()

                nursery.start_soon(flush_after_reconnect)
                await trio.to_thread.run_sync(nats_server.start)
                await next_event(events, Reconnected)
            assert flushed.is_set()
            got = await sub.next_batch()
            assert [m.data for m in got] == [b"%d" % i for i in range(100)]


async def test_reconnect_buffer_bound_is_a_clear_error(nats_server):
    async with connect(nats_server.url, reconnect_buffer_size=2000, **FAST) as nc:
        with nc.events() as events:
            sub = await nc.subscribe("bound")
            await nc.flush()
            await trio.to_thread.run_sync(nats_server.stop)
            await next_event(events, Disconnected)
            kept = 0
            with pytest.raises(OutboundBufferFull, match="reconnect buffer is full"):
                for i in range(1000):
                    await nc.publish("bound", b"%03d" % i + b"." * 96)
                    kept += 1
            assert 10 < kept < 20
            # The unchecked path used for acks honours the same bound.
            with pytest.raises(OutboundBufferFull):
                nc.publish_nowait("bound", b"x" * 100)
            await trio.to_thread.run_sync(nats_server.start)
            await next_event(events, Reconnected)
            await nc.flush(timeout=5)
            got = [m.data[:3] for m in await sub.next_batch()]
            # Exactly what publish accepted arrived; the refused call queued nothing.
            assert got == [b"%03d" % i for i in range(kept)]


async def test_stale_connection_detected_by_missing_pongs(nats_server):
    """A frozen server (SIGSTOP) keeps the TCP connection open but answers no PING."""
    opts = {**FAST, "ping_interval": 0.2, "max_pings_out": 2, "connect_timeout": 0.5}
    async with connect(nats_server.url, **opts) as nc:
        with nc.events() as events:
            sub = await nc.subscribe("stale")
            await nc.flush()
            assert nats_server.pid is not None
            nats_server.freeze()
            try:
                lost = await next_event(events, Disconnected, timeout=10)
                assert isinstance(lost.error, StaleConnectionError)
            finally:
                nats_server.thaw()
            await next_event(events, Reconnected)
            await nc.publish("stale", b"alive")
            assert (await sub.next_msg(timeout=5)).data == b"alive"


async def test_on_demand_reconnect(core_server):
    async with connect(core_server.url, **FAST) as nc:
        with nc.events() as events:
            sub = await nc.subscribe("od")
            await nc.flush()
            await nc.reconnect()
            lost = await next_event(events, Disconnected)
            assert lost.error is None
            await next_event(events, Reconnected)
            await nc.publish("od", b"still here")
            assert (await sub.next_msg(timeout=5)).data == b"still here"
            assert nc.stats.reconnects == 1


async def test_retry_on_failed_initial_connect(nats_server_factory):
    server = nats_server_factory(jetstream=False)
    await trio.to_thread.run_sync(server.stop)
    async with connect(server.url, retry_on_failed_connect=True, **FAST) as nc:
        assert nc.status is not Status.CONNECTED
        sub = await nc.subscribe("late")  # sent when the connection comes up
        await nc.publish("late", b"queued before connecting")
        await trio.to_thread.run_sync(server.start)
        with trio.fail_after(15):
            await nc.wait_connected()
        assert (await sub.next_msg(timeout=5)).data == b"queued before connecting"


async def test_gives_up_after_max_reconnect_attempts(core_server):
    async with connect(core_server.url, max_reconnect_attempts=3, **FAST) as nc:
        with nc.events() as events:
            sub = await nc.subscribe("gone")
            await nc.flush()
            await trio.to_thread.run_sync(core_server.stop)
            closed = await next_event(events, Closed)
            assert isinstance(closed.error, ConnectionRefusedError | OSError)
            assert nc.is_closed
            error = await sub.wait_closed()
            assert isinstance(error, ConnectionClosedError)
            with pytest.raises(ConnectionClosedError):
                await nc.publish("gone", b"x")


async def test_no_reconnect_when_disabled(core_server):
    async with connect(core_server.url, allow_reconnect=False) as nc:
        with nc.events() as events:
            await trio.to_thread.run_sync(core_server.stop)
            await next_event(events, Closed)
            assert nc.is_closed


# -- clusters ---------------------------------------------------------------------------------


@pytest.mark.slow
async def test_cluster_failover_through_discovered_servers(nats_cluster, natspy):
    """Given only node 0, the client learns nodes 1 and 2 from INFO and fails over to them."""
    first = nats_cluster[0]
    async with connect(first.url, **FAST) as nc:
        with nc.events() as events:
            with trio.fail_after(10):
                while len(nc.servers) < 3:
                    await next_event(events, ServersDiscovered)
            ports = {s.port for s in nc.servers}
            assert ports == {node.port for node in nats_cluster.servers}
            sub = await nc.subscribe("cluster.>")
            await nc.flush()
            await trio.to_thread.run_sync(nats_cluster.kill_node, 0)
            await next_event(events, Disconnected)
            back = await next_event(events, Reconnected)
            assert back.server.port != first.port
            # A peer on the third node publishes; it reaches us through the cluster. Our
            # subscription, replayed on the node we reconnected to, reaches the others over
            # the routes in its own time: until it has, node 2 drops what has no interest.
            # So the peer publishes again until a message arrives.
            last = nats_cluster[2]
            nc_py = await natspy.connect(last.url)

            async def publish_once() -> None:
                await nc_py.publish("cluster.x", b"via node 2")
                await nc_py.flush()

            msg = None
            with trio.fail_after(10):
                while msg is None:
                    await natspy.call(publish_once)
                    with trio.move_on_after(0.2):
                        msg = await sub.next_msg()
            assert msg.data == b"via node 2"


@pytest.mark.slow
async def test_failover_to_discovered_servers_keeps_url_credentials():
    auth = user_password_auth()
    cluster = NatsCluster(size=3, jetstream=False, auth=auth.config)
    try:
        await trio.to_thread.run_sync(cluster.start)
        first = cluster[0]
        url = f"nats://{auth.user}:{auth.password}@127.0.0.1:{first.port}"
        async with connect(url, **FAST) as nc:
            with nc.events() as events:
                while len(nc.servers) < 3:
                    await next_event(events, ServersDiscovered)
                sub = await nc.subscribe("creds")
                await nc.flush()
                await trio.to_thread.run_sync(cluster.kill_node, 0)
                back = await next_event(events, Reconnected)
                assert back.server.port != first.port
                await nc.publish("creds", b"authenticated elsewhere")
                assert (await sub.next_msg(timeout=5)).data == b"authenticated elsewhere"
    finally:
        await trio.to_thread.run_sync(cluster.close)


@pytest.mark.slow
async def test_lame_duck_mode_is_reported_then_failover(nats_cluster):
    first = nats_cluster[0]
    others = [s.url for s in nats_cluster.servers[1:]]
    async with connect([first.url, *others], dont_randomize=True, **FAST) as nc:
        assert nc.connected_server is not None and nc.connected_server.port == first.port
        with nc.events() as events:
            sub = await nc.subscribe("ldm")
            await nc.flush()
            await trio.to_thread.run_sync(first.lame_duck)
            ldm = await next_event(events, LameDuck)
            assert ldm.server.port == first.port
            back = await next_event(events, Reconnected, timeout=40)
            assert back.server.port != first.port
            await nc.publish("ldm", b"moved")
            assert (await sub.next_msg(timeout=5)).data == b"moved"


# -- frames and behaviours a real server never shows -----------------------------------------

FAKE_INFO = (
    b'INFO {"server_id":"FAKE","version":"2.10.0","headers":true,'
    b'"max_payload":67108864,"proto":1}\r\n'
)

Session = Callable[[trio.SocketStream, int, bytes], Awaitable[None]]


async def serve_fake(nursery: trio.Nursery, session: Session) -> int:
    """A minimal server: INFO, PONG for the handshake PING, then ``session(stream, n, rest)``
    for the n-th connection, ``rest`` being what the client sent after its handshake PING."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    count = 0

    async def handle(stream: trio.SocketStream) -> None:
        nonlocal count
        n, count = count, count + 1
        await stream.send_all(FAKE_INFO)
        data = b""
        while b"PING\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            data += chunk
        await stream.send_all(b"PONG\r\n")
        await session(stream, n, data[data.index(b"PING\r\n") + 6 :])

    nursery.start_soon(trio.serve_listeners, handle, listeners)
    return int(listeners[0].socket.getsockname()[1])


async def read_until(stream: trio.SocketStream, data: bytes, marker: bytes) -> bytes | None:
    """Read until ``marker`` is in ``data``; ``None`` when the client closes first."""
    while marker not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return None
        data += chunk
    return data


def bad_frame_after_publish(frame: bytes) -> Session:
    """First connection: send ``frame`` once the client publishes; later ones: stay quiet."""

    async def session(stream: trio.SocketStream, n: int, rest: bytes) -> None:
        if n == 0:
            if await read_until(stream, rest, b"PUB ") is not None:
                await stream.send_all(frame)
            while await stream.receive_some(65536):
                pass
            return
        # Later connections answer PINGs, so that closing the client (a final flush) is quick.
        data = rest
        while (got := await read_until(stream, data, b"PING\r\n")) is not None:
            data = got.partition(b"PING\r\n")[2]
            await stream.send_all(b"PONG\r\n")

    return session


@pytest.mark.parametrize(
    ("frame", "error", "text"),
    [
        (b"MSG foo 1 notanumber\r\n", ProtocolError, "MSG size"),
        (b"-ERR 'Stale Connection'\r\n", StaleConnectionError, "stale"),
    ],
)
async def test_bad_frame_ends_session_and_reconnects(frame, error, text):
    async with trio.open_nursery() as nursery:
        port = await serve_fake(nursery, bad_frame_after_publish(frame))
        async with connect(f"nats://127.0.0.1:{port}", **FAST) as nc:
            with nc.events() as events:
                await nc.publish("provoke", b"")
                lost = await next_event(events, Disconnected)
                assert isinstance(lost.error, error)
                assert text in str(lost.error)
                await next_event(events, Reconnected)
        nursery.cancel_scope.cancel()


async def test_close_when_the_connection_dies_under_its_flush():
    async def drop_on_ping(stream: trio.SocketStream, n: int, rest: bytes) -> None:
        await read_until(stream, rest, b"PING\r\n")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        port = await serve_fake(nursery, drop_on_ping)
        with pytest.raises(KeyError):
            async with connect(f"nats://127.0.0.1:{port}", **FAST) as nc:
                await nc.publish("x", b"y")
                raise KeyError("the body's own error survives")
        assert nc.is_closed
        nursery.cancel_scope.cancel()


async def test_close_waits_for_bytes_the_writer_already_took():
    payload = b"x" * (8 * 1024 * 1024)
    received = trio.Event()
    total = 0

    async def slow_reader(stream: trio.SocketStream, n: int, rest: bytes) -> None:
        nonlocal total
        total = len(rest)
        tail = rest[-6:]
        while True:
            await trio.sleep(0.001)  # a slow peer: the client's send_all has to wait
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            total += len(chunk)
            tail = (tail + chunk)[-6:]
            if tail == b"PING\r\n":
                await stream.send_all(b"PONG\r\n")
        received.set()

    async with trio.open_nursery() as nursery:
        port = await serve_fake(nursery, slow_reader)
        async with connect(f"nats://127.0.0.1:{port}", connect_timeout=20) as nc:
            await nc.publish("big", payload)
            # The writer takes the bytes and blocks in send_all: the buffer is empty now.
            await trio.testing.wait_all_tasks_blocked()
            assert nc._out.size == 0
        with trio.fail_after(20):
            await received.wait()
        nursery.cancel_scope.cancel()
    assert total >= len(payload)


async def test_a_server_that_drops_us_at_once_is_dialled_with_backoff():
    dials: list[float] = []
    enough = trio.Event()

    async def drop(stream: trio.SocketStream, n: int, rest: bytes) -> None:
        dials.append(trio.current_time())
        if len(dials) >= 5:
            enough.set()
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        port = await serve_fake(nursery, drop)
        opts = {"reconnect_wait": 0.1, "reconnect_wait_max": 0.1, "reconnect_jitter": 0}
        async with connect(f"nats://127.0.0.1:{port}", **opts):
            with trio.fail_after(10):
                await enough.wait()
        nursery.cancel_scope.cancel()
    gaps = [b - a for a, b in itertools.pairwise(dials)]
    assert min(gaps) >= 0.09, gaps


async def test_subscription_drain_ends_even_if_the_connection_is_lost():
    async def drop_on_unsub(stream: trio.SocketStream, n: int, rest: bytes) -> None:
        data = rest
        while True:
            got = await read_until(stream, data, b"PING\r\n")
            if got is None:
                return
            before, _, data = got.partition(b"PING\r\n")
            if n == 0 and b"UNSUB" in before:
                await stream.aclose()
                return
            await stream.send_all(b"PONG\r\n")

    async with trio.open_nursery() as nursery:
        port = await serve_fake(nursery, drop_on_unsub)
        async with connect(f"nats://127.0.0.1:{port}", **FAST) as nc:
            sub = await nc.subscribe("d")
            await nc.flush()
            with trio.fail_after(10):
                await sub.drain(timeout=5)
            assert sub.is_closed and sub not in nc.subscriptions
        nursery.cancel_scope.cancel()


async def test_unresolvable_host_is_just_a_failed_attempt(core_server):
    async with connect(["nats://a..b:4222", core_server.url], dont_randomize=True) as nc:
        assert nc.is_connected


async def test_publisher_waiting_for_room_learns_of_the_close(nats_server_factory):
    server = nats_server_factory(jetstream=False)
    async with connect(server.url, write_buffer_size=1024, connect_timeout=0.5) as nc:
        assert server.pid is not None
        server.freeze()  # nothing is read: the socket fills up
        try:
            outcome: list[BaseException] = []

            async def publisher() -> None:
                try:
                    while True:
                        await nc.publish("fill", b"x" * 60_000)
                except ConnectionClosedError as exc:
                    outcome.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(publisher)
                await trio.testing.wait_all_tasks_blocked()
                await nc.close()
            assert len(outcome) == 1
        finally:
            server.thaw()
