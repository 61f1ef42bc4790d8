"""``headrace bench checkpoints``: events per second through checkpointed subscriptions with
many entities, against what a user would do without them.

Setup: one private nats-server; stream ``EVENTS`` (``orders.>``, direct get allowed) loaded
with N events spread round-robin over E entities (``orders.<entity>.e<k>``). The handler stands
for real work that waits on I/O: it sleeps ``--handler-ms`` (1 ms by default).

- ``headrace-checkpoints``: ``GlobalConsumer`` + ``CheckpointWorkers`` (default concurrency)
  on a fresh KV bucket; each entity's events in order, entities in parallel; done when every
  event was handled (the handler counts) and every checkpoint's position reached its version.
- ``nats-py-serial``: the order-preserving loop without checkpoints: one pull consumer,
  ``fetch(100)``, each message handled then acked, one at a time (parallel handling would lose
  the per-entity order).

Each runs in its own process (peak RSS its own); the clock runs from the first read to the
last event handled. Printed: events/s, seconds, peak RSS, and headrace's ratio.

After its run, headrace's process also measures what matters with many idle entities
(``--entities 10000``): the latency of a new event to an idle entity (published, then
handled: ``LATENCY_EVENTS`` of them one at a time, p50 and p99), the CPU the idle host and the
server use (over ``IDLE_SECONDS``, as % of one core), and how long ``headrace checkpoints
list`` takes on the group (the command run as a user would, Python's start included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

import trio
from headrace.checkpoints import CheckpointId
from headrace.localserver import LocalServer

from headrace_bench.consume import (
    BenchmarkError,
    _failure,
    _last_json,
    _peak_rss_mb,
    _run_child,
)

IMPLS = ("headrace-checkpoints", "nats-py-serial")
LATENCY_EVENTS = 50
IDLE_SECONDS = 5.0
STREAM = "EVENTS"
ENTITIES = 200
HANDLER_MS = 1.0
_ME = [sys.executable, "-m", "headrace_bench.checkpoints"]


async def _load(url: str, n: int, entities: int) -> None:
    from headrace.jetstream import JetStream, StreamConfig, publish_acked
    from headrace.nats import connect

    async with connect(url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name=STREAM, subjects=["orders.>"], allow_direct=True))
        messages = ((f"orders.{i % entities}.e{i // entities}", b"{}", None) for i in range(n))
        load = await publish_acked(nc, messages, window=1000)
        if load.refused:
            raise BenchmarkError(f"loading failed: {load.refused} publishes refused")


async def _run_headrace(
    url: str,
    n: int,
    handler_ms: float,
    entities: int = ENTITIES,
    server_pid: int | None = None,
    concurrency: int | None = None,
) -> dict[str, Any]:
    from headrace.checkpoints import (
        CheckpointStore,
        CheckpointWorkers,
        GlobalConsumer,
        Subscription,
        SubscriptionGroup,
    )
    from headrace.jetstream import JetStream, KeyValueConfig, create_key_value
    from headrace.nats import connect

    handled = 0
    done = trio.Event()
    pause = handler_ms / 1000
    awaited: dict[str, trio.Event] = {}  # the latency probe's events, by subject

    async def handle(msg: Any) -> None:
        nonlocal handled
        await trio.sleep(pause)
        handled += 1
        if handled >= n:
            done.set()
        if msg.subject in awaited:
            awaited[msg.subject].set()

    group = SubscriptionGroup(
        name="bench",
        subscriptions=[Subscription(name="all", subjects=["orders.>"], handler=handle)],
    )
    async with connect(url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="bench")))
        workers = CheckpointWorkers(js, STREAM, group, store)
        if concurrency is not None:
            workers.concurrency = concurrency
        started, cpu = time.perf_counter(), time.process_time()
        server_cpu = _cpu_seconds(server_pid)
        async with trio.open_nursery() as nursery:
            await nursery.start(GlobalConsumer(js, STREAM, group, store, max_wait=0.05).run)
            await nursery.start(workers.run)
            finished = None
            with trio.move_on_after(600):
                await done.wait()
                # The last handlers have returned; their positions are being written.
                finished = await _caught_up(store)
            elapsed = (finished or time.perf_counter()) - started
            busy_cpu = round(100 * (time.process_time() - cpu) / elapsed, 1)
            server_after = _cpu_seconds(server_pid)
            busy_server = (
                round(100 * (server_after - server_cpu) / elapsed, 1)
                if server_cpu is not None and server_after is not None
                else None
            )
            behind = await _behind(store)
            ok = handled == n and not behind
            problems = [] if handled == n else [f"handled {handled} events, not {n}"]
            idle = await _idle_cpu(server_pid) if ok else {}
            latency = await _latency(js, entities, awaited) if ok else {}
            nursery.cancel_scope.cancel()
        listing = await _list_seconds(url) if ok else {}
    if behind:
        problems.append(f"{len(behind)} checkpoints not at their version")
    return _result(
        "headrace-checkpoints",
        n,
        elapsed,
        problems,
        concurrency=workers.concurrency,
        run_host_cpu_pct=busy_cpu,
        run_server_cpu_pct=busy_server,
        **idle,
        **latency,
        **listing,
    )


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid``, from /proc (None if unknown)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _idle_cpu(server_pid: int | None) -> dict[str, Any]:
    """% of one core the idle host (this process, workers running) and the server use."""
    host0, server0 = time.process_time(), _cpu_seconds(server_pid)
    await trio.sleep(IDLE_SECONDS)
    host1, server1 = time.process_time(), _cpu_seconds(server_pid)
    out: dict[str, Any] = {"idle_host_cpu_pct": round(100 * (host1 - host0) / IDLE_SECONDS, 1)}
    if server0 is not None and server1 is not None:
        out["idle_server_cpu_pct"] = round(100 * (server1 - server0) / IDLE_SECONDS, 1)
    return out


async def _latency(js: Any, entities: int, awaited: dict[str, trio.Event]) -> dict[str, Any]:
    """A new event to an idle entity, one at a time: seconds from publish to handled."""
    took = []
    for k in range(LATENCY_EVENTS):
        subject = f"orders.{(k * 7919) % entities}.probe{k}"
        awaited[subject] = trio.Event()
        start = time.perf_counter()
        await js.publish(subject, b"{}")
        with trio.fail_after(60):
            await awaited[subject].wait()
        took.append(time.perf_counter() - start)
    took.sort()
    return {
        "latency_p50_ms": round(1000 * took[len(took) // 2], 1),
        "latency_p99_ms": round(1000 * took[min(len(took) - 1, int(len(took) * 0.99))], 1),
    }


async def _list_seconds(url: str) -> dict[str, Any]:
    """``headrace checkpoints list`` on the bench group, as a user runs it."""
    cmd = [sys.executable, "-m", "headrace", "checkpoints", "list", "--bucket", "bench"]
    started = time.perf_counter()
    done = await trio.run_process(
        [*cmd, "--nats", url], capture_stdout=True, capture_stderr=True, check=False
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        why = (done.stderr.decode().strip().splitlines() or ["?"])[-1]
        return {"list_error": f"exit {done.returncode}: {why}"}
    return {"list_seconds": round(took, 2), "listed": len(done.stdout.splitlines())}


async def _behind(store: Any) -> list[Any]:
    return [s async for s in store.all("bench") if s.checkpoint.position < s.checkpoint.version]


async def _caught_up(store: Any) -> float:
    """Wait until every checkpoint's position reached its version; the moment (perf_counter)
    just before the read that found them so. The first read takes every checkpoint, later
    ones only those still behind: a whole read of 10,000 costs the host more CPU than the
    workers' last writes, and the time it takes is not theirs."""
    keys = await store.kv.keys("bench.>")  # no new entity comes: the stream is loaded
    ids = [CheckpointId.from_key(k) for k in keys]
    while True:
        at = time.perf_counter()
        read = await store.get_many(ids)
        ids = [cid for cid, s in read.items() if s.checkpoint.position < s.checkpoint.version]
        if not ids:
            return at
        await trio.sleep(0.01)


async def _run_natspy(url: str, n: int, handler_ms: float) -> dict[str, Any]:
    import nats  # type: ignore[import-not-found,unused-ignore]

    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe("orders.>", durable="serial", stream=STREAM)
    handled = 0
    started = time.perf_counter()
    while handled < n:
        try:
            batch = await sub.fetch(100, timeout=5)
        except TimeoutError:
            break
        for msg in batch:
            await asyncio.sleep(handler_ms / 1000)
            handled += 1
            await msg.ack()
    elapsed = time.perf_counter() - started
    await nc.close()
    problems = [] if handled == n else [f"handled {handled} events, not {n}"]
    return _result("nats-py-serial", n, elapsed, problems)


def _result(impl: str, n: int, elapsed: float, problems: list[str], **extra: Any) -> dict[str, Any]:
    result: dict[str, Any] = {"bench": "checkpoints", "impl": impl, "msgs": n, **extra}
    if problems:
        result["error"] = "; ".join(problems)
    else:
        result["seconds"] = round(elapsed, 3)
        result["msg_per_s"] = round(n / elapsed) if elapsed > 0 else 0
    result["peak_rss_mb"] = _peak_rss_mb()
    return result


def run(
    messages: int,
    *,
    entities: int = ENTITIES,
    handler_ms: float = HANDLER_MS,
    concurrency: int | None = None,
    as_json: bool,
) -> list[dict[str, Any]]:
    if (
        messages < 1
        or entities < 1
        or handler_ms < 0
        or (concurrency is not None and concurrency < 1)
    ):
        raise BenchmarkError(
            "--messages, --entities and --concurrency must be at least 1, --handler-ms >= 0"
        )
    results: list[dict[str, Any]] = []
    with LocalServer(jetstream=True) as server:
        trio.run(_load, server.url, messages, entities)
        for impl in IMPLS:
            cmd = [*_ME, "child", "--impl", impl, "--url", server.url, "--messages", str(messages)]
            cmd += ["--entities", str(entities), "--server-pid", str(server.pid or 0)]
            if concurrency is not None:
                cmd += ["--concurrency", str(concurrency)]
            child = _run_child([*cmd, "--handler-ms", str(handler_ms)])
            result = _last_json(child)
            if child.returncode != 0 or result is None:
                result = {"bench": "checkpoints", "impl": impl, "msgs": 0, "error": _failure(child)}
            elif child.peak_rss_mb is not None:
                result["peak_rss_mb"] = max(result.get("peak_rss_mb") or 0, child.peak_rss_mb)
            result.update(entities=entities, handler_ms=handler_ms)
            results.append(result)
    ours, peer = results
    if ours.get("msg_per_s") and peer.get("msg_per_s"):
        ours["ratio_vs_nats-py-serial"] = round(ours["msg_per_s"] / peer["msg_per_s"], 2)
    for r in results:
        if as_json:
            print(json.dumps(r), flush=True)
        elif "error" in r:
            print(f"{r['impl']:>21}: FAILED: {r['error']}")
        else:
            ratio = r.get("ratio_vs_nats-py-serial")
            print(
                f"{r['impl']:>21}: {r['msg_per_s']:>8,} events/s  {r['msgs']:,} events over "
                f"{entities} entities, handler {handler_ms} ms  peak RSS {r.get('peak_rss_mb')} MB"
                + (f"  vs serial {ratio}x" if ratio else "")
            )
            if "run_host_cpu_pct" in r:
                print(
                    f"{'':>21}  concurrency {r.get('concurrency')}; CPU while running: host "
                    f"{r['run_host_cpu_pct']}%, server {r.get('run_server_cpu_pct')}% of a core"
                )
            if "latency_p50_ms" in r:
                print(
                    f"{'':>21}  new event to an idle entity p50 {r['latency_p50_ms']} ms, p99 "
                    f"{r['latency_p99_ms']} ms; idle CPU host {r.get('idle_host_cpu_pct')}%, "
                    f"server {r.get('idle_server_cpu_pct')}%; checkpoints list "
                    f"{r.get('list_seconds', r.get('list_error'))} s"
                )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m headrace_bench.checkpoints")
    parser.add_argument("role", nargs="?", choices=["child"])
    parser.add_argument("--impl", choices=IMPLS, default=IMPLS[0])
    parser.add_argument("--url")
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--entities", type=int, default=ENTITIES)
    parser.add_argument("--handler-ms", type=float, default=HANDLER_MS)
    parser.add_argument("--server-pid", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.role == "child":
        if args.impl == "headrace-checkpoints":
            result = trio.run(
                _run_headrace,
                args.url,
                args.messages,
                args.handler_ms,
                args.entities,
                args.server_pid or None,
                args.concurrency,
            )
        else:
            result = asyncio.run(_run_natspy(args.url, args.messages, args.handler_ms))
        print(json.dumps(result), flush=True)
    else:
        run(args.messages, entities=args.entities, handler_ms=args.handler_ms, as_json=args.json)


if __name__ == "__main__":
    main()
