"""The reconnect decisions (``headrace.nats.redial``): a hypothesis state machine against a
model, with no socket and no clock but the one the test advances.

The model keeps, per server, when it was last dialled and how many dials in a row failed, and
the attempts since the last handshake; the rules are ADR-40's as the module docs state them.
"""

from __future__ import annotations

import random

import pytest
from headrace.errors import AuthorizationError, ConnectionClosedError, TLSError
from headrace.nats.redial import Dial, GiveUp, Redial, fatal_on_first_connect
from headrace.nats.servers import PoolEntry, ServerPool
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

WAIT = 0.25
WAIT_MAX = 2.0


class RedialMachine(RuleBasedStateMachine):
    """Dials, failures, handshakes and losses in any order; the clock only moves forward."""

    @initialize(
        servers=st.integers(1, 4),
        max_attempts=st.none() | st.integers(0, 6),
        jitter=st.sampled_from([0.0, 0.25]),
    )
    def start(self, servers: int, max_attempts: int | None, jitter: float) -> None:
        urls = [f"nats://127.0.0.1:{4222 + i}" for i in range(servers)]
        self.pool = ServerPool(urls, randomize=False)
        self.redial = Redial(
            self.pool,
            max_attempts=max_attempts,
            wait=WAIT,
            wait_max=WAIT_MAX,
            jitter=jitter,
            rng=random.Random(0),
        )
        self.max_attempts = max_attempts
        self.jitter = jitter
        self.now = 100.0
        self.last_dial: dict[str, float] = {}
        self.failures: dict[str, int] = {u: 0 for u in self.hostports()}
        self.attempts = 0
        self.dialled: PoolEntry | None = None  # dial in progress
        self.connected: PoolEntry | None = None
        self.gave_up = False
        self.last_error: BaseException | None = None

    def hostports(self) -> list[str]:
        return [e.address.hostport for e in self.pool.entries]

    @rule(seconds=st.floats(0, 5))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @precondition(lambda self: self.dialled is None and self.connected is None and not self.gave_up)
    @rule()
    def next_dial(self) -> None:
        order = self.hostports()
        step = self.redial.next()
        if self.max_attempts is not None and self.attempts >= self.max_attempts:
            assert type(step) is GiveUp
            if self.last_error is None:
                assert isinstance(step.error, ConnectionClosedError)
            else:
                assert step.error is self.last_error
            self.gave_up = True
            return
        assert type(step) is Dial
        key = step.entry.address.hostport
        assert key == order[0], "the rotation's head is dialled next"
        assert self.hostports()[-1] == key, "and goes to the back"
        if key not in self.last_dial:
            assert step.at == float("-inf"), "a server never dialled is dialled at once"
        else:
            base = min(WAIT_MAX, WAIT * 2 ** (max(self.failures[key], 1) - 1))
            low, high = base * (1 - self.jitter), base * (1 + self.jitter)
            waited = step.at - self.last_dial[key]
            assert low - 1e-9 <= waited <= high + 1e-9, (waited, low, high)
        # The driver sleeps until step.at, then dials.
        self.now = max(self.now, step.at)
        self.redial.dialing(step.entry, self.now)
        self.last_dial[key] = self.now
        self.dialled = step.entry

    @precondition(lambda self: self.dialled is not None)
    @rule(kind=st.sampled_from([OSError, ConnectionResetError, AuthorizationError]))
    def dial_fails(self, kind: type[Exception]) -> None:
        assert self.dialled is not None
        error = kind("refused")
        self.redial.failed(self.dialled, error)
        self.failures[self.dialled.address.hostport] += 1
        self.attempts += 1
        self.last_error = error
        assert self.dialled.last_error is error
        self.dialled = None

    @precondition(lambda self: self.dialled is not None)
    @rule()
    def handshake_completes(self) -> None:
        assert self.dialled is not None
        self.redial.connected(self.dialled)
        self.failures[self.dialled.address.hostport] = 0
        self.attempts = 0
        assert self.dialled.did_connect
        self.connected, self.dialled = self.dialled, None

    @precondition(lambda self: self.connected is not None and len(self.failures) < 8)
    @rule()
    def servers_discovered(self) -> None:
        """INFO ``connect_urls`` add servers behind the one we are connected to."""
        assert self.connected is not None
        port = 5000 + len(self.failures)
        added = self.pool.add_discovered([f"127.0.0.1:{port}"], source=self.connected)
        assert [a.hostport for a in added] == [f"127.0.0.1:{port}"]
        self.failures[f"127.0.0.1:{port}"] = 0

    @precondition(lambda self: self.connected is not None)
    @rule()
    def connection_lost(self) -> None:
        assert self.connected is not None
        self.redial.lost(self.connected)
        assert self.hostports()[-1] == self.connected.address.hostport, "tried last"
        self.connected = None

    @invariant()
    def counts_agree(self) -> None:
        if not hasattr(self, "redial"):
            return
        assert self.redial.attempts == self.attempts
        for entry in self.pool.entries:
            assert entry.failed_attempts == self.failures[entry.address.hostport]


TestRedial = RedialMachine.TestCase


def test_first_pass_after_a_loss_is_immediate() -> None:
    """ADR-40: after a loss, the servers never dialled are dialled at once; the lost one,
    dialled before, waits its backoff."""
    pool = ServerPool(["a:1", "b:2", "c:3"], randomize=False)
    redial = Redial(pool, max_attempts=None, wait=1.0, wait_max=8.0, jitter=0.0)
    first = redial.next()
    assert type(first) is Dial
    redial.dialing(first.entry, 10.0)
    redial.connected(first.entry)
    redial.lost(first.entry)
    again = [redial.next() for _ in range(3)]
    assert [type(s) for s in again] == [Dial, Dial, Dial]
    assert [s.at for s in again if type(s) is Dial] == [float("-inf"), float("-inf"), 11.0]


def test_no_attempts_allowed_gives_up_with_a_clear_error() -> None:
    redial = Redial(ServerPool(["a:1"]), max_attempts=0, wait=0.1, wait_max=1.0, jitter=0.0)
    step = redial.next()
    assert type(step) is GiveUp
    assert "no reconnect attempts allowed" in str(step.error)


@pytest.mark.parametrize(
    ("error", "fatal"),
    [(AuthorizationError("no"), True), (TLSError("bad cert"), True), (OSError("refused"), False)],
)
def test_what_ends_a_first_connect_at_once(error: BaseException, fatal: bool) -> None:
    assert fatal_on_first_connect(error) is fatal
