"""A fault campaign against checkpointed subscriptions, judged by what is read back.

Three host processes (fault_host.py) share group "billing" while nats-py publishes 2,000 events
to 40 entities. Meanwhile, at random moments (the seed is in every failure message): hosts are
SIGKILLed and started again under the same owner name, hosts are SIGSTOPped for longer than
their reservation and then SIGCONTed, and nats-server itself is SIGKILLed and restarted. Each
handler's effect goes to stream EFFECTS with its fencing token; the test reads EFFECTS back
with nats-py and keeps what a fencing store would (an effect whose token is lower than one
already seen for its entity is refused), then asserts docs/checkpoints.md's guarantees:

- nothing lost: every event has an effect, and every checkpoint caught up with every event
  counted and processed (none failed, none reported missing events);
- per entity in order: the effects' positions never go back (an event runs twice only before
  any later event of its entity);
- at least once, bounded: repeats at most the events in hand at each fault (a host's
  concurrency per host fault, every host's per server restart);
- every host process still running at the end exits 0 when told to stop.
"""

from __future__ import annotations

import random
import signal
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.checkpoints import Checkpoint, CheckpointStore, Status
from headrace.jetstream import JetStream
from headrace.jetstream.kv import KeyValueConfig, create_key_value
from headrace.jetstream.transient import retry_transient
from headrace.nats import connect

from tests.checkpoints.fault_host import CONCURRENCY, RESERVATION
from tests.checkpoints.host_output import read_lines
from tests.checkpoints.stored import until_group_stored

pytestmark = pytest.mark.slow

HOSTS = 3
ENTITIES = 40
EVENTS = 2_000
#: Three of each host fault, one server restart, in a random order.
FAULTS = ["kill"] * 3 + ["stop"] * 3 + ["server"]
HOST = Path(__file__).with_name("fault_host.py")


class Hosts:
    """The host processes, by index: started, killed and started again, stopped and
    continued. Their stdout lines are kept per process."""

    def __init__(self, nursery: trio.Nursery, url: str) -> None:
        self.nursery = nursery
        self.url = url
        self.current: list[trio.Process] = []
        #: Every process started, killed ones included (for the clean-up).
        self.started: list[trio.Process] = []
        self.lines: dict[int, list[str]] = {}
        self.stopped: set[int] = set()
        self._continued = trio.Event()
        self._new_lines = trio.Event()
        self.log: list[str] = []

    async def start(self, index: int) -> None:
        proc = await trio.lowlevel.open_process(
            [sys.executable, str(HOST), self.url, f"host-{index}"], stdout=-1
        )
        if index < len(self.current):
            self.current[index] = proc
        else:
            self.current.append(proc)
        self.started.append(proc)
        self.lines[proc.pid] = []
        self.nursery.start_soon(read_lines, proc, self.lines[proc.pid], self._said)

    async def kill(self, index: int) -> None:
        proc = self.current[index]
        proc.send_signal(signal.SIGKILL)
        with trio.fail_after(10):
            await proc.wait()
        await self.start(index)  # same owner name: it must not join its own old runs

    async def stop_for(self, index: int, seconds: float) -> None:
        proc = self.current[index]
        self.stopped.add(index)
        proc.send_signal(signal.SIGSTOP)
        try:
            await trio.sleep(seconds)  # the fault itself: stopped past its reservation
        finally:
            proc.send_signal(signal.SIGCONT)
            self.stopped.discard(index)
            self._continued.set()
            self._continued = trio.Event()

    async def running(self, rng: random.Random) -> int:
        """A host that is not stopped, at random (waiting for one to be continued if all
        are)."""
        while len(self.stopped) == len(self.current):
            await self._continued.wait()
        return rng.choice([i for i in range(len(self.current)) if i not in self.stopped])

    def _said(self) -> None:
        self._new_lines.set()
        self._new_lines = trio.Event()

    async def wait_ready(self) -> None:
        with trio.fail_after(60):
            while not all("ready" in self.lines[p.pid] for p in self.current):
                await self._new_lines.wait()

    async def stop_all(self) -> list[int | None]:
        for proc in self.current:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            for proc in self.current:
                await proc.wait()
        return [proc.returncode for proc in self.current]

    def kill_all(self) -> None:
        """The clean-up after a failure: no host left retrying its connection."""
        for proc in self.started:
            if proc.returncode is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()


async def test_random_faults_lose_nothing_and_keep_each_entity_in_order(
    nats_server: Any, natspy: Any
) -> None:
    seed = random.randrange(1 << 30)
    pick_event, pick_fault = random.Random(seed), random.Random(seed + 1)
    await natspy.connect(nats_server.url)
    js_py = natspy.nc.jetstream()
    await natspy.call(js_py.add_stream, name="EVENTS", subjects=["orders.>"], allow_direct=True)
    await natspy.call(js_py.add_stream, name="EFFECTS", subjects=["effects.>"])
    last: dict[str, int] = {}  # entity ("7" of orders.7) -> the sequence of its last event
    faults = FAULTS[:]
    pick_fault.shuffle(faults)

    async def publish() -> None:
        for n in range(EVENTS):
            entity = str(pick_event.randrange(ENTITIES))
            subject = f"orders.{entity}.e{n}"
            for _ in range(200):  # the server restart: connect again, publish again
                try:
                    if natspy.nc.is_closed:
                        await natspy.connect(nats_server.url)
                    ack = await natspy.call(
                        natspy.nc.jetstream().publish,
                        subject,
                        b"x",
                        headers={"Nats-Msg-Id": subject},  # a retry of one that landed
                        timeout=2,
                    )
                    break
                except Exception:  # any failure while the server is away
                    await trio.sleep(0.1)  # (pacing the retries)
            else:
                raise AssertionError(f"seed {seed}: {subject} could not be published")
            last[entity] = ack.seq
            await trio.sleep(0.004)  # about 10 s of events, for the faults to land in

    async def inject(hosts: Hosts, nursery: trio.Nursery) -> None:
        for fault in faults:
            await trio.sleep(pick_fault.uniform(0.8, 1.6))
            if fault == "server":
                hosts.log.append("nats-server SIGKILLed and restarted")
                await trio.to_thread.run_sync(lambda: nats_server.restart(kill=True))
                continue
            index = await hosts.running(pick_fault)
            hosts.log.append(f"host {index}: {fault}")
            if fault == "kill":
                await hosts.kill(index)
            else:
                nursery.start_soon(hosts.stop_for, index, RESERVATION + 1.0)

    async with connect(nats_server.url) as nc, trio.open_nursery() as nursery:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        hosts = Hosts(nursery, nats_server.url)
        try:
            for index in range(HOSTS):
                await hosts.start(index)
            await hosts.wait_ready()
            async with trio.open_nursery() as campaign:
                campaign.start_soon(publish)
                campaign.start_soon(inject, hosts, campaign)
            context = f"seed {seed}, faults {hosts.log}"
            final = await caught_up(store, last, context)
            await hosts.wait_ready()  # (a host started by the last kill has said so)
            codes = await hosts.stop_all()
        finally:
            hosts.kill_all()
        nursery.cancel_scope.cancel()
    assert codes == [0] * HOSTS, (codes, context)
    assert all(cp.seen_events == cp.processed_events for cp in final), (final, context)

    if natspy.nc.is_closed:  # the restart came after the last publish
        await natspy.connect(nats_server.url)
    js_py = natspy.nc.jetstream()
    effects = await natspy.call(read_stream, js_py, "EFFECTS")
    accepted, refused = fenced(effects)
    assert set(accepted) == set(last), context
    published = await natspy.call(read_stream, js_py, "EVENTS")
    events: dict[str, list[int]] = defaultdict(list)
    for subject, seq, _ in published:
        events[subject.split(".")[1]].append(seq)
    repeats = 0
    for entity, seqs in accepted.items():
        assert seqs == sorted(seqs), (entity, seqs, context)  # never back
        assert sorted(set(seqs)) == events[entity], (entity, seqs, context)  # none lost
        repeats += len(seqs) - len(set(seqs))
    host_faults = sum(f != "server" for f in faults)
    bound = host_faults * CONCURRENCY + (len(faults) - host_faults) * HOSTS * CONCURRENCY
    print(f"repeats {repeats} (bound {bound}), stale effects refused {refused}; {context}")
    assert repeats <= bound, (repeats, refused, context)
    assert len(published) == EVENTS


async def caught_up(
    store: CheckpointStore, last: dict[str, int], context: str, timeout: float = 120
) -> list[Checkpoint]:
    """Every entity's checkpoint at its last event, handled, released; a failed one fails the
    test at once (missing events reported, or a handler that kept failing)."""
    wanted = {f"orders.{entity}": seq for entity, seq in last.items()}

    def done(seen: dict[Any, Checkpoint]) -> bool:
        failed = [cp for cp in seen.values() if cp.status is Status.FAILED]
        assert not failed, (failed, context)
        return {cp.id.stream: cp.version for cp in seen.values()} == wanted and all(
            cp.position == cp.version and cp.reservation is None for cp in seen.values()
        )

    try:
        # (Retried if the watch cannot start yet: the server may have just restarted.)
        found = await retry_transient(lambda: until_group_stored(store, "billing", done, timeout))
        return list(found.values())
    except AssertionError as exc:
        raise AssertionError(f"{exc} ({context})") from None


async def read_stream(js_py: Any, stream: str) -> list[tuple[str, int, str]]:
    """Every message of ``stream`` in order: (subject, sequence, payload). (Run by nats-py.)"""
    info = await js_py.stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await js_py.get_msg(stream, seq)
        out.append((msg.subject, msg.seq, msg.data.decode()))
    return out


def fenced(effects: list[tuple[str, int, str]]) -> tuple[dict[str, list[int]], int]:
    """Per entity, the positions of the effects a fencing store keeps (in stream order), and
    how many it refused: an effect whose fencing token is lower than the highest one already
    seen for its entity comes from a holder that lost the entity."""
    highest: dict[str, int] = {}
    accepted: dict[str, list[int]] = defaultdict(list)
    refused = 0
    for subject, _, payload in effects:
        entity = subject.split(".", 1)[1]
        _, seq, fence, _ = payload.split()
        if int(fence) < highest.get(entity, 0):
            refused += 1
            continue
        highest[entity] = int(fence)
        accepted[entity].append(int(seq))
    return dict(accepted), refused
