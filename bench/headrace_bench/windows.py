"""``headrace bench windows``: per-user counts of clicks in one-minute tumbling windows of event
time, a headrace pipeline with a stateful window operator against Bytewax (0.21) fed by
nats-py, from one JetStream stream, in one run.

Setup: one private nats-server with JetStream (file storage); stream ``CLICKS`` (subjects
``clicks.>``) is loaded once with N JSON clicks (1,000,000 by default) like those of
examples/clickstream_windows.py, ``{"user": "u17", "ts": 1700000000.123456, "page": "/cart"}``
on ``clicks.<user>``: users drawn among 1000, ``ts`` (event time, seconds, whole microseconds)
1 ms apart from 2023-11-14T22:13:20Z and each moved by up to 5 s either way (out of order), so
N clicks span N ms of event time; then one sentinel click (user ``end``) a day after the last,
which moves the watermark past every real window so that all of them close. Both
implementations read all N + 1 messages, count per (user, minute) with a lateness of 30 s, and
must produce exactly the counts computed from the generated clicks while they were published.

- ``headrace-windows``: ``Pipeline``: ``JetStreamSource`` (a durable pull consumer, consume
  buffer ``--buffer`` 10,000, ``max_ack_pending`` 100,000) -> ``map(json.loads)`` ->
  ``key_by(user)`` -> ``window(TumblingWindow(60), count(), event_time=ts, lateness=30)`` ->
  ``MemorySink`` (the results kept in memory: a few per user and minute), run until caught up
  (``run_until_caught_up``, written out so that the run's stages can be read after: its
  ``pipe.running`` and ``run.wait_caught_up()``, then the drain). Exactly once: each click is
  acked only once a snapshot of the windows in KV holds it, and each window's count goes to
  the sink only once the snapshot that closed it is saved (docs/state.md). The line reports
  the stage's ``StateStats``: snapshots, ``snapshot_seconds`` (time in saving them) and their
  share of the wall time.
- ``bytewax``: ``headrace_bench.windows_bytewax``: a custom ``DynamicSource`` reading a durable
  pull consumer with nats-py's ``fetch(1000)``, each message acked when fetched (at most
  once), ``op.map(json.loads)``, ``count_window`` (``op.key_on`` and ``fold_window``) with
  ``EventClock(ts, wait_for_system_duration=30 s)`` and ``TumblingWindower(60 s, align_to=
  epoch)``, into a ``TestingSink``; ``bytewax.testing.run_main(flow)`` (one worker), ending
  when the source has read N + 1 messages.

Each runs in a fresh process of its own (its peak RSS is its own) after its imports and
``tune_gc()`` (what the ``headrace`` commands do; Bytewax's process gets it too, so the ratio is
the code's, not the collector settings'). The clock runs from the start of the run (the
consumer's creation) to its end: headrace's drain (its last acks flushed), Bytewax's
``run_main`` returning (its source drained its connection). CPU on the clock: the child's own
(``python_cpu_s``: every thread of the process, Bytewax's Rust runtime included) and
nats-server's (``server_cpu_s``), and both per 100k messages.

Checks, off the clock: the windows each child emitted, (user, start, count) without the
sentinel's, are compared with the expected counts: none missing, none extra, none emitted
twice, every count equal; and the server must agree that the consumer delivered N + 1 messages
once each and that all are acked (ack floor N + 1). A line that fails says how (``missing``,
``extra``, ``duplicates``, ``wrong_counts``, ``counted`` events against ``events``, ``late``)
with ``verified: false``, ``error`` and no figures; ``headrace bench`` then exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import importlib.util
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import trio
from headrace.localserver import LocalServer

from headrace_bench.consume import (
    BenchmarkError,
    _cpu_seconds,
    _failure,
    _last_json,
    _peak_rss_mb,
    _run_child,
    _settled_problems,
    _stored,
    report,
)

HEADRACE = "headrace-windows"
HEADRACE_DISK = "headrace-windows-disk"
BYTEWAX = "bytewax"
IMPLS = (HEADRACE, HEADRACE_DISK, BYTEWAX)
#: The window operator's backend of each headrace line.
BACKENDS = {HEADRACE: "memory", HEADRACE_DISK: "disk"}
STREAM = "CLICKS"
SUBJECTS = "clicks.>"
MESSAGES = 1_000_000
USERS = 1000
PAGES = ("/", "/search", "/item", "/cart", "/pay")
#: Event time of click 0 (2023-11-14T22:13:20Z), in microseconds, and the clicks' spacing.
BASE_US = 1_700_000_000_000_000
SPACING_US = 1_000
#: Each click's event time is moved by up to this much either way (out of order).
JITTER_US = 5_000_000
WINDOW_S = 60
LATENESS_S = 30
#: The sentinel's user: its click comes a day after the last, and its window is not counted.
SENTINEL = "end"
SEED = 22
#: headrace's consume buffer (``--buffer``) and both consumers' ``max_ack_pending``.
BUFFER = 10_000
MAX_ACK_PENDING = 100_000
#: The window operator's name: its stage is ``stateful:<name>``.
OPERATOR = "per-minute"
LOAD_WINDOW = 2000
#: A run that has not caught up (or read every message) by then is stopped and reported.
RUN_TIMEOUT = 600.0
IDLE = 10.0
CHILD_TIMEOUT = 900.0
_ME = [sys.executable, "-m", "headrace_bench.windows"]


# -- the clicks and the expected counts -------------------------------------------------------


def clicks(n: int, *, seed: int = SEED, users: int = USERS) -> Iterator[tuple[str, int, str]]:
    """The ``n`` clicks as ``(user, event time in microseconds, page)`` (see the module
    docs), by ``users`` users; the same ``n``, ``seed`` and ``users`` give the same clicks."""
    rng = random.Random(seed)
    for i in range(n):
        user = f"u{rng.randrange(users)}"
        t_us = BASE_US + i * SPACING_US + rng.randint(-JITTER_US, JITTER_US)
        yield user, t_us, PAGES[rng.randrange(len(PAGES))]


def sentinel_us(n: int) -> int:
    """The sentinel's event time: a day after the latest possible click."""
    return BASE_US + n * SPACING_US + JITTER_US + 86_400_000_000


def click_json(user: str, t_us: int, page: str) -> bytes:
    # t_us / 1e6 is the double nearest to a whole microsecond: both implementations round it
    # back to t_us (datetime and headrace's to_micros round to the microsecond).
    return json.dumps({"user": user, "ts": t_us / 1_000_000, "page": page}).encode()


def window_start_s(t_us: int, window_s: int = WINDOW_S) -> int:
    """The start (seconds since the epoch) of the window of ``t_us`` (one minute unless
    ``window_s`` says otherwise)."""
    return t_us // (window_s * 1_000_000) * window_s


async def load(
    url: str, n: int, users: int = USERS, window_s: int = WINDOW_S
) -> tuple[dict[str, Any], Counter[tuple[str, int]]]:
    """Create the stream and publish the ``n`` clicks and the sentinel, every publish
    acknowledged; returns the load's figures and the expected counts per (user, window start),
    computed from the clicks as they are generated (not read back)."""
    from headrace.jetstream import JetStream, StreamConfig, publish_acked
    from headrace.nats import connect

    expected: Counter[tuple[str, int]] = Counter()

    def messages() -> Iterator[tuple[str, bytes, None]]:
        for user, t_us, page in clicks(n, users=users):
            expected[(user, window_start_s(t_us, window_s))] += 1
            yield f"clicks.{user}", click_json(user, t_us, page), None
        yield f"clicks.{SENTINEL}", click_json(SENTINEL, sentinel_us(n), "/"), None

    async with connect(url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECTS]))
        done = await publish_acked(nc, messages(), window=LOAD_WINDOW)
        stored = await _stored(js, n + 1, done.refused, STREAM)
        info = await js.stream_info(STREAM)
    return {
        "stored": stored,
        "load_msg_per_s": round(done.msg_per_s),
        "avg_stored_bytes": round(info.state.bytes / stored, 1),
    }, expected


def compare(
    expected: Counter[tuple[str, int]], emitted: list[tuple[str, int, int]]
) -> dict[str, Any]:
    """How the windows an implementation emitted, ``(user, start, count)`` (the sentinel's
    left out), differ from ``expected``: counts of missing, extra, duplicated and miscounted
    windows, the events counted, and a few examples; ``problems`` is empty when they agree."""
    got: dict[tuple[str, int], int] = {}
    duplicates = 0
    for user, start, count in emitted:
        key = (user, start)
        if key in got:
            duplicates += 1
            got[key] += count
        else:
            got[key] = count
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    wrong = [(k, got[k], v) for k, v in expected.items() if k in got and got[k] != v]
    counted, events = sum(c for _, _, c in emitted), sum(expected.values())
    problems = []
    if missing:
        problems.append(f"{len(missing)} windows missing (first: {missing[0]})")
    if extra:
        problems.append(f"{len(extra)} windows not expected (first: {extra[0]})")
    if duplicates:
        problems.append(f"{duplicates} windows emitted more than once")
    if wrong:
        (key, have, want) = wrong[0]
        problems.append(f"{len(wrong)} windows miscounted (first: {key}: {have}, not {want})")
    if counted != events:
        problems.append(f"{counted} events counted, not {events}")
    return {
        "windows": len(emitted),
        "expected_windows": len(expected),
        "missing": len(missing),
        "extra": len(extra),
        "duplicates": duplicates,
        "wrong_counts": len(wrong),
        "counted": counted,
        "events": events,
        "problems": problems,
    }


# -- the children -----------------------------------------------------------------------------


class _Clock:
    """Wall time, this process's CPU and nats-server's, from start to :meth:`stop`."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid
        self.server = _cpu_seconds(server_pid) if server_pid else None
        self.cpu = time.process_time()
        self.started = time.perf_counter()

    def stop(self) -> dict[str, Any]:
        spent: dict[str, Any] = {"seconds": time.perf_counter() - self.started}
        spent["python_cpu_s"] = round(time.process_time() - self.cpu, 3)
        if self.server_pid and self.server is not None:
            spent["server_cpu_s"] = round(_cpu_seconds(self.server_pid) - self.server, 3)
        return spent


def user_of(click: dict[str, Any]) -> str:
    return str(click["user"])


def click_time(click: dict[str, Any]) -> float:
    return float(click["ts"])


async def _run_headrace(
    url: str,
    total: int,
    buffer: int,
    server_pid: int | None,
    impl: str = HEADRACE,
    window_s: int = WINDOW_S,
) -> dict[str, Any]:
    from headrace.jetstream import ConsumeOptions, ConsumerConfig, JetStream
    from headrace.nats import connect
    from headrace.pipeline import JetStreamSource, Pipeline, tune_gc
    from headrace.sinks import MemorySink
    from headrace.state import TumblingWindow, WindowResult, count, to_micros

    durable = f"windows_{os.getpid()}"
    sink = MemorySink()
    # A pipeline (and so a state) of its own for each line: the state is keyed by names.
    pipe = Pipeline(f"windows-{BACKENDS[impl]}", drain_timeout=60)
    source = JetStreamSource(
        stream=STREAM,
        durable=durable,
        config=ConsumerConfig(max_ack_pending=MAX_ACK_PENDING),
        consume=ConsumeOptions(max_messages=buffer),
    )
    (
        pipe.source(source, name="clicks")
        .map(json.loads, name="decode")
        .key_by(user_of)
        .window(
            TumblingWindow(timedelta(seconds=window_s)),
            count(),
            event_time=click_time,
            lateness=timedelta(seconds=LATENESS_S),
            name=OPERATOR,
            backend=BACKENDS[impl],  # type: ignore[arg-type]
        )
        .sink(sink, name="memory")
    )
    problems: list[str] = []
    async with connect(url) as nc:
        tune_gc()
        clock = _Clock(server_pid)
        # run_until_caught_up(pipe, nc), written out: the same running() and wait, so that the
        # window stage's stats can be read from the run afterwards.
        async with pipe.running(nc) as run:
            with trio.move_on_after(RUN_TIMEOUT) as scope:
                await run.wait_caught_up()
        spent = clock.stop()
        if scope.cancelled_caught:
            problems.append(f"did not catch up within {RUN_TIMEOUT:.0f}s")
        if run.drain_timed_out:
            problems.append(f"the drain timed out: {run.stats.ack_pending} messages not acked")
        peak = _peak_rss_mb()
        stats = run.state_stats(OPERATOR)
        js = JetStream(nc)
        server = await _settled_problems(
            total, True, lambda: js.consumer_info(STREAM, durable), trio.sleep
        )
        await js.delete_consumer(STREAM, durable)
    results = [r.value for r in sink.records if isinstance(r.value, WindowResult)]
    windows = [(r.key, to_micros(r.start) // 1_000_000, r.value) for r in results]
    return {
        "emitted": {"windows": windows, "late": stats.late},
        "impl": impl,
        "backend": BACKENDS[impl],
        "msgs": run.stats.acks,
        **spent,
        "peak_rss_mb": peak,
        "problems": problems + server,
        "buffer": buffer,
        "snapshots": stats.snapshots,
        "snapshot_seconds": round(stats.snapshot_seconds, 3),
        "snapshot_share": round(stats.snapshot_seconds / spent["seconds"], 3),
        "last_snapshot_bytes": stats.snapshot_bytes,
        "state_file_bytes": stats.state_file_bytes,
        "results_emitted": stats.results_emitted,
        "dead_lettered": run.stats.dead_lettered,
    }


def _run_bytewax(
    url: str, total: int, server_pid: int | None, window_s: int = WINDOW_S
) -> dict[str, Any]:
    from bytewax.testing import run_main
    from headrace.pipeline import tune_gc

    from headrace_bench import windows_bytewax as bw

    durable = f"bytewax_{os.getpid()}"
    counts: list[Any] = []
    late: list[Any] = []
    source = bw.JetStreamSource(
        url,
        STREAM,
        SUBJECTS,
        durable,
        fetch=bw.FETCH,
        stop_after=total,
        idle=IDLE,
        max_ack_pending=MAX_ACK_PENDING,
    )
    flow = bw.flow(
        source,
        window=timedelta(seconds=window_s),
        lateness=timedelta(seconds=LATENESS_S),
        counts=counts,
        late=late,
    )
    tune_gc()
    clock = _Clock(server_pid)
    run_main(flow)  # type: ignore[no-untyped-call]
    spent = clock.stop()
    peak = _peak_rss_mb()

    async def check() -> list[str]:
        import nats  # type: ignore[import-not-found,unused-ignore]

        nc = await nats.connect(url)
        js = nc.jetstream()
        try:
            return await _settled_problems(
                total, True, lambda: js.consumer_info(STREAM, durable), asyncio.sleep
            )
        finally:
            await js.delete_consumer(STREAM, durable)
            await nc.close()

    server = asyncio.run(check())
    # (user, (window id, count)); window k starts at the epoch + k minutes.
    windows = [(user, wid * window_s, n) for user, (wid, n) in counts]
    return {
        "emitted": {"windows": windows, "late": len(late)},
        "impl": BYTEWAX,
        "msgs": source.read[0],
        **spent,
        "peak_rss_mb": peak,
        "problems": server,
        "fetch": bw.FETCH,
        "acked": "when fetched",
        "bytewax_version": importlib.metadata.version("bytewax"),
    }


def _child(args: argparse.Namespace) -> dict[str, Any]:
    # Imports off the clock, in both processes alike.
    for module in ("headrace.jetstream", "headrace.nats", "headrace.pipeline", "nats"):
        importlib.import_module(module)
    total = args.messages + 1
    if args.impl in BACKENDS:
        raw = trio.run(
            _run_headrace,
            args.url,
            total,
            args.buffer,
            args.server_pid,
            args.impl,
            args.window_size,
        )
    else:
        importlib.import_module("bytewax.operators")
        raw = _run_bytewax(args.url, total, args.server_pid, args.window_size)
    # The windows emitted go to a file (a few per user and minute); the figures to stdout.
    Path(args.out).write_text(json.dumps(raw.pop("emitted")))
    return dict(raw)


# -- the parent -------------------------------------------------------------------------------


def check_bytewax() -> None:
    """:class:`BenchmarkError` unless Bytewax can be imported (it is a dependency of the
    benchmarks' distribution; an environment made otherwise may lack it)."""
    if importlib.util.find_spec("bytewax") is None:
        raise BenchmarkError(
            "`bench windows` needs Bytewax: pip install 'bytewax==0.21.*' (or pip install -e bench)"
        )


def _finish(
    raw: dict[str, Any], n: int, expected: Counter[tuple[str, int]], emitted: dict[str, Any]
) -> dict[str, Any]:
    """The child's figures and its windows, checked against ``expected``, as a result line."""
    result: dict[str, Any] = {"bench": "windows", "impl": raw.pop("impl")}
    result["msgs"] = raw.pop("msgs")
    result["expected"] = n + 1
    windows = [
        (user, start, count) for user, start, count in emitted["windows"] if user != SENTINEL
    ]
    diff = compare(expected, windows)
    problems = raw.pop("problems") + diff.pop("problems")
    late = emitted.get("late", 0)
    if late:
        problems.append(f"{late} events judged late")
    result["verified"] = not problems
    seconds = raw.pop("seconds")
    if problems:
        result["error"] = "; ".join(problems)
        for key in ("python_cpu_s", "server_cpu_s", "snapshot_share"):
            raw.pop(key, None)
    else:
        total = n + 1
        result["seconds"] = round(seconds, 3)
        result["msg_per_s"] = round(total / seconds) if seconds > 0 else 0
        for key in ("python_cpu_s", "server_cpu_s"):
            if key in raw:
                result[f"{key}_per_100k"] = round(raw[key] * 100_000 / total, 3)
    result.update(diff, late=late)
    result.update(raw)
    return result


def _measure(
    impl: str,
    url: str,
    work: Path,
    n: int,
    buffer: int,
    server_pid: int | None,
    expected: Counter[tuple[str, int]],
    window_s: int = WINDOW_S,
) -> dict[str, Any]:
    out = work / f"{impl}.json"
    cmd = [*_ME, "child", "--impl", impl, "--url", url, "--out", str(out)]
    cmd += ["--messages", str(n), "--buffer", str(buffer), "--window-size", str(window_s)]
    if server_pid is not None:
        cmd += ["--server-pid", str(server_pid)]
    child = _run_child(cmd, timeout=CHILD_TIMEOUT)
    raw = _last_json(child)
    if child.returncode != 0 or raw is None or not out.exists():
        return {
            "bench": "windows",
            "impl": impl,
            "msgs": 0,
            "expected": n + 1,
            "verified": False,
            "error": _failure(child),
        }
    if child.peak_rss_mb is not None:
        raw["peak_rss_mb"] = max(raw.get("peak_rss_mb") or 0, child.peak_rss_mb)
    return _finish(raw, n, expected, json.loads(out.read_text()))


def _add_ratio(results: list[dict[str, Any]]) -> None:
    peer = next((r for r in results if r["impl"] == BYTEWAX), None)
    for ours in results:
        if ours["impl"] in BACKENDS and peer and ours.get("msg_per_s") and peer.get("msg_per_s"):
            ours["ratio_vs_bytewax"] = round(ours["msg_per_s"] / peer["msg_per_s"], 2)


def _print_table(results: list[dict[str, Any]], load: dict[str, Any]) -> None:
    print(
        f"stream loaded: {load['stored']:,} messages ({load['avg_stored_bytes']} B each as "
        f"stored) at {load['load_msg_per_s']:,} msg/s; per-user counts in {load['window_s']} s "
        f"windows of {load['users']:,} users"
    )
    for r in results:
        if "error" in r:
            print(f"{r['impl']:>16}: FAILED: {r['error']}")
            continue
        ratio = f"  vs bytewax {r['ratio_vs_bytewax']}x" if "ratio_vs_bytewax" in r else ""
        print(
            f"{r['impl']:>16}: {r['msg_per_s']:>9,} msg/s  {r['seconds']:7.2f} s  "
            f"{r['windows']:,} windows verified{ratio}"
        )
        cpu = ", ".join(
            f"{name} {r[f'{name}_cpu_s_per_100k']:.2f}"
            for name in ("python", "server")
            if f"{name}_cpu_s_per_100k" in r
        )
        snapshots = (
            f"; {r['snapshots']} snapshots, {r['snapshot_seconds']:.2f} s "
            f"({r['snapshot_share']:.1%} of the wall time)"
            if "snapshots" in r
            else ""
        )
        print(f"{'':>16}  CPU s/100k: {cpu}; peak RSS {r.get('peak_rss_mb')} MB{snapshots}")


def run(
    messages: int = MESSAGES,
    *,
    buffer: int = BUFFER,
    users: int = USERS,
    window_s: int = WINDOW_S,
    impls: tuple[str, ...] = IMPLS,
    as_json: bool = False,
) -> list[dict[str, Any]]:
    """Load the stream once, run each implementation in its own process, check its windows,
    print JSON lines or a table; returns the lines (one that failed a check has ``error``,
    ``verified: false`` and no figures)."""
    if BYTEWAX in impls:
        check_bytewax()
    if messages < 1 or buffer < 1 or users < 1 or window_s < 1:
        raise BenchmarkError(
            "--messages, --buffer, --entities and --window-size must be at least 1"
        )
    unknown = set(impls) - set(IMPLS)
    if unknown or not impls:
        raise BenchmarkError(f"implementations are some of {', '.join(IMPLS)}, not {impls}")
    results: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="headrace-bench-windows-") as work,
        LocalServer(jetstream=True) as server,
    ):
        loaded, expected = trio.run(load, server.url, messages, users, window_s)
        loaded["users"] = users
        loaded["window_s"] = window_s
        for impl in impls:
            result = _measure(
                impl, server.url, Path(work), messages, buffer, server.pid, expected, window_s
            )
            result["avg_stored_bytes"] = loaded["avg_stored_bytes"]
            results.append(result)
    _add_ratio(results)
    report(
        "windows",
        results,
        label=lambda r: str(r["impl"]),
        as_json=as_json,
        table=lambda: _print_table(results, loaded),
    )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m headrace_bench.windows")
    parser.add_argument("role", nargs="?", choices=["child"])
    parser.add_argument("--impl", choices=IMPLS, default=HEADRACE)
    parser.add_argument("--url")
    parser.add_argument("--out")
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--buffer", type=int, default=BUFFER)
    parser.add_argument("--server-pid", type=int, default=None)
    parser.add_argument("--users", type=int, default=USERS)
    parser.add_argument("--window-size", type=int, default=WINDOW_S)
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.role == "child":
        print(json.dumps(_child(args)), flush=True)
    else:
        results = run(
            args.messages,
            buffer=args.buffer,
            users=args.users,
            window_s=args.window_size,
            impls=tuple(args.impls.split(",")),
            as_json=args.json,
        )
        if any(not r.get("verified") for r in results):
            sys.exit(1)


if __name__ == "__main__":
    main()
