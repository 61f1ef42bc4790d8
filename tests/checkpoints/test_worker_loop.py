"""The worker loop on a real nats-server: a new event reaches an idle entity among many
through the watch of the checkpoints, not a poll; and workers (in this process, and hosts in
their own processes) ride out three server restarts with every event handled in order."""

from __future__ import annotations

import signal
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.checkpoints import (
    Checkpoint,
    CheckpointId,
    CheckpointStore,
    CheckpointWorkers,
    GlobalConsumer,
    Subscription,
    SubscriptionGroup,
)
from headrace.jetstream import JetStream
from headrace.jetstream.kv import KeyValueConfig, create_key_value
from headrace.jetstream.transient import retry_transient
from headrace.nats import connect

from tests.checkpoints.host_output import read_lines
from tests.checkpoints.stored import until_stored

ENTITIES = 8
ROUNDS = 4  # events per entity published before the first restart and after each of three


def billing(handler: Any) -> SubscriptionGroup:
    return SubscriptionGroup(
        name="billing",
        subscriptions=[Subscription(name="ledger", subjects=["orders.>"], handler=handler)],
    )


async def make_stream(natspy: Any, url: str) -> None:
    await natspy.connect(url)
    js = natspy.nc.jetstream()
    await natspy.call(js.add_stream, name="EVENTS", subjects=["orders.>"], allow_direct=True)


async def publish_round(js: JetStream, round_: int) -> list[str]:
    """One event per entity; a publish caught by the restart's tail is retried."""
    sent = []
    for n in range(1, ENTITIES + 1):
        subject = f"orders.{n}.r{round_}"
        await retry_transient(lambda s=subject: js.publish(s, b"x", msg_id=s))  # type: ignore[misc]
        sent.append(subject)
    return sent


async def restart(server: Any, round_: int, reported: Any) -> None:
    """Restart the server, off the event loop: the first time at once, the second time kept
    down until ``reported()`` says the hosts saw the outage (a request timing out; a quick
    restart may hide inside the client's reconnect), the third time a SIGKILL."""
    if round_ == 2:
        await trio.to_thread.run_sync(server.stop)
        with trio.fail_after(60):  # a request must time out first (5 s), under CI load too
            while not reported():  # noqa: ASYNC110 - the hosts' state, no event to wait on
                await trio.sleep(0.02)
    await trio.to_thread.run_sync(lambda: server.restart(kill=round_ == 3))


def check_order(handled: list[str], sent: list[str]) -> int:
    """Every sent event handled, per entity in publish order; an event may come twice only
    right after itself (handled, then its position write lost to the restart). Returns the
    number of such repeats."""
    per: dict[str, list[str]] = defaultdict(list)
    repeats = 0
    for subject in handled:
        entity = subject.rsplit(".", 1)[0]
        if per[entity] and per[entity][-1] == subject:
            repeats += 1
            continue
        per[entity].append(subject)
    expected: dict[str, list[str]] = defaultdict(list)
    for subject in sent:
        expected[subject.rsplit(".", 1)[0]].append(subject)
    assert dict(per) == dict(expected)
    return repeats


async def test_a_new_event_reaches_an_idle_entity_without_waiting_for_a_poll(
    nats_server: Any, natspy: Any
) -> None:
    await make_stream(natspy, nats_server.url)
    many = 300
    js_py = natspy.nc.jetstream()
    for n in range(many):
        await natspy.call(js_py.publish, f"orders.{n}.created", b"")
    handled: list[str] = []
    arrived = trio.Event()

    async def handle(msg: Any) -> None:
        handled.append(msg.subject)
        if msg.subject == "orders.77.paid":
            arrived.set()

    group = billing(handle)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        # An hour between polls: only the watch can bring the work.
        workers = CheckpointWorkers(js, "EVENTS", group, store, poll_interval=3600)
        async with trio.open_nursery() as nursery:
            await nursery.start(GlobalConsumer(js, "EVENTS", group, store, max_wait=0.05).run)
            await nursery.start(workers.run)
            with trio.fail_after(30):
                while len(handled) < many:  # noqa: ASYNC110 - a count, no event to wait on
                    await trio.sleep(0.02)
            await natspy.call(js_py.publish, "orders.77.paid", b"")
            start = trio.current_time()
            with trio.fail_after(5):
                await arrived.wait()
            waited = trio.current_time() - start
            nursery.cancel_scope.cancel()
    assert workers.polls == 0  # no poll ran: the watch brought both the backlog and the event
    assert handled.count("orders.77.paid") == 1 and len(handled) == many + 1
    assert waited < 2.0  # the global consumer's fetch window plus a few writes, not a poll


@pytest.mark.slow
async def test_workers_ride_out_three_server_restarts(nats_server: Any, natspy: Any) -> None:
    await make_stream(natspy, nats_server.url)
    handled: list[str] = []
    outages: list[str] = []

    async def handle(msg: Any) -> None:
        await trio.sleep(0.002)
        handled.append(msg.subject)

    group = billing(handle)
    sent: list[str] = []
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        # Polls this often meet the restarts for sure (a request timing out, no connection):
        # that ended the loop before; the watch and the consumer meet them too.
        workers = CheckpointWorkers(
            js, "EVENTS", group, store, reservation=3.0, recovery_interval=0.5, poll_interval=0.05
        )
        consumer = GlobalConsumer(js, "EVENTS", group, store, max_wait=0.05)
        ended: list[str] = []

        async def watched(name: str, run: Any, task_status: Any) -> None:
            try:
                await run(task_status=task_status)
            finally:
                ended.append(name)

        async def watch_outage() -> None:
            while True:  # what a user sees while the server is away
                for outage in (workers.outage, consumer.outage):
                    if outage and outage not in outages:
                        outages.append(outage)
                await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            await nursery.start(watched, "consumer", consumer.run)
            await nursery.start(watched, "workers", workers.run)
            nursery.start_soon(watch_outage)
            for round_ in range(ROUNDS):
                if round_:
                    # Mid-run: the previous round is still being handled.
                    # Down until either loop saw it (what the assertions below need).
                    await restart(nats_server, round_, lambda: workers.outage or consumer.outage)
                sent += await publish_round(js, round_)
            with trio.fail_after(60):
                while len(set(handled)) < len(sent):  # noqa: ASYNC110 - a count
                    await trio.sleep(0.05)
            assert ended == []  # both loops alive after the restarts
            nursery.cancel_scope.cancel()
    repeats = check_order(handled, sent)
    assert repeats <= 3 * ENTITIES  # at most the one in hand per entity per restart
    assert workers.outages + consumer.outages > 0  # the restarts were seen, and ridden out
    assert outages  # and visible while they lasted


@pytest.mark.slow
async def test_host_processes_ride_out_three_server_restarts(nats_server: Any, natspy: Any) -> None:
    await make_stream(natspy, nats_server.url)
    host = Path(__file__).with_name("restart_host.py")
    lines: dict[str, list[str]] = {"a": [], "b": []}
    sent: list[str] = []
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await create_key_value(js, KeyValueConfig(bucket="cp"))
        async with trio.open_nursery() as nursery:
            procs = {}
            for name in lines:
                proc = await trio.lowlevel.open_process(
                    [sys.executable, str(host), nats_server.url, name],
                    stdout=-1,
                )
                procs[name] = proc
                nursery.start_soon(read_lines, proc, lines[name])
            with trio.fail_after(30):
                while not all("ready" in got for got in lines.values()):  # noqa: ASYNC110
                    await trio.sleep(0.05)
            for round_ in range(ROUNDS):
                if round_:
                    await restart(nats_server, round_, lambda: reported(lines))
                sent += await publish_round(js, round_)

            def handled() -> list[str]:
                return [
                    line.split()[1]
                    for got in lines.values()
                    for line in got
                    if line.startswith("handled")
                ]

            try:
                with trio.fail_after(60):
                    while len(set(handled())) < len(sent):  # noqa: ASYNC110 - output
                        await trio.sleep(0.05)
                alive = {name: proc.returncode for name, proc in procs.items()}
            finally:
                for proc in procs.values():
                    if proc.returncode is None:
                        proc.send_signal(signal.SIGTERM)
                with trio.fail_after(10):
                    for proc in procs.values():
                        await proc.wait()
    assert alive == {"a": None, "b": None}  # every host process still running
    # Per entity, the two hosts' lines may interleave only in order: merged by stream seq.
    everything = sorted(
        (int(line.split()[2]), line.split()[1])
        for got in lines.values()
        for line in got
        if line.startswith("handled")
    )
    repeats = check_order([subject for _, subject in everything], sent)
    assert repeats <= 3 * ENTITIES
    for got in lines.values():  # and each host handled each entity's events in order
        seqs: dict[str, list[int]] = defaultdict(list)
        for line in got:
            if line.startswith("handled"):
                _, subject, seq = line.split()
                seqs[subject.rsplit(".", 1)[0]].append(int(seq))
        assert all(s == sorted(s) for s in seqs.values()), seqs


def reported(lines: dict[str, list[str]]) -> bool:
    """Each host said it lost the server (its workers or its global consumer: a request timed
    out). Not both: a global consumer whose pulls simply expire while the server is down may
    never see a failed request (a CI run waited 60 s for one)."""
    return all(
        any(line.startswith(("outage workers", "outage consumer")) for line in got)
        for got in lines.values()
    )


@pytest.mark.slow
async def test_the_watch_itself_survives_a_restart(nats_server: Any, natspy: Any) -> None:
    """No poll to fall back on (an hour apart): after a restart (a SIGKILL) the watch and the
    global consumer still bring a new event to its handler."""
    await make_stream(natspy, nats_server.url)
    arrived = {subject: trio.Event() for subject in ("orders.1.before", "orders.1.after")}

    async def handle(msg: Any) -> None:
        arrived[msg.subject].set()

    group = billing(handle)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        workers = CheckpointWorkers(js, "EVENTS", group, store, poll_interval=3600)
        async with trio.open_nursery() as nursery:
            consumer = GlobalConsumer(js, "EVENTS", group, store, max_wait=0.05)
            await nursery.start(consumer.run)
            await nursery.start(workers.run)
            await js.publish("orders.1.before", b"")
            with trio.fail_after(10):
                await arrived["orders.1.before"].wait()
            await trio.to_thread.run_sync(lambda: nats_server.restart(kill=True))
            await retry_transient(lambda: js.publish("orders.1.after", b""))
            with trio.move_on_after(30):
                await arrived["orders.1.after"].wait()
            nursery.cancel_scope.cancel()
        state = await store.get(CheckpointId("billing", "ledger", "orders.1"))
    assert arrived["orders.1.after"].is_set(), (state, workers, consumer)
    assert workers.polls == 0


async def test_a_new_event_costs_its_checkpoint_three_writes(nats_server: Any, natspy: Any) -> None:
    """The global consumer's write, the reservation, and one advance that also releases it:
    the release is not a write of its own (each write is also a watch entry for every host).
    A second event to the entity costs the same three."""
    await make_stream(natspy, nats_server.url)
    js_py = natspy.nc.jetstream()
    handled: list[str] = []
    count = trio.Event()

    async def handle(msg: Any) -> None:
        handled.append(msg.subject)
        count.set()

    group = billing(handle)
    cid = CheckpointId("billing", "ledger", "orders.1")
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = await create_key_value(js, KeyValueConfig(bucket="cp", history=64))
        store = CheckpointStore(kv)
        workers = CheckpointWorkers(js, "EVENTS", group, store, poll_interval=3600)
        async with trio.open_nursery() as nursery:
            await nursery.start(GlobalConsumer(js, "EVENTS", group, store, max_wait=0.05).run)
            await nursery.start(workers.run)
            for n, subject in enumerate(("orders.1.created", "orders.1.paid"), start=1):
                await natspy.call(js_py.publish, subject, b"")
                with trio.fail_after(10):
                    while len(handled) < n:
                        await count.wait()
                        count = trio.Event()
                # The handler has returned; its advance is written next.
                await until_stored(
                    store, cid, lambda cp, n=n: cp.position == n and cp.reservation is None, 10
                )
            nursery.cancel_scope.cancel()
        history = await kv.history(cid.key)
    states = [Checkpoint.from_json(cid, e.value) for e in history]
    assert [(s.version, s.position, s.reservation is not None) for s in states] == [
        (1, 0, False),  # created by the global consumer
        (1, 0, True),  # reserved
        (1, 1, False),  # advanced and released in one write
        (2, 1, False),
        (2, 1, True),
        (2, 2, False),
    ]
    assert handled == ["orders.1.created", "orders.1.paid"]
    assert workers.lost == 0
