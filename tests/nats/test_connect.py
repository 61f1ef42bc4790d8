"""The handshake against real servers: every auth method right and wrong, TLS (explicit,
required by the server, TLS-first, client certificates, the wrong CA), permissions, and the
errors a user meets when nothing answers."""

from __future__ import annotations

import pytest
import trio
from headrace.errors import (
    AuthorizationError,
    ConnectTimeout,
    NoServersError,
    PermissionViolation,
    TLSError,
)
from headrace.nats import ServerErrorEvent, Status, TLSConfig, connect

from tests.servers import (
    nkey_auth,
    operator_auth,
    permissions_auth,
    token_auth,
    user_password_auth,
)


async def roundtrip(nc, subject: str = "auth.check") -> None:
    """Prove the connection really works: a message comes back through the server."""
    sub = await nc.subscribe(subject)
    await nc.publish(subject, b"ok")
    assert (await sub.next_msg(timeout=5)).data == b"ok"


async def test_handshake_sends_connect_and_learns_info(core_server):
    async with connect(core_server.url, name="hs-test") as nc:
        assert nc.status is Status.CONNECTED
        info = nc.server_info
        assert info is not None and info.headers and info.max_payload > 0
        assert info.version.startswith("2.")
        assert nc.connected_server is not None
        assert nc.connected_server.port == core_server.port
        await roundtrip(nc)
    assert nc.status is Status.CLOSED
    assert nc.stats.connects == 1


async def test_user_password(nats_server_factory):
    auth = user_password_auth()
    server = nats_server_factory(jetstream=False, auth=auth.config)
    async with connect(server.url, user=auth.user, password=auth.password) as nc:
        await roundtrip(nc)
    with pytest.raises(AuthorizationError, match=r"(?i)authorization violation"):
        async with connect(server.url, user=auth.user, password="wrong"):
            pass
    with pytest.raises(AuthorizationError):
        async with connect(server.url):
            pass


async def test_user_password_in_url(nats_server_factory):
    auth = user_password_auth()
    server = nats_server_factory(jetstream=False, auth=auth.config)
    url = f"nats://{auth.user}:{auth.password}@127.0.0.1:{server.port}"
    async with connect(url) as nc:
        await roundtrip(nc)
    with pytest.raises(AuthorizationError):
        async with connect(f"nats://{auth.user}:nope@127.0.0.1:{server.port}"):
            pass


async def test_token(nats_server_factory):
    auth = token_auth()
    server = nats_server_factory(jetstream=False, auth=auth.config)
    async with connect(server.url, token=auth.token) as nc:
        await roundtrip(nc)
    async with connect(f"nats://{auth.token}@127.0.0.1:{server.port}") as nc:
        await roundtrip(nc)
    with pytest.raises(AuthorizationError):
        async with connect(server.url, token="not-the-token"):
            pass


async def test_nkey_seed_inline_and_from_file(nats_server_factory, tmp_path):
    auth = nkey_auth()
    server = nats_server_factory(jetstream=False, auth=auth.config)
    async with connect(server.url, nkey_seed=auth.seed) as nc:
        await roundtrip(nc)
    seed_file = tmp_path / "user.nk"
    seed_file.write_text(auth.seed + "\n")
    async with connect(server.url, nkey_seed=str(seed_file)) as nc:
        await roundtrip(nc)
    stranger = nkey_auth()  # a valid seed the server does not know
    with pytest.raises(AuthorizationError):
        async with connect(server.url, nkey_seed=stranger.seed):
            pass


async def test_creds_file(nats_server_factory, tmp_path):
    auth = operator_auth(tmp_path)
    server = nats_server_factory(auth=auth.config)
    async with connect(server.url, creds_file=str(auth.creds_file)) as nc:
        await roundtrip(nc)
        assert nc.server_info is not None and nc.server_info.nonce
    with pytest.raises(AuthorizationError):
        async with connect(server.url, creds_file=str(auth.unknown_creds_file)):
            pass


async def test_bad_creds_file_is_a_clear_error(core_server, tmp_path):
    bad = tmp_path / "bad.creds"
    bad.write_text("not a creds file\n")
    with pytest.raises(Exception, match=r"creds file .* must hold a user JWT"):
        async with connect(core_server.url, creds_file=str(bad)):
            pass


async def test_permission_violation_names_the_subject(nats_server_factory):
    auth = permissions_auth()
    server = nats_server_factory(jetstream=False, auth=auth.config)
    async with connect(server.url, user=auth.user, password=auth.password) as nc:
        with nc.events() as events:
            forbidden = await nc.subscribe("secret.stuff")
            allowed = await nc.subscribe("allowed.x")
            await nc.publish("forbidden.topic", b"x")
            await nc.publish("allowed.x", b"fine")
            # The subscription the server refused ends with a typed error naming its subject.
            error = await forbidden.wait_closed()
            assert isinstance(error, PermissionViolation)
            assert error.operation == "subscription" and error.subject == "secret.stuff"
            with pytest.raises(PermissionViolation, match=r"secret.stuff"):
                await forbidden.next_msg(timeout=5)
            # Publishing is reported as an event naming the subject; the connection lives on.
            seen: list[PermissionViolation] = []
            with trio.fail_after(5):
                while not any(e.operation == "publish" for e in seen):
                    event = await events.receive()
                    if isinstance(event, ServerErrorEvent) and isinstance(
                        event.error, PermissionViolation
                    ):
                        seen.append(event.error)
            publish_error = next(e for e in seen if e.operation == "publish")
            assert publish_error.subject == "forbidden.topic"
        assert (await allowed.next_msg(timeout=5)).data == b"fine"
        assert nc.status is Status.CONNECTED and nc.stats.reconnects == 0


async def test_request_to_forbidden_subject_fails_fast(nats_server_factory):
    auth = permissions_auth()
    server = nats_server_factory(jetstream=False, auth=auth.config)
    async with connect(server.url, user=auth.user, password=auth.password) as nc:
        with trio.fail_after(4), pytest.raises(PermissionViolation, match=r"service.forbidden"):
            await nc.request("service.forbidden", b"?", timeout=30)


async def test_refused_request_inbox_fails_requests_fast(nats_server_factory):
    auth = permissions_auth()  # may subscribe to _INBOX.> only, not to other prefixes
    server = nats_server_factory(jetstream=False, auth=auth.config)
    async with connect(
        server.url, user=auth.user, password=auth.password, inbox_prefix="private"
    ) as nc:
        with trio.fail_after(4), pytest.raises(PermissionViolation, match=r"private\."):
            await nc.request("allowed.svc", b"?", timeout=30)
        # The refused inbox is replaced, not reused, by the next request.
        with trio.fail_after(4), pytest.raises(PermissionViolation):
            await nc.request("allowed.svc", b"?", timeout=30)


# -- TLS --------------------------------------------------------------------------------------


async def test_tls_with_verification(nats_server_factory, tls_files):
    server = nats_server_factory(jetstream=False, tls=tls_files)
    assert server.url.startswith("tls://")
    tls = TLSConfig(ca_file=tls_files.ca_file)
    async with connect(server.url, tls=tls) as nc:
        await roundtrip(nc)
        assert nc.server_info is not None and nc.server_info.tls_required


async def test_tls_required_by_server_upgrades_a_nats_url(nats_server_factory, tls_files):
    server = nats_server_factory(jetstream=False, tls=tls_files)
    plain_url = f"nats://127.0.0.1:{server.port}"
    async with connect(plain_url, tls=TLSConfig(ca_file=tls_files.ca_file)) as nc:
        await roundtrip(nc)
    # Without our CA the upgrade uses the system trust store and must fail verification.
    with pytest.raises(TLSError, match=r"(?i)certificate verify failed"):
        async with connect(plain_url):
            pass


async def test_tls_wrong_ca_fails_clearly(nats_server_factory, tls_files):
    server = nats_server_factory(jetstream=False, tls=tls_files)
    with pytest.raises(TLSError, match=r"(?i)certificate verify failed"):
        async with connect(server.url, tls=TLSConfig(ca_file=tls_files.wrong_ca_file)):
            pass


async def test_tls_client_certificate_required(nats_server_factory, tls_files):
    server = nats_server_factory(jetstream=False, tls=tls_files, tls_verify=True)
    tls = TLSConfig(
        ca_file=tls_files.ca_file, cert_file=tls_files.client_cert, key_file=tls_files.client_key
    )
    async with connect(server.url, tls=tls) as nc:
        await roundtrip(nc)
    with pytest.raises(TLSError):
        async with connect(server.url, tls=TLSConfig(ca_file=tls_files.ca_file)):
            pass


async def test_tls_first_handshake(nats_server_factory, tls_files):
    server = nats_server_factory(jetstream=False, tls=tls_files, tls_handshake_first=True)
    tls = TLSConfig(ca_file=tls_files.ca_file, handshake_first=True)
    async with connect(server.url, tls=tls) as nc:
        await roundtrip(nc)
    # A client that waits for INFO in clear text gets nothing from a TLS-first server.
    with pytest.raises((ConnectTimeout, TLSError, NoServersError)):
        async with connect(server.url, tls=TLSConfig(ca_file=tls_files.ca_file), connect_timeout=1):
            pass


async def test_client_requires_tls_but_server_has_none(core_server, tls_files):
    tls_url = f"tls://127.0.0.1:{core_server.port}"
    with pytest.raises(TLSError, match="does not offer TLS"):
        async with connect(tls_url, tls=TLSConfig(ca_file=tls_files.ca_file)):
            pass


# -- nothing there ----------------------------------------------------------------------------


async def test_no_server_listening(core_server):
    port = core_server.port
    core_server.stop()
    with pytest.raises(NoServersError, match=str(port)) as info:
        async with connect(f"nats://127.0.0.1:{port}"):
            pass
    assert list(info.value.errors) == [f"nats://127.0.0.1:{port}"]


async def test_connect_timeout_when_server_stays_silent():
    # A fake server: accepts TCP and never sends INFO, which a real server never does.
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:

        async def silent(stream: trio.SocketStream) -> None:
            await trio.sleep_forever()

        nursery.start_soon(trio.serve_listeners, silent, listeners)
        with pytest.raises(NoServersError) as info:
            async with connect(f"nats://127.0.0.1:{port}", connect_timeout=0.3):
                pass
        assert isinstance(next(iter(info.value.errors.values())), ConnectTimeout)
        nursery.cancel_scope.cancel()


def test_bad_urls_and_options_fail_early():
    from headrace.nats import ConnectOptions

    with pytest.raises(ValueError, match="websocket"):
        ConnectOptions(servers=["ws://host:80"])
    with pytest.raises(ValueError, match="unknown scheme"):
        ConnectOptions(servers=["http://host"])
    with pytest.raises(ValueError, match="ping_interval"):
        ConnectOptions(ping_interval=0)
    with pytest.raises(ValueError, match="a password needs a user"):
        from headrace.nats import Credentials

        Credentials(password="x")
