"""``headrace bench core``: core NATS subscriber throughput, headrace against nats-py.

One private nats-server; for each implementation a fresh subscriber process subscribes and then
blocks its event loop on stdin, so it reads nothing. The same publisher (headrace, in its own
process) sends N messages and flushes: the server now holds them all for the subscriber
(``max_pending`` is raised for this). Then the subscriber is told "go" and the clock starts; the
figure is the subscriber's own pace, from "go" to its last message, with no publisher running.
Each subscriber reports its peak RSS. Processes are separate so that neither client's memory or
event loop affects the other's figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
from typing import Any

import trio
from headrace.localserver import LocalServer

SUBJECT = "bench.core"
IMPLS = ("headrace", "nats-py")
_SERVER_CONFIG = 'max_pending: 1GB\nwrite_deadline: "60s"\n'


def _peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _report(impl: str, got: int, n: int, first: float | None, last: float | None) -> None:
    elapsed = (last - first) if first is not None and last is not None else 0.0
    print(
        json.dumps(
            {
                "bench": "core-sub",
                "impl": impl,
                "msgs": got,
                "expected": n,
                "seconds": round(elapsed, 3),
                "msg_per_s": round(got / elapsed) if elapsed > 0 else 0,
                "peak_rss_mb": _peak_rss_mb(),
            }
        ),
        flush=True,
    )


async def _sub_headrace(url: str, n: int, idle: float) -> None:
    from headrace.nats import connect

    async with connect(url, pending_msgs_limit=n + 1, pending_bytes_limit=2**31) as nc:
        sub = await nc.subscribe(SUBJECT)
        await nc.flush()
        print("ready", flush=True)
        sys.stdin.readline()  # blocks the loop on purpose: the server queues everything
        got, first, last = 0, time.perf_counter(), None
        while got < n:
            with trio.move_on_after(idle):
                batch = await sub.next_batch()
                got += len(batch)
                last = time.perf_counter()
                continue
            break
        _report("headrace", got, n, first, last)


async def _sub_natspy(url: str, n: int, idle: float) -> None:
    import nats  # type: ignore[import-not-found,unused-ignore]

    nc = await nats.connect(url, pending_size=2**31)
    state: dict[str, Any] = {"got": 0, "last": None}
    done = asyncio.Event()
    progress = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        state["got"] += 1
        state["last"] = time.perf_counter()
        progress.set()
        if state["got"] >= n:
            done.set()

    await nc.subscribe(SUBJECT, cb=on_msg, pending_msgs_limit=n + 1, pending_bytes_limit=2**31)
    await nc.flush()
    print("ready", flush=True)
    sys.stdin.readline()  # blocks the loop on purpose: the server queues everything
    first = time.perf_counter()
    while not done.is_set():
        progress.clear()
        try:
            await asyncio.wait_for(progress.wait(), idle)
        except TimeoutError:
            break
    _report("nats-py", state["got"], n, first, state["last"])
    await nc.close()


async def _publish(url: str, n: int, size: int) -> None:
    from headrace.nats import connect

    payload = b"x" * size
    async with connect(url) as nc:
        started = time.perf_counter()
        for _ in range(n):
            await nc.publish(SUBJECT, payload)
        await nc.flush(60)
        elapsed = time.perf_counter() - started
    print(json.dumps({"publisher_msg_per_s": round(n / elapsed)}), flush=True)


def _child(args: argparse.Namespace) -> None:
    if args.role == "pub":
        trio.run(_publish, args.url, args.messages, args.payload)
    elif args.impl == "headrace":
        trio.run(_sub_headrace, args.url, args.messages, args.idle)
    else:
        asyncio.run(_sub_natspy(args.url, args.messages, args.idle))


def run(messages: int, payload: int, impls: list[str], as_json: bool) -> list[dict[str, Any]]:
    """Run the benchmark; print one JSON line per implementation (plus ratios) or a table."""
    results: list[dict[str, Any]] = []
    me = [sys.executable, "-m", "headrace_bench.core"]
    common = ["--messages", str(messages), "--payload", str(payload)]
    with LocalServer(jetstream=False, extra_config=_SERVER_CONFIG) as server:
        for impl in impls:
            sub = subprocess.Popen(
                [*me, "sub", "--impl", impl, "--url", server.url, *common],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert sub.stdout is not None and sub.stdin is not None
            if sub.stdout.readline().strip() != "ready":
                sub.kill()
                raise RuntimeError(f"the {impl} subscriber did not start")
            pub = subprocess.run(
                [*me, "pub", "--url", server.url, *common],
                check=True,
                capture_output=True,
                text=True,
            )
            sub.stdin.write("go\n")
            sub.stdin.flush()
            line = sub.stdout.readline()
            sub.wait(120)
            result = json.loads(line)
            result["payload"] = payload
            result.update(json.loads(pub.stdout.strip().splitlines()[-1]))
            results.append(result)
    by_impl = {r["impl"]: r for r in results}
    if "headrace" in by_impl:
        ours = by_impl["headrace"]["msg_per_s"]
        for r in results:
            if r["impl"] != "headrace" and r["msg_per_s"]:
                by_impl["headrace"][f"ratio_vs_{r['impl']}"] = round(ours / r["msg_per_s"], 2)
    for r in results:
        if as_json:
            print(json.dumps(r))
        else:
            ratios = " ".join(f"{k}={v}" for k, v in r.items() if k.startswith("ratio"))
            print(
                f"{r['impl']:>9}: {r['msg_per_s']:>9,} msg/s  {r['msgs']:,}/{r['expected']:,} "
                f"msgs  {payload} B  peak RSS {r['peak_rss_mb']} MB  {ratios}"
            )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m headrace_bench.core")
    parser.add_argument("role", nargs="?", choices=["sub", "pub"])
    parser.add_argument("--impl", choices=IMPLS, default="headrace")
    parser.add_argument("--url")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--payload", type=int, default=128)
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.role:
        _child(args)
    else:
        run(args.messages, args.payload, list(IMPLS), args.json)


if __name__ == "__main__":
    main()
