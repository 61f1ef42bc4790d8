"""The checkpoint values and rules of Beckett's model, without a server: keys, stored form,
transitions and the retry policy. (The KV-backed workers are tested against nats-server.)"""

from __future__ import annotations

import random

import attrs
import pytest
from headrace.checkpoints import (
    AlreadyReserved,
    Checkpoint,
    CheckpointError,
    CheckpointId,
    GiveUp,
    InvalidCheckpoint,
    Retry,
    RetryPolicy,
    Status,
)
from hypothesis import given
from hypothesis import strategies as st

parts = st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s)
KEY_TOKEN_CHARS = set("-/_=abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


@given(parts, parts, parts)
def test_keys_are_valid_kv_keys_and_read_back(group: str, sub: str, stream: str) -> None:
    cid = CheckpointId(group, sub, stream)
    tokens = cid.key.split(".")
    assert len(tokens) == 3
    assert all(tok and set(tok) <= KEY_TOKEN_CHARS for tok in tokens)
    assert CheckpointId.from_key(cid.key) == cid


def test_entity_subject_dots_are_escaped() -> None:
    cid = CheckpointId("billing", "invoices", "orders.42")
    assert cid.key == "billing.invoices.orders=2E42"
    assert str(cid) == "billing/invoices/orders.42"


@pytest.mark.parametrize("key", ["a.b", "a.b.c.d", "a.b.=ZZ", "a.b.c*", "a..c"])
def test_bad_keys_are_refused(key: str) -> None:
    with pytest.raises(InvalidCheckpoint):
        CheckpointId.from_key(key)


CID = CheckpointId("g", "s", "orders.1")


def test_lagging_only_when_active_and_behind() -> None:
    cp = Checkpoint(id=CID)
    assert not cp.lagging
    cp = cp.seen(5)
    assert cp.lagging
    assert cp.seen(3).version == 5  # never moves back
    assert not cp.advanced(5).lagging
    failed = cp.failed(ValueError("x"), GiveUp(10), now=0)
    assert failed.status is Status.FAILED and not failed.lagging


def test_reservations_exclude_others_until_they_expire() -> None:
    cp = Checkpoint(id=CID).seen(1).reserve("host-a", now=100, timeout=300)
    assert cp.reserved(now=399) and not cp.reserved(now=400)
    with pytest.raises(AlreadyReserved, match="host-a"):
        cp.reserve("host-b", now=200, timeout=300)
    assert cp.reserve("host-a", now=200, timeout=300).reservation.expires_at == 500  # renewed
    taken = cp.reserve("host-b", now=401, timeout=300)  # expired: recovered by another host
    assert taken.reservation.owner == "host-b"
    assert cp.release().reservation is None
    with pytest.raises(ValueError):
        cp.reserve("host-a", now=0, timeout=0)


def test_failure_retry_success_cycle() -> None:
    policy = RetryPolicy(jitter=False, max_retries=2, initial_delay=10, max_delay=15)
    cp = Checkpoint(id=CID, version=3, position=1).reserve("h", now=0, timeout=300)
    boom = RuntimeError("db down")
    cp = cp.failed(boom, policy.decide(boom, cp.failed_retries), now=1000)
    assert (cp.status, cp.attempt, cp.retry_at, cp.reservation) == (Status.RETRY, 1, 1010, None)
    assert cp.error == "RuntimeError: db down"
    assert cp.retry_due(1010) and not cp.retry_due(1009)
    cp = cp.failed(boom, policy.decide(boom, cp.failed_retries), now=1010)
    assert (cp.attempt, cp.retry_at) == (2, 1025)  # 20 s capped at 15
    cp = cp.failed(boom, policy.decide(boom, cp.failed_retries), now=1025)
    assert cp.status is Status.FAILED and cp.retry_at is None
    # an operator retries it; it then succeeds and is active again
    cp = cp.retry_now(now=2000)
    assert cp.retry_due(2000) and cp.attempt == 1
    cp = cp.advanced(2)
    assert (cp.status, cp.attempt, cp.error, cp.retry_at) == (Status.ACTIVE, 0, None, None)
    assert cp.lagging  # message 3 still to do


def test_skip_moves_past_the_failing_message() -> None:
    cp = Checkpoint(id=CID, version=4, position=1)
    with pytest.raises(CheckpointError, match="active"):
        cp.skip()
    with pytest.raises(CheckpointError, match="which message"):
        cp.failed(ValueError("bad payload"), GiveUp(0), now=0).skip()
    failed = cp.failed(ValueError("bad payload"), GiveUp(0), now=0, seq=3)
    assert failed.failing_seq == 3
    skipped = failed.skip()
    assert (skipped.position, skipped.status, skipped.failing_seq) == (3, Status.ACTIVE, None)
    with pytest.raises(ValueError):
        skipped.advanced(1)


def test_counting_never_counts_an_event_twice() -> None:
    cp = Checkpoint(id=CID).counted([3, 5])
    assert (cp.version, cp.seen_events) == (5, 2)
    # The same batch again (redelivered after its write), then one overlapping it.
    assert cp.counted([3, 5]) == cp
    again = cp.counted([5, 8])
    assert (again.version, again.seen_events) == (8, 3)
    assert again.counted([]) == again


def test_a_checkpoint_stored_before_counting_starts_counting_once_caught_up() -> None:
    old = Checkpoint.from_json(CID, b'{"version": 4, "position": 1, "status": "active"}')
    assert old.seen_events is None and old.processed_events is None
    assert old.counted([6]).seen_events is None  # not counted: no false loss later
    caught_up = old.counted([6]).advanced(6)
    assert caught_up.events_missing == 0
    counting = caught_up.caught_up_counts()
    assert (counting.seen_events, counting.processed_events) == (0, 0)
    assert counting.counted([7]).seen_events == 1


def test_missing_events_count_only_once_caught_up() -> None:
    cp = attrs.evolve(Checkpoint(id=CID).counted([1, 2, 3, 4]), processed_events=1)
    assert cp.events_missing == 0  # behind: the rest may still come
    assert cp.advanced(4).events_missing == 3
    assert attrs.evolve(cp.advanced(4), processed_events=5).events_missing == 0


def test_skip_counts_the_skipped_event_or_accepts_what_is_missing() -> None:
    cp = attrs.evolve(Checkpoint(id=CID).counted([1, 2, 3]), processed_events=1)
    handler_failed = cp.advanced(1).failed(ValueError("x"), GiveUp(0), now=0, seq=2)
    skipped = handler_failed.skip()
    assert (skipped.position, skipped.processed_events) == (2, 2)
    gone = cp.advanced(1).failed(ValueError("gone"), GiveUp(0), now=0, seq=3)
    accepted = gone.skip()
    assert (accepted.position, accepted.processed_events, accepted.seen_events) == (3, 3, 3)


checkpoints = st.builds(
    Checkpoint,
    id=st.just(CID),
    version=st.integers(0, 10**12),
    position=st.integers(0, 10**12),
    status=st.sampled_from(Status),
    attempt=st.integers(0, 50),
    retry_at=st.none() | st.floats(0, 2e9),
    error=st.none() | st.text(max_size=50),
    failing_seq=st.none() | st.integers(0, 10**12),
    seen_events=st.none() | st.integers(0, 10**9),
    processed_events=st.none() | st.integers(0, 10**9),
    reservation=st.none()
    | st.builds(
        lambda o, t: Checkpoint(id=CID).reserve(o, 0, t).reservation,
        st.text(min_size=1, max_size=10),
        st.floats(1, 1e6),
    ),
)


@given(checkpoints)
def test_stored_form_round_trips(cp: Checkpoint) -> None:
    assert Checkpoint.from_json(CID, cp.to_json()) == cp


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"version": 1, "status": "active"}', "position"),
        (b'{"version": "1", "position": 0, "status": "active"}', "integer"),
        (b'{"version": 1, "position": 0, "status": "sleeping"}', "sleeping"),
        (b'{"version": -1, "position": 0, "status": "active"}', "negative"),
        (
            b'{"version": 1, "position": 0, "status": "active", "reserved_by": "h"}',
            "reserved_until",
        ),
    ],
)
def test_unreadable_stored_checkpoints_say_why(data: bytes, why: str) -> None:
    with pytest.raises(InvalidCheckpoint, match=why) as caught:
        Checkpoint.from_json(CID, data)
    assert "g/s/orders.1" in str(caught.value)


# -- the retry policy ---------------------------------------------------------------------------


@given(st.integers(0, 30), st.integers(0, 2**32))
def test_delays_grow_are_capped_and_jittered_below_the_ceiling(failed: int, seed: int) -> None:
    policy = RetryPolicy(max_retries=100)
    decision = policy.decide(RuntimeError(), failed, random.Random(seed))
    assert isinstance(decision, Retry)
    assert decision.attempt == failed + 1
    ceiling = min(240.0, 10.0 * 2**failed)
    assert policy.ceiling(decision.attempt) == ceiling
    assert 0 <= decision.delay <= ceiling


def test_defaults_are_becketts() -> None:
    policy = RetryPolicy()
    assert (policy.max_retries, policy.initial_delay, policy.max_delay) == (10, 10.0, 240.0)
    assert isinstance(policy.decide(RuntimeError(), 9), Retry)
    assert policy.decide(RuntimeError(), 10) == GiveUp(10)


class ParseError(ValueError):
    pass


def test_per_exception_budgets_most_derived_wins_and_zero_fails_at_once() -> None:
    policy = RetryPolicy(overrides={ValueError: 3, ParseError: 0}, jitter=False)
    assert policy.decide(ParseError("x"), 0) == GiveUp(0)
    assert policy.decide(ValueError("x"), 2) == Retry(3, 40.0)
    assert policy.decide(ValueError("x"), 3) == GiveUp(3)
    assert policy.retries_for(KeyError()) == 10


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_retries": -1}, ValueError),
        ({"initial_delay": 60, "max_delay": 10}, ValueError),
        ({"overrides": {"ValueError": 1}}, TypeError),
        ({"overrides": {ValueError: -1}}, ValueError),
    ],
)
def test_bad_policies_are_refused(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_checkpoints_are_values() -> None:
    cp = Checkpoint(id=CID)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cp.position = 3  # type: ignore[misc]
