"""One worker process of ``headrace bench scale`` (see scale.py): the benchmark's pipeline,
``JetStreamSource -> SparkSink(out, writer="arrow")``, on the durable consumer that every worker
of the run shares, into the output directory that every worker of the run shares.

Why a script of its own rather than ``headrace run --workers N``: the benchmark must know when a
worker is ready (its consumer bound and its sink open, so no set-up is on the clock) and must get
each worker's own figures back (its peak RSS, its sink's and its commit coordinator's counters)
once the run is over. The supervisor of ``headrace run`` reports neither.

The conversation with the parent, one JSON object per line on stdout:

1. ``{"event": "ready", ...}`` once the pipeline has bound the consumer (``wait_bound``) and the
   sink is open (its output claimed: the commit state read or made). The consumer is paused by
   the parent until every worker said so, so nothing is consumed before the clock starts;
2. ``{"event": "taken", "n": ...}`` when the number of messages it took changed (at most
   every 10 ms), and ``{"event": "failed", ...}`` if a batch fails (the commit protocol gave
   up, the write failed): the parent reports it; the run goes on (the batch comes again);
3. a line (or end of file) on stdin tells the worker to stop: it drains (commits and acks what
   it holds: nothing, by then) and prints ``{"event": "done", ...}`` with its figures.

The figures read after the drain come from objects taken while the sink was open: ``close``
drops the sink's reference to its shared writer, not the writer's counters.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from headrace.pipeline import tune_gc

from headrace_bench.consume import _peak_rss_mb

#: The name every worker's pipeline has: the owner of a shared output is "<pipeline>/<sink>",
#: and workers of one pipeline must agree on it.
PIPELINE = "bench-scale"
SINK = "spark"
#: How long a worker waits for its sink to open before it gives up.
OPEN_TIMEOUT = 60.0


class _Timed:
    """Wraps the coordinator's ``commit`` to add up the time spent in it: the compare-and-set
    round trip, plus the re-reads and retries when another worker wrote first. That is the
    commit protocol's own cost per batch, which no counter of the coordinator gives."""

    def __init__(self, commit: Callable[..., Awaitable[Any]]) -> None:
        self.commit = commit
        self.seconds = 0.0
        self.calls = 0
        self.slowest = 0.0

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await self.commit(*args, **kwargs)
        finally:
            took = time.perf_counter() - started
            self.seconds += took
            self.calls += 1
            self.slowest = max(self.slowest, took)


def _say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def _stop_requested() -> None:
    """Returns when the parent writes a line to stdin or closes it (it exited: stop too)."""
    stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    async with stream:
        while True:
            data = await stream.receive_some(4096)
            if not data or b"\n" in data:
                return


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from headrace.jetstream import ConsumeOptions, ConsumerConfig
    from headrace.nats import connect
    from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline
    from headrace_spark import SparkSink

    commits = 0
    committed_rows = 0
    first_batch_s: list[float] = []

    def on_commit(info: Any) -> None:  # in the sink's worker thread: counts only
        nonlocal commits, committed_rows
        commits += 1
        committed_rows += info.rows
        if not first_batch_s:  # the first batch of a process pays first uses (Arrow, parquet)
            first_batch_s.append(round(info.seconds, 4))

    sink = SparkSink(path=Path(args.out), writer="arrow", commits=args.commits, on_commit=on_commit)
    pipe = Pipeline(PIPELINE, drain_timeout=60)
    source = JetStreamSource(
        stream=args.stream,
        durable=args.durable,
        config=ConsumerConfig(max_ack_pending=args.max_ack_pending),
        consume=ConsumeOptions(max_messages=args.buffer),
    )
    policy = BatchPolicy(max_messages=args.batch, max_age=args.max_age)
    pipe.source(source).sink(sink, name=SINK, batch=policy)
    # Set-up done (modules imported, pipeline built): as the headrace commands do, so the
    # figure is the code's and not the collector settings'.
    tune_gc()
    timed: _Timed | None = None
    shared: Any = None
    errors: list[str] = []
    async with connect(args.url) as nc:
        async with pipe.running(nc) as run:
            await run.wait_bound()
            with trio.fail_after(OPEN_TIMEOUT):
                # open() runs in the sink's stage, which signals nothing when it is done.
                while sink.output is None:  # noqa: ASYNC110
                    await trio.sleep(0.005)
            shared = sink.shared
            if shared is not None:
                timed = _Timed(shared.coordinator.commit)
                shared.coordinator.commit = timed
            _say(event="ready", worker=args.index, pid=os.getpid(), mode=args.commits)
            cpu_ready = time.process_time()
            async with trio.open_nursery() as nursery:

                async def watch_failures() -> None:
                    seen = 0
                    while True:
                        await trio.sleep(0.1)
                        if run.stats.batches_failed > seen:
                            seen = run.stats.batches_failed
                            why = [f"{e.stage}: {e.error!r}" for e in run.errors[-1:]]
                            errors.extend(why)
                            _say(event="failed", worker=args.index, errors=why)

                async def report_taken() -> None:
                    # The parent stops the workers once they took every message (not merely
                    # once the server sent them all: one still on its way to a worker that
                    # already drained would wait out its ack wait).
                    said = -1
                    while True:
                        if run.stats.messages_in != said:
                            said = run.stats.messages_in
                            _say(event="taken", worker=args.index, n=said)
                        await trio.sleep(0.01)

                nursery.start_soon(watch_failures)
                nursery.start_soon(report_taken)
                await _stop_requested()
                nursery.cancel_scope.cancel()
        # Drained: whatever this worker held is committed and acked. The CPU from ready to
        # here is this worker's share of the measured run (and of its drain and close).
        cpu_s = time.process_time() - cpu_ready
        stats = run.stats
    result: dict[str, Any] = {
        "event": "done",
        "worker": args.index,
        "peak_rss_mb": _peak_rss_mb(),
        "messages": stats.messages_in,
        "acks": stats.acks,
        "redeliveries": stats.redeliveries,
        "batches": stats.batches_committed,
        "batches_failed": stats.batches_failed,
        "commit_s": round(stats.commit_seconds_total, 3),
        "cpu_s": round(cpu_s, 3),
        "sink_commits": commits,
        "rows": committed_rows,
        "first_batch_s": first_batch_s[0] if first_batch_s else None,
        "skipped": sink.duplicates_skipped,
        "errors": errors[-3:],
        "drain_timed_out": run.drain_timed_out,
    }
    if shared is not None:
        coordinator = shared.coordinator
        result.update(
            commits=coordinator.commits,
            cas_refused=coordinator.refused,
            max_refusals=coordinator.max_refusals,
            in_doubt=coordinator.in_doubt,
            overlaps=coordinator.overlaps,
            redone=shared.redone,
        )
    if timed is not None:
        result.update(state_s=round(timed.seconds, 4), state_max_s=round(timed.slowest, 4))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m headrace_bench.scale_worker")
    parser.add_argument("--url", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--durable", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--commits", choices=["shared", "local"], required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--max-age", type=float, default=1.0)
    parser.add_argument("--buffer", type=int, required=True)
    parser.add_argument("--max-ack-pending", type=int, required=True)
    parser.add_argument("--index", type=int, default=0)
    args = parser.parse_args(argv)
    _say(**trio.run(_run, args))


if __name__ == "__main__":
    main()
