"""Checkpoint workers on a real nats-server: per-entity order under concurrency, a poison
entity that never blocks the others, retry then failed, and an operator's skip."""

from __future__ import annotations

import signal
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.checkpoints import (
    Checkpoint,
    CheckpointError,
    CheckpointId,
    CheckpointStore,
    GiveUp,
    GlobalConsumer,
    RetryPolicy,
    Status,
    Subscription,
    SubscriptionGroup,
    operators,
)
from headrace.checkpoints.worker import CheckpointWorkers
from headrace.jetstream import JetStream
from headrace.jetstream.kv import KeyValueConfig, create_key_value, key_value
from headrace.nats import connect

from tests.checkpoints.stored import until_group_stored, until_stored

ENTITIES = 5
EVENTS = 6


async def load(natspy: Any, url: str) -> int:
    """ENTITIES x EVENTS events, interleaved across entities; returns how many."""
    await natspy.connect(url)
    js = natspy.nc.jetstream()
    await natspy.call(js.add_stream, name="EVENTS", subjects=["orders.>"], allow_direct=True)
    for e in range(EVENTS):
        for n in range(1, ENTITIES + 1):
            await natspy.call(js.publish, f"orders.{n}.e{e}", b"%d" % e)
    return ENTITIES * EVENTS


async def until(predicate: Any, timeout: float = 20) -> None:
    # The handlers' own counters have no event to wait on across hosts; polled under a bound.
    with trio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.02)


def billing(handler: Any) -> SubscriptionGroup:
    """Group "billing" with one subscription, "ledger", to every order event."""
    return SubscriptionGroup(
        name="billing",
        subscriptions=[Subscription(name="ledger", subjects=["orders.>"], handler=handler)],
    )


async def settled(store: CheckpointStore, group: str = "billing") -> None:
    """Every checkpoint at its version and released: the last handlers' positions written."""

    def done(seen: dict[CheckpointId, Checkpoint]) -> bool:
        return all(cp.position >= cp.version and cp.reservation is None for cp in seen.values())

    await until_group_stored(store, group, done)


async def test_each_entity_in_order_all_entities_at_once(nats_server: Any, natspy: Any) -> None:
    total = await load(natspy, nats_server.url)
    seen: dict[str, list[int]] = defaultdict(list)
    running = 0
    most = 0

    async def handle(msg: Any) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await trio.sleep(0.005)  # a handler that takes a moment: lets entities overlap
        seen[msg.subject.rsplit(".", 1)[0]].append(msg.seq)
        running -= 1

    group = billing(handle)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        workers = CheckpointWorkers(js, "EVENTS", group, store, concurrency=4, poll_interval=0.05)
        async with trio.open_nursery() as nursery:
            await nursery.start(GlobalConsumer(js, "EVENTS", group, store, max_wait=0.1).run)
            await nursery.start(workers.run)
            await until(lambda: sum(len(v) for v in seen.values()) >= total)
            await settled(store)
            nursery.cancel_scope.cancel()
        checkpoints = [s.checkpoint async for s in store.all("billing")]
    assert sorted(seen) == [f"orders.{n}" for n in range(1, ENTITIES + 1)]
    for seqs in seen.values():
        assert len(seqs) == EVENTS and seqs == sorted(seqs)  # in order, each once
    assert 1 < most <= 4  # entities were processed at the same time, never more than 4
    assert all(cp.position == cp.version and not cp.lagging for cp in checkpoints)
    assert all(cp.reservation is None for cp in checkpoints)


async def test_a_version_raised_during_the_last_write_waits_for_a_slot(
    nats_server: Any, natspy: Any
) -> None:
    """A processing gives its handler slot back while its last position write is on the way.
    Here that write finds the version raised (the handler published the entity's next event
    and waited for it to be counted) while another entity's event waits for the one slot: the
    first processing takes a slot again before handling more, so the two handlers never run
    at once, and each entity's events are handled once, in order."""
    await natspy.connect(nats_server.url)
    js_py = natspy.nc.jetstream()
    await natspy.call(js_py.add_stream, name="EVENTS", subjects=["orders.>"], allow_direct=True)
    handled: list[str] = []
    running = most = 0

    async def handle(msg: Any) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        if msg.subject == "orders.1.e0":
            await js.publish("orders.2.e0", b"")
            ack = await js.publish("orders.1.e1", b"")
            one = CheckpointId("billing", "ledger", "orders.1")
            await until_stored(store, one, lambda cp: cp.version >= ack.seq, timeout=10)
            # orders.2 is lagging too by now; give the dispatcher its chance.
            two = CheckpointId("billing", "ledger", "orders.2")
            await until_stored(store, two, lambda cp: cp.lagging, timeout=10)
        await trio.sleep(0.002)
        handled.append(msg.subject)
        running -= 1

    group = billing(handle)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        workers = CheckpointWorkers(js, "EVENTS", group, store, concurrency=1)
        async with trio.open_nursery() as nursery:
            await nursery.start(GlobalConsumer(js, "EVENTS", group, store, max_wait=0.05).run)
            await nursery.start(workers.run)
            await js.publish("orders.1.e0", b"")
            await until(lambda: len(handled) >= 3)
            await settled(store)
            nursery.cancel_scope.cancel()
    assert most == 1
    assert sorted(handled) == ["orders.1.e0", "orders.1.e1", "orders.2.e0"]
    assert handled.index("orders.1.e0") < handled.index("orders.1.e1")
    assert workers.errors == [] and workers.lost == 0


async def test_a_poison_entity_retries_fails_and_blocks_nobody(
    nats_server: Any, natspy: Any
) -> None:
    total = await load(natspy, nats_server.url)
    handled: list[str] = []
    attempts: list[int] = []

    async def handle(msg: Any) -> None:
        if msg.subject == "orders.2.e1":
            attempts.append(msg.seq)
            raise ValueError("cannot bill this one")
        handled.append(msg.subject)

    group = billing(handle)
    fast = RetryPolicy(max_retries=2, initial_delay=0.05, max_delay=0.1, jitter=False)
    poison = CheckpointId("billing", "ledger", "orders.2")
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        workers = CheckpointWorkers(js, "EVENTS", group, store, retry=fast, poll_interval=0.05)
        async with trio.open_nursery() as nursery:
            await nursery.start(GlobalConsumer(js, "EVENTS", group, store, max_wait=0.1).run)
            await nursery.start(workers.run)
            # everyone else is done; orders.2 stopped at its second event
            await until(lambda: len(handled) >= total - (EVENTS - 1) and len(attempts) >= 3)
            # The third failure is being written.
            stuck = await until_stored(store, poison, lambda cp: cp.status is Status.FAILED, 10)
            assert stuck.error == "ValueError: cannot bill this one"
            assert len(attempts) == 3  # the first try and two retries, then failed
            assert [s for s in handled if s.startswith("orders.2.")] == ["orders.2.e0"]
            # an operator skips the poison message: the rest of orders.2 is processed
            await store.change(poison, lambda cp: cp.skip())
            await until(lambda: len(handled) >= total - 1)
            await settled(store)
            nursery.cancel_scope.cancel()
        final = await store.get(poison)
    assert final is not None and final.checkpoint.status is Status.ACTIVE
    assert final.checkpoint.position == final.checkpoint.version
    assert [s for s in handled if s.startswith("orders.2.")] == [
        f"orders.2.e{e}" for e in range(EVENTS) if e != 1
    ]


async def test_two_hosts_share_a_group_and_never_process_a_checkpoint_together(
    nats_server: Any, natspy: Any
) -> None:
    total = await load(natspy, nats_server.url)
    seen: dict[str, list[tuple[int, str]]] = defaultdict(list)
    inside: set[str] = set()
    overlaps: list[str] = []

    def handler_for(host: str) -> Any:
        async def handle(msg: Any) -> None:
            entity = msg.subject.rsplit(".", 1)[0]
            if entity in inside:
                overlaps.append(entity)  # two hosts inside one entity at once
            inside.add(entity)
            await trio.sleep(0.005)
            seen[entity].append((msg.seq, host))
            inside.discard(entity)

        return handle

    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        hosts = []
        for host in ("a", "b"):
            group = billing(handler_for(host))
            hosts.append(
                CheckpointWorkers(js, "EVENTS", group, store, owner=host, poll_interval=0.02)
            )
        async with trio.open_nursery() as nursery:
            await nursery.start(
                GlobalConsumer(js, "EVENTS", hosts[0].group, store, max_wait=0.1).run
            )
            for workers in hosts:
                await nursery.start(workers.run)
            await until(lambda: sum(len(v) for v in seen.values()) >= total)
            nursery.cancel_scope.cancel()
    assert overlaps == []
    for entries in seen.values():
        seqs = [seq for seq, _ in entries]
        assert len(seqs) == EVENTS and seqs == sorted(seqs)  # each once, in order


@pytest.mark.slow  # a few seconds of timers: the full suite runs it
async def test_a_dead_hosts_reservations_expire_and_are_taken_over(
    nats_server: Any, natspy: Any
) -> None:
    total = await load(natspy, nats_server.url)
    handled: list[int] = []

    async def handle(msg: Any) -> None:
        handled.append(msg.seq)

    group = billing(handle)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        consumer = GlobalConsumer(js, "EVENTS", group, store, max_wait=0.1)
        async with trio.open_nursery() as nursery:
            await nursery.start(consumer.run)
            await until(lambda: consumer.messages >= total)
            nursery.cancel_scope.cancel()
        # A host that was killed holding every checkpoint, its reservations running 2 s more.
        dead_until = time.time() + 2.0
        ids = [s.checkpoint.id async for s in store.all("billing")]
        for cid in ids:
            await store.change(cid, lambda cp: cp.reserve("dead-host", dead_until - 300, 300))
        workers = CheckpointWorkers(
            js, "EVENTS", group, store, owner="alive", poll_interval=0.05, recovery_interval=0.2
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(workers.run)
            await trio.sleep(0.3)  # the test's subject is a wait: nothing may happen before expiry
            assert handled == []
            await until(lambda: len(handled) >= total)
            nursery.cancel_scope.cancel()
    assert time.time() >= dead_until
    assert sorted(handled) == sorted(set(handled)) and len(handled) == total


@pytest.mark.slow
async def test_a_killed_host_is_recovered_and_each_event_handled_once(
    nats_server: Any, natspy: Any
) -> None:
    total = await load(natspy, nats_server.url)
    async with connect(nats_server.url) as nc:
        await create_key_value(JetStream(nc), KeyValueConfig(bucket="cp"))
    # Host 1 runs in a child process and kills itself (SIGKILL) inside the handler of
    # orders.3.e2, holding that checkpoint's reservation (and maybe others).
    child = Path(__file__).with_name("kill_child.py")
    with trio.fail_after(60):
        dead = await trio.run_process(
            [sys.executable, str(child), nats_server.url, "orders.3.e2"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert dead.returncode == -signal.SIGKILL, dead.stderr.decode()
    by_dead = [line.split()[1] for line in dead.stdout.decode().splitlines()]
    assert "orders.3.e2" not in by_dead and "orders.3.e1" in by_dead

    handled: list[str] = []

    async def handle(msg: Any) -> None:
        handled.append(msg.subject)

    group = billing(handle)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await key_value(js, "cp"))
        workers = CheckpointWorkers(
            js, "EVENTS", group, store, owner="survivor", poll_interval=0.05, recovery_interval=0.2
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(GlobalConsumer(js, "EVENTS", group, store, max_wait=0.05).run)
            await nursery.start(workers.run)
            await until(lambda: len(set(by_dead) | set(handled)) >= total)
            await settled(store)
            nursery.cancel_scope.cancel()
        final = [s.checkpoint async for s in store.all("billing")]
    assert set(by_dead) | set(handled) == {
        f"orders.{n}.e{e}" for n in range(1, ENTITIES + 1) for e in range(EVENTS)
    }
    assert "orders.3.e2" in handled  # the event the host died in, handled by the survivor
    # At least once, and at most once more: an event handled twice is the last one the dead
    # host handled for its entity (killed before it wrote the position), and per entity the
    # two hosts' events join in order.
    for n in range(1, ENTITIES + 1):
        mine = [s for s in by_dead if s.startswith(f"orders.{n}.")]
        theirs = [s for s in handled if s.startswith(f"orders.{n}.")]
        joined = mine + theirs[1:] if mine and theirs and theirs[0] == mine[-1] else mine + theirs
        assert joined == [f"orders.{n}.e{e}" for e in range(EVENTS)], (mine, theirs)
    assert all(cp.position == cp.version and cp.reservation is None for cp in final)


async def test_a_failed_checkpoint_retried_by_hand_resumes_once_fixed(
    nats_server: Any, natspy: Any
) -> None:
    total = await load(natspy, nats_server.url)
    fixed = False
    handled: list[str] = []

    async def handle(msg: Any) -> None:
        if msg.subject == "orders.4.e3" and not fixed:
            raise ConnectionError("ledger offline")
        handled.append(msg.subject)

    group = billing(handle)
    no_retries = RetryPolicy(overrides={ConnectionError: 0})  # fail at once
    stuck = CheckpointId("billing", "ledger", "orders.4")
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        workers = CheckpointWorkers(
            js, "EVENTS", group, store, retry=no_retries, poll_interval=0.05
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(GlobalConsumer(js, "EVENTS", group, store, max_wait=0.1).run)
            await nursery.start(workers.run)
            with trio.fail_after(20):
                while not [cp async for cp in _failed(store)]:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            assert [cp.id for cp in await operators.view(store, "failed")] == [stuck]
            fixed = True  # the ledger is back
            await operators.retry(store, stuck)
            await until(lambda: len(handled) >= total)
            await settled(store)
            nursery.cancel_scope.cancel()
    mine = [s for s in handled if s.startswith("orders.4.")]
    assert mine == [f"orders.4.e{e}" for e in range(EVENTS)]  # in order, the failed one once
    assert len(handled) == len(set(handled)) == total


async def _failed(store: CheckpointStore) -> Any:
    for cp in await operators.view(store, "failed"):
        yield cp


async def test_a_long_run_renews_its_reservation_so_no_second_host_joins(
    nats_server: Any, natspy: Any
) -> None:
    # Reservations of 0.3 s, one entity with 30 events of 30 ms each (0.9 s of work): without
    # renewal the recovery task would free it mid-run and the other host would join.
    await natspy.connect(nats_server.url)
    js_py = natspy.nc.jetstream()
    await natspy.call(js_py.add_stream, name="EVENTS", subjects=["orders.>"], allow_direct=True)
    for e in range(30):
        await natspy.call(js_py.publish, f"orders.1.e{e}", b"")
    inside = 0
    overlaps = 0
    handled: list[tuple[str, int]] = []

    def handler_for(host: str) -> Any:
        async def handle(msg: Any) -> None:
            nonlocal inside, overlaps
            inside += 1
            overlaps += inside > 1
            await trio.sleep(0.03)
            handled.append((host, msg.seq))
            inside -= 1

        return handle

    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        hosts = [
            CheckpointWorkers(
                js,
                "EVENTS",
                billing(handler_for(h)),
                store,
                owner=h,
                reservation=0.3,
                poll_interval=0.02,
                recovery_interval=0.05,
            )
            for h in ("a", "b")
        ]
        async with trio.open_nursery() as nursery:
            await nursery.start(
                GlobalConsumer(js, "EVENTS", hosts[0].group, store, max_wait=0.05).run
            )
            for workers in hosts:
                await nursery.start(workers.run)
            await until(lambda: len(handled) >= 30)
            await settled(store)
            nursery.cancel_scope.cancel()
    assert overlaps == 0
    assert [seq for _, seq in handled] == list(range(1, 31))  # once each, in order


async def test_stale_work_deleted_messages_and_unknown_subscriptions(
    nats_server: Any, natspy: Any
) -> None:
    await load(natspy, nats_server.url)
    handled: list[str] = []

    async def handle(msg: Any) -> None:
        handled.append(msg.subject)

    group = billing(handle)
    with pytest.raises(ValueError, match="without a handler"):
        CheckpointWorkers(
            None,
            "EVENTS",
            SubscriptionGroup(name="g", subscriptions=[Subscription(name="s", subjects=["x.>"])]),
            None,
        )  # type: ignore[arg-type]
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        workers = CheckpointWorkers(js, "EVENTS", group, store, owner="w", poll_interval=0.1)
        one = CheckpointId("billing", "ledger", "orders.1")
        # Stale: the poll saw it lagging, but it is failed by now: not processed, not revived.
        await store.change(
            one, lambda cp: cp.seen(26).failed(ValueError("x"), GiveUp(10), 0, 1), create=True
        )
        assert await workers.process(one) is None
        stored = await store.get(one)
        assert stored is not None and stored.checkpoint.status is Status.FAILED
        assert handled == []
        # Its messages after the failing one were deleted (say, by a retention limit): the
        # skip resumes it, and it fails on the lost event its version counts (never caught
        # up in silence, nor lagging for ever); a second skip accepts the loss.
        for seq in (6, 11, 16, 21, 26):  # orders.1.e1 .. e5
            await js.delete_msg("EVENTS", seq)
        await store.change(one, lambda cp: cp.skip())
        with pytest.warns(RuntimeWarning, match="event #26 of orders.1 is gone"):
            lost = await workers.process(one)
        assert lost is not None and (lost.position, lost.status, lost.failing_seq) == (
            1,
            Status.FAILED,
            26,
        )
        assert lost.error is not None and lost.error.startswith("MissingEvents:")
        assert workers.missing == 1 and workers.failures == 0
        done = await operators.skip(store, one, failing=26)
        assert (done.position, done.version, done.status) == (26, 26, Status.ACTIVE)
        assert handled == []
        # A checkpoint of a subscription this host does not know is left to the hosts that do.
        alien = CheckpointId("billing", "newer", "orders.2")
        await store.change(alien, lambda cp: cp.seen(2), create=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(workers.run)
            await until(lambda: workers.polls >= 3, timeout=10)
            nursery.cancel_scope.cancel()
        assert workers.errors == []
        stored = await store.get(alien)
        assert stored is not None and stored.checkpoint.reservation is None


async def test_operators_do_not_retry_or_skip_work_in_progress(
    nats_server: Any,
) -> None:
    async with connect(nats_server.url) as nc:
        store = CheckpointStore(await create_key_value(JetStream(nc), KeyValueConfig(bucket="cp")))
        cid = CheckpointId("billing", "ledger", "orders.9")
        await store.change(
            cid,
            lambda cp: (
                cp.seen(5).failed(ValueError("x"), GiveUp(1), 0, 3).reserve("h", time.time(), 60)
            ),
            create=True,
        )
        with pytest.raises(CheckpointError, match="being processed by 'h'"):
            await operators.skip(store, cid, failing=3)
        with pytest.raises(CheckpointError, match="release it first"):
            await operators.retry(store, cid)
        await operators.release(store, cid)
        assert (await operators.skip(store, cid, failing=3)).position == 3
