"""Real ``nats-server`` processes for the test suite.

Plain synchronous, subprocess-based helpers: no trio, no asyncio.  Every
server writes its log to stdout/stderr; a reader thread collects the lines,
so readiness and other conditions are detected from log lines (events), not
by polling with sleeps.

Main entry points:

* :class:`NatsServer`: one server with a generated config file in its own
  temporary directory (JetStream on by default).
* :class:`NatsCluster`: N routed servers with clustered JetStream.
* :class:`TLSFiles`: CA / server / client certificates made with ``trustme``.
* ``*_auth()`` helpers returning a config block plus matching credentials,
  including operator/JWT mode with ``.creds`` files.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import nacl.utils
import nkeys

# One way to find the binary and pick a port: the library's (its local server for the demo and
# the benchmarks uses them too). READY_LINE is the log line both wait for.
from headrace.localserver import (
    ADDRESS_IN_USE,
    READY_LINE,
    LocalServerError,
    find_nats_server,
    free_port,
)

__all__ = [
    "LDM_LINE",
    "META_ADD_PEER_RE",
    "META_BOOTSTRAP_LINE",
    "META_LEADER_OTHER_RE",
    "META_LEADER_SELF_LINE",
    "READY_LINE",
    "ROUTE_REGISTERED_RE",
    "NKeyAuth",
    "NatsCluster",
    "NatsServer",
    "OperatorAuth",
    "ServerError",
    "TLSFiles",
    "TokenAuth",
    "UserPasswordAuth",
    "decode_jwt_claims",
    "encode_jwt",
    "format_creds",
    "free_port",
    "make_user_creds",
    "nats_server_binary",
    "new_nkey",
    "nkey_auth",
    "operator_auth",
    "permissions_auth",
    "token_auth",
    "user_password_auth",
]

#: Logged (debug level) once per route connection, naming the remote server ID.
ROUTE_REGISTERED_RE = re.compile(r'Registering remote route "(N[A-Z0-9]{55})"')
#: Logged by the node that won the JetStream meta-leader election.
META_LEADER_SELF_LINE = "Self is new JetStream cluster metadata leader"
#: Logged by the other nodes: ``JetStream cluster new metadata leader: <server_name>/<cluster>``.
META_LEADER_OTHER_RE = re.compile(r"JetStream cluster new metadata leader: ([^/\s]+)/(\S+)")
#: Logged (debug) on each node when the meta leader's AddPeer for a node is committed.
META_ADD_PEER_RE = re.compile(r'Committed membership change AddPeer peer "(\w+)"')
#: Logged when a node forms a brand-new JetStream meta group (empty store).
META_BOOTSTRAP_LINE = "JetStream cluster bootstrapping"
#: Logged when the server receives SIGUSR2 (lame duck mode).
LDM_LINE = "Entering lame duck mode, stop accepting new clients"

_META_RAFT_RE = re.compile(r"RAFT \[(\w+) - _meta_\]")
_META_ADD_PEER_RE = META_ADD_PEER_RE
_SERVER_ID_RE = re.compile(r"\]\s+ID:\s+(N[A-Z0-9]{55})\s*$")

DEFAULT_TIMEOUT = 10.0
#: Cluster waits: a JetStream meta-leader re-election takes ~4-8 s with nats-server 2.15.
CLUSTER_TIMEOUT = 30.0


class ServerError(RuntimeError):
    """A nats-server process failed to start, exited, or a wait timed out."""


# --------------------------------------------------------------------------
# Binary and ports
# --------------------------------------------------------------------------


def nats_server_binary() -> str:
    """Path of ``nats-server``, found as the library finds it (next to ``sys.executable``,
    else on PATH), as a :class:`ServerError` when there is none."""
    try:
        return find_nats_server()
    except LocalServerError as exc:
        raise ServerError(str(exc)) from None


def _q(value: str | os.PathLike[str]) -> str:
    """Quote a string for the nats-server config format."""
    return json.dumps(os.fspath(value))


# --------------------------------------------------------------------------
# Safety net: no nats-server outlives the test process.
# --------------------------------------------------------------------------

_LIVE: weakref.WeakSet[NatsServer] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.kill()
            shutil.rmtree(server.directory, ignore_errors=True)


# --------------------------------------------------------------------------
# TLS
# --------------------------------------------------------------------------


@dataclass
class TLSFiles:
    """PEM files for TLS tests, all issued by one trustme CA, plus an unrelated CA.

    ``ca_file`` signs ``server_cert`` (valid for 127.0.0.1 and localhost) and
    ``client_cert``; ``wrong_ca_file`` is a different CA that trusts nothing here.
    """

    directory: Path
    ca_file: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    wrong_ca_file: Path
    _owns_directory: bool = False

    @classmethod
    def create(cls, directory: str | os.PathLike[str] | None = None) -> TLSFiles:
        import trustme

        owns = directory is None
        d = Path(tempfile.mkdtemp(prefix="headrace-tls-")) if directory is None else Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        client = ca.issue_cert("client.headrace.test", common_name="headrace-test-client")
        wrong = trustme.CA()
        files = cls(
            directory=d,
            ca_file=d / "ca.pem",
            server_cert=d / "server-cert.pem",
            server_key=d / "server-key.pem",
            client_cert=d / "client-cert.pem",
            client_key=d / "client-key.pem",
            wrong_ca_file=d / "wrong-ca.pem",
            _owns_directory=owns,
        )
        ca.cert_pem.write_to_path(files.ca_file)
        server.private_key_pem.write_to_path(files.server_key)
        for i, blob in enumerate(server.cert_chain_pems):
            blob.write_to_path(files.server_cert, append=i > 0)
        client.private_key_pem.write_to_path(files.client_key)
        for i, blob in enumerate(client.cert_chain_pems):
            blob.write_to_path(files.client_cert, append=i > 0)
        wrong.cert_pem.write_to_path(files.wrong_ca_file)
        return files

    def client_context(self, *, wrong_ca: bool = False, client_cert: bool = True) -> ssl.SSLContext:
        """Client context trusting ``ca_file`` (or ``wrong_ca_file``), maybe with client cert."""
        ctx = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH,
            cafile=str(self.wrong_ca_file if wrong_ca else self.ca_file),
        )
        if client_cert:
            ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx

    def cleanup(self) -> None:
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


# --------------------------------------------------------------------------
# Auth helpers: each returns the config text and the matching credentials.
# --------------------------------------------------------------------------


def _secret() -> str:
    return base64.urlsafe_b64encode(os.urandom(18)).decode().rstrip("=")


@dataclass(frozen=True)
class UserPasswordAuth:
    user: str
    password: str
    config: str


@dataclass(frozen=True)
class TokenAuth:
    token: str
    config: str


@dataclass(frozen=True)
class NKeyAuth:
    seed: str
    public_key: str
    config: str


def user_password_auth(user: str = "alice", password: str | None = None) -> UserPasswordAuth:
    """``authorization { user, password }``."""
    password = password or _secret()
    config = f"authorization {{\n  user: {_q(user)}\n  password: {_q(password)}\n}}\n"
    return UserPasswordAuth(user=user, password=password, config=config)


def token_auth(token: str | None = None) -> TokenAuth:
    """``authorization { token }``."""
    token = token or _secret()
    return TokenAuth(token=token, config=f"authorization {{\n  token: {_q(token)}\n}}\n")


def new_nkey(prefix: int) -> nkeys.KeyPair:
    """A fresh nkey pair; *prefix* is one of ``nkeys.PREFIX_BYTE_*`` (user, account, ...)."""
    seed = nkeys.encode_seed(nacl.utils.random(32), prefix)
    return nkeys.from_seed(bytearray(seed))


def nkey_auth() -> NKeyAuth:
    """An nkey user: ``authorization { users: [{nkey: U...}] }``; the client signs the nonce."""
    kp = new_nkey(nkeys.PREFIX_BYTE_USER)
    public = kp.public_key.decode()
    config = f"authorization {{\n  users: [\n    {{ nkey: {_q(public)} }}\n  ]\n}}\n"
    return NKeyAuth(seed=bytes(kp.seed).decode(), public_key=public, config=config)


def permissions_auth(
    user: str = "limited",
    password: str | None = None,
    *,
    publish: Sequence[str] = ("allowed.>", "_INBOX.>"),
    subscribe: Sequence[str] = ("allowed.>", "_INBOX.>"),
    admin_password: str | None = None,
) -> UserPasswordAuth:
    """A user/password user that may publish only on ``publish`` and subscribe only on
    ``subscribe`` (by default ``allowed.>`` and ``_INBOX.>`` for both).

    Publishing or subscribing anywhere else triggers a ``Permissions Violation``. With
    ``admin_password``, a second user ``admin`` may do anything (to set up streams, or to look
    at them from a peer).
    """
    password = password or _secret()

    def subjects(items: Sequence[str]) -> str:
        return "[" + ", ".join(_q(item) for item in items) + "]"

    admin = f"    {{ user: admin, password: {_q(admin_password)} }}\n" if admin_password else ""
    config = (
        "authorization {\n"
        "  users: [\n"
        f"    {{ user: {_q(user)}, password: {_q(password)}, permissions: {{\n"
        f"        publish: {{ allow: {subjects(publish)} }}\n"
        f"        subscribe: {{ allow: {subjects(subscribe)} }}\n"
        "    } }\n"
        f"{admin}"
        "  ]\n"
        "}\n"
    )
    return UserPasswordAuth(user=user, password=password, config=config)


# --- operator / JWT mode ---------------------------------------------------


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


_JWT_HEADER = _b64url(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())


def encode_jwt(issuer: nkeys.KeyPair, subject: str, name: str, nats_claims: dict[str, Any]) -> str:
    """Build and sign a NATS v2 JWT (``ed25519-nkey``) with *issuer*'s nkey."""
    claims: dict[str, Any] = {
        "jti": "",
        "iat": int(time.time()),
        "iss": issuer.public_key.decode(),
        "sub": subject,
        "name": name,
        "nats": {**nats_claims, "version": 2},
    }
    digest = hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    payload = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    signing_input = f"{_JWT_HEADER}.{payload}"
    signature = issuer.sign(signing_input.encode())
    return f"{signing_input}.{_b64url(signature)}"


def decode_jwt_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT (no verification); handy in assertions."""
    payload = token.split(".")[1]
    claims: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return claims


_UNLIMITED_ACCOUNT = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
}
_JETSTREAM_UNLIMITED = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
_USER_CLAIMS = {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user"}


def format_creds(user_jwt: str, user_seed: str) -> str:
    """The standard ``.creds`` file text for a user JWT and its nkey seed."""
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n"
        "\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n"
        "\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{user_seed}\n"
        "------END USER NKEY SEED------\n"
        "\n"
        "*************************************************************\n"
    )


@dataclass(frozen=True)
class OperatorAuth:
    """Operator/JWT (decentralised auth) setup with a memory resolver.

    ``config`` goes into the server config (top level).  ``creds_file`` is a
    user of ``account_public_key`` (JetStream enabled); ``unknown_creds_file``
    is a user signed by an account the server does not know, so it must be
    rejected with an authorization error.
    """

    config: str
    operator_jwt: str
    operator_public_key: str
    system_account_public_key: str
    account_jwt: str
    account_public_key: str
    account_seed: str
    user_jwt: str
    user_seed: str
    user_public_key: str
    creds_file: Path
    unknown_creds_file: Path


def make_user_creds(account: nkeys.KeyPair, name: str = "user") -> tuple[str, str, str]:
    """Issue a user under *account*; returns ``(jwt, seed, public_key)``."""
    user = new_nkey(nkeys.PREFIX_BYTE_USER)
    public = user.public_key.decode()
    token = encode_jwt(account, public, name, dict(_USER_CLAIMS))
    return token, bytes(user.seed).decode(), public


def operator_auth(directory: str | os.PathLike[str]) -> OperatorAuth:
    """Generate operator, system account, JetStream account and users; write ``.creds`` files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)

    operator = new_nkey(nkeys.PREFIX_BYTE_OPERATOR)
    system = new_nkey(nkeys.PREFIX_BYTE_ACCOUNT)
    account = new_nkey(nkeys.PREFIX_BYTE_ACCOUNT)
    op_pub = operator.public_key.decode()
    sys_pub = system.public_key.decode()
    acc_pub = account.public_key.decode()

    operator_jwt = encode_jwt(
        operator, op_pub, "headrace-operator", {"type": "operator", "system_account": sys_pub}
    )
    system_jwt = encode_jwt(
        operator,
        sys_pub,
        "SYS",
        {"type": "account", "limits": dict(_UNLIMITED_ACCOUNT)},
    )
    account_jwt = encode_jwt(
        operator,
        acc_pub,
        "HEADRACE",
        {"type": "account", "limits": {**_UNLIMITED_ACCOUNT, **_JETSTREAM_UNLIMITED}},
    )
    user_jwt, user_seed, user_pub = make_user_creds(account, "headrace-user")

    # A user whose issuing account is never registered with the server.
    stranger = new_nkey(nkeys.PREFIX_BYTE_ACCOUNT)
    unknown_jwt, unknown_seed, _ = make_user_creds(stranger, "stranger")

    creds_file = directory / "user.creds"
    creds_file.write_text(format_creds(user_jwt, user_seed))
    unknown_creds_file = directory / "unknown-account.creds"
    unknown_creds_file.write_text(format_creds(unknown_jwt, unknown_seed))
    for f in (creds_file, unknown_creds_file):
        f.chmod(0o600)

    config = (
        f"operator: {_q(operator_jwt)}\n"
        f"system_account: {_q(sys_pub)}\n"
        "resolver: MEMORY\n"
        "resolver_preload: {\n"
        f"  {sys_pub}: {_q(system_jwt)}\n"
        f"  {acc_pub}: {_q(account_jwt)}\n"
        "}\n"
    )
    return OperatorAuth(
        config=config,
        operator_jwt=operator_jwt,
        operator_public_key=op_pub,
        system_account_public_key=sys_pub,
        account_jwt=account_jwt,
        account_public_key=acc_pub,
        account_seed=bytes(account.seed).decode(),
        user_jwt=user_jwt,
        user_seed=user_seed,
        user_public_key=user_pub,
        creds_file=creds_file,
        unknown_creds_file=unknown_creds_file,
    )


# --------------------------------------------------------------------------
# One server
# --------------------------------------------------------------------------


class NatsServer:
    """A nats-server subprocess with a generated config in its own temp dir.

    The constructor only writes the config; call :meth:`start` (or use it as
    a context manager).  :meth:`stop`/:meth:`kill` end the process but keep
    the directory, so :meth:`restart` comes back on the same port with the
    same JetStream store.  :meth:`close` stops and removes the directory.

    Keyword arguments (all optional):

    * ``port``: client port (default: a free one; re-picked if lost to a race).
    * ``jetstream``: ``jetstream { store_dir }`` with ``store_dir`` in the temp dir.
    * ``server_name``; ``max_payload``; ``debug``/``trace`` logging.
    * ``auth``: config text for authentication (see the ``*_auth()`` helpers).
    * ``tls`` (:class:`TLSFiles`) with ``tls_verify`` (require client certs) and
      ``tls_handshake_first``; the URL scheme becomes ``tls://``.
    * ``cluster_name``, ``cluster_port`` (default: free when a name is given), ``routes``.
    * ``lame_duck_duration`` (nats-server rejects anything under 30 s) and
      ``lame_duck_grace_period``.
    * ``extra_config``: appended verbatim.
    * ``log_condition``: share one :class:`threading.Condition` between servers.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        jetstream: bool = True,
        server_name: str | None = None,
        auth: str | None = None,
        tls: TLSFiles | None = None,
        tls_verify: bool = False,
        tls_handshake_first: bool = False,
        cluster_name: str | None = None,
        cluster_port: int | None = None,
        routes: Sequence[str] = (),
        max_payload: int | None = None,
        lame_duck_duration: str = "30s",
        lame_duck_grace_period: str = "500ms",
        debug: bool = False,
        trace: bool = False,
        extra_config: str = "",
        start_timeout: float = DEFAULT_TIMEOUT,
        log_condition: threading.Condition | None = None,
    ) -> None:
        self.binary = nats_server_binary()
        self.host = host
        self._auto_port = port is None
        self.port = free_port(host) if port is None else port
        if cluster_name is not None and cluster_port is None:
            cluster_port = free_port(host)
        self.cluster_port = cluster_port
        self.jetstream = jetstream
        self.server_name = server_name
        self.auth = auth
        self.tls = tls
        self.tls_verify = tls_verify
        self.tls_handshake_first = tls_handshake_first
        self.cluster_name = cluster_name
        self.routes = list(routes)
        self.max_payload = max_payload
        self.lame_duck_duration = lame_duck_duration
        self.lame_duck_grace_period = lame_duck_grace_period
        self.debug = debug
        self.trace = trace
        self.extra_config = extra_config
        self.start_timeout = start_timeout

        self.directory = Path(tempfile.mkdtemp(prefix="headrace-nats-"))
        self.store_dir = self.directory / "store"
        self.config_path = self.directory / "nats-server.conf"
        self.write_config()

        self._cond = log_condition or threading.Condition()
        self._lines: list[str] = []
        self._run_start = 0
        self._ready = threading.Event()
        self._eof = True
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        #: Server ID (``N...``) of the current run, parsed from the startup banner.
        self.server_id: str | None = None
        #: Server IDs this run has registered routes to (needs ``debug``).
        self.route_ids: set[str] = set()
        #: server_name of the JetStream meta leader as last logged by this run.
        self.meta_leader_view: str | None = None
        #: This node's RAFT peer ID in the JetStream meta group (hash of server_name).
        self.meta_raft_id: str | None = None
        #: Meta-group peers whose AddPeer membership change this run committed (debug).
        self.meta_peers_added: set[str] = set()
        #: True if this run formed a new meta group (rather than recovering one).
        self.meta_bootstrapped = False
        self._closed = False

    # --- config ------------------------------------------------------------

    @property
    def scheme(self) -> str:
        return "tls" if self.tls is not None else "nats"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def route_url(self) -> str | None:
        if self.cluster_port is None:
            return None
        return f"nats-route://{self.host}:{self.cluster_port}"

    def config_text(self) -> str:
        lines = [f"listen: {self.host}:{self.port}"]
        if self.server_name:
            lines.append(f"server_name: {_q(self.server_name)}")
        lines.append(f"lame_duck_duration: {_q(self.lame_duck_duration)}")
        lines.append(f"lame_duck_grace_period: {_q(self.lame_duck_grace_period)}")
        if self.debug:
            lines.append("debug: true")
        if self.trace:
            lines.append("trace: true")
        if self.max_payload is not None:
            lines.append(f"max_payload: {self.max_payload}")
        if self.jetstream:
            lines.append(f"jetstream {{\n  store_dir: {_q(self.store_dir)}\n}}")
        if self.tls is not None:
            tls = [
                f"  cert_file: {_q(self.tls.server_cert)}",
                f"  key_file: {_q(self.tls.server_key)}",
                f"  ca_file: {_q(self.tls.ca_file)}",
                "  timeout: 2",
            ]
            if self.tls_verify:
                tls.append("  verify: true")
            if self.tls_handshake_first:
                tls.append("  handshake_first: true")
            lines.append("tls {\n" + "\n".join(tls) + "\n}")
        if self.cluster_port is not None:
            cluster = [f"  listen: {self.host}:{self.cluster_port}"]
            if self.cluster_name:
                cluster.insert(0, f"  name: {_q(self.cluster_name)}")
            if self.routes:
                cluster.append("  routes: [" + ", ".join(_q(r) for r in self.routes) + "]")
            lines.append("cluster {\n" + "\n".join(cluster) + "\n}")
        if self.auth:
            lines.append(self.auth.rstrip("\n"))
        if self.extra_config:
            lines.append(self.extra_config.rstrip("\n"))
        return "\n".join(lines) + "\n"

    def write_config(self) -> None:
        self.config_path.write_text(self.config_text())

    # --- process -----------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float | None = None) -> Self:
        """Start the process and wait (event-based) for ``Server is ready``."""
        attempts = 3 if self._auto_port and self.cluster_port is None else 1
        for attempt in range(attempts):
            self.spawn()
            try:
                self.wait_ready(timeout)
            except ServerError:
                if attempt + 1 < attempts and ADDRESS_IN_USE in self.run_log:
                    # Lost the race for the port; pick another one and retry.
                    self.kill()
                    self.port = free_port(self.host)
                    self.write_config()
                    continue
                self.kill()
                raise
            return self
        raise AssertionError("unreachable")

    def spawn(self) -> None:
        """Start the process without waiting for readiness (see :meth:`wait_ready`)."""
        if self._closed:
            raise ServerError("server was closed")
        if self.is_running:
            raise ServerError(f"nats-server already running (pid {self.pid})")
        self._join_previous()
        with self._cond:
            self._run_start = len(self._lines)
            self._ready.clear()
            self._eof = False
            self.server_id = None
            self.route_ids = set()
            self.meta_leader_view = None
            self.meta_raft_id = None
            self.meta_peers_added = set()
            self.meta_bootstrapped = False
        self._proc = subprocess.Popen(
            [self.binary, "-c", str(self.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            cwd=self.directory,
            start_new_session=True,
        )
        _LIVE.add(self)
        self._reader = threading.Thread(
            target=self._read_output,
            args=(self._proc,),
            name=f"nats-server-log-{self._proc.pid}",
            daemon=True,
        )
        self._reader.start()

    def _read_output(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                with self._cond:
                    self._lines.append(line)
                    self._track(line)
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def _track(self, line: str) -> None:
        """Update state derived from log lines (called with the lock held)."""
        if self.server_id is None and (m := _SERVER_ID_RE.search(line)):
            self.server_id = m.group(1)
        elif line.endswith(f"[INF] {READY_LINE}"):
            self._ready.set()
        elif m := ROUTE_REGISTERED_RE.search(line):
            self.route_ids.add(m.group(1))
        elif META_LEADER_SELF_LINE in line:
            self.meta_leader_view = self.server_name or self.server_id
        elif m := META_LEADER_OTHER_RE.search(line):
            self.meta_leader_view = m.group(1)
        elif "RAFT [" in line and (m := _META_RAFT_RE.search(line)):
            self.meta_raft_id = m.group(1)
            if a := _META_ADD_PEER_RE.search(line):
                self.meta_peers_added.add(a.group(1))
        elif META_BOOTSTRAP_LINE in line:
            self.meta_bootstrapped = True

    def wait_ready(self, timeout: float | None = None) -> None:
        timeout = self.start_timeout if timeout is None else timeout
        with self._cond:
            self._cond.wait_for(lambda: self._ready.is_set() or self._eof, timeout)
            if self._ready.is_set():
                return
            exited = self._eof
        what = "exited before it was ready" if exited else f"not ready after {timeout:g}s"
        raise ServerError(f"nats-server on port {self.port} {what}\n{self.log_tail()}")

    def _terminate(self, sig: signal.Signals, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._join_previous()
        _LIVE.discard(self)

    def _join_previous(self) -> None:
        if self._reader is not None:
            self._reader.join(5)
            self._reader = None
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()

    def stop(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """SIGTERM and wait for exit (SIGKILL if it takes longer than *timeout*)."""
        self._terminate(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL and wait for exit."""
        self._terminate(signal.SIGKILL, DEFAULT_TIMEOUT)

    def freeze(self) -> None:
        """SIGSTOP, and wait until the process is stopped: ``kill()`` returns when the signal is
        queued, and a server thread already running may still answer a request sent at once
        (CI saw a commit answered "while frozen"). ``waitpid(WUNTRACED)`` returns once every
        thread is stopped: the event, not a guess at how long it takes."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise ServerError("nats-server is not running")
        proc.send_signal(signal.SIGSTOP)
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        if not os.WIFSTOPPED(status):
            raise ServerError(f"nats-server did not stop (wait status {status})")

    def thaw(self) -> None:
        """SIGCONT (see :meth:`freeze`)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)

    def restart(self, *, kill: bool = False, timeout: float | None = None) -> Self:
        """Stop (or kill) and start again: same port, store dir and config."""
        if kill:
            self.kill()
        else:
            self.stop()
        self.write_config()
        self.spawn()
        try:
            self.wait_ready(timeout)
        except ServerError:
            self.kill()
            raise
        return self

    def lame_duck(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Put the server into lame duck mode (SIGUSR2, the same as
        ``nats-server --signal ldm=<pid>``) and wait until it logs that it entered it.

        Connected clients get an INFO with ``"ldm": true`` at once.  After
        ``lame_duck_grace_period`` the clients are closed in batches spread over
        ``lame_duck_duration`` (a handful of clients: about one per 0.5 s) and the
        process exits by itself (see :meth:`wait_exited`).  SIGTERM during lame duck
        mode is honoured only once the grace period is over.
        """
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise ServerError("nats-server is not running")
        mark = self.log_position()
        proc.send_signal(signal.SIGUSR2)
        self.wait_for_log(LDM_LINE, timeout, since=mark)

    def wait_exited(self, timeout: float = DEFAULT_TIMEOUT) -> int:
        """Wait for the process to exit on its own (e.g. after lame duck mode)."""
        if self._proc is None:
            raise ServerError("nats-server was never started")
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise ServerError(f"nats-server still running after {timeout:g}s") from None
        self._join_previous()
        _LIVE.discard(self)
        return code

    def close(self) -> None:
        """Stop the process and delete the temp dir (config and store)."""
        if self._closed:
            return
        self.stop()
        self._closed = True
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        if not self.is_running:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return f"<NatsServer {self.server_name or ''} {self.url} {state}>"

    # --- logs --------------------------------------------------------------

    @property
    def log(self) -> str:
        """All log text so far (across restarts)."""
        with self._cond:
            return "\n".join(self._lines)

    @property
    def run_log(self) -> str:
        """Log text of the current (or last) process run only."""
        with self._cond:
            return "\n".join(self._lines[self._run_start :])

    def log_tail(self, n: int = 40) -> str:
        with self._cond:
            return "\n".join(self._lines[-n:])

    def log_position(self) -> int:
        """An index into the log; pass as ``since=`` to wait only for later lines."""
        with self._cond:
            return len(self._lines)

    def wait_for_log(
        self,
        pattern: str | re.Pattern[str],
        timeout: float = DEFAULT_TIMEOUT,
        *,
        since: int | None = None,
    ) -> re.Match[str]:
        """Wait for a log line matching *pattern* (substring or regex).

        Only lines from *since* (a :meth:`log_position`) on are considered;
        by default, lines of the current process run.
        """
        regex = re.compile(re.escape(pattern)) if isinstance(pattern, str) else pattern
        found: list[re.Match[str]] = []
        with self._cond:
            pos = self._run_start if since is None else since

        def check() -> bool:
            nonlocal pos
            lines = self._lines
            while pos < len(lines):
                m = regex.search(lines[pos])
                pos += 1
                if m:
                    found.append(m)
                    return True
            return self._eof

        with self._cond:
            self._cond.wait_for(check, timeout)
        if found:
            return found[0]
        why = "process exited" if self._eof else f"timed out after {timeout:g}s"
        raise ServerError(
            f"{why} waiting for log line {regex.pattern!r} on {self.url}\n{self.log_tail()}"
        )


# --------------------------------------------------------------------------
# Cluster
# --------------------------------------------------------------------------


def _route_ports(size: int) -> tuple[list[int], list[str]]:
    """``size`` free route ports, and the route URLs every node of the cluster is given."""
    ports = [free_port() for _ in range(size)]
    return ports, [f"nats-route://127.0.0.1:{p}" for p in ports]


class NatsCluster:
    """*size* routed servers (full mesh routes) with clustered JetStream.

    Nodes are named ``n0``..``n{size-1}`` and log at debug level, which is
    what makes route registration visible in the log.  All nodes share one
    condition variable, so cluster-wide conditions are waited for as events.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        name: str = "headrace",
        jetstream: bool = True,
        start_timeout: float = CLUSTER_TIMEOUT,
        **server_kwargs: Any,
    ) -> None:
        self.name = name
        self.jetstream = jetstream
        self.start_timeout = start_timeout
        self._cond = threading.Condition()
        cluster_ports, route_urls = _route_ports(size)
        server_kwargs.setdefault("debug", True)
        self.servers = [
            NatsServer(
                server_name=f"n{i}",
                cluster_name=name,
                cluster_port=cluster_ports[i],
                routes=route_urls,
                jetstream=jetstream,
                start_timeout=start_timeout,
                log_condition=self._cond,
                **server_kwargs,
            )
            for i in range(size)
        ]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def __getitem__(self, index: int) -> NatsServer:
        return self.servers[index]

    def __len__(self) -> int:
        return len(self.servers)

    @property
    def running(self) -> list[NatsServer]:
        return [s for s in self.servers if s.is_running]

    def start(self, timeout: float | None = None) -> Self:
        """Start all nodes at once, then wait for readiness, routes and the JS meta leader.

        A node that lost the race for one of its ports (another process bound it between
        ``free_port`` and the node's listen) logs ``address already in use`` and exits, after
        saying it is ready: the whole cluster is then started again on new ports and empty
        stores, up to three times. (A CI run once waited 30 s for a meta leader of a cluster
        whose node n1 had died so, and failed the test.)"""
        timeout = self.start_timeout if timeout is None else timeout
        attempts = 3
        for attempt in range(attempts):
            try:
                self._start_once(timeout)
            except ServerError:
                self.stop()
                if attempt + 1 < attempts and self._lost_a_port():
                    self._move_ports()
                    continue
                raise
            except BaseException:
                self.stop()
                raise
            return self
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> None:
        for s in self.servers:
            s.spawn()
        for s in self.servers:
            s.wait_ready(timeout)
        self.wait_routed(timeout)
        dead = [s.server_name for s in self.servers if not s.is_running]
        if dead:
            raise ServerError(f"cluster: {dead} exited while starting")
        if self.jetstream:
            self.wait_jetstream_ready(timeout)

    def _lost_a_port(self) -> bool:
        return any(ADDRESS_IN_USE in s.run_log for s in self.servers)

    def _move_ports(self) -> None:
        """New client and route ports for every node, and empty stores (the failed start may
        have begun a meta group)."""
        cluster_ports, routes = _route_ports(len(self.servers))
        for server, cluster_port in zip(self.servers, cluster_ports, strict=True):
            if server._auto_port:
                server.port = free_port(server.host)
            server.cluster_port = cluster_port
            server.routes = list(routes)
            shutil.rmtree(server.store_dir, ignore_errors=True)
            server.write_config()

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def close(self) -> None:
        for s in self.servers:
            s.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wait(self, what: str, predicate: Callable[[], bool], timeout: float) -> None:
        with self._cond:
            if self._cond.wait_for(predicate, timeout):
                return
        tails = "\n".join(f"--- {s.server_name}\n{s.log_tail(15)}" for s in self.servers)
        raise ServerError(f"cluster: timed out after {timeout:g}s waiting for {what}\n{tails}")

    def _routed(self, nodes: Iterable[NatsServer]) -> bool:
        nodes = list(nodes)
        for s in nodes:
            if not s.is_running or s.server_id is None:
                return False
        return all(o.server_id in s.route_ids for s in nodes for o in nodes if o is not s)

    def wait_routed(self, timeout: float = CLUSTER_TIMEOUT) -> None:
        """Wait until every running node logged a route to every other running node.

        Keyed on the debug line ``Registering remote route "<server id>"``.
        """
        if not all(s.debug for s in self.servers):
            raise ServerError("wait_routed needs debug logging on every node")
        self._wait("full route mesh", lambda: self._routed(self.running), timeout)

    def meta_leader(self) -> str | None:
        """server_name of the JetStream meta leader every running node agrees on, if any."""
        with self._cond:
            return self._agreed_leader()

    def _agreed_leader(self) -> str | None:
        running = self.running
        if not running:
            return None
        names = {s.server_name for s in running}
        views = {s.meta_leader_view for s in running}
        if len(views) != 1:
            return None
        (leader,) = views
        if leader not in names:
            return None
        # A freshly formed meta group is only settled once every node has committed
        # the first leader's AddPeer entries for all N-1 followers; killing the
        # leader before that (a few ms) leaves the others unable to elect a new one.
        for s in running:
            if s.meta_bootstrapped and len(s.meta_peers_added) < len(self.servers) - 1:
                return None
        return leader

    def wait_jetstream_ready(self, timeout: float = CLUSTER_TIMEOUT) -> str:
        """Wait until all running nodes agree on a running JetStream meta leader; return its name.

        Keyed on ``Self is new JetStream cluster metadata leader`` (the leader) and
        ``JetStream cluster new metadata leader: <name>/<cluster>`` (the others); a
        freshly formed group must also have logged ``Committed membership change
        AddPeer peer "<raft id>"`` for all N-1 followers on every node.  The leader
        seen by each node is the last such line of its current run.
        """
        found: list[str] = []

        def ready() -> bool:
            leader = self._agreed_leader()
            if leader is not None:
                found.append(leader)
            return leader is not None

        self._wait("JetStream meta leader", ready, timeout)
        return found[-1]

    def kill_node(self, index: int) -> NatsServer:
        self.servers[index].kill()
        return self.servers[index]

    def stop_node(self, index: int) -> NatsServer:
        self.servers[index].stop()
        return self.servers[index]

    def restart_node(self, index: int, *, kill: bool = False, wait: bool = True) -> NatsServer:
        """Restart node *index* (same ports and store); by default wait for routes and JS."""
        node = self.servers[index]
        node.restart(kill=kill)
        if wait:
            self.wait_routed()
            if self.jetstream:
                self.wait_jetstream_ready()
        return node
