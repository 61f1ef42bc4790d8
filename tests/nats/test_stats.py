"""``nc.stats`` against the server's own count of the connection (``/connz``).

``in_bytes`` / ``out_bytes`` count message bytes (header block plus payload), as nats-server's
monitoring, nats.go and nats.py do: they used to count socket bytes, 801 in for one 11-byte
message. What crossed the socket is ``in_wire_bytes`` / ``out_wire_bytes``. The server's
counts are the reference: its ``in_*`` are what we sent, its ``out_*`` what we received.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import trio
from headrace.jetstream import AckPolicy, ConsumerConfig, JetStream, StreamConfig, ack_all
from headrace.nats import Connection, connect
from headrace.protocol import Headers

from tests.servers import free_port

NAME = "stats-probe"


async def connz(port: int) -> dict[str, Any]:
    """This test's connection as the server's monitoring endpoint reports it."""

    def get() -> dict[str, Any]:
        url = f"http://127.0.0.1:{port}/connz?subs=0"
        with urllib.request.urlopen(url, timeout=5) as response:
            return dict(json.load(response))

    report = await trio.to_thread.run_sync(get)
    (conn,) = [c for c in report["connections"] if c.get("name") == NAME]
    return conn


async def assert_matches_server(nc: Connection, port: int) -> None:
    await nc.flush()  # everything we sent was counted; what it sent us before the PONG, read
    server = await connz(port)
    stats = nc.stats
    assert (stats.out_msgs, stats.out_bytes) == (server["in_msgs"], server["in_bytes"])
    assert (stats.in_msgs, stats.in_bytes) == (server["out_msgs"], server["out_bytes"])


async def test_one_small_message_counts_its_eleven_bytes(nats_server_factory):
    port = free_port()
    server = nats_server_factory(jetstream=False, extra_config=f"http: 127.0.0.1:{port}")
    async with connect(server.url, name=NAME) as nc:
        sub = await nc.subscribe("t.x")
        await nc.publish("t.x", b"hello world")
        with trio.fail_after(5):
            await sub.next_msg()
        await assert_matches_server(nc, port)
        stats = nc.stats
        assert (stats.in_msgs, stats.in_bytes, stats.out_msgs, stats.out_bytes) == (1, 11, 1, 11)
        # The socket carried the INFO, the message's protocol line, PONGs, ...: much more.
        assert stats.in_wire_bytes > 11 + len("MSG t.x 1 11\r\n\r\n")
        assert stats.out_wire_bytes > 11 + len("PUB t.x 11\r\n\r\n")


async def test_headers_pull_requests_and_acks_count_as_the_server_counts(nats_server_factory):
    port = free_port()
    server = nats_server_factory(extra_config=f"http: 127.0.0.1:{port}")
    async with connect(server.url, name=NAME) as nc:
        sub = await nc.subscribe("t.>")
        headers = Headers([("Trace", "a"), ("Trace", "b")])
        for i in range(5):
            await nc.publish(f"t.{i}", b"x" * (i * 10), headers=headers if i % 2 else None)
        with trio.fail_after(5):
            for _ in range(5):
                await sub.next_msg()
        await assert_matches_server(nc, port)
        # JetStream: API requests and their replies, pull requests (publish_nowait), messages
        # with headers, and acks written as one batch (write_nowait).
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        for i in range(6):
            await js.publish("s.x", b"p" * i, headers={"K": str(i)})
        await js.create_consumer(
            "S", ConsumerConfig(durable_name="C", ack_policy=AckPolicy.EXPLICIT)
        )
        consumer = await js.pull_consumer("S", "C")
        batch = await consumer.fetch(6, expires=2)
        assert len(batch) == 6
        assert ack_all(batch) == 6
        await assert_matches_server(nc, port)
        assert nc.stats.in_wire_bytes > nc.stats.in_bytes
        assert nc.stats.out_wire_bytes > nc.stats.out_bytes
