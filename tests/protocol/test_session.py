"""The sans-IO client session: a hypothesis state machine against a model, with no server.

The server's side is bytes written here and parsed by the real :class:`ProtocolParser`; what the
session sends back is parsed here with a small client-command reader, so the test checks the
wire, not the session's own bookkeeping.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
import pytest
from headrace.errors import (
    AuthorizationError,
    PermissionViolation,
    ProtocolError,
    ServerError,
    StaleConnectionError,
    TLSError,
)
from headrace.protocol import Event, ProtocolParser
from headrace.protocol.session import (
    ClientSession,
    InfoChanged,
    Phase,
    PongReceived,
    SendNow,
    ServerErrorReport,
    SessionConfig,
)
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)


@attrs.define
class FakeSub:
    """The fields of a subscription the session reads (the driver's Subscription has more)."""

    sid: int
    subject: str
    queue: str | None
    max_msgs: int | None = None
    delivered: int = 0


def server(*frames: bytes) -> list[Event]:
    return ProtocolParser().feed(b"".join(frames))


def info(**fields: Any) -> bytes:
    return (
        b"INFO " + json.dumps({"server_id": "S", "max_payload": 1024, **fields}).encode() + b"\r\n"
    )


def err(text: str) -> bytes:
    return b"-ERR '" + text.encode() + b"'\r\n"


_COMMAND = re.compile(rb"(SUB|UNSUB) ([^\r]*)\r\n")


def client_commands(data: bytes) -> list[tuple[str, list[str]]]:
    """SUB/UNSUB commands in ``data``, which must contain nothing else."""
    found = [(m.group(1).decode(), m.group(2).decode().split(" ")) for m in _COMMAND.finditer(data)]
    assert sum(len(m.group(0)) for m in _COMMAND.finditer(data)) == len(data), data
    return found


def new_session(**config: Any) -> ClientSession[FakeSub]:
    return ClientSession(SessionConfig(version="9.9.9", **config))


def handshaken(session: ClientSession[FakeSub], **fields: Any) -> None:
    session.connection_made("nats://h:4222")
    assert session.receive_info(server(info(**fields))) is not None
    session.connect_command(tls=False, auth={})
    assert session.receive_handshake(server(b"PONG\r\n")) == []


SUBJECTS = st.sampled_from(["a", "b.c", "d.>", "e.*"])
QUEUES = st.sampled_from([None, "q1", "q2"])
ERRORS = st.sampled_from(
    [
        ("Authorization Violation", AuthorizationError, True),
        ("Maximum Payload Violation", ServerError, True),
        ("Stale Connection", StaleConnectionError, True),
        ('Permissions Violation for Publish to "x.y"', PermissionViolation, False),
        ('Permissions Violation for Publish with Reply of "r"', PermissionViolation, False),
        ("something new", ServerError, False),
    ]
)


class SessionMachine(RuleBasedStateMachine):
    """Drives one session through transports, subscriptions, PINGs and errors."""

    @initialize(max_pings=st.integers(1, 4))
    def start(self, max_pings: int) -> None:
        self.session = new_session(max_pings_out=max_pings, ping_interval=1.0)
        self.max_pings = max_pings
        self.phase = Phase.IDLE
        self.subs: dict[int, FakeSub] = {}
        self.draining: set[int] = set()
        self.pings_out = 0
        self.info: dict[str, Any] = {}
        self.next_sid = 1
        self.now = 0.0

    # -- the handshake ------------------------------------------------------------------------

    @precondition(lambda self: self.phase not in (Phase.CONNECTED, Phase.CLOSED))
    @rule()
    def open_transport(self) -> None:
        self.session.connection_made("nats://h:4222")
        self.phase = Phase.AWAIT_INFO
        self.info = {}

    @precondition(lambda self: self.phase is Phase.AWAIT_INFO)
    @rule(nonce=st.sampled_from(["n1", "n2"]), split=st.booleans())
    def server_info(self, nonce: str, split: bool) -> None:
        if split:  # nothing complete read yet: the session keeps waiting
            assert self.session.receive_info([]) is None
            assert self.session.phase is Phase.AWAIT_INFO
        got = self.session.receive_info(server(info(nonce=nonce)))
        assert got is not None and got.nonce == nonce
        self.info = {"nonce": nonce}
        self.phase = Phase.INFO_RECEIVED

    @precondition(lambda self: self.phase is Phase.INFO_RECEIVED)
    @rule()
    def send_connect(self) -> None:
        assert not self.session.upgrade_tls(want_tls=False, tls_first=False, buffered=False)
        hello = self.session.connect_command(tls=False, auth={"user": "u"})
        assert hello.startswith(b"CONNECT ") and hello.endswith(b"\r\nPING\r\n")
        fields = json.loads(hello[len(b"CONNECT ") : -len(b"\r\nPING\r\n")])
        assert fields["protocol"] == 1 and fields["headers"] and fields["user"] == "u"
        assert fields["version"] == "9.9.9" and not fields["verbose"]
        self.phase = Phase.AWAIT_PONG

    @precondition(lambda self: self.phase is Phase.AWAIT_PONG)
    @rule(pings=st.integers(0, 2), urls=st.lists(st.sampled_from(["x:1", "y:2"]), max_size=2))
    def server_talks_before_pong(self, pings: int, urls: list[str]) -> None:
        frames = [b"PING\r\n"] * pings + [info(connect_urls=urls)]
        assert self.session.receive_handshake(server(*frames)) is None
        assert self.session.data_to_send() == b"PONG\r\n" * pings
        assert self.session.data_to_send() == b""
        # Merged: the nonce of the first INFO stays.
        assert self.session.info is not None and self.session.info.nonce == self.info["nonce"]
        assert self.session.info.connect_urls == tuple(urls)

    @precondition(lambda self: self.phase is Phase.AWAIT_PONG)
    @rule(after=st.integers(0, 3))
    def server_pong(self, after: int) -> None:
        leftover = self.session.receive_handshake(server(b"PONG\r\n", b"PING\r\n" * after))
        assert leftover is not None and len(leftover) == after
        self.phase = Phase.READY

    @precondition(lambda self: self.phase is Phase.READY)
    @rule()
    def establish(self) -> None:
        replay = client_commands(self.session.established())
        self.phase = Phase.CONNECTED
        self.pings_out = 0
        # Every subscription not being drained, exactly once, in the order made, each SUB
        # followed by the UNSUB of what is left of its limit.
        expected: list[tuple[str, list[str]]] = []
        for sid, sub in sorted(self.subs.items()):
            if sid in self.draining:
                continue
            expected.append(("SUB", [sub.subject, *([sub.queue] if sub.queue else []), str(sid)]))
            if sub.max_msgs is not None:
                expected.append(("UNSUB", [str(sid), str(sub.max_msgs - sub.delivered)]))
        assert replay == expected
        sids = [int(args[-1]) for op, args in replay if op == "SUB"]
        assert len(sids) == len(set(sids))

    @precondition(lambda self: self.phase not in (Phase.CONNECTED, Phase.CLOSED))
    @rule(data=st.data())
    def whole_handshake(self, data: st.DataObject) -> None:
        """All of the above in one step, so that runs spend their steps connected."""
        self.open_transport()
        self.server_info(nonce=data.draw(st.sampled_from(["n1", "n2"])), split=False)
        self.send_connect()
        self.server_pong(after=0)
        self.establish()

    @precondition(lambda self: self.phase is not Phase.CLOSED)
    @rule()
    def lose_transport(self) -> None:
        self.session.connection_lost()
        self.phase = Phase.IDLE

    # -- subscriptions ------------------------------------------------------------------------

    @precondition(lambda self: self.phase is not Phase.CLOSED)
    @rule(subject=SUBJECTS, queue=QUEUES)
    def subscribe(self, subject: str, queue: str | None) -> None:
        sid = self.session.next_sid(subject, queue)
        assert sid == self.next_sid
        sub = FakeSub(sid, subject, queue)
        sent = self.session.add(sub)
        self.next_sid += 1
        self.subs[sid] = sub
        if self.phase is Phase.CONNECTED:
            assert sent is not None
            assert client_commands(sent) == [
                ("SUB", [subject, *([queue] if queue else []), str(sid)])
            ]
        else:
            assert sent is None

    def _pick(self, data: st.DataObject) -> FakeSub | None:
        if not self.subs:
            return None
        return self.subs[data.draw(st.sampled_from(sorted(self.subs)))]

    @rule(data=st.data(), n=st.integers(1, 5))
    def deliver(self, data: st.DataObject, n: int) -> None:
        sub = self._pick(data)
        if sub is not None:  # the driver counts what it routed
            sub.delivered += n
            if sub.max_msgs is not None and sub.delivered >= sub.max_msgs:
                self.session.forget(sub.sid)  # reached its limit: the driver forgets it
                self._gone(sub.sid)

    @rule(data=st.data(), extra=st.integers(1, 5))
    def limit(self, data: st.DataObject, extra: int) -> None:
        sub = self._pick(data)
        if sub is None:
            return
        sub.max_msgs = sub.delivered + extra
        sent = self.session.limit(sub.sid, sub.max_msgs)
        if self.phase is Phase.CONNECTED:
            assert sent is not None
            assert client_commands(sent) == [("UNSUB", [str(sub.sid), str(sub.max_msgs)])]
        else:
            assert sent is None

    @rule(data=st.data())
    def unsubscribe(self, data: st.DataObject) -> None:
        sub = self._pick(data)
        if sub is None:
            return
        sent = self.session.unsubscribe(sub.sid)
        self._gone(sub.sid)
        if self.phase is Phase.CONNECTED:
            assert sent is not None and client_commands(sent) == [("UNSUB", [str(sub.sid)])]
        else:
            assert sent is None

    @rule(data=st.data())
    def drain(self, data: st.DataObject) -> None:
        sub = self._pick(data)
        if sub is None:
            return
        sent = self.session.stop_replay(sub.sid)
        self.draining.add(sub.sid)
        if self.phase is Phase.CONNECTED:
            assert sent is not None and client_commands(sent) == [("UNSUB", [str(sub.sid)])]
        else:
            assert sent is None

    def _gone(self, sid: int) -> None:
        del self.subs[sid]
        self.draining.discard(sid)

    # -- connected: PING/PONG, INFO, -ERR -----------------------------------------------------

    @precondition(lambda self: self.phase is Phase.CONNECTED)
    @rule(step=st.floats(0.5, 5.0))
    def ping_timer(self, step: float) -> None:
        self.now += step
        if self.pings_out >= self.max_pings:
            with pytest.raises(StaleConnectionError):
                self.session.ping_due(self.now)
            # The driver ends the transport with that error.
            self.session.connection_lost()
            self.phase = Phase.IDLE
            return
        self.session.ping_due(self.now)
        self.pings_out += 1
        assert self.session.last_ping_at == self.now

    @precondition(lambda self: self.phase is Phase.CONNECTED)
    @rule()
    def pong(self) -> None:
        (event,) = server(b"PONG\r\n")
        assert self.session.receive(event) == PongReceived()
        self.pings_out = 0

    @precondition(lambda self: self.phase is Phase.CONNECTED)
    @rule()
    def ping(self) -> None:
        (event,) = server(b"PING\r\n")
        assert self.session.receive(event) == SendNow(b"PONG\r\n")

    @precondition(lambda self: self.phase is Phase.CONNECTED)
    @rule(urls=st.lists(st.sampled_from(["x:1", "y:2", "z:3"]), max_size=3), ldm=st.booleans())
    def info_update(self, urls: list[str], ldm: bool) -> None:
        (event,) = server(info(connect_urls=urls, ldm=ldm))
        notice = self.session.receive(event)
        assert isinstance(notice, InfoChanged)
        assert notice.info.connect_urls == tuple(urls) and notice.info.lame_duck_mode is ldm
        assert notice.info.nonce == self.info["nonce"]  # kept from the handshake INFO

    @precondition(lambda self: self.phase is Phase.CONNECTED)
    @rule(error=ERRORS)
    def server_error(self, error: tuple[str, type[Exception], bool]) -> None:
        text, kind, terminal = error
        (event,) = server(err(text))
        notice = self.session.receive(event)
        assert isinstance(notice, ServerErrorReport)
        assert type(notice.error) is kind and notice.terminal is terminal
        assert notice.ended is None
        if terminal:  # the server closes the connection after it
            self.session.connection_lost()
            self.phase = Phase.IDLE

    @precondition(lambda self: self.phase is Phase.CONNECTED)
    @rule(data=st.data())
    def subscription_refused(self, data: st.DataObject) -> None:
        sub = self._pick(data)
        if sub is None:
            return
        queue = f' using queue "{sub.queue}"' if sub.queue else ""
        (event,) = server(err(f'Permissions Violation for Subscription to "{sub.subject}"{queue}'))
        notice = self.session.receive(event)
        assert isinstance(notice, ServerErrorReport) and not notice.terminal
        assert isinstance(notice.error, PermissionViolation)
        # The first subscription with that subject and queue ends, and only that one.
        first = min(
            s for s, v in self.subs.items() if (v.subject, v.queue) == (sub.subject, sub.queue)
        )
        assert notice.ended is self.subs[first]
        self._gone(first)

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        assert self.session.phase is self.phase
        assert self.session.connected is (self.phase is Phase.CONNECTED)
        assert sorted(self.session.subs) == sorted(self.subs)
        if self.phase is Phase.CONNECTED:
            assert self.session.pings_out == self.pings_out


SessionMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSession = SessionMachine.TestCase


# -- single situations ------------------------------------------------------------------------


def test_out_of_order_calls_are_refused() -> None:
    session = new_session()
    with pytest.raises(RuntimeError):
        session.connect_command(tls=False, auth={})
    session.connection_made("s")
    with pytest.raises(RuntimeError):
        session.established()
    with pytest.raises(RuntimeError):
        session.ping_due(0.0)


def test_the_server_must_speak_first_with_info() -> None:
    session = new_session()
    session.connection_made("nats://h:1")
    with pytest.raises(ProtocolError, match="did not start with INFO"):
        session.receive_info(server(b"PING\r\n"))
    session.connection_made("nats://h:1")
    with pytest.raises(ServerError, match="maximum connections"):
        session.receive_info(server(err("maximum connections exceeded")))


def test_errors_during_the_handshake_are_typed() -> None:
    session = new_session()
    session.connection_made("nats://h:1")
    session.receive_info(server(info()))
    session.connect_command(tls=False, auth={})
    with pytest.raises(AuthorizationError):
        session.receive_handshake(server(err("Authorization Violation")))
    session.connection_made("nats://h:1")
    session.receive_info(server(info()))
    session.connect_command(tls=False, auth={})
    with pytest.raises(ServerError, match="nats://h:1 refused the connection: nope"):
        session.receive_handshake(server(err("nope")))


@pytest.mark.parametrize(
    ("fields", "want", "upgrade"),
    [
        ({}, False, False),
        ({"tls_required": True}, False, True),
        ({"tls_available": True}, True, True),
        ({}, True, TLSError),
    ],
)
def test_whether_to_upgrade_to_tls(fields: dict[str, Any], want: bool, upgrade: Any) -> None:
    session = new_session()
    session.connection_made("nats://h:1")
    session.receive_info(server(info(**fields)))
    if upgrade is TLSError:
        with pytest.raises(TLSError):
            session.upgrade_tls(want_tls=want, tls_first=False, buffered=False)
    else:
        assert session.upgrade_tls(want_tls=want, tls_first=False, buffered=False) is upgrade
    # Implicit TLS (tls_first) was done before INFO: never again.
    assert session.upgrade_tls(want_tls=want, tls_first=True, buffered=False) is False


def test_no_plain_bytes_may_precede_a_tls_upgrade() -> None:
    session = new_session()
    session.connection_made("nats://h:1")
    session.receive_info(server(info(tls_required=True), b"PING\r\n"))
    with pytest.raises(ProtocolError, match="before the TLS upgrade"):
        session.upgrade_tls(want_tls=False, tls_first=False, buffered=False)


def test_a_bad_subject_changes_nothing() -> None:
    session = new_session()
    with pytest.raises(ProtocolError):
        session.next_sid("a b", None)
    assert session.next_sid("ok", None) == 1
    with pytest.raises(ValueError, match="not given out"):
        session.add(FakeSub(7, "ok", None))
    assert session.subs == {}


def test_closing_ends_every_subscription_for_good() -> None:
    session = new_session()
    handshaken(session)
    session.established()
    subs = []
    for subject in ("a", "b"):
        subs.append(FakeSub(session.next_sid(subject, None), subject, None))
        assert session.add(subs[-1]) == f"SUB {subject} {subs[-1].sid}\r\n".encode()
    assert session.close() == subs
    assert session.subs == {} and session.phase is Phase.CLOSED
    session.connection_lost()  # the driver's session task ends after the close
    assert session.phase is Phase.CLOSED
    assert session.stop_replay(1) is None and session.unsubscribe(1) is None
    with pytest.raises(RuntimeError):
        session.connection_made("s")


def test_a_draining_subscription_is_not_replayed_but_still_routed() -> None:
    session = new_session()
    handshaken(session)
    assert session.established() == b""
    for subject in ("a", "b"):
        session.add(FakeSub(session.next_sid(subject, None), subject, None))
    assert session.stop_replay(1) == b"UNSUB 1\r\n"
    assert 1 in session.subs  # its last messages are still routed
    session.connection_lost()
    handshaken(session)
    assert session.established() == b"SUB b 2\r\n"


def test_the_session_does_no_io() -> None:
    """It imports nothing that could wait, read a clock or touch a socket."""
    import ast
    import inspect

    from headrace.protocol import session

    tree = ast.parse(inspect.getsource(session))
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    allowed = {"__future__", "enum", "collections.abc", "typing", "attrs", "headrace.errors"}
    assert {m for m in imported if m and not m.startswith("headrace.protocol.")} <= allowed
