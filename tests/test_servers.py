"""Tests of the nats-server fixtures themselves, checked with nats-py (asyncio).

nats-py needs asyncio, so these are plain sync tests calling ``asyncio.run``,
except one trio test that runs nats-py in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
import pytest
import trio
from nats.aio.client import Client
from nats.js.api import StorageType

from tests.natspy_peer import once_placed_natspy
from tests.servers import (
    CLUSTER_TIMEOUT,
    LDM_LINE,
    META_LEADER_OTHER_RE,
    META_LEADER_SELF_LINE,
    READY_LINE,
    NatsCluster,
    NatsServer,
    ServerError,
    TLSFiles,
    decode_jwt_claims,
    nkey_auth,
    operator_auth,
    permissions_auth,
    token_auth,
    user_password_auth,
)

T = TypeVar("T")
TIMEOUT = 15.0


def run(fn: Callable[[], Awaitable[T]], timeout: float = TIMEOUT) -> T:
    """Run an asyncio coroutine function to completion with an overall timeout."""

    async def main() -> T:
        return await asyncio.wait_for(fn(), timeout)

    return asyncio.run(main())


async def _quiet_error_cb(e: Exception) -> None:
    pass


async def connect(url: str | list[str], **kwargs: Any) -> Client:
    kwargs.setdefault("error_cb", _quiet_error_cb)
    kwargs.setdefault("connect_timeout", 2)
    return await nats.connect(url, **kwargs)


async def connect_fails(url: str, **kwargs: Any) -> BaseException:
    """Connect with reconnects off; return the exception nats-py raised."""
    try:
        nc = await connect(url, allow_reconnect=False, **kwargs)
    except Exception as e:
        return e
    await nc.close()
    raise AssertionError("connect unexpectedly succeeded")


def assert_auth_error(exc: BaseException) -> None:
    """nats-py raises AuthorizationError, or a plain nats Error carrying the server's -ERR."""
    assert isinstance(exc, nats.errors.Error), repr(exc)
    assert isinstance(exc, nats.errors.AuthorizationError) or (
        "Authorization Violation" in str(exc)
    ), repr(exc)


async def roundtrip(nc: Client, subject: str = "fixture.check") -> None:
    sub = await nc.subscribe(subject)
    await nc.publish(subject, b"hello")
    msg = await sub.next_msg(timeout=5)
    assert msg.data == b"hello"
    await sub.unsubscribe()


# --------------------------------------------------------------------------
# single node
# --------------------------------------------------------------------------


async def test_single_node_pubsub_from_trio(nats_server: NatsServer) -> None:
    """Trio test: nats-py runs under asyncio.run in a worker thread."""

    async def check() -> bytes:
        nc = await connect(nats_server.url)
        try:
            sub = await nc.subscribe("greet.*")
            await nc.publish("greet.trio", b"hi from asyncio")
            msg = await sub.next_msg(timeout=5)
            assert msg.subject == "greet.trio"
            return msg.data
        finally:
            await nc.close()

    with trio.fail_after(TIMEOUT):
        data = await trio.to_thread.run_sync(run, check)
    assert data == b"hi from asyncio"


def test_server_attributes(nats_server: NatsServer) -> None:
    assert nats_server.is_running
    assert nats_server.url == f"nats://127.0.0.1:{nats_server.port}"
    assert nats_server.host == "127.0.0.1"
    assert nats_server.config_path.is_file()
    assert str(nats_server.store_dir) in nats_server.config_path.read_text()
    assert READY_LINE in nats_server.log
    assert nats_server.server_id is not None and nats_server.server_id.startswith("N")


def test_jetstream_account_info(nats_server: NatsServer) -> None:
    async def check() -> None:
        nc = await connect(nats_server.url)
        try:
            info = await nc.jetstream().account_info()
            assert info.limits is not None
            assert info.streams == 0
        finally:
            await nc.close()

    run(check)


def test_restart_keeps_file_stream(nats_server: NatsServer) -> None:
    port, store = nats_server.port, nats_server.store_dir

    async def write() -> None:
        nc = await connect(nats_server.url)
        js = nc.jetstream()
        await js.add_stream(name="KEEP", subjects=["keep.>"], storage=StorageType.FILE)
        for i in range(3):
            await js.publish(f"keep.{i}", f"m{i}".encode())
        await nc.close()

    async def read() -> None:
        nc = await connect(nats_server.url)
        js = nc.jetstream()
        info = await js.stream_info("KEEP")
        assert info.state.messages == 3
        msg = await js.get_msg("KEEP", seq=2)
        assert msg.data == b"m1"
        await nc.close()

    run(write)
    old_pid = nats_server.pid
    nats_server.restart()
    assert nats_server.pid != old_pid
    assert (nats_server.port, nats_server.store_dir) == (port, store)
    run(read)
    # a hard kill keeps it too (messages were synced on the graceful stop above)
    nats_server.restart(kill=True)
    run(read)


def test_max_payload_and_extra_config(nats_server_factory: Callable[..., NatsServer]) -> None:
    server = nats_server_factory(jetstream=False, max_payload=4096, extra_config="max_pending: 1MB")

    async def check() -> None:
        nc = await connect(server.url)
        assert nc.max_payload == 4096
        assert "jetstream" not in nc._server_info or not nc._server_info["jetstream"]
        await nc.close()

    run(check)
    assert "max_pending: 1MB" in server.config_path.read_text()


def test_bad_config_raises_with_log() -> None:
    server = NatsServer(extra_config="this is { not valid")
    try:
        with pytest.raises(ServerError, match="exited before it was ready") as info:
            server.start()
        assert "nats-server" in str(info.value)
        assert not server.is_running
    finally:
        server.close()


def test_context_manager_cleans_up() -> None:
    with NatsServer(jetstream=False) as server:
        proc = server._proc
        assert proc is not None and proc.poll() is None
        directory = server.directory
    assert proc.poll() is not None
    assert not directory.exists()


# --------------------------------------------------------------------------
# auth
# --------------------------------------------------------------------------


def test_user_password(nats_server_factory: Callable[..., NatsServer]) -> None:
    auth = user_password_auth()
    server = nats_server_factory(auth=auth.config, jetstream=False)

    async def check() -> None:
        nc = await connect(server.url, user=auth.user, password=auth.password)
        await roundtrip(nc)
        await nc.close()
        assert_auth_error(await connect_fails(server.url, user=auth.user, password="wrong"))
        assert_auth_error(await connect_fails(server.url))

    run(check)


def test_token(nats_server_factory: Callable[..., NatsServer]) -> None:
    auth = token_auth()
    server = nats_server_factory(auth=auth.config, jetstream=False)

    async def check() -> None:
        nc = await connect(server.url, token=auth.token)
        await roundtrip(nc)
        await nc.close()
        assert_auth_error(await connect_fails(server.url, token="not-the-token"))

    run(check)


def test_nkey(nats_server_factory: Callable[..., NatsServer]) -> None:
    auth = nkey_auth()
    other = nkey_auth()
    assert auth.public_key.startswith("U") and auth.seed.startswith("SU")
    server = nats_server_factory(auth=auth.config, jetstream=False)

    async def check() -> None:
        nc = await connect(server.url, nkeys_seed_str=auth.seed)
        await roundtrip(nc)
        await nc.close()
        assert_auth_error(await connect_fails(server.url, nkeys_seed_str=other.seed))

    run(check)


def test_permissions_violation(nats_server_factory: Callable[..., NatsServer]) -> None:
    auth = permissions_auth()
    server = nats_server_factory(auth=auth.config, jetstream=False)

    async def check() -> None:
        errors: asyncio.Queue[Exception] = asyncio.Queue()

        async def error_cb(e: Exception) -> None:
            errors.put_nowait(e)

        nc = await connect(server.url, user=auth.user, password=auth.password, error_cb=error_cb)
        try:
            await roundtrip(nc, "allowed.ok")
            await nc.publish("denied.pub", b"x")
            await nc.flush()
            err = await asyncio.wait_for(errors.get(), 5)
            assert "permissions violation for publish" in str(err).lower()
            assert "denied.pub" in str(err)

            await nc.subscribe("denied.sub")
            await nc.flush()
            err = await asyncio.wait_for(errors.get(), 5)
            assert "permissions violation for subscription" in str(err).lower()
            assert "denied.sub" in str(err)
            # the connection survives permission errors
            await roundtrip(nc, "allowed.again")
        finally:
            await nc.close()

    run(check)
    server.wait_for_log('Publish Violation - Subject "denied.pub"', 5)
    server.wait_for_log('Subscription Violation - Subject "denied.sub"', 5)


def test_operator_jwt_creds(nats_server_factory: Callable[..., NatsServer], tmp_path: Any) -> None:
    auth = operator_auth(tmp_path / "jwt")
    text = auth.creds_file.read_text()
    assert "-----BEGIN NATS USER JWT-----" in text and "------END USER NKEY SEED------" in text
    claims = decode_jwt_claims(auth.user_jwt)
    assert claims["iss"] == auth.account_public_key
    assert claims["nats"] == {**claims["nats"], "type": "user", "version": 2}
    server = nats_server_factory(auth=auth.config)

    async def check() -> None:
        nc = await connect(server.url, user_credentials=str(auth.creds_file))
        try:
            await roundtrip(nc)
            info = await nc.jetstream().account_info()
            assert info.streams == 0
        finally:
            await nc.close()
        err = await connect_fails(server.url, user_credentials=str(auth.unknown_creds_file))
        assert_auth_error(err)

    run(check)


# --------------------------------------------------------------------------
# TLS
# --------------------------------------------------------------------------


def test_tls(nats_server_factory: Callable[..., NatsServer], tls_files: TLSFiles) -> None:
    server = nats_server_factory(tls=tls_files, jetstream=False)
    assert server.url.startswith("tls://127.0.0.1:")

    async def check() -> None:
        nc = await connect(server.url, tls=tls_files.client_context(client_cert=False))
        await roundtrip(nc)
        await nc.close()
        err = await connect_fails(server.url, tls=tls_files.client_context(wrong_ca=True))
        assert isinstance(err, ssl.SSLCertVerificationError), repr(err)

    run(check)


def test_tls_verify_requires_client_cert(
    nats_server_factory: Callable[..., NatsServer], tls_files: TLSFiles
) -> None:
    server = nats_server_factory(tls=tls_files, tls_verify=True, jetstream=False)

    async def check() -> None:
        nc = await connect(server.url, tls=tls_files.client_context())
        await roundtrip(nc)
        await nc.close()
        err = await connect_fails(server.url, tls=tls_files.client_context(client_cert=False))
        # TLS 1.3: "certificate required" alert (ssl.SSLError), or EOF if it races the read
        assert isinstance(err, (ssl.SSLError, ConnectionError, nats.errors.Error)), repr(err)

    run(check)


def test_tls_handshake_first(
    nats_server_factory: Callable[..., NatsServer], tls_files: TLSFiles
) -> None:
    server = nats_server_factory(tls=tls_files, tls_handshake_first=True, jetstream=False)
    assert "handshake_first: true" in server.config_path.read_text()
    if "tls_handshake_first" not in inspect.signature(Client.connect).parameters:
        pytest.skip("nats-py has no tls_handshake_first")

    async def check() -> None:
        nc = await connect(server.url, tls=tls_files.client_context(), tls_handshake_first=True)
        await roundtrip(nc)
        await nc.close()

    run(check)


# --------------------------------------------------------------------------
# lame duck
# --------------------------------------------------------------------------


def test_lame_duck(nats_server_factory: Callable[..., NatsServer]) -> None:
    """SIGUSR2: clients get INFO ldm=true at once, are closed after the grace period
    (500 ms by default here), and the process then exits on its own."""
    server = nats_server_factory(jetstream=False)

    async def check() -> None:
        ldm = asyncio.Event()
        disconnected = asyncio.Event()

        async def on_ldm() -> None:
            ldm.set()

        async def on_disconnect() -> None:
            disconnected.set()

        nc = await connect(
            server.url,
            lame_duck_mode_cb=on_ldm,
            disconnected_cb=on_disconnect,
            allow_reconnect=False,
        )
        try:
            await roundtrip(nc)
            await asyncio.to_thread(server.lame_duck)
            await asyncio.wait_for(ldm.wait(), 5)
            assert not disconnected.is_set()
            await asyncio.wait_for(disconnected.wait(), 10)
        finally:
            await nc.close()

    run(check)
    assert server.wait_exited(10) == 0
    assert not server.is_running
    assert LDM_LINE in server.log
    assert 'Trapped "user defined signal 2" signal' in server.log


def test_stop_during_lame_duck(nats_server_factory: Callable[..., NatsServer]) -> None:
    """SIGTERM in lame duck mode still shuts down (after the grace period)."""
    server = nats_server_factory(jetstream=False, lame_duck_grace_period="200ms")

    async def check() -> None:
        nc = await connect(server.url, allow_reconnect=False)
        try:
            await asyncio.to_thread(server.lame_duck)
            started = time.monotonic()
            await asyncio.to_thread(server.stop)
            assert time.monotonic() - started < 5
        finally:
            await nc.close()

    run(check)
    assert not server.is_running


# --------------------------------------------------------------------------
# cluster
# --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_cluster_node_that_loses_the_race_for_its_route_port_starts_again_elsewhere() -> None:
    """Another process listens on node n1's route port before the cluster starts (what a
    concurrent test did in CI, between ``free_port`` and the node's listen): the start moves
    the cluster to new ports instead of waiting for a meta leader that cannot come."""
    cluster = NatsCluster(size=3)
    taken = cluster[1].cluster_port
    assert taken is not None
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        try:
            started = time.monotonic()
            cluster.start()
            assert time.monotonic() - started < CLUSTER_TIMEOUT  # not a timed-out wait
            assert cluster[1].cluster_port != taken
            assert cluster.meta_leader() is not None
            assert all(s.is_running for s in cluster.servers)
        finally:
            cluster.close()


@pytest.mark.slow
def test_cluster_routing_and_connect_urls(nats_cluster: NatsCluster) -> None:
    assert len(nats_cluster.urls) == 3
    assert len({s.server_name for s in nats_cluster.servers}) == 3
    leader = nats_cluster.meta_leader()
    assert leader in {"n0", "n1", "n2"}
    assert any(META_LEADER_SELF_LINE in s.log for s in nats_cluster.servers)
    assert any(META_LEADER_OTHER_RE.search(s.log) for s in nats_cluster.servers)

    async def check() -> None:
        nc0 = await connect(nats_cluster.urls[0], dont_randomize=True, allow_reconnect=False)
        nc2 = await connect(nats_cluster.urls[2], dont_randomize=True, allow_reconnect=False)
        try:
            assert nc0.connected_url is not None
            assert nc0.connected_url.port == nats_cluster[0].port
            connect_urls = set(nc0._server_info.get("connect_urls", []))
            others = {f"127.0.0.1:{s.port}" for s in nats_cluster.servers[1:]}
            assert others <= connect_urls, connect_urls
            discovered = {u.netloc for u in nc0.discovered_servers}
            assert others <= discovered

            sub = await nc0.subscribe("cluster.hop")
            await nc0.flush()
            # Interest reaches n2 over the route asynchronously: publish until delivered.
            while True:
                await nc2.publish("cluster.hop", b"from n2")
                await nc2.flush()
                with contextlib.suppress(nats.errors.TimeoutError):
                    msg = await sub.next_msg(timeout=0.2)
                    break
            assert msg.data == b"from n2"

            js = nc2.jetstream()
            await once_placed_natspy(
                lambda: js.add_stream(name="R3", subjects=["r3.>"], num_replicas=3)
            )
            # The stream's subjects reach the other nodes asynchronously too: retry the first
            # publish (its message id keeps a stored retry from counting twice).
            while True:
                try:
                    ack = await js.publish(
                        "r3.x", b"replicated", headers={"Nats-Msg-Id": "r3-first"}
                    )
                    break
                # nats-py's JetStream publish says "no responders" as NoStreamResponseError.
                except (
                    nats.errors.NoRespondersError,
                    nats.errors.TimeoutError,
                    nats.js.errors.NoStreamResponseError,
                ):
                    await asyncio.sleep(0.05)  # retry pacing, not a wait
            assert ack.seq == 1
            info = await nc0.jetstream().stream_info("R3")
            assert info.cluster is not None
            assert len(info.cluster.replicas or []) == 2
        finally:
            await nc0.close()
            await nc2.close()

    run(check)


@pytest.mark.slow
def test_cluster_restart_node(nats_cluster: NatsCluster) -> None:
    leader = nats_cluster.meta_leader()
    index = next(i for i, s in enumerate(nats_cluster.servers) if s.server_name != leader)
    node = nats_cluster.kill_node(index)
    assert not node.is_running
    assert len(nats_cluster.running) == 2
    old_id = node.server_id
    nats_cluster.restart_node(index)
    assert node.is_running and node.server_id != old_id
    assert nats_cluster.meta_leader() == leader

    async def check() -> None:
        nc = await connect(node.url)
        await roundtrip(nc)
        await nc.close()

    run(check)


@pytest.mark.slow
def test_cluster_meta_leader_failover(nats_cluster: NatsCluster) -> None:
    """Killing the meta leader right after the fixture returns must still elect a new one."""
    leader = nats_cluster.meta_leader()
    index = next(i for i, s in enumerate(nats_cluster.servers) if s.server_name == leader)
    nats_cluster.kill_node(index)
    new_leader = nats_cluster.wait_jetstream_ready()
    assert new_leader != leader
    nats_cluster.restart_node(index)
    assert nats_cluster.meta_leader() == new_leader

    async def check() -> None:
        nc = await connect(nats_cluster.urls[index])
        try:
            info = await nc.jetstream().account_info()
            assert info.streams == 0
        finally:
            await nc.close()

    run(check)
