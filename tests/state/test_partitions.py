"""Partitioned stateful pipelines (pipeline/partitions.py) on a real nats-server: three worker
processes share four partitions through leases; one is SIGKILLed, the others take its
partitions over with their state, and every (user, minute) is in the output once, exact."""

from __future__ import annotations

import collections
import functools
import json
import math
import os
import random
import signal
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.jetstream import JetStream, StreamConfig, publish_acked
from headrace.jetstream.stream_config import SubjectTransformConfig
from headrace.nats import connect
from headrace.pipeline import JetStreamSource, Partitioning, Pipeline
from headrace.pipeline.partitions import partition_graph
from headrace.sinks import MemorySink

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from cli_support import clean_env, headrace

pytestmark = pytest.mark.slow

CHILD = Path(__file__).with_name("partition_child.py")
BASE = 1_700_000_000.0
FAR = BASE + 86_400.0


def test_a_partition_graph_names_its_consumer_filter_and_state_after_the_partition():
    pipe = Pipeline("p")
    (
        pipe.source(JetStreamSource(stream="S", durable="d"))
        .key_by(lambda v: v)
        .fold(lambda: 0, lambda a, v: a + 1, name="total")
        .sink(MemorySink())
    )
    copy = partition_graph(pipe, Partitioning(4, "s.{partition}.>"), 3)
    source, total, sink = copy.nodes
    assert source.source is not None
    assert source.source.durable == "d-p3" and source.source.filter_subjects == ("s.3.>",)
    assert total.name == "total-p3" and total.upstream == [source] and sink.upstream == [total]
    assert sink.sink_obj is not pipe.nodes[2].sink_obj
    assert pipe.nodes[0].source.durable == "d"  # type: ignore[union-attr]
    copy.validate()


async def _partitioned_stream(url: str, *, seed: int) -> tuple[list[dict[str, Any]], list[str]]:
    """CLICKS, split four ways by user on the server, holding 150,000 clicks out of order and
    then one far in the future per user (every real window closes in every partition); the
    clicks and the users."""
    rng = random.Random(seed)
    clicks = [
        {"user": f"u{rng.randrange(24)}", "ts": BASE + i * 0.01 + rng.uniform(-3, 3)}
        for i in range(150_000)
    ]
    users = sorted({c["user"] for c in clicks})
    async with connect(url) as nc:
        js = JetStream(nc)
        await js.add_stream(
            StreamConfig(
                name="CLICKS",
                subjects=["clicks.*"],
                subject_transform=SubjectTransformConfig(
                    src="clicks.*", dest="clicks.{{partition(4,1)}}.{{wildcard(1)}}"
                ),
            )
        )
        messages = [(f"clicks.{c['user']}", json.dumps(c).encode(), None) for c in clicks]
        messages += [
            (f"clicks.{u}", json.dumps({"user": u, "ts": FAR}).encode(), None) for u in users
        ]
        await publish_acked(nc, messages)
    return clicks, users


def assert_exact(rows: list[dict[str, Any]], want: collections.Counter[tuple[str, int]]) -> None:
    """Every real window once, with the count computed from the clicks."""
    got: dict[tuple[str, int], list[int]] = {}
    for r in rows:
        start = datetime.fromisoformat(r["value"]["start"]).timestamp()
        if start >= FAR - 60:
            continue
        got.setdefault((r["value"]["key"], round(start)), []).append(r["value"]["value"])
    twice = {k: v for k, v in got.items() if len(v) > 1}
    assert not twice, f"windows written twice: {list(twice.items())[:5]}"
    assert {k: v[0] for k, v in got.items()} == dict(want)


class Worker:
    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.held: set[int] = set()
        self.changed = trio.Event()

    async def read(self) -> None:
        assert self.proc.stdout is not None
        pending = b""
        while chunk := await self.proc.stdout.receive_some(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                change = json.loads(line)
                self.held |= set(change["gained"])
                self.held -= set(change["lost"])
                self.changed.set()
                self.changed = trio.Event()


async def wait_for(predicate: Any, workers: list[Worker], what: str, timeout: float) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            events = [w.changed for w in workers]
            async with trio.open_nursery() as nursery:
                for event in events:

                    async def one(e: trio.Event = event) -> None:
                        await e.wait()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(one)


def read_rows(out: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(out.glob("*.jsonl")):
        rows.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return rows


async def test_three_workers_one_killed_every_window_once_and_exact(nats_server, tmp_path):
    clicks, users = await _partitioned_stream(nats_server.url, seed=31)
    out = tmp_path / "out"
    workers: list[Worker] = []
    async with trio.open_nursery() as nursery:
        for k in range(3):
            argv = [sys.executable, str(CHILD), nats_server.url, str(out), f"w{k}"]
            proc = await nursery.start(
                functools.partial(trio.run_process, argv, stdout=-1, check=False)
            )
            worker = Worker(proc)
            workers.append(worker)
            nursery.start_soon(worker.read)
        await wait_for(
            lambda: (
                sorted(p for w in workers for p in w.held) == [0, 1, 2, 3]
                and all(w.held for w in workers)
            ),
            workers,
            "every partition held once, every worker holding one or two",
            60,
        )
        split = sorted(len(w.held) for w in workers)
        want: collections.Counter[tuple[str, int]] = collections.Counter(
            (c["user"], math.floor(c["ts"] / 60) * 60) for c in clicks
        )
        # The kill lands mid-way: some windows out, most to come.
        with trio.fail_after(60):
            while len(read_rows(out)) < len(want) // 10:  # noqa: ASYNC110 - files, no event
                await trio.sleep(0.05)  # pacing the reads of another process's files
        victim = max(workers, key=lambda w: len(w.held))
        lost = set(victim.held)
        victim.proc.send_signal(signal.SIGKILL)
        at_kill = len(read_rows(out))
        assert at_kill < len(want), "every window was out before the kill"
        others = [w for w in workers if w is not victim]
        await wait_for(
            lambda: lost <= {p for w in others for p in w.held},
            others,
            "the killed worker's partitions taken over",
            30,
        )
        with trio.fail_after(120):
            while True:
                rows = [r for r in read_rows(out) if r["value"]["key"] in users]
                if len({(r["value"]["key"], r["value"]["start"]) for r in rows}) >= len(want):
                    break
                await trio.sleep(0.2)  # pacing the reads of another process's files
        for w in others:
            w.proc.send_signal(signal.SIGINT)
    assert_exact(read_rows(out), want)
    assert split == [1, 1, 2]
    print(f"split {split}; killed the one holding {sorted(lost)}, {at_kill} of {len(want)} out")


async def test_headrace_run_workers_share_the_partitions_one_killed(nats_server, tmp_path):
    """`headrace run` of a pipeline that declares its partitioning, with --workers 3: the
    workers lease the partitions; one SIGKILLed mid-way is restarted by the supervisor and the
    partitions go on; every window once and exact."""
    clicks, users = await _partitioned_stream(nats_server.url, seed=37)
    out = tmp_path / "out"
    env = clean_env(PARTITIONED_OUT=str(out))
    args = ("run", str(CHILD), "--nats", nats_server.url, "--workers", "3", "--json-logs")
    want = collections.Counter((c["user"], math.floor(c["ts"] / 60) * 60) for c in clicks)
    async with headrace(*args, env=env) as supervisor:
        start = 0
        for _ in range(3):
            index, _started = await supervisor.wait_event("worker_started", start=start, timeout=30)
            start = index + 1
        starts = [e for e in supervisor.events() if e.get("event") == "worker_started"]
        pids = [e["pid"] for e in starts]
        with trio.fail_after(60):
            while len(read_rows(out)) < len(want) // 10:  # noqa: ASYNC110 - files, no event
                await trio.sleep(0.05)  # pacing the reads of another process's files
        os.kill(pids[0], signal.SIGKILL)
        at_kill = len(read_rows(out))
        with trio.fail_after(120):
            while True:
                rows = [r for r in read_rows(out) if r["value"]["key"] in users]
                if len({(r["value"]["key"], r["value"]["start"]) for r in rows}) >= len(want):
                    break
                await trio.sleep(0.2)
        supervisor.proc.send_signal(signal.SIGTERM)
        code = await supervisor.wait_exit(60)
        assert code == 0, supervisor.transcript()
    assert at_kill < len(want), "every window was out before the kill"
    assert_exact(read_rows(out), want)
