"""``headrace bench scale``: what the shared commit protocol costs, and how a pipeline's
throughput grows with worker processes sharing one consumer and one output.

Setup: one private nats-server with JetStream (file storage); stream ``ORDERS`` is loaded once
with M JSON orders of about 150 bytes (e2e.py's orders and loader). Then, per implementation, a
fresh durable pull consumer over that stream and a fresh output directory:

- ``headrace-single-writer``: one worker process, ``SparkSink(out, writer="arrow",
  commits="local")``: the single-process ledger in the output directory (one process at a time,
  an exclusive lock). The baseline: what a pipeline did before outputs could be shared.
- ``headrace-scale`` with N workers (each N of ``--workers``): N worker processes of the same
  pipeline, ``SparkSink(out, writer="arrow", commits="shared")`` (what ``"auto"`` is in a
  pipeline): every batch committed by a compare-and-set of the output's state in a JetStream KV
  bucket, all N writing the one directory.

Every worker runs ``JetStreamSource`` (consume buffer 10000, ``--buffer``) on the durable
consumer shared by the workers, ``BatchPolicy(max_messages=B, max_age=1)``, the sink with Arrow's
parquet writer: no JVM per worker, so the figure is the pipeline's and the commit protocol's, not
Spark's. The consumer's ``max_ack_pending`` is at least what N workers may hold at once (each
twice the larger of its buffer and its batch), so the server never holds a worker back.

Workers are plain child processes running scale_worker.py, not ``headrace run --workers``: the
benchmark needs to know when each is ready and to get each one's figures back. Each is a process
of its own so its peak RSS (``VmHWM``) is its own; each calls ``tune_gc()`` once its pipeline is
built, as the ``headrace`` commands do. There is no warm-up: a process's first batch pays the
first uses of Arrow's kernels and parquet writer (``worker_first_batch_s`` shows it), N times
over with N workers, as a real deployment does once per worker start.

The clock. The parent creates the consumer *paused* (``pause_until`` far ahead; nats-server 2.11
and later): workers bind it and open their sinks (claim the output, read or make the commit
state) while the server delivers nothing, and each says ``ready``. When all N have, the parent
makes the pause run out 0.1 s later (see :func:`_resume` for why not "resume now") and the clock
starts then. Without the pause the first worker bound would consume alone until the others
arrived, and binding and opening would be on the clock.

The clock stops when the consumer's ack floor reaches M, polled every 10 ms from the parent's
loop (so up to 10 ms late: under 1% of a run of a second or more). Once the server reports every
message handed out (``num_pending`` 0), the parent tells the workers to stop: each drains, which
commits its last, partial batch at once. The messages are not split between workers in
multiples of the batch, so without that each run would end waiting up to ``max_age`` (1 s) for
those partial batches: a tail a continuous stream does not have, the same for any N, which would
flatten the ratios. ``delivered_s`` says when everything was handed out.

Checked off the clock: the server's view (ack floor M, nothing pending, none redelivered) and the
output read back with ``pyarrow.dataset`` (names starting with ``_`` or ``.`` skipped, as Spark
does): M rows, M distinct ``stream_seq``, from 1 to M. ``verified`` says all held; otherwise the
line has ``error`` and no figure, and ``headrace bench`` exits 1.

Ratios come from the same run: ``vs_single_writer`` (a headrace-scale line's msg/s over the
single writer's) and, for N > 1, ``vs_one_worker`` (over headrace-scale with 1 worker). At N = 1
the first is the protocol's cost: a compare-and-set round trip to the KV bucket per batch in
place of the ledger's append and fsync. The second is the scaling itself, protocol included.

The protocol's own figures, summed over the workers: ``commits``, ``cas_refused`` (writes of the
state refused because another worker wrote first), ``max_refusals`` (the most refusals one
commit met, the largest of the workers'), ``in_doubt``, ``overlaps``, ``redone``, and
``state_s`` / ``state_ms_per_commit`` / ``state_max_ms``: the time spent in the coordinator's
``commit`` (the compare-and-set, and under contention the re-reads, retries and back-off).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import attrs
import trio
from headrace.localserver import LocalServer

from headrace_bench.consume import BenchmarkError, _settled_problems
from headrace_bench.e2e import STREAM, _load

IMPLS = ("headrace-single-writer", "headrace-scale")
SINGLE, SCALE = IMPLS
#: Worker counts of headrace-scale (``--workers``).
WORKERS = (1, 2, 4)
#: Records per batch (``--batch``) and the consume buffer of each worker (``--buffer``).
BATCH = 10_000
BUFFER = 10_000
#: A batch is cut after this many seconds even if not full.
MAX_AGE = 1.0
#: The consumer's max_ack_pending is at least this, and never below what N workers may hold.
MAX_ACK_PENDING = 100_000
#: How often the parent asks for the consumer's ack floor while the clock runs.
POLL = 0.01
#: Workers must all be ready within this many seconds.
READY_TIMEOUT = 120.0
#: A run whose ack floor does not move for this long is given up; none may last longer than
#: RUN_TIMEOUT.
STALL_TIMEOUT = 60.0
RUN_TIMEOUT = 900.0
#: How long workers get to drain and report after the clock stopped.
DONE_TIMEOUT = 90.0
#: The paused consumer is paused until then (the parent ends the pause long before).
PAUSED_UNTIL = "2099-01-01T00:00:00Z"
#: The pause is ended this many seconds after the request that says so (see _resume).
RESUME_AFTER = 0.1
_WORKER = [sys.executable, "-m", "headrace_bench.scale_worker"]


class ScaleUnavailable(BenchmarkError):
    """The Spark sink plugin or pyarrow is missing."""


def check_requirements() -> None:
    """:class:`ScaleUnavailable` unless the Spark sink and pyarrow can be imported (the Arrow
    writer needs no pyspark session and no Java)."""
    for name in ("pyarrow", "headrace_spark"):
        if importlib.util.find_spec(name) is None:
            raise ScaleUnavailable(
                f"bench scale needs the Spark sink and pyarrow ({name} is missing): pip install "
                "'headrace[spark]'"
            )


def parse_workers(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` as (1, 2, 4): distinct counts of at least 1, in the order given."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--workers takes numbers separated by commas, not {text!r}") from None
    if not counts or any(n < 1 for n in counts):
        raise ValueError(f"--workers takes worker counts of at least 1, not {text!r}")
    return tuple(dict.fromkeys(counts))


@attrs.define
class _Plan:
    """One implementation to measure: its name, how many workers, which commit mode."""

    impl: str
    workers: int
    commits: str  # "local" or "shared" (the sink's commits=)

    @property
    def label(self) -> str:
        return f"{self.impl}-{self.workers}"


@attrs.define
class _Timing:
    """What the clock saw: the seconds from the end of the pause to an ack floor of N, the ack
    floor then, nats-server's CPU seconds meanwhile, the seconds the workers took to get
    ready (off the clock), the seconds until every message was handed out (None if never),
    and what went wrong."""

    seconds: float = 0.0
    acked: int = 0
    server_cpu_s: float | None = None
    ready_s: float = 0.0
    delivered_s: float | None = None
    problems: list[str] = attrs.field(factory=list)


@attrs.define
class _Worker:
    """A running worker process, the lines it printed, and where its stderr goes."""

    index: int
    proc: trio.Process
    stderr: IO[bytes]
    ready: trio.Event = attrs.field(factory=trio.Event)
    exited: trio.Event = attrs.field(factory=trio.Event)
    done: dict[str, Any] | None = None
    told: bool = False
    #: Messages it took so far (its ``taken`` reports).
    taken: int = 0
    failures: list[str] = attrs.field(factory=list)

    def tail(self) -> str:
        """The last lines of the worker's stderr: why it failed."""
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace")
        lines = [line for line in text.strip().splitlines() if line.strip()][-3:]
        return " | ".join(lines) or "no output"


async def _read_lines(worker: _Worker) -> None:
    """Follow the worker's stdout: ``ready``, ``failed`` and ``done`` events (see
    scale_worker.py); set ``exited`` at its end of file."""
    assert worker.proc.stdout is not None
    pending = b""
    try:
        while True:
            data = await worker.proc.stdout.receive_some(65536)
            if not data:
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                if event.get("event") == "ready":
                    worker.ready.set()
                elif event.get("event") == "taken":
                    worker.taken = int(event.get("n") or 0)
                elif event.get("event") == "failed":
                    worker.failures.extend(event.get("errors") or ["a batch failed"])
                elif event.get("event") == "done":
                    worker.done = event
    finally:
        await worker.proc.wait()
        worker.exited.set()


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU of a live process (``/proc/<pid>/stat``), None if unknown."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


async def _measure(
    url: str,
    plan: _Plan,
    n: int,
    *,
    batch: int,
    buffer: int,
    out: Path,
    server_pid: int | None,
) -> dict[str, Any]:
    """One implementation: a paused consumer, N workers made ready, the clock from resuming
    the consumer to its ack floor reaching N messages; then the workers' reports."""
    from headrace.jetstream import AckPolicy, ConsumerConfig, JetStream
    from headrace.nats import connect

    durable = f"scale_{plan.commits}_{plan.workers}"
    max_ack_pending = max(MAX_ACK_PENDING, 2 * max(batch, buffer) * plan.workers)
    problems: list[str] = []
    workers: list[_Worker] = []
    timing = _Timing()
    # The workers' stderr, read when one fails: closed however this ends.
    with contextlib.ExitStack() as files:
        async with connect(url) as nc:
            js = JetStream(nc)
            config = ConsumerConfig(
                durable_name=durable,
                ack_policy=AckPolicy.EXPLICIT,
                max_ack_pending=max_ack_pending,
                extra={"pause_until": PAUSED_UNTIL},
            )
            info = await js.create_consumer(STREAM, config)
            if not info.paused:
                raise BenchmarkError(
                    "this nats-server did not pause the consumer (pause_until needs nats-server "
                    "2.11 or later); bench scale needs it to start every worker together"
                )
            cmd = [*_WORKER, "--url", url, "--stream", STREAM, "--durable", durable]
            cmd += ["--out", str(out), "--commits", plan.commits, "--batch", str(batch)]
            cmd += ["--max-age", str(MAX_AGE), "--buffer", str(buffer)]
            cmd += ["--max-ack-pending", str(max_ack_pending)]
            async with trio.open_nursery() as nursery:
                started_ready = time.perf_counter()
                for index in range(plan.workers):
                    err = files.enter_context(tempfile.TemporaryFile())
                    proc = await trio.lowlevel.open_process(
                        [*cmd, "--index", str(index)],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=err,
                    )
                    worker = _Worker(index, proc, err)
                    workers.append(worker)
                    nursery.start_soon(_read_lines, worker)
                try:
                    timing = await _clock(js, durable, n, workers, server_pid, started_ready)
                    problems += timing.problems
                finally:
                    await _tell_stop(workers)
                    with trio.move_on_after(DONE_TIMEOUT) as waited:
                        for worker in workers:
                            await worker.exited.wait()
                    if waited.cancelled_caught:
                        problems.append(f"workers did not stop within {DONE_TIMEOUT:.0f}s")
                        for worker in workers:
                            if worker.proc.returncode is None:
                                worker.proc.kill()
            for worker in workers:
                if worker.done is None:
                    problems.append(f"worker {worker.index} {_exit_text(worker)}")
            if not problems:
                server = await _settled_problems(
                    n, True, lambda: js.consumer_info(STREAM, durable), trio.sleep
                )
                problems += server
            await js.delete_consumer(STREAM, durable)
    reports = [w.done for w in workers if w.done is not None]
    failures = [f for w in workers for f in w.failures]
    return {
        "seconds": timing.seconds,
        "acked": timing.acked,
        "ready_s": timing.ready_s,
        "delivered_s": timing.delivered_s,
        "server_cpu_s": timing.server_cpu_s,
        "problems": list(dict.fromkeys(problems)),  # a worker's exit may be seen twice
        "reports": reports,
        "failures": failures,
        "max_ack_pending": max_ack_pending,
    }


async def _resume(js: Any, durable: str) -> float:
    """End the consumer's pause a moment from now; returns that moment (``perf_counter``).

    Not by resuming it outright: nats-server (2.15.1) then leaves the pull requests that
    arrived while it was paused waiting until their next heartbeat (15 s with the default 30 s
    expiry: the first run of this benchmark took 15 s for 3000 messages), whereas a pause that
    runs out wakes them as it ends (a 20 ms pause: first messages 23 ms after the request). So
    the pause is moved to ``RESUME_AFTER`` seconds ahead, and the clock starts then. If the
    request took longer than that (the server would take a past time as "resume now"), it is
    asked again with a longer delay.
    """
    delay = RESUME_AFTER
    while True:
        wall, now = time.time(), time.perf_counter()
        until = dt.datetime.fromtimestamp(wall + delay, dt.UTC)
        answer = await js.api_request(
            f"CONSUMER.PAUSE.{STREAM}.{durable}",
            {"pause_until": until.strftime("%Y-%m-%dT%H:%M:%S.%fZ")},
        )
        if answer.get("paused") and time.time() < wall + delay:
            return now + delay
        if delay > 10:
            raise BenchmarkError(f"could not end the pause of consumer {durable}: {answer}")
        delay *= 4


async def _tell_stop(workers: list[_Worker]) -> None:
    """Tell each worker not told yet to stop (a line, then end of file): it drains."""
    for worker in workers:
        if worker.told:
            continue
        worker.told = True
        assert worker.proc.stdin is not None
        try:
            await worker.proc.stdin.send_all(b"stop\n")
            await worker.proc.stdin.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def _exit_text(worker: _Worker) -> str:
    return f"exited with {worker.proc.returncode} before reporting: {worker.tail()}"


async def _clock(
    js: Any,
    durable: str,
    n: int,
    workers: list[_Worker],
    server_pid: int | None,
    started_ready: float,
) -> _Timing:
    """Wait for every worker's ``ready``, end the consumer's pause, and time until its ack
    floor is N."""
    # Off the clock, so a plain poll: every worker ready, or one gone, or too late.
    give_up = time.perf_counter() + READY_TIMEOUT
    while not all(w.ready.is_set() for w in workers):
        gone = [w for w in workers if w.exited.is_set() and not w.ready.is_set()]
        if gone:
            return _Timing(problems=[f"worker {gone[0].index} {_exit_text(gone[0])}"])
        if time.perf_counter() > give_up:
            return _Timing(problems=[f"the workers were not ready within {READY_TIMEOUT:.0f}s"])
        await trio.sleep(0.01)
    ready_s = time.perf_counter() - started_ready
    cpu_before = _cpu_seconds(server_pid)
    started = await _resume(js, durable)
    await trio.sleep(max(0.0, started - time.perf_counter()))
    floor = 0
    moved = started
    delivered_s: float | None = None
    problems: list[str] = []
    while True:
        info = await js.consumer_info(STREAM, durable)
        now = time.perf_counter()
        if info.ack_floor.stream_seq >= n:
            floor = info.ack_floor.stream_seq
            break
        if info.ack_floor.stream_seq != floor:
            floor, moved = info.ack_floor.stream_seq, now
        if (
            delivered_s is None
            and info.num_pending == 0
            and info.delivered.stream_seq >= n
            and sum(w.taken for w in workers) >= n
        ):
            # Everything is handed out and taken: the workers drain, so their last batches
            # (partial: the messages are not split in multiples of the batch) commit now, not
            # after max_age. A continuous stream has no such tail; see the module docs. (Taken,
            # not only sent: a message on its way to a worker that drained would be dropped
            # and wait out its ack wait.)
            delivered_s = now - started
            await _tell_stop(workers)
        gone = [w for w in workers if w.exited.is_set()]
        if gone and (delivered_s is None or len(gone) == len(workers)):
            if delivered_s is None:
                problems.append(f"worker {gone[0].index} {_exit_text(gone[0])}")
                break
            # All drained and gone: their last acks are in.
            floor = (await js.consumer_info(STREAM, durable)).ack_floor.stream_seq
            if floor < n:
                problems.append(f"every worker stopped with the ack floor at {floor} of {n}")
            break
        if now - moved > STALL_TIMEOUT or now - started > RUN_TIMEOUT:
            problems.append(f"stalled: ack floor {floor} of {n} after {now - started:.0f}s")
            break
        await trio.sleep(POLL)
    seconds = time.perf_counter() - started
    cpu_after = _cpu_seconds(server_pid)
    server_cpu = (
        round(cpu_after - cpu_before, 3)
        if cpu_before is not None and cpu_after is not None
        else None
    )
    return _Timing(seconds, floor, server_cpu, ready_s, delivered_s, problems)


# -- checking the output ----------------------------------------------------------------------


def verify_output(out: Path, n: int) -> tuple[int, int, list[str], float]:
    """Read ``out`` back with pyarrow (``_`` and ``.`` names skipped): (rows, distinct
    stream sequences, problems, seconds taken). Every sequence 1..N once, nothing else."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    started = time.perf_counter()
    if not out.is_dir():
        return 0, 0, [f"no output directory {out}"], 0.0
    dataset = ds.dataset(out, format="parquet", ignore_prefixes=["_", "."])
    seqs = dataset.to_table(columns=["stream_seq"]).column("stream_seq")
    rows = len(seqs)
    distinct = pc.count_distinct(seqs).as_py() if rows else 0
    problems = []
    if rows != n:
        problems.append(f"the output holds {rows} rows, not {n}")
    if distinct != n:
        problems.append(f"the output holds {distinct} distinct stream sequences, not {n}")
    if rows:
        low, high = pc.min_max(seqs).values()
        if (low.as_py(), high.as_py()) != (1, n):
            problems.append(f"the output's stream sequences run {low}..{high}, not 1..{n}")
    return rows, distinct, problems, time.perf_counter() - started


# -- results ----------------------------------------------------------------------------------


def _finish(plan: _Plan, raw: dict[str, Any], n: int, batch: int, buffer: int) -> dict[str, Any]:
    """A result line from the parent's and the workers' figures."""
    reports: list[dict[str, Any]] = sorted(raw["reports"], key=lambda r: r["worker"])
    problems: list[str] = raw["problems"]
    seconds: float = raw["seconds"]
    result: dict[str, Any] = {"bench": "scale", "impl": plan.impl, "workers": plan.workers}
    if not problems:  # else no figure to trust
        result["msg_per_s"] = round(n / seconds) if seconds > 0 else 0
    peaks = [r.get("peak_rss_mb") or 0.0 for r in reports]
    result["peak_rss_mb"] = round(sum(peaks), 1)  # all the worker processes together
    result["worker_peak_rss_mb"] = peaks
    result["verified"] = not problems
    if problems:
        result["error"] = "; ".join(problems)
    else:
        result["seconds"] = round(seconds, 3)
    result["msgs"] = raw["acked"]
    result["expected"] = n
    result["commit_mode"] = plan.commits
    result["batch"] = batch
    result["buffer"] = buffer

    def total(key: str) -> Any:
        return sum(r.get(key) or 0 for r in reports)

    result["batches"] = total("batches")
    result["batches_failed"] = total("batches_failed")
    result["worker_rows"] = [r.get("rows", 0) for r in reports]
    result["skipped"] = total("skipped")
    result["redeliveries"] = total("redeliveries")
    result["commit_s"] = round(total("commit_s"), 3)
    result["worker_first_batch_s"] = [r.get("first_batch_s") for r in reports]
    result["workers_cpu_s"] = round(total("cpu_s"), 3)
    result["server_cpu_s"] = raw["server_cpu_s"]
    if plan.commits == "shared":
        commits = total("commits")
        result["commits"] = commits
        result["cas_refused"] = total("cas_refused")
        result["max_refusals"] = max((r.get("max_refusals") or 0 for r in reports), default=0)
        result["in_doubt"] = total("in_doubt")
        result["overlaps"] = total("overlaps")
        result["redone"] = total("redone")
        state_s = total("state_s")
        result["state_s"] = round(state_s, 3)
        result["state_ms_per_commit"] = round(1000 * state_s / commits, 2) if commits else None
        result["state_max_ms"] = round(
            1000 * max((r.get("state_max_s") or 0.0 for r in reports), default=0.0), 1
        )
    if raw["failures"]:
        result["batch_failures"] = raw["failures"][:3]
    delivered = raw["delivered_s"]
    result["delivered_s"] = round(delivered, 3) if delivered is not None else None
    result["ready_s"] = round(raw["ready_s"], 3)
    result["max_ack_pending"] = raw["max_ack_pending"]
    return result


def _add_ratios(results: list[dict[str, Any]]) -> None:
    """``vs_single_writer`` on each headrace-scale line, ``vs_one_worker`` for N > 1: figures
    of the same run only."""
    single = next((r for r in results if r["impl"] == SINGLE), None)
    one = next((r for r in results if r["impl"] == SCALE and r["workers"] == 1), None)
    for r in results:
        if r["impl"] != SCALE or not r.get("msg_per_s"):
            continue
        if single is not None and single.get("msg_per_s"):
            r["vs_single_writer"] = round(r["msg_per_s"] / single["msg_per_s"], 2)
        if r["workers"] > 1 and one is not None and one.get("msg_per_s"):
            r["vs_one_worker"] = round(r["msg_per_s"] / one["msg_per_s"], 2)


def _print_lines(results: list[dict[str, Any]], load: dict[str, Any], n: int) -> None:
    avg = load["payload_bytes"] / max(1, load["stored"])
    print(
        f"stream loaded: {load['stored']:,} JSON orders (avg {avg:.0f} B) at "
        f"{load['load_msg_per_s']:,} msg/s; {os.cpu_count()} CPUs"
    )
    for r in results:
        name = f"{r['impl']} x{r['workers']}"
        if "error" in r:
            print(f"{name:>26}: FAILED: {r['error']}")
            continue
        ratios = ""
        if "vs_single_writer" in r:
            ratios += f"  vs single writer {r['vs_single_writer']}x"
        if "vs_one_worker" in r:
            ratios += f"  vs 1 worker {r['vs_one_worker']}x"
        per = " + ".join(f"{p:g}" for p in r["worker_peak_rss_mb"])
        rss = f"peak RSS {r['peak_rss_mb']:g} MB" + (f" ({per})" if r["workers"] > 1 else "")
        protocol = ""
        if r["commit_mode"] == "shared":
            per_commit = r["state_ms_per_commit"]
            protocol = (
                f"  {r['commits']} commits, {r['cas_refused']} CAS refused (max "
                f"{r['max_refusals']} in a row), state {per_commit} ms/commit"
            )
        if r["batches_failed"]:
            protocol += f"  {r['batches_failed']} batches FAILED"
        print(
            f"{name:>26}: {r['msg_per_s']:>9,} msg/s  {r['seconds']:6.2f} s{ratios}  {rss}"
            f"{protocol}  verified"
        )


def run(
    messages: int,
    *,
    workers: Sequence[int] = WORKERS,
    batch: int = BATCH,
    buffer: int = BUFFER,
    as_json: bool = False,
) -> list[dict[str, Any]]:
    """Load the stream once, measure the single writer and then headrace-scale with each
    worker count, print JSON lines or one line per implementation; returns the lines (one that
    failed its checks has ``verified: false`` and ``error``, and no figure)."""
    check_requirements()
    if messages < 1 or batch < 1 or buffer < 1 or not workers or min(workers) < 1:
        raise BenchmarkError("--messages, --batch, --buffer and --workers must be at least 1")
    plans = [_Plan(SINGLE, 1, "local")] + [_Plan(SCALE, w, "shared") for w in workers]
    results: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="headrace-bench-scale-") as work,
        LocalServer(jetstream=True) as server,
    ):
        proc = getattr(server, "_proc", None)
        server_pid = proc.pid if proc is not None else None
        load = trio.run(_load, server.url, messages)
        for plan in plans:
            out = Path(work) / f"out-{plan.label}"
            measure = functools.partial(
                _measure,
                server.url,
                plan,
                messages,
                batch=batch,
                buffer=buffer,
                out=out,
                server_pid=server_pid,
            )
            raw = trio.run(measure)
            rows, distinct, problems, verify_s = verify_output(out, messages)  # off the clock
            raw["problems"] += problems
            result = _finish(plan, raw, messages, batch, buffer)
            result.update(rows=rows, distinct_stream_seq=distinct, verify_s=round(verify_s, 3))
            result["avg_payload"] = round(load["payload_bytes"] / messages, 1)
            results.append(result)
    _add_ratios(results)
    if as_json:
        for r in results:
            print(json.dumps(r), flush=True)
    else:
        _print_lines(results, load, messages)
    return results


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m headrace_bench.scale")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--workers", type=parse_workers, default=WORKERS)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--buffer", type=int, default=BUFFER)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    run(
        args.messages, workers=args.workers, batch=args.batch, buffer=args.buffer, as_json=args.json
    )


if __name__ == "__main__":
    main()
