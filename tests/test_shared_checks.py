"""The checks the layers share (issue 12): one validator per rule, one message size, one PING.

Each rule used to be written in several modules, and the copies had drifted: a NaN delay was
refused by ``ConnectOptions`` but accepted by ``RetryPolicy``, and ``BatchPolicy`` said
"must be positive" of a field that may also be ``None``. These tests hold every options class
to the one rule and the one wording.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import headrace.localserver
import headrace.protocol.events as events
import pytest
from headrace.checkpoints import RetryPolicy
from headrace.jetstream import ConsumeOptions, PullRequest
from headrace.nats import ConnectOptions
from headrace.pipeline import BatchPolicy, SinkRetry
from headrace.protocol import PING, PONG, Msg, Ping, Pong
from headrace.protocol.events import PING_EVENT, PONG_EVENT, messages_size

from tests import servers

NEGATIVE = r"^{} must not be negative, not {}$"
POSITIVE = r"^{} must be positive, not {}$"
POSITIVE_OR_NONE = r"^{} must be positive or None, not {}$"


@pytest.mark.parametrize(
    ("make", "name", "value", "pattern"),
    [
        (lambda v: ConnectOptions(reconnect_wait=v), "reconnect_wait", -1.0, NEGATIVE),
        (lambda v: RetryPolicy(initial_delay=v), "initial_delay", -1.0, NEGATIVE),
        (lambda v: RetryPolicy(initial_delay=v), "initial_delay", math.nan, NEGATIVE),
        (lambda v: RetryPolicy(max_delay=v), "max_delay", math.nan, NEGATIVE),
        (lambda v: ConnectOptions(ping_interval=v), "ping_interval", 0.0, POSITIVE),
        (lambda v: SinkRetry(backoff=v), "backoff", math.nan, POSITIVE),
        (lambda v: SinkRetry(deadline=v), "deadline", 0.0, POSITIVE_OR_NONE),
        (lambda v: BatchPolicy(max_bytes=v), "max_bytes", 0, POSITIVE_OR_NONE),
        (lambda v: PullRequest(expires=v), "expires", -2.0, POSITIVE_OR_NONE),
    ],
)
def test_one_rule_and_one_wording_in_every_layer(
    make: Callable[[float], object], name: str, value: float, pattern: str
) -> None:
    with pytest.raises(ValueError, match=pattern.format(name, value)):
        make(value)


def test_a_count_of_at_least_one() -> None:
    with pytest.raises(ValueError, match=r"^max_messages must be at least 1, not 0$"):
        ConsumeOptions(max_messages=0)
    assert ConsumeOptions(max_bytes=None).max_bytes is None


def test_messages_size_is_the_sum_of_msg_size() -> None:
    batch = [
        Msg("a", 1, None, b"12345"),
        Msg("a.b", 1, "r", b"", b"NATS/1.0\r\nA: b\r\n\r\n"),
        Msg("c", 2, None, b"xy", b"NATS/1.0 408 Request Timeout\r\n\r\n"),
    ]
    assert [m.size for m in batch] == [5, 18, 34]
    assert messages_size(batch) == 57
    assert messages_size([]) == 0


def test_ping_is_the_command_and_the_events_have_their_own_names() -> None:
    assert (PING, PONG) == (b"PING\r\n", b"PONG\r\n")
    assert isinstance(PING_EVENT, Ping) and isinstance(PONG_EVENT, Pong)
    # The old names are gone (nothing is deprecated before a release: issue 25).
    for old in ("PING", "PONG", "OK", "NOT_A_NAME"):
        assert not hasattr(events, old)


def test_the_test_servers_find_the_binary_and_ports_as_the_library_does() -> None:
    assert servers.free_port is headrace.localserver.free_port
    assert servers.READY_LINE == headrace.localserver.READY_LINE
    assert servers.nats_server_binary() == headrace.localserver.find_nats_server()
