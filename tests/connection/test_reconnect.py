"""Keeping the connection alive: server restarts, stale connections, lame duck mode, cluster
failover with discovered servers, the reconnect buffer, and malformed frames. Real servers
throughout; a fake server only for frames a real server never sends."""

from __future__ import annotations

import os
import signal
from typing import TypeVar

import pytest
import trio
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
    EventWatcher,
    LameDuck,
    Reconnected,
    ServersDiscovered,
    Status,
    connect,
)

E = TypeVar("E")

FAST = {"reconnect_wait": 0.05, "reconnect_wait_max": 0.2, "connect_timeout": 2}


async def next_event(watcher: EventWatcher, kind: type[E], timeout: float = 15) -> E:
    """The next event of ``kind`` (earlier events of other kinds are skipped)."""
    with trio.fail_after(timeout):
        while True:
            event = await watcher.receive()
            if isinstance(event, kind):
                return event


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
            os.kill(nats_server.pid, signal.SIGSTOP)
            try:
                lost = await next_event(events, Disconnected, timeout=10)
                assert isinstance(lost.error, StaleConnectionError)
            finally:
                os.kill(nats_server.pid, signal.SIGCONT)
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
            # A peer on the third node publishes; it reaches us through the cluster.
            last = nats_cluster[2]
            nc_py = await natspy.connect(last.url)

            async def publish_until_seen() -> None:
                await nc_py.publish("cluster.x", b"via node 2")
                await nc_py.flush()

            await natspy.call(publish_until_seen)
            msg = await sub.next_msg(timeout=10)
            assert msg.data == b"via node 2"


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


# -- frames a real server never sends ---------------------------------------------------------


async def _fake_server(
    nursery: trio.Nursery, after_handshake: list[bytes], connections: list[int]
) -> int:
    """A minimal server: INFO, then PONG for the handshake PING; on the n-th connection,
    ``after_handshake[n]`` once the client has published something (so that it arrives in the
    session, not in the handshake)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")

    async def handle(stream: trio.SocketStream) -> None:
        n = len(connections)
        connections.append(n)
        await stream.send_all(b'INFO {"server_id":"FAKE","version":"2.10.0","headers":true,'
                              b'"max_payload":1048576,"proto":1}\r\n')
        data = b""
        while b"PING\r\n" not in data:
            chunk = await stream.receive_some(4096)
            if not chunk:
                return
            data += chunk
        await stream.send_all(b"PONG\r\n")
        if n < len(after_handshake):
            data = data[data.index(b"PING\r\n") + 6 :]
            while b"PUB " not in data:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    return
                data += chunk
            await stream.send_all(after_handshake[n])
        while await stream.receive_some(4096):
            pass

    nursery.start_soon(trio.serve_listeners, handle, listeners)
    return int(listeners[0].socket.getsockname()[1])


async def test_malformed_frame_ends_session_and_reconnects():
    connections: list[int] = []
    async with trio.open_nursery() as nursery:
        port = await _fake_server(nursery, [b"MSG foo 1 notanumber\r\n"], connections)
        async with connect(f"nats://127.0.0.1:{port}", **FAST) as nc:
            with nc.events() as events:
                await nc.publish("provoke", b"")
                lost = await next_event(events, Disconnected)
                assert isinstance(lost.error, ProtocolError)
                assert "MSG size" in str(lost.error)
                await next_event(events, Reconnected)
                assert len(connections) == 2
        nursery.cancel_scope.cancel()


async def test_server_stale_connection_error_ends_session():
    connections: list[int] = []
    async with trio.open_nursery() as nursery:
        port = await _fake_server(nursery, [b"-ERR 'Stale Connection'\r\n"], connections)
        async with connect(f"nats://127.0.0.1:{port}", **FAST) as nc:
            with nc.events() as events:
                await nc.publish("provoke", b"")
                lost = await next_event(events, Disconnected)
                assert isinstance(lost.error, StaleConnectionError)
                await next_event(events, Reconnected)
        nursery.cancel_scope.cancel()
