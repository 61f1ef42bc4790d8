"""A handler that outlives its reservation keeps it (renewed while it runs); a holder that
stalled past it is fenced: its checkpoint writes are refused, its handler cancelled, and its
outside effects refused by the fencing token. Real servers; the stalled host is a separate
process stopped with SIGSTOP."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
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
    HandlerContext,
    ReservationLost,
    Subscription,
    SubscriptionGroup,
)
from headrace.checkpoints.fencing import takes_context
from headrace.jetstream import JetStream
from headrace.jetstream.kv import KeyValueConfig, create_key_value
from headrace.nats import connect

CID = CheckpointId("billing", "ledger", "orders.1")
HOST = str(Path(__file__).with_name("fenced_host.py"))


def billing(handler: Any) -> SubscriptionGroup:
    return SubscriptionGroup(
        name="billing",
        subscriptions=[Subscription(name="ledger", subjects=["orders.>"], handler=handler)],
    )


def test_each_claim_takes_a_higher_fence_and_renewals_keep_it() -> None:
    cp = Checkpoint(id=CID).seen(3)
    first = cp.reserve("a", 100, 10)
    assert first.fence == 1 and first.held_by("a", 1)
    renewed = first.reserve("a", 105, 10)
    assert renewed.fence == 1 and renewed.reservation is not None
    assert renewed.reservation.expires_at == 115
    taken = renewed.reserve("b", 200, 10)  # a's expired: b claims it
    assert taken.fence == 2 and not taken.held_by("a", 1) and taken.held_by("b", 2)
    again = taken.release().reserve("b", 300, 10)  # released, claimed anew: a new token
    assert again.fence == 3 and not again.held_by("b", 2)
    assert Checkpoint.from_json(CID, again.to_json()) == again
    assert Checkpoint.from_json(CID, again.release().to_json()).fence == 3


def test_the_handler_context_knows_its_expiry_and_loss() -> None:
    now = 100.0
    ctx = HandlerContext(CID, 4, 110.0, lambda: now)
    assert ctx.held()
    ctx.ensure_held()
    now = 110.0
    assert not ctx.held()
    with pytest.raises(ReservationLost, match=r"orders\.1 \(fence 4\)"):
        ctx.ensure_held()
    now = 100.0
    ctx.lost = "taken over"
    with pytest.raises(ReservationLost, match="taken over"):
        ctx.ensure_held()


def test_handlers_with_one_argument_are_called_as_before() -> None:
    async def old(msg: Any) -> None: ...

    async def new(msg: Any, ctx: HandlerContext) -> None: ...

    async def flexible(msg: Any, ctx: Any = None, *rest: Any) -> None: ...

    assert not takes_context(old) and takes_context(new) and takes_context(flexible)
    assert not takes_context(print)  # only *args: called the old way


async def one_entity(natspy: Any, url: str, events: int) -> None:
    await natspy.connect(url)
    js = natspy.nc.jetstream()
    await natspy.call(js.add_stream, name="EVENTS", subjects=["orders.>"], allow_direct=True)
    for e in range(events):
        await natspy.call(js.publish, f"orders.1.e{e}", b"")


async def test_a_stolen_reservation_cancels_the_handler_and_refuses_its_writes(
    nats_server: Any, natspy: Any
) -> None:
    await one_entity(natspy, nats_server.url, 2)
    cancelled: list[int] = []
    returned: list[int] = []
    mode = "hang"
    store: CheckpointStore

    async def thief() -> None:
        # An operator's release and another host's claim, while the handler runs.
        await store.change(CID, lambda cp: cp.release().reserve("thief", time.time(), 60))

    async def handle(msg: Any, ctx: HandlerContext) -> None:
        await thief()
        if mode == "hang":
            try:
                await trio.sleep_forever()  # the renewal finds it lost and cancels us
            except trio.Cancelled:
                cancelled.append(ctx.seq)
                raise
        returned.append(msg.seq)  # returns at once: the advance is refused

    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        await store.change(CID, lambda cp: cp.seen(2), create=True)
        workers = CheckpointWorkers(js, "EVENTS", billing(handle), store, reservation=0.3)
        with trio.fail_after(10):
            assert await workers.process(CID) is None
        assert cancelled == [1] and workers.lost == 1
        after = await store.get(CID)
        assert after is not None and after.checkpoint.position == 0
        assert after.checkpoint.reservation is not None  # the thief's claim is left alone
        assert after.checkpoint.reservation.owner == "thief"
        # Second round: the handler of seq 1 returns normally once the thief holds it.
        mode = "return"
        await store.change(CID, lambda cp: cp.release())
        with trio.fail_after(10):
            assert await workers.process(CID) is None
        assert returned == [1] and workers.lost == 2  # seq 1 returned into a lost claim
        after = await store.get(CID)
        assert after is not None and after.checkpoint.position == 0
        assert after.checkpoint.reservation is not None
        assert after.checkpoint.reservation.owner == "thief"
        assert workers.failures == 0  # a lost claim is no handler failure


@pytest.mark.slow
async def test_a_handler_longer_than_its_reservation_keeps_it(
    nats_server: Any, natspy: Any
) -> None:
    await one_entity(natspy, nats_server.url, 2)
    inside: list[str] = []
    overlaps: list[str] = []
    runs: list[tuple[str, int, int, bool]] = []
    both = trio.Event()

    def handler_for(host: str) -> Any:
        async def handle(msg: Any, ctx: HandlerContext) -> None:
            if inside:
                overlaps.append(host)
            inside.append(host)
            await trio.sleep(1.0)  # more than two reservations long
            runs.append((host, msg.seq, ctx.fence, ctx.held()))
            inside.remove(host)
            if len(runs) == 2:
                both.set()

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
                reservation=0.45,
                poll_interval=0.02,
                recovery_interval=0.05,
            )
            for h in ("a", "b")
        ]
        async with trio.open_nursery() as nursery:
            await nursery.start(GlobalConsumer(js, "EVENTS", hosts[0].group, store).run)
            for workers in hosts:
                await nursery.start(workers.run)
            with trio.fail_after(20):
                await both.wait()
            nursery.cancel_scope.cancel()
    assert overlaps == []
    assert [seq for _, seq, _, _ in runs] == [1, 2]
    assert all(held for *_, held in runs)
    assert sum(h.lost for h in hosts) == 0


class Board:
    """Wakes whoever waits on the hosts' output when any host prints a line."""

    def __init__(self) -> None:
        self.changed = trio.Event()

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def wait_until(self, predicate: Any, timeout: float = 30) -> None:
        with trio.fail_after(timeout):
            while not predicate():
                await self.changed.wait()


class Host:
    """A fenced_host.py process and the lines it printed."""

    def __init__(self, process: trio.Process, board: Board) -> None:
        self.process = process
        self.board = board
        self.lines: list[str] = []

    async def read(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *done, buffer = buffer.split(b"\n")
            self.lines += [line.decode() for line in done]
            self.board.notify()

    def line(self, prefix: str) -> str | None:
        return next((line for line in self.lines if line.startswith(prefix)), None)

    async def wait_for(self, prefix: str, timeout: float = 20) -> str:
        try:
            await self.board.wait_until(lambda: self.line(prefix) is not None, timeout)
        except trio.TooSlowError:
            raise AssertionError(f"no {prefix!r} line in {timeout} s: {self.lines}") from None
        found = self.line(prefix)
        assert found is not None
        return found

    def runs(self) -> list[list[str]]:
        return [line.split() for line in self.lines if line.startswith("exit ")]


async def start_host(
    nursery: trio.Nursery, board: Board, url: str, owner: str, work: float, reservation: float
) -> Host:
    process = await trio.lowlevel.open_process(
        [sys.executable, HOST, url, owner, str(work), str(reservation)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # a crash's traceback among the lines a failure shows
    )
    host = Host(process, board)
    nursery.start_soon(host.read)
    return host


async def stop(host: Host) -> None:
    host.process.send_signal(signal.SIGCONT)
    host.process.terminate()
    with trio.fail_after(10):
        await host.process.wait()


async def effects_log(js: JetStream, entity: str) -> list[list[Any]]:
    from headrace.jetstream.kv import key_value

    kv = await key_value(js, "effects")
    entry = await kv.get(entity.replace(".", "_"))
    log: list[list[Any]] = json.loads(entry.value)["log"]
    return log


def intervals(hosts: list[Host]) -> list[tuple[float, float, str, int]]:
    """Handler runs whose effect was applied: (enter, exit, owner, seq), by enter time."""
    enters = {
        (w[1], w[2], w[3]): float(w[4])
        for h in hosts
        for w in (line.split() for line in h.lines)
        if w[0] == "enter"
    }
    return sorted(
        (enters[(w[1], w[2], w[3])], float(w[4]), w[1], int(w[2]))
        for h in hosts
        for w in h.runs()
        if w[6] == "applied"
    )


@pytest.mark.slow  # two host processes and a few seconds of handlers
async def test_long_handlers_on_two_host_processes_never_overlap(
    nats_server: Any, natspy: Any
) -> None:
    await one_entity(natspy, nats_server.url, 3)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        await create_key_value(js, KeyValueConfig(bucket="effects"))
        group = billing(lambda msg: None)
        board = Board()
        async with trio.open_nursery() as nursery:
            await nursery.start(GlobalConsumer(js, "EVENTS", group, store, max_wait=0.05).run)
            hosts = [
                await start_host(nursery, board, nats_server.url, owner, 1.0, 0.5)
                for owner in ("a", "b")
            ]
            try:
                await board.wait_until(lambda: len(intervals(hosts)) >= 3)
            except trio.TooSlowError:
                raise AssertionError([h.lines for h in hosts]) from None
            finally:
                for host in hosts:
                    await stop(host)
            nursery.cancel_scope.cancel()
        log = await effects_log(js, "orders.1")
    runs = intervals(hosts)
    assert [seq for *_, seq in runs] == [1, 2, 3]  # each event's effect once, in order
    for (_, left_exit, *_), (right_enter, *_) in itertools.pairwise(runs):
        assert left_exit <= right_enter  # never two handlers on the entity at once
    assert [w[6] for h in hosts for w in h.runs()] == ["applied"] * 3  # nothing refused
    assert [seq for seq, *_ in log] == [1, 2, 3]
    assert not any("reservation lost" in line for h in hosts for line in h.lines)


@pytest.mark.slow  # a stopped host's reservation must expire first
async def test_a_stopped_host_is_fenced_when_it_resumes(nats_server: Any, natspy: Any) -> None:
    await one_entity(natspy, nats_server.url, 3)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = await create_key_value(js, KeyValueConfig(bucket="cp", history=64))
        store = CheckpointStore(kv)
        await create_key_value(js, KeyValueConfig(bucket="effects"))
        group = billing(lambda msg: None)
        board = Board()
        async with trio.open_nursery() as nursery:
            await nursery.start(GlobalConsumer(js, "EVENTS", group, store, max_wait=0.05).run)
            stale = await start_host(nursery, board, nats_server.url, "stale", 1.5, 1.0)
            hosts = [stale]
            try:
                entered = await stale.wait_for("enter stale 1 ")
                stale.process.send_signal(signal.SIGSTOP)  # inside event 1's handler
                fresh = await start_host(nursery, board, nats_server.url, "fresh", 0.05, 1.0)
                hosts.append(fresh)
                await fresh.wait_for("exit fresh 3 ")
                stale.process.send_signal(signal.SIGCONT)
                lost = await stale.wait_for(
                    "warning checkpoint billing/ledger/orders.1: reservation"
                )
            finally:
                for host in hosts:
                    await stop(host)
            nursery.cancel_scope.cancel()
        log = await effects_log(js, "orders.1")
        final = await store.get(CID)
        history = [Checkpoint.from_json(CID, e.value) for e in await kv.history(CID.key)]
    assert "reservation lost" in lost
    stale_fence = int(entered.split()[3])
    assert [(seq, owner) for seq, owner, _ in log] == [(1, "fresh"), (2, "fresh"), (3, "fresh")]
    assert all(fence > stale_fence for *_, fence in log)
    # If the stale handler got as far as its effect, the fence refused it and it knew.
    for _, owner, seq, _, _, held, outcome in stale.runs():
        assert (held, outcome) == ("False", "refused"), (owner, seq)
    assert final is not None
    assert (final.checkpoint.position, final.checkpoint.version) == (3, 3)
    assert final.checkpoint.fence > stale_fence
    # No write of the stale holder landed once the checkpoint was claimed anew.
    claimed = next(i for i, cp in enumerate(history) if cp.fence > stale_fence)
    assert all(cp.fence == final.checkpoint.fence for cp in history[claimed:])
    assert all(
        cp.reservation is None or cp.reservation.owner == "fresh" for cp in history[claimed:]
    )
    positions = [cp.position for cp in history]
    assert positions == sorted(positions)
    # Only applied effects count as handler runs: those never overlapped, in order.
    runs = intervals(hosts)
    assert [(owner, seq) for _, _, owner, seq in runs] == [("fresh", n) for n in (1, 2, 3)]
