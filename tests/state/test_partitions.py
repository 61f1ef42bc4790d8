"""Partitioned stateful pipelines (pipeline/partitions.py) on a real nats-server: three worker
processes share four partitions through leases; one is SIGKILLed, the others take its
partitions over with their state, and every (user, minute) is in the output once, exact. And
what `headrace run` shows of a partitioned run, alone and with `--workers`: the figures of a
plain run, its partitions' copies added up, checked against the clicks and the output."""

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
from headrace.pipeline.stats import STATEFUL
from headrace.sinks import MemorySink

from tests.cli.cli_support import clean_env, headrace, metrics_samples

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


async def _partitioned_stream(
    url: str, *, seed: int, count: int = 150_000, step: float = 0.01, far: bool = True
) -> tuple[list[dict[str, Any]], list[str]]:
    """CLICKS, split four ways by user on the server, holding ``count`` clicks ``step`` seconds
    apart, out of order, and then (``far``) one far in the future per user (every real window
    closes in every partition); the clicks and the users."""
    rng = random.Random(seed)
    clicks = [
        {"user": f"u{rng.randrange(24)}", "ts": BASE + i * step + rng.uniform(-3, 3)}
        for i in range(count)
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
        if far:
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


# -- what `headrace run` shows of a partitioned run ----------------------------------------------


def copies(event: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The stateful figures of a progress event, by partition's copy (``per-minute-p<n>``)."""
    found: dict[str, dict[str, Any]] = event["stats"].get(STATEFUL, {})
    return found


def settled(event: dict[str, Any], held: list[int]) -> bool:
    """A progress event of a run holding the partitions ``held``, each copy's state saved
    (none held back for a snapshot, no result waiting for its commit)."""
    figures = copies(event)
    return (
        event["partitions"]["held"] == held
        and sorted(figures) == [f"per-minute-p{p}" for p in held]
        and all(
            f["held"] == 0 and f["results_pending"] == 0 and f["epoch"] >= 1
            for f in figures.values()
        )
    )


def windows_left(
    clicks: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> set[tuple[str, float]]:
    """The (user, minute) windows of ``clicks`` not in the output ``rows``, each row once."""
    emitted = [
        (r["value"]["key"], datetime.fromisoformat(r["value"]["start"]).timestamp()) for r in rows
    ]
    assert len(emitted) == len(set(emitted)), "a window written twice"
    every = {(c["user"], math.floor(c["ts"] / 60) * 60.0) for c in clicks}
    assert set(emitted) <= every
    return every - set(emitted)


async def test_headrace_run_shows_the_figures_of_the_partitions_it_holds(nats_server, tmp_path):
    """`headrace run` of a partitioned pipeline: its progress and metrics are those of its
    partitions' copies added up (messages, acks, records), with each copy's window figures
    under its name (``per-minute-p<n>``) and the partitions it holds. When a second worker
    takes two partitions over, the first one's counts stay (those of its stopped copies are
    kept), its figures are those of the partitions it keeps, and the second shows the state it
    took over."""
    clicks, _users = await _partitioned_stream(
        nats_server.url, seed=41, count=3000, step=0.1, far=False
    )
    sent = len(clicks)
    out = tmp_path / "out"
    env = clean_env(PARTITIONED_OUT=str(out))
    args = ("run", str(CHILD), "--nats", nats_server.url, "--json-logs", "--interval", "0.2")
    async with headrace(*args, "--metrics-port", "0", env=env) as first:
        _, metrics = await first.wait_event("metrics")
        _, started = await first.wait_event("started")
        _, progress = await first.wait_event(
            "progress",
            lambda e: e["stats"]["acks"] >= sent and settled(e, [0, 1, 2, 3]),
            timeout=60,
        )
        samples = await metrics_samples(metrics["port"])
        rows = read_rows(out)

        stats, figures = progress["stats"], copies(progress)
        assert started["partitions"] == 4
        assert progress["partitions"] == {"count": 4, "held": [0, 1, 2, 3]}
        assert stats["messages_in"] == stats["acks"] == sent
        assert stats["redeliveries"] == stats["errors"] == stats["lag"] == 0
        assert stats["ack_pending"] == 0
        assert 0 < stats["records_out"] == len(rows)  # the windows closed, each once
        left = windows_left(clicks, rows)
        assert left, "every window closed: nothing left to count"
        assert sum(f["open_windows"] for f in figures.values()) == len(left)
        assert sum(f["keys"] for f in figures.values()) == len({user for user, _ in left})
        for name, f in figures.items():
            assert f["kind"] == "window" and f["late"] == 0 and f["snapshots"] >= 1, name
            assert f["watermark_lag"] == pytest.approx(30.0)
            assert progress["states"][f"stateful:{name}"] == "running"

        def metric(name: str, operator: str | None = None) -> float:
            labels = 'pipeline="partitioned"'
            if operator is not None:
                labels += f',operator="{operator}"'
            return samples[f"{name}{{{labels}}}"]

        assert metric("headrace_messages_total") == metric("headrace_acks_total") == sent
        assert metric("headrace_records_committed_total") == len(rows)
        assert metric("headrace_partitions") == metric("headrace_partitions_held") == 4
        for name, f in figures.items():
            assert metric("headrace_state_open_windows", name) == f["open_windows"]
            assert metric("headrace_state_keys", name) == f["keys"]

        # A second worker: the first hands two partitions over (drained first), and keeps
        # what their copies counted.
        async with headrace(*args, env=env) as second:
            index, change = await first.wait_event(
                "partitions", lambda e: bool(e["lost"]), timeout=30
            )
            kept = change["held"]
            assert len(kept) == 2 and sorted(kept + change["lost"]) == [0, 1, 2, 3]
            _, after = await first.wait_event("progress", lambda e: settled(e, kept), start=index)
            gone = {f"per-minute-p{p}": figures[f"per-minute-p{p}"] for p in change["lost"]}

            def took_over(e: dict[str, Any]) -> bool:
                """The second worker's copies hold the state the first one saved."""
                theirs = copies(e)
                return settled(e, sorted(change["lost"])) and all(
                    theirs[name]["open_windows"] == f["open_windows"]
                    and theirs[name]["keys"] == f["keys"]
                    for name, f in gone.items()
                )

            _, theirs = await second.wait_event("progress", took_over, timeout=30)
            for p in kept:
                name = f"per-minute-p{p}"
                assert copies(after)[name]["open_windows"] == figures[name]["open_windows"]
            assert after["stats"]["messages_in"] == after["stats"]["acks"] == sent
            assert after["stats"]["records_out"] == len(rows)
            assert theirs["stats"]["messages_in"] == 0
            second.signal(signal.SIGINT)
            assert await second.wait_exit() == 0, second.transcript()
        first.signal(signal.SIGINT)
        assert await first.wait_exit() == 0, first.transcript()
        events = first.events()
    stopped = events[-1]
    assert stopped["event"] == "stopped" and stopped["stats"]["messages_in"] == sent
    ins = [e["stats"]["messages_in"] for e in events if e["event"] == "progress"]
    assert ins == sorted(ins), "the count of messages went down"


async def test_headrace_run_workers_sum_the_figures_of_their_partitions(nats_server, tmp_path):
    """`headrace run --workers 2` of a partitioned pipeline: the supervisor's progress and
    metrics are the workers' sums (each the sum of its partitions' copies), with every
    partition's copy once and which worker holds which partitions."""
    clicks, _users = await _partitioned_stream(
        nats_server.url, seed=43, count=3000, step=0.1, far=False
    )
    sent = len(clicks)
    out = tmp_path / "out"
    env = clean_env(PARTITIONED_OUT=str(out))
    args = (
        *("run", str(CHILD), "--nats", nats_server.url, "--workers", "2", "--json-logs"),
        *("--interval", "0.2", "--metrics-port", "0"),
    )

    def balanced(e: dict[str, Any]) -> bool:
        held = sorted(len(w["partitions"] or ()) for w in e["workers"])
        return held == [2, 2] and e["stats"]["acks"] >= sent and settled(e, [0, 1, 2, 3])

    async with headrace(*args, env=env) as supervisor:
        _, metrics = await supervisor.wait_event("metrics")
        _, progress = await supervisor.wait_event("progress", balanced, timeout=60)
        samples = await metrics_samples(metrics["port"])
        rows = read_rows(out)
        supervisor.signal(signal.SIGTERM)
        assert await supervisor.wait_exit() == 0, supervisor.transcript()
        events = supervisor.events()

    stats, figures = progress["stats"], copies(progress)
    assert stats["messages_in"] - stats["redeliveries"] == sent
    assert stats["lag"] == stats["ack_pending"] == stats["errors"] == 0
    assert 0 < stats["records_out"] == len(rows)
    assert sum(w["messages_in"] for w in progress["workers"]) == stats["messages_in"]
    held = sorted(p for w in progress["workers"] for p in w["partitions"])
    assert held == [0, 1, 2, 3]  # each partition held by one worker
    left = windows_left(clicks, rows)
    assert sum(f["open_windows"] for f in figures.values()) == len(left)
    assert sum(f["keys"] for f in figures.values()) == len({user for user, _ in left})
    assert all(f["late"] == 0 for f in figures.values())
    labels = 'pipeline="partitioned"'
    assert samples[f"headrace_messages_total{{{labels}}}"] == stats["messages_in"]
    assert samples[f"headrace_partitions_held{{{labels}}}"] == 4
    assert samples[f"headrace_workers{{{labels}}}"] == 2
    for name, f in figures.items():
        labelled = f'headrace_state_open_windows{{{labels},operator="{name}"}}'
        assert samples[labelled] == f["open_windows"]
    # Counts never go down, in sum and per worker, however the partitions moved.
    reports = [e for e in events if e["event"] == "progress"]
    ins = [e["stats"]["messages_in"] for e in reports]
    assert ins == sorted(ins)
    for index in (0, 1):
        mine = [w["messages_in"] for e in reports for w in e["workers"] if w["index"] == index]
        assert mine == sorted(mine)
    stopped = events[-1]
    assert stopped["event"] == "stopped" and stopped["stats"]["messages_in"] == stats["messages_in"]
