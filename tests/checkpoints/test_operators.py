"""Operators' views and actions on checkpoints, from Python and from `headrace checkpoints`,
against a real KV bucket."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.checkpoints import (
    Checkpoint,
    CheckpointError,
    CheckpointId,
    CheckpointMoved,
    CheckpointStore,
    GiveUp,
    Retry,
    Status,
    operators,
)
from headrace.jetstream import JetStream
from headrace.jetstream.kv import KeyValueConfig, create_key_value
from headrace.nats import connect

HEADRACE = str(Path(sys.executable).parent / "headrace")
FAILED = CheckpointId("billing", "ledger", "orders.2")
LAGGING = CheckpointId("billing", "ledger", "orders.3")
RESERVED = CheckpointId("billing", "ledger", "orders.4")
OTHER = CheckpointId("shipping", "labels", "orders.2")


async def seed(store: CheckpointStore) -> None:
    boom = ValueError("cannot bill")
    await store.change(
        FAILED, lambda cp: cp.seen(9).advanced(4).failed(boom, GiveUp(10), 0, 7), create=True
    )
    await store.change(LAGGING, lambda cp: cp.seen(8), create=True)
    await store.change(RESERVED, lambda cp: cp.seen(6).reserve("host-a", 1000, 300), create=True)
    await store.change(OTHER, lambda cp: cp.seen(2).advanced(2), create=True)


@pytest.fixture
async def store(nats_server: Any) -> Any:
    async with connect(nats_server.url) as nc:
        kv = await create_key_value(JetStream(nc), KeyValueConfig(bucket="checkpoints"))
        s = CheckpointStore(kv)
        await seed(s)
        yield s


async def test_views(store: CheckpointStore) -> None:
    def ids(cps: list[Any]) -> list[CheckpointId]:
        return [cp.id for cp in cps]

    assert ids(await operators.view(store, "list")) == sorted([FAILED, LAGGING, RESERVED, OTHER])
    assert ids(await operators.view(store, "list", "shipping")) == [OTHER]
    # Lagging is version ahead of position, whatever the status: the failed one is behind.
    assert ids(await operators.view(store, "lagging")) == [FAILED, LAGGING, RESERVED]
    assert ids(await operators.view(store, "failed")) == [FAILED]
    assert ids(await operators.view(store, "reservations", clock=lambda: 1100)) == [RESERVED]
    assert ids(await operators.view(store, "reservations", clock=lambda: 1300)) == []
    with pytest.raises(ValueError, match="no view"):
        await operators.view(store, "stuck")


async def test_lagging_shows_checkpoints_behind_in_retry_or_failed(
    store: CheckpointStore,
) -> None:
    retrying = CheckpointId("billing", "ledger", "orders.5")
    caught_up = CheckpointId("billing", "ledger", "orders.6")
    boom = ValueError("down")
    await store.change(
        retrying, lambda cp: cp.seen(12).advanced(3).failed(boom, Retry(2, 30), 0, 5), create=True
    )
    # Failed on its last message, then skipped: position = version, not lagging any more.
    await store.change(
        caught_up, lambda cp: cp.seen(7).failed(boom, GiveUp(1), 0, 7).skip(), create=True
    )
    lagging = await operators.view(store, "lagging", "billing")
    assert [(cp.id, cp.status) for cp in lagging] == [
        (FAILED, Status.FAILED),
        (LAGGING, Status.ACTIVE),
        (RESERVED, Status.ACTIVE),
        (retrying, Status.RETRY),
    ]
    assert all(cp.version > cp.position for cp in lagging)


async def test_actions(store: CheckpointStore) -> None:
    retried = await operators.retry(store, FAILED, clock=lambda: 5000)
    assert (retried.status, retried.retry_at, retried.attempt) == (Status.RETRY, 5000, 1)
    skipped = await operators.skip(store, FAILED, failing=7)
    assert (skipped.status, skipped.position) == (Status.ACTIVE, 7)
    released = await operators.release(store, RESERVED)
    assert released.reservation is None
    with pytest.raises(CheckpointError, match="nothing to retry"):
        await operators.retry(store, LAGGING)
    with pytest.raises(CheckpointError, match="nothing to skip"):
        await operators.skip(store, LAGGING, failing=1)


async def cli(*args: str) -> tuple[int, str, str]:
    with trio.fail_after(30):
        done = await trio.run_process(
            [HEADRACE, "checkpoints", *args], capture_stdout=True, capture_stderr=True, check=False
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.mark.slow
async def test_command_line(store: CheckpointStore, nats_server: Any) -> None:
    url = ("--nats", nats_server.url)
    code, out, err = await cli("failed", *url)
    assert code == 0, err
    (line,) = out.splitlines()
    assert line.startswith("billing/ledger/orders.2  failed  4/9")
    assert "failing #7" in line and "error: ValueError: cannot bill" in line
    code, out, _ = await cli("lagging", "--json", *url)
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in rows] == [
        "billing/ledger/orders.2",
        "billing/ledger/orders.3",
        "billing/ledger/orders.4",
    ]
    assert (rows[0]["status"], rows[1]["version"]) == ("failed", 8)
    code, out, err = await cli("skip", "--failing", "7", "billing/ledger/orders.2", *url)
    assert code == 0, err
    assert out.startswith("skipped billing/ledger/orders.2 message #7")
    assert "active  7/9" in out
    stored = await store.get(FAILED)
    assert stored is not None and stored.checkpoint.position == 7
    # the KV key works as an ID too
    code, out, err = await cli("release", RESERVED.key, *url)
    assert code == 0 and "reserved by" not in out, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["retry", "billing/ledger/orders.3"], "nothing to retry"),
        (["skip", "--failing", "3", "billing/ledger/nope"], "no such checkpoint"),
        (["skip", "billing/ledger/orders.2"], "skip needs --failing S"),
        (["skip", "--failing", "8", "billing/ledger/orders.2"], "not failing at message #8"),
        (["release", "--failing", "7", "billing/ledger/orders.2"], "takes no --failing"),
        (["retry"], "retry needs an ID"),
        (["failed", "billing/ledger/orders.2"], "failed takes no ID"),
        (["list", "--bucket", "missing"], "missing"),
    ],
)
async def test_command_line_errors(
    store: CheckpointStore, nats_server: Any, args: list[str], message: str
) -> None:
    code, _, err = await cli(*args, "--nats", nats_server.url)
    assert code == 2
    assert message in err and "Traceback" not in err, err


def test_retry_decisions_are_values() -> None:
    assert Retry(1, 2.0) == Retry(1, 2.0) and GiveUp(3) != GiveUp(4)


async def test_skip_and_retry_act_only_at_the_position_they_name(store: CheckpointStore) -> None:
    with pytest.raises(CheckpointMoved, match="at position 4, not 3"):
        await operators.skip(store, FAILED, failing=7, position=3)
    skipped = await operators.skip(store, FAILED, failing=7, position=4)
    assert (skipped.status, skipped.position) == (Status.ACTIVE, 7)
    # The next message fails too; the same skip again must not skip it.
    await store.change(FAILED, lambda cp: cp.failed(ValueError("again"), GiveUp(10), 0, 8))
    with pytest.raises(CheckpointMoved, match="not failing at message #7"):
        await operators.skip(store, FAILED, failing=7)
    after = await store.get(FAILED)
    assert after is not None and (after.checkpoint.position, after.checkpoint.failing_seq) == (
        7,
        8,
    )
    retried = await operators.retry(store, FAILED, position=7, clock=lambda: 5000)
    assert (retried.status, retried.attempt, retried.retry_at) == (Status.RETRY, 1, 5000)
    with pytest.raises(CheckpointMoved, match="already due for a retry"):
        await operators.retry(store, FAILED, position=7, clock=lambda: 5001)
    with pytest.raises(CheckpointMoved, match="at position 7, not 6"):
        await operators.retry(store, FAILED, position=6)
    with pytest.raises(ValueError, match="not negative"):
        await operators.skip(store, FAILED, failing=8, position=-1)
    with pytest.raises(ValueError, match="at least 1"):
        await operators.skip(store, FAILED, failing=0)
    with pytest.raises(CheckpointMoved, match="not failing at message #9"):
        await operators.retry(store, FAILED, failing=9)


async def test_a_skip_run_again_refuses_a_new_failure_at_the_same_position(
    store: CheckpointStore,
) -> None:
    """A failure that does not move the position (events gone from the stream: position and
    failing message are the version), skipped, then a new failure at the same position: the
    same skip again names the old message, so it is refused instead of losing the new one."""
    gone = Checkpoint(id=FAILED, version=9, position=9).failed(ValueError("gone"), GiveUp(0), 0, 9)
    await store.change(FAILED, lambda cp: gone)
    skipped = await operators.skip(store, FAILED, failing=9, position=9)
    assert (skipped.status, skipped.position) == (Status.ACTIVE, 9)
    await store.change(FAILED, lambda cp: cp.seen(11).failed(ValueError("new"), GiveUp(0), 0, 11))
    with pytest.raises(CheckpointMoved, match="not failing at message #9"):
        await operators.skip(store, FAILED, failing=9, position=9)
    after = await store.get(FAILED)
    assert after is not None and after.checkpoint.failing_seq == 11


async def twice_at_once(*args: str) -> list[tuple[int, str, str]]:
    results: list[tuple[int, str, str]] = []

    async def one() -> None:
        results.append(await cli(*args))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        nursery.start_soon(one)
    return results


@pytest.mark.slow  # four command-line processes
async def test_the_same_skip_or_retry_from_two_commands_at_once_acts_once(
    store: CheckpointStore, nats_server: Any
) -> None:
    url = ("--nats", nats_server.url)
    results = await twice_at_once("skip", "--failing", "7", str(FAILED), *url)
    assert sorted(code for code, _, _ in results) == [0, 2], results
    (refused,) = [err for code, _, err in results if code == 2]
    assert "nothing to skip" in refused or "moved" in refused or "changed" in refused, refused
    (acted,) = [out for code, out, _ in results if code == 0]
    assert acted.startswith("skipped billing/ledger/orders.2 message #7")
    # Fail it again at the next message: only a retry now, from two commands at once.
    await store.change(FAILED, lambda cp: cp.failed(ValueError("again"), GiveUp(10), 0, 8))
    results = await twice_at_once("retry", str(FAILED), *url)
    assert sorted(code for code, _, _ in results) == [0, 2], results
    (refused,) = [err for code, _, err in results if code == 2]
    assert "already due" in refused or "changed since it was read" in refused, refused
    after = await store.get(FAILED)
    assert after is not None
    assert (after.checkpoint.position, after.checkpoint.status) == (7, Status.RETRY)
    # A skip naming the message (and the position) it was shown is refused once the
    # checkpoint moved on.
    code, _, err = await cli("skip", str(FAILED), "--failing", "7", "--position", "4", *url)
    assert code == 2 and "not failing at message #7" in err, err
    code, _, err = await cli("skip", str(FAILED), "--failing", "8", "--position", "4", *url)
    assert code == 2 and "at position 7, not 4" in err, err
    code, _, err = await cli("release", str(FAILED), "--position", "7", *url)
    assert code == 2 and "release takes no --position" in err, err
