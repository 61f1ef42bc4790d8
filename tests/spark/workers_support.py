"""Several ``headrace run`` workers of one pipeline writing one Spark sink output, and the
faults that break guarantees in production: SIGKILL at random moments, SIGSTOP past the ack
wait, a write that hangs, two workers committing the same redelivered batch at once.

The workers run the pipeline in :data:`PIPELINE`: stream ``ORDERS`` (every message a JSON
order ``{"id": i}`` with a unique id), durable pull consumer ``lake`` with a short ack wait, a
:class:`FaultySink` (a ``SparkSink`` with hooks the tests steer through files in a control
directory, since a worker is a process of its own):

- ``stage_sleep``/``publish_sleep`` (environment): each write takes that long (simulated work,
  so that the run lasts long enough for faults to land in the middle of it);
- ``hang``: the next write to be staged takes the file and then hangs for its content in
  seconds (a Spark write that hangs);
- ``kill-after-commit``: the next attempt to be published takes the file, and the worker
  SIGKILLs itself after its commit, before the files are in place and the messages acked;
- ``gate``: while the file exists, every write that was staged waits before its commit until
  ``go`` exists, after saying so with ``waiting-<pid>-<first seq>``.

At exit (SIGTERM, drained) a worker prints one JSON line on stdout,
``{"event": "sink", ...}``, with its sink's and its coordinator's counters.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from tests.natspy_peer import once_placed_natspy
from tests.procs import LineProcess, json_events
from tests.spark.spark_procs import child_env

HEADRACE = str(Path(sys.executable).parent / "headrace")

PIPELINE = """\
import json, os, signal, time
from pathlib import Path
from headrace.jetstream.consumer_config import ConsumerConfig
from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline
from headrace_spark import SparkSink

CONTROL = Path(CONTROL_DIR)


def take(name):
    try:
        (CONTROL / name).rename(CONTROL / f"{name}.taken-{os.getpid()}")
    except FileNotFoundError:
        return None
    return (CONTROL / f"{name}.taken-{os.getpid()}").read_text() or "0"


class FaultySink(SparkSink):
    def _stage_shared(self, keep, meta, tag, shared):
        time.sleep(STAGE_SLEEP)
        hang = take("hang")
        if hang is not None:
            print(json.dumps({"event": "hanging", "pid": os.getpid()}), flush=True)
            time.sleep(float(hang))
        staged = super()._stage_shared(keep, meta, tag, shared)
        if (CONTROL / "gate").exists():
            first = min(s.intervals[0][0] for s in staged.seqs.values())
            (CONTROL / f"waiting-{os.getpid()}-{first}").touch()
            while not (CONTROL / "go").exists():
                time.sleep(0.01)
        return staged

    async def open(self):
        await super().open()
        output = self.shared.output if self.shared is not None else None
        if output is not None:
            publish = output.publish

            def faulty_publish(token, replaces=()):
                # Committed, not yet in place, not acked.
                if take("kill-after-commit") is not None:
                    print(json.dumps({"event": "killing", "pid": os.getpid()}), flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(PUBLISH_SLEEP)
                return publish(token, replaces)

            output.publish = faulty_publish

    async def close(self):
        shared = self.shared
        if shared is not None:
            c = shared.coordinator
            print(json.dumps({
                "event": "sink", "pid": os.getpid(), "worker": c.worker,
                "batches_committed": self.batches_committed, "rows_written": self.rows_written,
                "duplicates_skipped": self.duplicates_skipped, "commits": c.commits,
                "refused": c.refused, "max_refusals": c.max_refusals, "in_doubt": c.in_doubt,
                "overlaps": c.overlaps, "redone": shared.redone,
                "swept_rolled": shared.swept.rolled, "swept_removed": shared.swept.removed,
            }), flush=True)
        await super().close()


pipeline = Pipeline("orders-lake", nak_delay=0.1, nak_delay_max=0.5, drain_timeout=60)
pipeline.source(
    JetStreamSource(
        stream="ORDERS",
        durable="lake",
        config=ConsumerConfig(ack_wait=ACK_WAIT, max_ack_pending=MAX_ACK_PENDING),
    )
).sink(
    FaultySink(OUT, stale_after=STALE_AFTER, sweep_interval=SWEEP_INTERVAL, **SINK_OPTIONS),
    name="lake",
    batch=BatchPolicy(max_messages=BATCH, max_age=0.3),
)
"""


def write_pipeline(
    directory: Path,
    out: Path,
    control: Path,
    *,
    ack_wait: float = 3.0,
    batch: int = 250,
    stage_sleep: float = 0.1,
    publish_sleep: float = 0.02,
    stale_after: float = 6.0,
    sweep_interval: float = 1.0,
    sink_options: dict[str, Any] | None = None,
) -> Path:
    control.mkdir(parents=True, exist_ok=True)
    settings = {
        "OUT": str(out),
        "CONTROL_DIR": str(control),
        "ACK_WAIT": ack_wait,
        "MAX_ACK_PENDING": 4 * batch * 4,
        "BATCH": batch,
        "STAGE_SLEEP": stage_sleep,
        "PUBLISH_SLEEP": publish_sleep,
        "STALE_AFTER": stale_after,
        "SWEEP_INTERVAL": sweep_interval,
        "SINK_OPTIONS": sink_options or {"writer": "arrow"},
    }
    header = "".join(f"{k} = {v!r}\n" for k, v in settings.items())
    path = directory / "workers_pipeline.py"
    path.write_text(header + textwrap.dedent(PIPELINE), "utf-8")
    return path


class Worker(LineProcess):
    """One ``headrace run`` worker process."""

    transcript_lines = (30, 10)
    transcript_skips = '"progress"'

    def __init__(self, proc: trio.Process, index: int, incarnation: int) -> None:
        super().__init__(proc, f"worker {index}.{incarnation} (pid {proc.pid})")
        self.index = index
        self.incarnation = incarnation

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def stdout_events(self, name: str) -> list[dict[str, Any]]:
        """The sink's JSON lines on stdout named ``name`` (workers_pipeline.py's)."""
        return self.events(name)

    def log_events(self, name: str) -> list[dict[str, Any]]:
        """``headrace run``'s JSON log events on stderr named ``name``."""
        return json_events(self.err, name)


class Workers:
    """The running workers of one pipeline file; restarted, killed, stopped by the test."""

    def __init__(self, nursery: trio.Nursery, pipeline: Path, servers: str, cwd: Path) -> None:
        self.nursery = nursery
        self.pipeline = pipeline
        self.servers = servers
        self.cwd = cwd
        self.current: list[Worker] = []
        self.ended: list[Worker] = []
        self.log: list[str] = []

    async def start(self, index: int) -> Worker:
        argv = [
            HEADRACE,
            "run",
            str(self.pipeline),
            "--nats",
            self.servers,
            "--json-logs",
            "--interval",
            "1",
        ]
        proc = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.cwd,
            env=child_env(),
        )
        incarnation = sum(1 for w in [*self.ended, *self.current] if w.index == index)
        worker = Worker(proc, index, incarnation)
        self.nursery.start_soon(worker._read, proc.stdout, worker.out)
        self.nursery.start_soon(worker._read, proc.stderr, worker.err)
        if index < len(self.current):
            self.current[index] = worker
        else:
            self.current.append(worker)
        return worker

    async def start_all(self, n: int) -> None:
        for index in range(n):
            await self.start(index)

    async def kill(self, index: int, *, restart: bool = True) -> None:
        worker = self.current[index]
        worker.proc.send_signal(signal.SIGKILL)
        await worker.proc.wait()
        self.ended.append(worker)
        self.log.append(f"killed worker {index}.{worker.incarnation}")
        if restart:
            await self.start(index)

    async def stall(self, index: int, seconds: float) -> None:
        """SIGSTOP the worker for ``seconds`` (the time is the point: a stalled process),
        then SIGCONT it."""
        worker = self.current[index]
        worker.proc.send_signal(signal.SIGSTOP)
        self.log.append(f"stopped worker {index}.{worker.incarnation} for {seconds}s")
        try:
            await trio.sleep(seconds)
        finally:
            worker.proc.send_signal(signal.SIGCONT)

    async def stop_all(self, timeout: float = 90) -> list[int]:
        """SIGTERM every worker (they drain) and their exit codes (see ``transcript(ended=True)``
        for what they said)."""
        for worker in self.current:
            worker.proc.send_signal(signal.SIGTERM)
        codes = []
        with trio.fail_after(timeout):
            for worker in self.current:
                codes.append(await worker.proc.wait())
                with trio.move_on_after(10):
                    await worker.wait_eof()
        self.ended.extend(self.current)
        self.current = []
        return codes

    async def wait_stdout_event(self, name: str, timeout: float) -> int:
        """The index of the first current worker that printed event ``name`` on stdout."""
        try:
            with trio.fail_after(timeout):
                while True:
                    for i, worker in enumerate(self.current):
                        if worker.stdout_events(name):
                            return i
                    await trio.sleep(0.05)  # several processes' lines: polled
        except trio.TooSlowError:
            raise AssertionError(f"no worker said {name!r}\n{self.transcript()}") from None

    def transcript(self, *, ended: bool = False) -> str:
        shown = [*self.ended, *self.current] if ended else self.current
        return "\n".join(self.log) + "\n" + "\n".join(w.transcript() for w in shown)

    def sink_reports(self) -> list[dict[str, Any]]:
        return [e for w in self.ended for e in w.stdout_events("sink")]


@asynccontextmanager
async def running_workers(
    pipeline: Path, servers: str, cwd: Path, n: int
) -> AsyncIterator[Workers]:
    async with trio.open_nursery() as nursery:
        workers = Workers(nursery, pipeline, servers, cwd)
        try:
            await workers.start_all(n)
            yield workers
        finally:
            with trio.CancelScope(shield=True):
                for worker in workers.current:
                    if worker.proc.returncode is None:
                        worker.proc.kill()
                        await worker.proc.wait()
                nursery.cancel_scope.cancel()


# -- the stream, and what the output holds ---------------------------------------------------


async def create_orders(natspy: Any, n: int, *, replicas: int = 1, start: int = 0) -> None:
    """Stream ``ORDERS`` (``orders.>``), made if missing, and ``n`` orders ``{"id": i}`` (from
    ``start``) published through nats-py, each acked by the stream, 500 in flight at a time."""

    async def make() -> None:
        js = natspy.nc.jetstream()
        try:
            await js.stream_info("ORDERS")
        except Exception:
            await once_placed_natspy(
                lambda: js.add_stream(name="ORDERS", subjects=["orders.>"], num_replicas=replicas)
            )

    async def publish(ids: range) -> None:
        # Each with a message id, retried until the stream acks it: a replicated stream just
        # created may not answer its first publishes (no leader yet), and a retry of one that
        # did land is then dropped as a duplicate by the stream.
        js = natspy.nc.jetstream()
        for first in range(ids.start, ids.stop, 500):
            todo = list(range(first, min(first + 500, ids.stop)))
            for _ in range(50):
                results = await asyncio.gather(
                    *(
                        js.publish(
                            "orders.new",
                            json.dumps({"id": i}).encode(),
                            headers={"Nats-Msg-Id": f"order-{i}"},
                        )
                        for i in todo
                    ),
                    return_exceptions=True,
                )
                todo = [i for i, r in zip(todo, results, strict=True) if isinstance(r, Exception)]
                if not todo:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"{len(todo)} orders could not be published")

    await natspy.call(make)
    for first in range(start, start + n, 5000):  # each call within nats-py's 20 s limit
        await natspy.call(publish, range(first, min(first + 5000, start + n)))


def count_orders(spark: Any, out: Path, n: int, start: int = 0) -> dict[str, Any]:
    """What Spark reads back: rows, duplicated and missing order ids (out of ``start`` ..
    ``start + n - 1``), and duplicated stream sequences."""
    rows = spark.read.parquet(str(out)).select("stream_seq", "data").collect()
    ids = Counter(json.loads(bytes(r["data"]))["id"] for r in rows)
    seqs = Counter(r["stream_seq"] for r in rows)
    return {
        "rows": len(rows),
        "duplicates": sum(c - 1 for c in ids.values() if c > 1),
        "missing": len(set(range(start, start + n)) - set(ids)),
        "duplicated_seqs": sum(c - 1 for c in seqs.values() if c > 1),
    }


async def wait_quiet_output(out: Path, natspy: Any, timeout: float) -> dict[str, Any]:
    """Until the output has nothing staged and its commit state no unpublished attempt: the
    sweeps have published what dead workers committed and deleted what never committed.
    Polled (a sweep has no event the test can wait on)."""
    from tests.spark.spark_support import commit_state, staged

    state: dict[str, Any] = {}
    try:
        with trio.fail_after(timeout):
            while True:
                state = await commit_state(natspy, out)
                if not staged(out) and not state["unpublished"]:
                    return state
                await trio.sleep(0.2)
    except trio.TooSlowError:
        raise AssertionError(
            f"still staged: {staged(out)}; state: {json.dumps(state)[:2000]}"
        ) from None
