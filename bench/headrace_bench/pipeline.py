"""``headrace bench pipeline``: a whole pipeline, with acks after commit, against the loop a
user would write by hand with nats-py, in one run.

headrace: ``JetStreamSource -> map -> sink`` where the sink keeps the records in memory (it
counts them; nothing is written anywhere), batches of 1000, every message acked only after its
batch was committed. nats-py: ``pull_subscribe`` + ``fetch(500)``, the same map function, the
records appended to a list, then ``await msg.ack()`` for each: what "ack after processing"
looks like when written by hand.

Both read the same loaded stream (200k x 128 B by default) on a private nats-server, each in its
own process with its own durable consumer; the clock runs from the start to the last ack being
out (a flush); the server must then agree: N deliveries, none redelivered, ack floor N.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import trio
from headrace.localserver import LocalServer

from headrace_bench.consume import (
    MAX_ACK_PENDING,
    STREAM,
    SUBJECTS,
    BenchmarkError,
    _failure,
    _last_json,
    _peak_rss_mb,
    _run_child,
    _settled_problems,
    _with_server_cpu,
)

IMPLS = ("headrace-pipeline", "nats-py")
BATCH = 1000
BUFFER = 10_000
NATSPY_FETCH = 500
_ME = [sys.executable, "-m", "headrace_bench.pipeline"]


def transform(data: bytes) -> bytes:
    """The map of both implementations: cheap, so the figure is the plumbing's."""
    return data


class _CountingSink:
    """An in-memory sink that keeps nothing but a count (the benchmark's memory sink)."""

    name = "memory"

    def __init__(self, n: int) -> None:
        self.count = 0
        self.n = n
        self.done = trio.Event()

    async def write_batch(self, batch: Any) -> None:
        self.count += len(batch)
        if self.count >= self.n:
            self.done.set()


async def _run_headrace(url: str, n: int, buffer: int) -> dict[str, Any]:
    from headrace.jetstream import ConsumeOptions, ConsumerConfig, JetStream
    from headrace.nats import connect
    from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline

    name = f"pipe_{int(time.time() * 1000)}"
    sink = _CountingSink(n)
    pipe = Pipeline("bench", drain_timeout=60)
    source = JetStreamSource(
        stream=STREAM,
        durable=name,
        config=ConsumerConfig(max_ack_pending=MAX_ACK_PENDING),
        consume=ConsumeOptions(max_messages=buffer),
    )
    pipe.source(source).map(transform).sink(sink, batch=BatchPolicy(max_messages=BATCH))
    async with connect(url) as nc:
        started = time.perf_counter()
        cpu_started = time.process_time()
        async with pipe.running(nc) as run:
            with trio.move_on_after(120):
                await sink.done.wait()
        elapsed = time.perf_counter() - started  # the drain's last acks are flushed
        cpu = time.process_time() - cpu_started
        js = JetStream(nc)
        problems = [] if sink.count == n else [f"committed {sink.count} records, not {n}"]
        server = await _settled_problems(
            n, True, lambda: js.consumer_info(STREAM, name), trio.sleep
        )
        stats = run.stats
        await js.delete_consumer(STREAM, name)
    result = _result("headrace-pipeline", n, sink.count, elapsed, problems + server)
    result.update(
        batches=stats.batches_committed,
        acks=stats.acks,
        buffer=buffer,
        batch=BATCH,
        client_cpu_s=round(cpu, 3),
        peak_rss_mb=_peak_rss_mb(),
    )
    return result


async def _run_natspy(url: str, n: int) -> dict[str, Any]:
    import nats  # type: ignore[import-not-found,unused-ignore]
    from nats.js.api import (  # type: ignore[import-not-found,unused-ignore]
        AckPolicy,
        ConsumerConfig,
    )

    name = f"natspy_{int(time.time() * 1000)}"
    nc = await nats.connect(url, pending_size=256 * 1024 * 1024)
    js = nc.jetstream()
    config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=MAX_ACK_PENDING)
    sub = await js.pull_subscribe(SUBJECTS, durable=name, stream=STREAM, config=config)
    kept: list[bytes] = []
    got = 0
    started = time.perf_counter()
    cpu_started = time.process_time()
    while got < n:
        try:
            batch = await sub.fetch(NATSPY_FETCH, timeout=5)
        except TimeoutError:
            break
        kept.extend(transform(m.data) for m in batch)  # "commit": into memory
        kept.clear()
        for msg in batch:
            await msg.ack()
        got += len(batch)
    await nc.flush(30)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    problems = [] if got == n else [f"processed {got} messages, not {n}"]
    server = await _settled_problems(n, True, lambda: js.consumer_info(STREAM, name), asyncio.sleep)
    await js.delete_consumer(STREAM, name)
    await nc.close()
    result = _result("nats-py", n, got, elapsed, problems + server)
    result.update(fetch=NATSPY_FETCH, client_cpu_s=round(cpu, 3), peak_rss_mb=_peak_rss_mb())
    return result


def _result(impl: str, n: int, got: int, elapsed: float, problems: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {"bench": "pipeline", "impl": impl, "ack": True, "msgs": got}
    result["expected"] = n
    if problems:
        result["error"] = "; ".join(problems)
    else:
        result["seconds"] = round(elapsed, 3)
        result["msg_per_s"] = round(got / elapsed) if elapsed > 0 else 0
    return result


def run(
    messages: int, payload: int, *, as_json: bool = False, buffer: int = BUFFER
) -> list[dict[str, Any]]:
    """Run both implementations against one loaded stream; print JSON lines or a table."""
    results: list[dict[str, Any]] = []
    with LocalServer(jetstream=True) as server:
        url = server.url
        sizes = ["--messages", str(messages), "--payload", str(payload)]
        load_cmd = [sys.executable, "-m", "headrace_bench.consume", "load", "--url", url]
        loader = _run_child([*load_cmd, *sizes])
        if loader.returncode != 0 or _last_json(loader) is None:
            raise BenchmarkError(f"loading the stream failed: {_failure(loader)}")
        for impl in IMPLS:
            cmd = [*_ME, "child", "--impl", impl, "--url", url, "--buffer", str(buffer), *sizes]

            def measure(cmd: list[str] = cmd, impl: str = impl) -> dict[str, Any]:
                child = _run_child(cmd)
                result = _last_json(child)
                if child.returncode != 0 or result is None:
                    return {"impl": impl, "ack": True, "msgs": 0, "error": _failure(child)}
                if child.peak_rss_mb is not None:
                    result["peak_rss_mb"] = max(result.get("peak_rss_mb") or 0, child.peak_rss_mb)
                return result

            # nats-server's CPU over the child's whole life (its start-up and the final checks
            # included, a few ms): with the client's, where the time goes.
            result = _with_server_cpu(server.pid, measure)
            result["payload"] = payload
            results.append(result)
    ours = next((r for r in results if r["impl"] == "headrace-pipeline"), None)
    peer = next((r for r in results if r["impl"] == "nats-py"), None)
    if ours and peer and ours.get("msg_per_s") and peer.get("msg_per_s"):
        ours["ratio_vs_nats-py"] = round(ours["msg_per_s"] / peer["msg_per_s"], 2)
    for r in results:
        if as_json:
            print(json.dumps(r), flush=True)
        elif "error" in r:
            print(f"{r['impl']:>18}: FAILED: {r['error']}")
        else:
            ratio = f"  vs nats-py {r['ratio_vs_nats-py']}x" if "ratio_vs_nats-py" in r else ""
            if "client_cpu_s_per_100k" in r and "server_cpu_s_per_100k" in r:
                ratio += (
                    f"  CPU s/100k: client {r['client_cpu_s_per_100k']:.2f}"
                    f" server {r['server_cpu_s_per_100k']:.2f}"
                )
            print(
                f"{r['impl']:>18}: {r['msg_per_s']:>9,} msg/s  {r['msgs']:,} msgs acked after "
                f"commit  peak RSS {r.get('peak_rss_mb')} MB{ratio}"
            )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m headrace_bench.pipeline")
    parser.add_argument("role", nargs="?", choices=["child"])
    parser.add_argument("--impl", choices=IMPLS, default="headrace-pipeline")
    parser.add_argument("--url")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--payload", type=int, default=128)
    parser.add_argument("--buffer", type=int, default=BUFFER)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.role == "child":
        if args.impl == "headrace-pipeline":
            result = trio.run(_run_headrace, args.url, args.messages, args.buffer)
        else:
            result = asyncio.run(_run_natspy(args.url, args.messages))
        print(json.dumps(result), flush=True)
    else:
        run(args.messages, args.payload, as_json=args.json, buffer=args.buffer)


if __name__ == "__main__":
    main()
