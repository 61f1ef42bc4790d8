"""Stateful operators under faults (issue 22), counted in what the sink holds.

examples/clickstream_windows.py runs as a real ``headrace run`` child on a real nats-server
over 200,000 clicks with out-of-order event times (its ``sample_clicks``). The first 70,000
come at once (enough event time for windows to close: from then on every kill lands among
closing windows and results on their way); the rest come as a live stream, a few thousand a
second, while the worker is SIGKILLed at five random moments, each after it made progress
(the consumer's ack floor moved), and started again; once it is also stalled (SIGSTOP) for
longer than its consumer's ack_wait, so that the server may deliver again what it holds, and
let go on (SIGCONT). Then the rest of the clicks come at once, and a last click far in the
future closes every real window. The last worker runs until every click is acked and every
window is out, and is stopped with SIGTERM.

The output is then judged against counts computed from the published clicks alone: every
(user, minute) exactly once, with its exact count, and nothing in the dead letter.

Why a live stream during the kills, and the far-future click last of all: the clicks a killed
worker held come again only once their ack_wait has passed, and meanwhile the next worker
takes and acks newer ones, as many as there are and it can take in that time (its acks keep
making room under max_ack_pending, so that bound does not hold it back). From a backlog of
all the clicks that is tens of thousands, hundreds of seconds of event time: more than the
lateness below, and those clicks would be late (dead-lettered, not counted). At a few thousand
a second, the disorder stays well within the lateness. The far-future click moves the
watermark a day on: a click coming again after it would be late whatever the lateness, so it
is published once every other click is acked.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import math
import random
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio
from headrace.jetstream import publish_acked
from headrace.nats import connect
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NotFoundError

from tests.cli.cli_support import HeadraceProcess, clean_env, headrace, read_jsonl
from tests.natspy_peer import NatsPyPeer

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples" / "clickstream_windows.py"
STREAM, DURABLE, DEAD = "CLICKS", "clicks-per-minute", "DEAD_CLICKS"
#: The stream of the operator's results, as the output's lines name it.
RESULTS = "clickstream.per-minute"
CLICKS = 200_000
KILLS = 5
#: Clicks published at once as the test starts (the first worker takes them as a backlog):
#: 700 s of event time, past the lateness and a minute, so that windows close (and results go
#: out) from the first kill on.
HEAD = 70_000
#: Clicks a second after those, while the worker is killed and started again (20 s of event
#: time a second: a minute's windows close every 3 s), published CHUNK at a time. The 130,000
#: would take 65 s: the kills take a third of that, so they all land while clicks come.
RATE = 2_000
CHUNK = 200
#: The consumer's ack_wait (CLICKS_ACK_WAIT): how long a killed worker's clicks wait to come
#: again. Short, so that five kills fit in the test's time.
ACK_WAIT = 2.0
#: How long the one stall lasts: well over ack_wait.
STALL = 2.5 * ACK_WAIT
#: Seconds of event time a click may come behind the newest (CLICKS_LATENESS). Clicks are
#: 10 ms apart and moved up to 5 s either way; after a kill they come out of order by what the
#: next worker took before their ack_wait ran out: what was waiting (at most what came during
#: the stall, 10,000 at RATE) and what came meanwhile (the worker's start and the ack_wait, a
#: few seconds at RATE): 200 s of event time at the very worst, usually under 100 s.
LATENESS = 600.0
#: The last click: a day after the others, so that every real window closes (its own never
#: does).
SENTINEL = {"user": "sentinel", "ts": 1_700_000_000.0 + 86_400.0, "page": "/"}
MINUTE = 60


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("clickstream_windows_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected_counts(clicks: list[dict[str, Any]]) -> collections.Counter[tuple[str, int]]:
    """Per (user, window start in seconds) the clicks in it, computed from the clicks alone."""
    return collections.Counter((c["user"], math.floor(c["ts"] / MINUTE) * MINUTE) for c in clicks)


def window_of(row: dict[str, Any]) -> tuple[str, int]:
    value = row["value"]
    return value["key"], round(datetime.fromisoformat(value["start"]).timestamp())


def as_message(click: dict[str, Any]) -> tuple[str, bytes, None]:
    """A click as the example's publisher sends it."""
    return f"clicks.{click['user']}", json.dumps(click).encode(), None


class Publisher:
    """Publishes the clicks in order, CHUNK at a time: the first HEAD at once, then RATE a
    second until ``full_speed`` is set, then the rest at once; ``done`` once all are
    stored."""

    def __init__(self, url: str, clicks: list[dict[str, Any]]) -> None:
        self.url = url
        self.clicks = clicks
        self.published = 0
        self.full_speed = trio.Event()
        self.done = trio.Event()

    async def run(self) -> None:
        async with connect(self.url, name="clicks-publisher") as nc:
            await self._publish(nc, 0, HEAD)
            start = trio.current_time()
            for base in range(HEAD, len(self.clicks), CHUNK):
                # The pace of the stream: the next chunk is due then (or at once at full
                # speed), not a wait for a condition.
                with trio.move_on_at(start + (base - HEAD) / RATE):
                    await self.full_speed.wait()
                await self._publish(nc, base, base + CHUNK)
        self.done.set()

    async def _publish(self, nc: Any, begin: int, end: int) -> None:
        result = await publish_acked(nc, map(as_message, self.clicks[begin:end]))
        assert result.refused == 0, f"the stream refused {result.refused} clicks"
        self.published = min(end, len(self.clicks))


def consumer_summary(info: Any) -> str:
    if info is None:
        return "not found"
    return (
        f"ack floor {info.ack_floor.stream_seq}, delivered {info.delivered.stream_seq}, "
        f"ack pending {info.num_ack_pending}, pending {info.num_pending}, "
        f"redelivered {info.num_redelivered}"
    )


def worker_summary(worker: HeadraceProcess) -> str:
    """What the worker's last progress event said of its operator."""
    last = None
    for line in worker.err:
        if '"event":"progress"' in line:
            last = line
    if last is None:
        return "no progress event"
    stats = json.loads(last)["stats"]
    state = stats.get("stateful", {}).get("per-minute", {})
    return (
        f"redeliveries {stats.get('redeliveries')}, "
        f"skipped {state.get('skipped_redeliveries')}, late {state.get('late')}, "
        f"snapshots {state.get('snapshots')}, results {state.get('results_emitted')}"
    )


async def consumer_info(natspy: NatsPyPeer) -> Any:
    return await natspy.call(natspy.nc.jetstream().consumer_info, STREAM, DURABLE)


async def until_consumer(
    natspy: NatsPyPeer,
    worker: HeadraceProcess,
    predicate: Callable[[Any], bool],
    what: str,
    timeout: float,
) -> Any:
    """The consumer's info once ``predicate(info)`` holds; fails at once if the worker exits
    meanwhile. Polls every 0.1 s under a time limit: the server's consumer state has no event."""
    info = None
    try:
        with trio.fail_after(timeout):
            while True:
                if worker.proc.returncode is not None:
                    raise AssertionError(
                        f"headrace exited ({worker.proc.returncode}) while waiting for {what}; "
                        f"consumer: {consumer_summary(info)}\n{worker.transcript()}"
                    )
                try:
                    info = await consumer_info(natspy)
                except (NotFoundError, NatsTimeout):
                    pass  # not made yet by the worker
                else:
                    if predicate(info):
                        return info
                await trio.sleep(0.1)
    except trio.TooSlowError:
        raise AssertionError(
            f"{what}: not within {timeout}s; consumer: {consumer_summary(info)}\n"
            + worker.transcript()
        ) from None


async def until_output(out: Path, want: int, worker: HeadraceProcess, timeout: float) -> None:
    """Until the output holds ``want`` distinct real windows (or more). Polls the directory
    every 0.1 s under a time limit: files appear by rename, with no event to wait on."""
    found = 0
    try:
        with trio.fail_after(timeout):
            while True:
                rows = read_jsonl(out)
                found = len({window_of(r) for r in rows if r["value"]["key"] != SENTINEL["user"]})
                if found >= want or worker.proc.returncode is not None:
                    break
                await trio.sleep(0.1)
    except trio.TooSlowError:
        pass
    if found < want:
        raise AssertionError(
            f"the output holds {found} of the {want} windows of the clicks "
            f"(worker exit code {worker.proc.returncode})\n{worker.transcript()}"
        )


async def dead_letters(natspy: NatsPyPeer) -> tuple[int, str]:
    """How many messages the dead letter stream holds, and the first three with reasons."""
    js = natspy.nc.jetstream()
    info = await natspy.call(js.stream_info, DEAD)
    shown = []
    for seq in range(info.state.first_seq, info.state.first_seq + min(info.state.messages, 3)):
        msg = await natspy.call(js.get_msg, DEAD, seq)
        headers = msg.headers or {}
        shown.append(
            f"#{headers.get('Headrace-Stream-Seq')}: {headers.get('Headrace-Error')} "
            f"{msg.data[:100]!r}"
        )
    return info.state.messages, "\n".join(shown)


def compare(
    got: dict[tuple[str, int], int], want: collections.Counter[tuple[str, int]]
) -> list[str]:
    """The windows whose counts differ (missing, extra or wrong), one line each, in order."""
    lines = []
    for window in sorted(set(got) | set(want)):
        g, w = got.get(window), want.get(window)
        if g != w:
            start = datetime.fromtimestamp(window[1], UTC).isoformat()
            lines.append(f"{window[0]} {start}: output {g}, clicks {w}")
    return lines


async def test_killed_and_stalled_worker_writes_every_window_once_with_its_exact_count(
    nats_server: Any, natspy: NatsPyPeer, tmp_path: Path
) -> None:
    rng = random.Random(22)
    clicks = load_example().sample_clicks(CLICKS)
    url = nats_server.url
    await natspy.connect(url)
    js = natspy.nc.jetstream()
    # The example's streams (as its publisher makes them).
    await natspy.call(js.add_stream, name=STREAM, subjects=["clicks.>"])
    await natspy.call(js.add_stream, name=DEAD, subjects=["dead.clicks"])

    out = tmp_path / "out"
    env = clean_env(
        CLICKS_OUT=str(out), CLICKS_LATENESS=str(LATENESS), CLICKS_ACK_WAIT=str(ACK_WAIT)
    )
    args = ("run", str(EXAMPLE), "--nats", url, "--json-logs", "--interval", "1")
    stall_at = rng.randrange(KILLS)
    story: list[str] = []  # what was done, for the failure messages
    publisher = Publisher(url, clicks)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(publisher.run)
        floor = 0
        for cycle in range(1, KILLS + 1):
            async with headrace(*args, env=env) as worker:
                # Progress: the first worker through the clicks that were there, the others
                # past where the last one was killed.
                target = HEAD if cycle == 1 else floor + 1
                info = await until_consumer(
                    natspy,
                    worker,
                    lambda i, target=target: i.ack_floor.stream_seq >= target,
                    f"worker {cycle} to move the ack floor to {target}",
                    timeout=60,
                )
                story.append(f"worker {cycle}: ack floor {info.ack_floor.stream_seq}")
                if cycle == stall_at + 1:
                    worker.signal(signal.SIGSTOP)
                    stopped = await consumer_info(natspy)
                    # The stall itself: its length is the fault, not a wait for a condition.
                    await trio.sleep(STALL)
                    worker.signal(signal.SIGCONT)
                    story.append(f"  stopped for {STALL}s at {consumer_summary(stopped)}")
                    moved = stopped.ack_floor.stream_seq
                    info = await until_consumer(
                        natspy,
                        worker,
                        lambda i, moved=moved: i.ack_floor.stream_seq > moved,
                        f"worker {cycle} to move the ack floor above {moved} after SIGCONT",
                        timeout=60,
                    )
                    story.append(f"  going on: ack floor {info.ack_floor.stream_seq}")
                delay = rng.uniform(0.2, 2.0)
                # The random moment of the kill: the fault's timing, not a wait for a condition.
                await trio.sleep(delay)
                worker.signal(signal.SIGKILL)
                assert await worker.wait_exit() == -signal.SIGKILL
            info = await consumer_info(natspy)
            floor = info.ack_floor.stream_seq
            story.append(
                f"  killed {delay:.2f}s later, {publisher.published} clicks published: "
                f"{consumer_summary(info)}; worker's last progress: {worker_summary(worker)}"
            )
            assert not publisher.done.is_set(), (
                f"every click was published before kill {cycle}: the kills are meant to land "
                "while clicks are coming\n" + "\n".join(story)
            )

        async with headrace(*args, env=env) as worker:
            await worker.wait_event("started", timeout=30)  # its SIGTERM handler is in place
            # What the last killed worker held comes again and is acked before the rest of
            # the clicks come at once (see the module docs).
            held = info.delivered.stream_seq
            await until_consumer(
                natspy,
                worker,
                lambda i: i.ack_floor.stream_seq >= held,
                f"the last worker to ack what the killed one held (the ack floor at {held})",
                timeout=60,
            )
            publisher.full_speed.set()
            with trio.fail_after(60):
                await publisher.done.wait()
            await until_consumer(
                natspy,
                worker,
                lambda i: i.ack_floor.stream_seq == CLICKS and i.num_ack_pending == 0,
                f"the last worker to ack every click (the ack floor at {CLICKS})",
                timeout=90,
            )
            ack = await natspy.call(
                js.publish, f"clicks.{SENTINEL['user']}", as_message(SENTINEL)[1]
            )
            assert ack.seq == CLICKS + 1
            info = await until_consumer(
                natspy,
                worker,
                lambda i: i.ack_floor.stream_seq == CLICKS + 1 and i.num_ack_pending == 0,
                "the last worker to ack the far-future click",
                timeout=30,
            )
            want = expected_counts(clicks)
            await until_output(out, len(want), worker, timeout=30)
            worker.signal(signal.SIGTERM)
            code = await worker.wait_exit(60)
            assert code == 0, f"exit code {code}\n{worker.transcript()}"
            story.append(
                f"last worker: {consumer_summary(info)}; its last progress: "
                f"{worker_summary(worker)}"
            )
    told = "\n".join(story)
    print(f"\n{told}")  # what the faults met (shown with -rP)
    await assert_exact(natspy, out, clicks, told)


async def assert_exact(
    natspy: NatsPyPeer, out: Path, clicks: list[dict[str, Any]], told: str
) -> None:
    """Nothing dead-lettered; every real window once, with its count from the clicks alone."""
    want = expected_counts(clicks)
    dead, shown = await dead_letters(natspy)
    assert dead == 0, f"{dead} clicks in {DEAD} (late, or failed); the first:\n{shown}\n{told}"

    rows = read_jsonl(out)
    assert {r["stream"] for r in rows} == {RESULTS}
    written: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        written.setdefault(window_of(row), []).append(row)
    twice = [
        f"{w}: results {[r['stream_seq'] for r in rs]}, counts {[r['value']['value'] for r in rs]}"
        for w, rs in sorted(written.items())
        if len(rs) > 1
    ]
    assert not twice, (
        f"{len(twice)} windows written more than once, the first:\n"
        + "\n".join(twice[:10])
        + f"\n{told}"
    )
    numbers = collections.Counter(r["stream_seq"] for r in rows)
    assert max(numbers.values()) == 1, f"result numbers written twice: {numbers.most_common(5)}"
    for row in rows:
        value = row["value"]
        start = datetime.fromisoformat(value["start"]).timestamp()
        assert datetime.fromisoformat(value["end"]).timestamp() - start == MINUTE, row
        assert value["value"] == value["count"], row

    got = {w: rs[0]["value"]["value"] for w, rs in written.items() if w[0] != SENTINEL["user"]}
    wrong = compare(got, want)
    assert not wrong, (
        f"{len(wrong)} of {len(want)} windows differ (the output counts {sum(got.values())} "
        f"clicks in {len(got)} windows; {len(clicks)} were published), the first:\n"
        + "\n".join(wrong[:10])
        + f"\n{told}"
    )
    assert sum(got.values()) == CLICKS


@pytest.mark.parametrize("backend", ["memory", "disk"])
async def test_a_backlog_is_replayed_in_order_after_a_kill(
    nats_server: Any, natspy: NatsPyPeer, tmp_path: Path, backend: str
) -> None:
    """All 200,000 clicks and the far-future one are in the stream before the first worker
    starts; it is killed twice mid-way. A restarted worker waits for what the dead one held to
    come back (their ack wait) before it pulls anything newer, so the stream is replayed in
    order: no click turns late (before that wait, one kill made 2,503 of them late with a
    lateness of 600 s), every window once, exact. With the windows on disk, the killed
    workers' state files are swept by the next one: none is left at the end."""
    rng = random.Random(23)
    clicks = load_example().sample_clicks(CLICKS, seed=5)
    url = nats_server.url
    await natspy.connect(url)
    js = natspy.nc.jetstream()
    await natspy.call(js.add_stream, name=STREAM, subjects=["clicks.>"])
    await natspy.call(js.add_stream, name=DEAD, subjects=["dead.clicks"])
    async with connect(url, name="clicks-publisher") as nc:
        done = await publish_acked(nc, map(as_message, [*clicks, SENTINEL]))
        assert done.refused == 0
    out = tmp_path / "out"
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    env = clean_env(
        CLICKS_OUT=str(out),
        CLICKS_LATENESS=str(LATENESS),
        CLICKS_ACK_WAIT=str(ACK_WAIT),
        CLICKS_BACKEND=backend,
        CLICKS_STATE_DIR=str(state_dir) if backend == "disk" else "",
    )
    args = ("run", str(EXAMPLE), "--nats", url, "--json-logs", "--interval", "1")
    story: list[str] = []
    floor = 0
    for cycle in (1, 2):
        async with headrace(*args, env=env) as worker:
            target = floor + 5_000
            info = await until_consumer(
                natspy,
                worker,
                lambda i, target=target: i.ack_floor.stream_seq >= target,
                f"worker {cycle} to move the ack floor to {target}",
                timeout=60,
            )
            delay = rng.uniform(0.2, 1.0)
            await trio.sleep(delay)  # the random moment of the kill: the fault's timing
            worker.signal(signal.SIGKILL)
            assert await worker.wait_exit() == -signal.SIGKILL
        info = await consumer_info(natspy)
        floor = info.ack_floor.stream_seq
        story.append(f"worker {cycle} killed {delay:.2f}s on: {consumer_summary(info)}")
        if backend == "disk":  # the dead worker's file is left behind: the state was there
            assert list(state_dir.glob("headrace-state-*.db")), "no state file on disk"
        assert floor < CLICKS, "the worker was through before its kill\n" + "\n".join(story)
    async with headrace(*args, env=env) as worker:
        await worker.wait_event("started", timeout=30)
        info = await until_consumer(
            natspy,
            worker,
            lambda i: i.ack_floor.stream_seq == CLICKS + 1 and i.num_ack_pending == 0,
            "the last worker to ack every click",
            timeout=120,
        )
        await until_output(out, len(expected_counts(clicks)), worker, timeout=30)
        worker.signal(signal.SIGTERM)
        code = await worker.wait_exit(60)
        assert code == 0, f"exit code {code}\n{worker.transcript()}"
        story.append(f"last worker: {consumer_summary(info)}; {worker_summary(worker)}")
    assert list(state_dir.iterdir()) == [], "state files left behind"
    await assert_exact(natspy, out, clicks, "\n".join(story))
