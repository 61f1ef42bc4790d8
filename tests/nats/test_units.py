"""The socket-free parts of the connection layer: URLs and the server pool, backoff, auth
signing, -ERR classification, the delivery queue and the outbound buffer's PING accounting."""

from __future__ import annotations

import base64
import random

import nkeys
import pytest
import trio
import trio.testing
from headrace.errors import (
    AuthorizationError,
    ConnectionLostError,
    OutboundBufferFull,
    PermissionViolation,
    ServerError,
    StaleConnectionError,
)
from headrace.nats.auth import Credentials, auth_fields, read_creds_file, sign_nonce
from headrace.nats.delivery import DeliveryQueue, SlowConsumerPolicy
from headrace.nats.outbound import OutboundBuffer, PongWaiter
from headrace.nats.servers import ServerAddress, ServerPool, backoff_delay
from headrace.protocol import server_errors
from headrace.protocol.events import Msg

from tests.servers import format_creds, new_nkey

# -- server addresses and the pool ------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("nats://h:1234", ServerAddress("h", 1234)),
        ("h", ServerAddress("h", 4222)),
        ("h:5", ServerAddress("h", 5)),
        ("tls://h", ServerAddress("h", 4222, tls=True)),
        ("nats://u:p%40ss@h", ServerAddress("h", 4222, user="u", password="p@ss")),
        ("nats://tok@h:1", ServerAddress("h", 1, token="tok")),
        ("nats://[::1]:4223", ServerAddress("::1", 4223)),
    ],
)
def test_server_address_parse(url, expected):
    assert ServerAddress.parse(url) == expected


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "non-empty"),
        ("ws://h", "websocket"),
        ("http://h", "unknown scheme"),
        ("nats://h:notaport", "invalid port"),
        ("nats://h/path", "no path"),
    ],
)
def test_server_address_rejects(url, message):
    with pytest.raises(ValueError, match=message):
        ServerAddress.parse(url)


def test_server_address_str_hides_credentials():
    assert str(ServerAddress.parse("nats://u:secret@h:1")) == "nats://h:1"
    assert str(ServerAddress.parse("tls://[::1]:2")) == "tls://[::1]:2"


def test_pool_rotation_order_and_dedup():
    pool = ServerPool(["a:1", "b:2", "a:1", "c:3"], randomize=False)
    assert [e.address.host for e in pool.entries] == ["a", "b", "c"]
    assert [pool.next().address.host for _ in range(4)] == ["a", "b", "c", "a"]


def test_pool_randomizes_unless_told_not_to():
    urls = [f"h{i}:1" for i in range(20)]
    shuffled = ServerPool(urls, rng=random.Random(1))
    assert [e.address.host for e in shuffled.entries] != [f"h{i}" for i in range(20)]
    kept = ServerPool(urls, randomize=False)
    assert [e.address.host for e in kept.entries] == [f"h{i}" for i in range(20)]


def test_pool_discovery_inherits_scheme_credentials_and_tls_name():
    pool = ServerPool(["tls://u:p@nats.example.com:1"], randomize=False)
    source = pool.next()
    added = pool.add_discovered(
        ["nats.example.com:1", "10.0.0.2:2", "10.0.0.3:3", "10.0.0.2:2"], source=source
    )
    assert [a.hostport for a in added] == ["10.0.0.2:2", "10.0.0.3:3"]
    assert all(a.tls and a.user == "u" and a.password == "p" for a in added)
    assert [e.discovered for e in pool.entries] == [False, True, True]
    assert {e.tls_name for e in pool.entries if e.discovered} == {"nats.example.com"}
    ignoring = ServerPool(["a:1"], use_discovered=False)
    assert ignoring.add_discovered(["b:2"], source=ignoring.next()) == []
    assert len(ignoring) == 1
    pool.replace(["z:9"])
    assert [e.address.host for e in pool.entries] == ["z"]
    with pytest.raises(ValueError):
        pool.replace([])


def test_pool_tries_others_before_the_server_just_lost():
    pool = ServerPool(["a:1"], randomize=False)
    current = pool.next()
    pool.add_discovered(["b:2", "c:3"], source=current)
    pool.demote(current)
    assert [pool.next().address.host for _ in range(3)] == ["b", "c", "a"]


def test_backoff_is_exponential_capped_and_jittered():
    exact = [backoff_delay(n, initial=0.1, maximum=1.0, jitter=0) for n in range(1, 7)]
    assert exact == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    rng = random.Random(7)
    spread = {backoff_delay(3, initial=0.1, maximum=1.0, jitter=0.25, rng=rng) for _ in range(50)}
    assert len(spread) > 10 and all(0.3 <= d <= 0.5 for d in spread)
    assert backoff_delay(10**6, initial=0.1, maximum=2.0, jitter=0) == 2.0
    assert backoff_delay(3, initial=0.1, maximum=1.0, jitter=0, custom=lambda n: n * 10) == 30


# -- auth -------------------------------------------------------------------------------------


def test_sign_nonce_verifies_with_the_public_key():
    kp = new_nkey(nkeys.PREFIX_BYTE_USER)
    public, sig = sign_nonce(bytes(kp.seed), "abc-nonce")
    assert public == kp.public_key.decode()
    raw = base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4))
    assert kp.verify(b"abc-nonce", raw)


def test_creds_file_parsing(tmp_path):
    path = tmp_path / "u.creds"
    path.write_text(format_creds("eyJhbGciOi.payload.sig", "SUAEXAMPLE"))
    assert read_creds_file(path) == ("eyJhbGciOi.payload.sig", b"SUAEXAMPLE")


def test_auth_field_precedence():
    address = ServerAddress.parse("nats://h")
    assert auth_fields(Credentials(user="u", password="p"), address, None) == {
        "user": "u",
        "pass": "p",
    }
    assert auth_fields(Credentials(token="t"), address, None) == {"auth_token": "t"}
    url = ServerAddress.parse("nats://a:b@h")
    assert auth_fields(Credentials(user="u", password="p"), url, None) == {
        "user": "a",
        "pass": "b",
    }
    with pytest.raises(AuthorizationError, match="no nonce"):
        auth_fields(Credentials(nkey_seed="SUAXXX"), address, None)


# -- -ERR classification ----------------------------------------------------------------------


def test_classify_server_errors():
    sub = server_errors.classify('Permissions Violation for Subscription to "a.b" using queue "q"')
    assert isinstance(sub, PermissionViolation)
    assert (sub.operation, sub.subject, sub.queue) == ("subscription", "a.b", "q")
    pub = server_errors.classify("Permissions Violation for Publish to a.c")
    assert isinstance(pub, PermissionViolation) and (pub.operation, pub.subject) == (
        "publish",
        "a.c",
    )
    assert not server_errors.is_terminal(pub)
    auth = server_errors.classify("Authorization Violation")
    assert isinstance(auth, AuthorizationError) and server_errors.is_terminal(auth)
    assert isinstance(server_errors.classify("User Authentication Expired"), AuthorizationError)
    stale = server_errors.classify("Stale Connection")
    assert isinstance(stale, StaleConnectionError) and server_errors.is_terminal(stale)
    payload = server_errors.classify("Maximum Payload Violation")
    assert type(payload) is ServerError and server_errors.is_terminal(payload)
    reply = server_errors.classify('Permissions Violation for Publish with Reply of "_INBOX.x.1"')
    assert isinstance(reply, PermissionViolation)
    assert (reply.operation, reply.subject) == ("reply", "_INBOX.x.1")
    subs = server_errors.classify("maximum subscriptions exceeded")
    assert type(subs) is ServerError and not server_errors.is_terminal(subs)


# -- delivery queue ---------------------------------------------------------------------------


def msgs(n: int, size: int = 1) -> list[Msg]:
    return [Msg("s", 1, None, b"x" * size) for _ in range(n)]


async def test_delivery_queue_drop_policy_keeps_what_fits():
    q = DeliveryQueue(max_msgs=5, max_bytes=1000, policy=SlowConsumerPolicy.DROP)
    assert q.put_nowait(msgs(3)) == 0
    assert q.put_nowait(msgs(4)) == 2
    assert (q.pending_msgs, q.dropped) == (5, 2)
    byte_bound = DeliveryQueue(max_msgs=100, max_bytes=25, policy=SlowConsumerPolicy.DROP)
    assert byte_bound.put_nowait(msgs(4, size=10)) == 2
    assert byte_bound.pending_bytes == 20


async def test_delivery_queue_backpressure_waits_for_room():
    q = DeliveryQueue(max_msgs=2, max_bytes=1000, policy=SlowConsumerPolicy.BACKPRESSURE)
    q.put_all(msgs(2))
    done = trio.Event()

    async def producer() -> None:
        await q.wait_room()
        q.put_all(msgs(1))
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set()  # full: the producer waits
        await q.get()
        with trio.fail_after(1):
            await done.wait()
    assert q.pending_msgs == 2


async def test_delivery_queue_close_drains_then_ends_or_raises():
    q = DeliveryQueue(10, 1000, SlowConsumerPolicy.DROP)
    q.put_nowait(msgs(2))
    q.close()
    assert len(await q.get_batch()) == 2
    with pytest.raises(trio.EndOfChannel):
        await q.get()
    failing = DeliveryQueue(10, 1000, SlowConsumerPolicy.DROP)
    failing.put_nowait(msgs(1))
    failing.close(ValueError("why"))
    await failing.get()
    with pytest.raises(ValueError, match="why"):
        await failing.get()


# -- outbound buffer --------------------------------------------------------------------------


async def test_outbound_one_ping_answers_every_waiting_flush():
    out = OutboundBuffer(high_water=100, reconnect_buffer=100)
    out.set_connected(True)
    waiters = [PongWaiter() for _ in range(3)]
    out.append(b"PUB a 0\r\n\r\n")
    for w in waiters:
        out.request_ping(w)
    data = out.take()
    assert data.endswith(b"PING\r\n") and data.count(b"PING") == 1
    out.pong()
    for w in waiters:
        with trio.fail_after(1):
            await w.wait()


async def test_outbound_lost_connection_fails_unconfirmed_flushes():
    out = OutboundBuffer(100, 100)
    out.set_connected(True)
    w = PongWaiter()
    out.append(b"data")
    out.request_ping(w)
    out.take()  # written, never confirmed
    out.set_connected(False)
    with pytest.raises(ConnectionLostError):
        await w.wait()


async def test_outbound_flush_while_disconnected_is_rearmed():
    out = OutboundBuffer(100, 100)
    out.set_connected(True)
    out.set_connected(False)
    w = PongWaiter()
    out.request_ping(w)
    out.set_connected(True)
    assert out.take() == b"PING\r\n"
    out.pong()
    await w.wait()


async def test_outbound_reconnect_buffer_bound():
    out = OutboundBuffer(high_water=10, reconnect_buffer=10)
    await out.put(b"12345")
    await out.put(b"12345")
    with pytest.raises(OutboundBufferFull):
        await out.put(b"1")
    assert out.size == 10
