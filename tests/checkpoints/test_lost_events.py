"""Events that leave the stream before they are handled, and batches a host leaves behind, on a
real nats-server (nats-py makes the streams, publishes, purges and reads consumer state):
streams that drop acked events are refused at start, a purge under a running host fails the
checkpoints it left behind, and the global consumer's batch reaches another host soon after
its host stops or dies."""

from __future__ import annotations

import signal
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.checkpoints import (
    CheckpointId,
    CheckpointStore,
    CheckpointWorkers,
    GlobalConsumer,
    Status,
    StreamLimitWarning,
    Subscription,
    SubscriptionGroup,
    UnsafeStream,
    check_stream,
    operators,
)
from headrace.checkpoints.global_consumer import DEFAULT_ACK_WAIT, durable_name
from headrace.jetstream import JetStream
from headrace.jetstream.errors import ConsumerNotFound
from headrace.jetstream.kv import KeyValueConfig, create_key_value
from headrace.nats import connect
from nats.js.api import DiscardPolicy, RetentionPolicy

from tests.checkpoints.stored import until_stored
from tests.natspy_peer import consumer_info, wait_consumer


def billing(handler: Any = None) -> SubscriptionGroup:
    return SubscriptionGroup(
        name="billing",
        subscriptions=[Subscription(name="ledger", subjects=["orders.>"], handler=handler)],
    )


async def publish(natspy: Any, url: str, entities: int, events: int, **stream: Any) -> Any:
    """Stream EVENTS (``orders.>``) with ``entities`` x ``events``, interleaved."""
    await natspy.connect(url)
    js = natspy.nc.jetstream()
    await natspy.call(js.add_stream, name="EVENTS", subjects=["orders.>"], **stream)
    for e in range(events):
        for n in range(1, entities + 1):
            await natspy.call(js.publish, f"orders.{n}.e{e}", b"%d" % e)
    return js


async def test_streams_that_drop_events_before_they_are_handled_are_refused(
    nats_server: Any, natspy: Any
) -> None:
    await natspy.connect(nats_server.url)
    jsp = natspy.nc.jetstream()
    for name, retention in (("INTEREST", RetentionPolicy.INTEREST), ("QUEUE", "workqueue")):
        await natspy.call(jsp.add_stream, name=name, subjects=[f"{name}.>"], retention=retention)
    await natspy.call(
        jsp.add_stream, name="AGED", subjects=["aged.>"], max_age=3600, max_msgs_per_subject=10
    )
    await natspy.call(
        jsp.add_stream, name="BOUNDED", subjects=["b.>"], max_msgs=100, discard=DiscardPolicy.NEW
    )
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        for name, why in (("INTEREST", "interest retention"), ("QUEUE", "work-queue retention")):
            consumer = GlobalConsumer(js, name, billing(), store)
            with pytest.raises(UnsafeStream, match=f"stream '{name}' cannot back .*{why}"):
                await consumer.run()
            # Refused before its durable consumer exists: nothing read, acked or removed.
            with pytest.raises(ConsumerNotFound):
                await js.consumer_info(name, durable_name("billing"))
        with pytest.warns(StreamLimitWarning, match=r"max_msgs_per_subject=10, max_age=3600s"):
            await check_stream(js, "AGED")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a limit with discard=new drops nothing
            await check_stream(js, "BOUNDED")
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="ack_wait must be a positive"):
            GlobalConsumer(js, "EVENTS", billing(), store, ack_wait=bad)


async def test_a_purge_under_a_running_host_fails_the_checkpoints_it_left_behind(
    nats_server: Any, natspy: Any
) -> None:
    # More events per entity than a worker reads ahead (64): a purge while the first handlers
    # run leaves each entity's tail unread.
    jsp = await publish(natspy, nats_server.url, entities=2, events=100, allow_direct=True)
    handled: dict[str, list[int]] = {"orders.1": [], "orders.2": []}
    gate, all_waiting, after = trio.Event(), trio.Event(), trio.Event()

    async def handle(msg: Any) -> None:
        entity = msg.subject.rsplit(".", 1)[0]
        if msg.subject == "orders.1.after":
            after.set()
            return
        handled[entity].append(msg.seq)
        if all(handled.values()):
            all_waiting.set()
        await gate.wait()

    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        workers = CheckpointWorkers(js, "EVENTS", billing(handle), store, poll_interval=0.05)
        with pytest.warns(RuntimeWarning, match="is gone from stream 'EVENTS' before it was"):
            async with trio.open_nursery() as nursery:
                await nursery.start(GlobalConsumer(js, "EVENTS", billing(), store).run)
                await nursery.start(workers.run)
                with trio.fail_after(20):
                    await all_waiting.wait()
                await natspy.call(jsp.purge_stream, "EVENTS")
                gate.set()
                with trio.fail_after(20):
                    while workers.missing < 2:  # noqa: ASYNC110 - a counter, no event
                        await trio.sleep(0.02)
                lagging = await operators.view(store, "lagging", "billing")
                for n in (1, 2):
                    cid = CheckpointId("billing", "ledger", f"orders.{n}")
                    stored = await store.get(cid)
                    assert stored is not None
                    cp = stored.checkpoint
                    assert cp.status is Status.FAILED, cp
                    assert cp.error is not None and cp.error.startswith("MissingEvents: event #")
                    # Never caught up: its position is the last message handled, its version
                    # (the lost last event) ahead, and it shows as lagging.
                    assert handled[f"orders.{n}"] and len(handled[f"orders.{n}"]) < 100
                    assert cp.position == handled[f"orders.{n}"][-1] < cp.version
                    assert cp.failing_seq == cp.version and cp in lagging
                # An operator's skip accepts the loss; the entity's next event is handled.
                one = CheckpointId("billing", "ledger", "orders.1")
                cp1 = await store.get(one)
                assert cp1 is not None and cp1.checkpoint.failing_seq is not None
                skipped = await operators.skip(store, one, failing=cp1.checkpoint.failing_seq)
                assert (skipped.status, skipped.position) == (Status.ACTIVE, skipped.version)
                await natspy.call(jsp.publish, "orders.1.after", b"")
                with trio.fail_after(20):
                    await after.wait()
                nursery.cancel_scope.cancel()
    assert workers.errors == []


async def test_events_gone_in_the_middle_of_a_backlog_fail_the_checkpoint(
    nats_server: Any, natspy: Any
) -> None:
    """The global consumer counted five events of orders.1; two are deleted before any worker
    runs. The worker handles the three left, and instead of reporting the entity caught up,
    parks it as failed with the count; an operator's retry accepts the loss, and the next
    event is handled with the counts agreeing again. orders.2 is untouched."""
    jsp = await publish(natspy, nats_server.url, entities=2, events=5, allow_direct=True)
    handled: list[str] = []
    after = trio.Event()

    async def handle(msg: Any) -> None:
        handled.append(msg.subject)
        if msg.subject == "orders.1.after":
            after.set()

    one = CheckpointId("billing", "ledger", "orders.1")
    two = CheckpointId("billing", "ledger", "orders.2")
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        workers = CheckpointWorkers(js, "EVENTS", billing(handle), store, poll_interval=3600)
        async with trio.open_nursery() as nursery:
            await nursery.start(GlobalConsumer(js, "EVENTS", billing(), store).run)
            await wait_consumer(
                natspy,
                lambda info: info.ack_floor.stream_seq == 10,
                stream="EVENTS",
                durable=durable_name("billing"),
            )
            # orders.1's events are the odd sequences: e2 is #5, e3 is #7.
            for seq in (5, 7):
                await natspy.call(jsp.delete_msg, "EVENTS", seq)
            with pytest.warns(RuntimeWarning, match="2 of the 5 events of orders.1 counted"):
                await nursery.start(workers.run)
                with trio.fail_after(20):
                    while workers.missing < 1:  # noqa: ASYNC110 - a counter, no event
                        await trio.sleep(0.02)
            stored = await store.get(one)
            assert stored is not None
            cp = stored.checkpoint
            assert cp.status is Status.FAILED and cp.reservation is None, cp
            assert cp.error is not None and cp.error.startswith(
                "MissingEvents: 2 of the 5 events of orders.1 counted up to #9 are gone"
            )
            # Every event still there was handled, in order; the loss is what is reported.
            assert [s for s in handled if s.startswith("orders.1.")] == [
                "orders.1.e0",
                "orders.1.e1",
                "orders.1.e4",
            ]
            assert (cp.position, cp.version, cp.failing_seq) == (9, 9, 9)
            other = await until_stored(store, two, lambda cp: cp.position == 10)
            assert other.status is Status.ACTIVE
            assert other.seen_events == other.processed_events == 5

            await operators.retry(store, one, position=9)
            await until_stored(store, one, lambda cp: cp.status is Status.ACTIVE)
            await natspy.call(jsp.publish, "orders.1.after", b"")
            with trio.fail_after(20):
                await after.wait()
            # (The event is #11: the retry left position and version at 9.)
            last = await until_stored(store, one, lambda cp: cp.position == cp.version > 9)
            nursery.cancel_scope.cancel()
    assert last.status is Status.ACTIVE
    assert last.seen_events == last.processed_events == 6
    assert workers.missing == 1 and workers.errors == []
    assert handled.count("orders.1.e4") == 1 and len(handled) == 3 + 5 + 1


class StuckStore(CheckpointStore):
    """Holds the global consumer inside its batch: the first write never returns."""

    holding: trio.Event

    async def change(self, *args: Any, **kwargs: Any) -> Any:
        self.holding.set()
        await trio.sleep_forever()


async def test_a_stopped_host_hands_its_batch_over_at_once(nats_server: Any, natspy: Any) -> None:
    await publish(natspy, nats_server.url, entities=3, events=2)
    durable = durable_name("billing")
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        stuck = StuckStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        stuck.holding = trio.Event()
        # A long ack wait: only the nak on stop can hand the batch over within the test's bound.
        first = GlobalConsumer(js, "EVENTS", billing(), stuck, ack_wait=30, max_wait=0.05)
        async with trio.open_nursery() as nursery:
            await nursery.start(first.run)
            with trio.fail_after(10):
                await stuck.holding.wait()
            nursery.cancel_scope.cancel()
    info = await consumer_info(natspy, "EVENTS", durable)
    assert info.config.ack_wait == 30 and info.num_ack_pending == 6
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        second = GlobalConsumer(js, "EVENTS", billing(), store, ack_wait=30, max_wait=0.05)
        async with trio.open_nursery() as nursery:
            await nursery.start(second.run)
            await wait_consumer(
                natspy,
                lambda i: i.ack_floor.stream_seq == 6 and i.num_ack_pending == 0,
                stream="EVENTS",
                durable=durable,
                timeout=5,
            )
            nursery.cancel_scope.cancel()
        versions = {s.checkpoint.id.stream: s.checkpoint.version async for s in store.all()}
    assert second.messages == 6 and versions == {"orders.1": 4, "orders.2": 5, "orders.3": 6}


class SlowStore(CheckpointStore):
    """The first write of a batch takes ``delay`` seconds (a slow KV); the rest are normal."""

    delay: float
    entered: trio.Event

    async def change(self, *args: Any, **kwargs: Any) -> Any:
        if not self.entered.is_set():
            self.entered.set()
            await trio.sleep(self.delay)  # simulated slowness, not a wait for a condition
        return await super().change(*args, **kwargs)


@pytest.mark.slow  # a 2 s batch
async def test_a_batch_slower_than_the_ack_wait_is_not_handed_over(
    nats_server: Any, natspy: Any
) -> None:
    await publish(natspy, nats_server.url, entities=3, events=2)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = await create_key_value(js, KeyValueConfig(bucket="cp"))
        slow = SlowStore(kv)
        slow.delay, slow.entered = 2.0, trio.Event()
        ack_wait = 0.6
        holder = GlobalConsumer(js, "EVENTS", billing(), slow, ack_wait=ack_wait, max_wait=0.05)
        # A second host polling the same durable would get the batch if its ack wait ran out.
        other = GlobalConsumer(
            js, "EVENTS", billing(), CheckpointStore(kv), ack_wait=ack_wait, max_wait=0.05
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(holder.run)
            with trio.fail_after(10):
                await slow.entered.wait()
            await nursery.start(other.run)
            info = await wait_consumer(
                natspy,
                lambda i: i.ack_floor.stream_seq == 6 and i.num_ack_pending == 0,
                stream="EVENTS",
                durable=durable_name("billing"),
                timeout=10,
            )
            nursery.cancel_scope.cancel()
    assert (holder.messages, other.messages, info.num_redelivered) == (6, 0, 0)


@pytest.mark.slow  # waits out the default ack wait (5 s)
async def test_a_killed_hosts_batch_is_handled_by_another_host_within_the_ack_wait(
    nats_server: Any, natspy: Any
) -> None:
    await publish(natspy, nats_server.url, entities=5, events=2, allow_direct=True)
    async with connect(nats_server.url) as nc:
        await create_key_value(JetStream(nc), KeyValueConfig(bucket="cp"))
    child = Path(__file__).with_name("batch_kill_child.py")
    with trio.fail_after(30):
        dead = await trio.run_process(
            [sys.executable, str(child), nats_server.url],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    killed_at = trio.current_time()
    assert dead.returncode == -signal.SIGKILL, dead.stderr.decode()
    assert dead.stdout.decode().startswith("holding a batch")
    info = await consumer_info(natspy, "EVENTS", durable_name("billing"))
    assert info.config.ack_wait == DEFAULT_ACK_WAIT and info.num_ack_pending == 10

    handled: list[str] = []
    done = trio.Event()

    async def handle(msg: Any) -> None:
        handled.append(msg.subject)
        if len(handled) == 10:
            done.set()

    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        workers = CheckpointWorkers(js, "EVENTS", billing(handle), store, poll_interval=0.05)
        async with trio.open_nursery() as nursery:
            await nursery.start(GlobalConsumer(js, "EVENTS", billing(), store, max_wait=0.05).run)
            await nursery.start(workers.run)
            # The batch was delivered before the kill: the ack wait runs out within
            # DEFAULT_ACK_WAIT of it; a few seconds more for two busy cores.
            with trio.fail_after(DEFAULT_ACK_WAIT + 4 - (trio.current_time() - killed_at)):
                await done.wait()
            nursery.cancel_scope.cancel()
    assert sorted(handled) == sorted(f"orders.{n}.e{e}" for n in range(1, 6) for e in range(2))
