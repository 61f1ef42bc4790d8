"""``headrace bench spark``: JetStream into parquet through Spark's own engine (the ``jetstream``
data source, headrace_spark.datasource) against today's pipeline path (JetStream -> pipeline ->
SparkSink) and the loop a user would write with nats-py and PySpark.

Setup: one private nats-server with JetStream (file storage); stream ``ORDERS`` (subjects
``orders.>``, ``allow_direct``) loaded once with N messages of ``--payload`` bytes (300,000 x
128 B by default; each body different, range_read.py's), every publish acknowledged; and a
small stream ``WARMUP`` for the warm-up. Then each line below runs in a fresh process of its
own (its peak RSS its own), with its own SparkSession (``local[*]``, the sink's embedded
defaults) and its own output directory, and writes every message of ``ORDERS`` into parquet:

- ``headrace-spark-source`` (once per ``--partitions`` value, default 1, 2 and 4):
  ``spark.readStream.format("jetstream")`` with ``startingOffsets`` earliest and that
  ``numPartitions``, ``trigger(availableNow=True)`` into ``writeStream.format("parquet")`` with
  a checkpoint location; the clock runs from ``start()`` to ``awaitTermination()`` returning;
- ``headrace-spark-batch-read`` (``numPartitions`` left to the source, then 2):
  ``spark.read.format("jetstream")...load().write.parquet(out)``;
- ``headrace-sparksink``: bench e2e's headrace implementation (e2e.py ``_run_headrace``, the
  Spark writer): a pipeline, ``JetStreamSource`` on a durable consumer into ``SparkSink``,
  batches of ``--batch`` (100,000) acked after their commit;
- ``naive``: bench e2e's nats-py loop (e2e.py ``_run_naive``): ``fetch(1000)`` until a batch is
  held, ``createDataFrame(rows)``, ``write.parquet``, each message acked.

Before its clock each process starts its session (``session_s``), registers the format and runs
the same warm-up (``warmup_s``): bench e2e's few small writes through Arrow and Rows, then a
batch read and an availableNow query of ``WARMUP`` through the format (the JVM's first uses and
Spark's Python workers started, in every process alike). Then ``tune_gc()``.

Figures per line: ``msg_per_s``; CPU seconds on the clock, in total and per 100k messages, of
the driver's Python process (``python_cpu_s``), its JVM (``jvm_cpu_s``), Spark's Python workers
(``workers_cpu_s``: every process under the JVM, those that ended during the run included, as
last sampled; see ``_TreeClock``) and nats-server (``server_cpu_s``), and
``client_cpu_s_per_100k``, the first three together; memory: ``peak_rss_mb`` (the Python
process's ``VmHWM``) and ``jvm_peak_rss_mb`` (the JVM's), both reset when the clock starts,
``workers_peak_pss_mb``
(the largest sum of the workers' PSS, sampled every 0.1 s: forked workers share pages, which
RSS would count once per worker) and ``tree_peak_mb`` (the largest sum of the three). The
source's line adds ``micro_batches``, ``input_rows`` and ``durations_ms`` (Spark's progress
reports' ``durationMs``, summed over the micro-batches); the batch read's adds
``planned_partitions`` (its tasks). Checked off the clock, with Spark's reader: the output
holds N rows with N distinct stream sequences (``verified``; a mismatch is a line with
``error`` and no figure, a ``MISMATCH`` message on stderr, and exit status 1). Ratios from the
same run, on the source and batch-read lines: ``ratio_vs_sparksink`` and ``ratio_vs_naive``
(and ``ratio_vs_naive`` on the sparksink line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
from headrace.localserver import LocalServer

from headrace_bench import e2e
from headrace_bench.consume import (
    BenchmarkError,
    _failure,
    _last_json,
    _peak_rss_mb,
    _run_child,
    report,
)
from headrace_bench.range_read import load as load_stream

SOURCE = "headrace-spark-source"
BATCH_READ = "headrace-spark-batch-read"
SPARKSINK = "headrace-sparksink"
NAIVE = "naive"
IMPLS = (SOURCE, BATCH_READ, SPARKSINK, NAIVE)
#: bench e2e's records per batch and consume buffer (``--batch``, ``--buffer``).
BATCH = e2e.BATCH
BUFFER = e2e.BUFFER
#: The stream and subjects of bench e2e, whose implementations the last two lines reuse.
STREAM = e2e.STREAM
SUBJECTS = e2e.SUBJECTS
WARM_STREAM = "WARMUP"
WARM_SUBJECTS = "warmup.>"
WARM_MESSAGES = 10_000
MESSAGES = 300_000
PAYLOAD = 128
#: The source's numPartitions, one line each (``--partitions``).
PARTITIONS = (1, 2, 4)
#: The batch read's numPartitions (None: the source's own choice, by partitionBytes).
BATCH_PARTITIONS: tuple[int | None, ...] = (None, 2)
CHILD_TIMEOUT = 900.0
_ME = [sys.executable, "-m", "headrace_bench.spark"]


def parse_partitions(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` as (1, 2, 4): distinct counts of at least 1, in the order given."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--partitions takes numbers separated by commas, not {text!r}") from None
    if not counts or any(n < 1 for n in counts):
        raise ValueError(f"--partitions takes partition counts of at least 1, not {text!r}")
    return tuple(dict.fromkeys(counts))


@attrs.frozen
class _Plan:
    """One line: an implementation, and the source's numPartitions (None: its default)."""

    impl: str
    partitions: int | None = None


def plans(partitions: Sequence[int] = PARTITIONS) -> list[_Plan]:
    """The lines of a run, in the order they run: the two baselines first."""
    lines = [_Plan(SPARKSINK), _Plan(NAIVE)]
    lines += [_Plan(SOURCE, p) for p in partitions]
    lines += [_Plan(BATCH_READ, p) for p in BATCH_PARTITIONS]
    return lines


# -- the process tree: CPU and memory ---------------------------------------------------------
#
# Spark's Python workers are processes under the JVM: pyspark.daemon (one per worker module) and
# the workers it forks (reused from task to task), and the streaming source's runner, which the
# JVM starts for each query. Processes come and go during a run, and what an ended one used
# cannot be read afterwards: pyspark.daemon ignores SIGCHLD, so its workers that end are reaped by
# the kernel and their time is in no parent's "reaped children" figures; and a parent's reaped
# time, where there is one, is only known once it has waited, which races with the end of the
# clock. So the sampler reads every process's own CPU time every SAMPLE_S, and each counts with
# its last reading: its figure at the end if it is still there, else its last sample (short by
# what it used in its last interval).

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
SAMPLE_S = 0.1


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid``. Unlike e2e's, over all its threads' children: the JVM
    starts Python workers from threads other than its main one."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for thread in threads:
            try:
                children = Path(f"/proc/{parent}/task/{thread}/children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                found.append(child)
                todo.append(child)
    return found


def _cpu(pid: int) -> float | None:
    """User plus system CPU seconds of a live process (``None``: gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def _status_mb(pid: int, field: str) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _pss_mb(pid: int) -> float:
    """Proportional set size: a forked worker's pages shared with pyspark.daemon count once
    over them all, not once per worker as RSS counts them."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class _TreeClock:
    """CPU seconds of this process, its JVM, its JVM's Python workers and nats-server while the
    clock runs; and, every :data:`SAMPLE_S`, each worker's CPU time and the workers' memory
    (the sum of their PSS) and the whole tree's (this process's and the JVM's RSS, plus the
    workers'), whose largest values are reported. The sampler's own reads (a few files per
    process per sample) are on this process's clock: about 1% of a core."""

    def __init__(self, jvm: int | None, server: int | None) -> None:
        self.jvm = jvm
        self.server = server
        self.workers_peak = 0.0
        self.tree_peak = 0.0
        self._python = time.process_time()
        self._jvm = _cpu(jvm) if jvm is not None else None
        self._server = _cpu(server) if server is not None else None
        self._start = self._workers_now()
        self._last = dict(self._start)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _workers_now(self) -> dict[int, float]:
        if self.jvm is None:
            return {}
        found = {}
        for pid in _descendants(self.jvm):
            cpu = _cpu(pid)
            if cpu is not None:
                found[pid] = cpu
        return found

    def _sample(self) -> None:
        me = os.getpid()
        while True:
            now = self._workers_now()
            self._last.update(now)
            workers = sum(_pss_mb(pid) for pid in now)
            jvm_rss = _status_mb(self.jvm, "VmRSS") if self.jvm is not None else 0.0
            tree = _status_mb(me, "VmRSS") + jvm_rss + workers
            self.workers_peak = max(self.workers_peak, workers)
            self.tree_peak = max(self.tree_peak, tree)
            if self._stop.wait(SAMPLE_S):
                return

    def spent(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        self._last.update(self._workers_now())
        spent: dict[str, Any] = {"python_cpu_s": round(time.process_time() - self._python, 3)}
        jvm_end = _cpu(self.jvm) if self.jvm is not None else None
        if self._jvm is not None and jvm_end is not None:
            spent["jvm_cpu_s"] = round(jvm_end - self._jvm, 3)
            workers = sum(cpu - self._start.get(pid, 0.0) for pid, cpu in self._last.items())
            spent["workers_cpu_s"] = round(workers, 3)
        server_end = _cpu(self.server) if self.server is not None else None
        if self._server is not None and server_end is not None:
            spent["server_cpu_s"] = round(server_end - self._server, 3)
        spent["workers_peak_pss_mb"] = round(self.workers_peak, 1)
        spent["tree_peak_mb"] = round(self.tree_peak, 1)
        spent["python_workers_seen"] = len(self._last)
        spent["python_workers_started"] = len(set(self._last) - set(self._start))
        return spent


# -- the children -----------------------------------------------------------------------------


def _options(url: str, stream: str, partitions: int | None) -> dict[str, str]:
    options = {"servers": url, "stream": stream}
    if partitions is not None:
        options["numPartitions"] = str(partitions)
    return options


def _stream_into(spark: Any, options: dict[str, str], out: Path, checkpoint: Path) -> Any:
    """``readStream.format("jetstream")`` from the earliest message, availableNow, into
    parquet; the query, once it ended (``awaitTermination`` raises if it failed)."""
    query = (
        spark.readStream.format("jetstream")
        .options(**options)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query


def _batch_into(spark: Any, options: dict[str, str], out: Path) -> None:
    spark.read.format("jetstream").options(**options).load().write.parquet(str(out))


def _warm_up(spark: Any, url: str, where: Path, rows: int, partitions: int) -> float:
    """bench e2e's warm-up (the JVM's first Arrow and Row writes), then the format's: a batch
    read and an availableNow query of the warm-up stream in ``partitions`` tasks (so that as
    many of Spark's Python workers run, warm, as the measured runs use)."""
    started = time.perf_counter()
    e2e._warm_up(spark, where, rows)
    options = _options(url, WARM_STREAM, partitions)
    _batch_into(spark, options, where / "source-batch")
    _stream_into(spark, options, where / "source-stream", where / "source-checkpoint")
    return time.perf_counter() - started


def _planned_partitions(url: str, partitions: int | None) -> int:
    """How many partitions (tasks) the batch read plans, asked of the source's reader as
    Spark's planner asks it (off the clock)."""
    from headrace_spark.datasource import JetStreamBatchReader, SourceSpec

    spec = SourceSpec.from_options(_options(url, STREAM, partitions), streaming=False)
    return len(JetStreamBatchReader(spec).partitions())


def _read_back(spark: Any, out: Path, column: str) -> tuple[int, int, float]:
    """Rows and distinct values of ``column`` (the stream sequence) in the output, read back by
    Spark; and how long that took."""
    started = time.perf_counter()
    if not any(out.rglob("*.parquet")):
        return 0, 0, 0.0
    df = spark.read.parquet(str(out))
    rows = df.count()
    distinct = df.select(column).distinct().count()
    return rows, distinct, time.perf_counter() - started


def _run_source(spark: Any, url: str, partitions: int | None, out: Path) -> dict[str, Any]:
    options = _options(url, STREAM, partitions)
    started = time.perf_counter()
    problems: list[str] = []
    progress: list[Any] = []
    try:
        query = _stream_into(spark, options, out, out.with_name(out.name + "-checkpoint"))
        progress = [p for p in query.recentProgress if p]
    except Exception as exc:  # a failed query: reported, no figure
        problems.append(f"the query failed: {str(exc).splitlines()[0][:500]}")
    elapsed = time.perf_counter() - started
    read = [int(p.numInputRows or 0) for p in progress]
    durations: dict[str, int] = {}
    for p in progress:
        for key, ms in (p["durationMs"] or {}).items():
            durations[key] = durations.get(key, 0) + int(ms)
    return {
        "seconds": elapsed,
        "problems": problems,
        "micro_batches": sum(1 for n in read if n),
        "input_rows": sum(read),
        "durations_ms": durations,
        "planned_partitions": partitions,
    }


def _run_batch_read(spark: Any, url: str, partitions: int | None, out: Path) -> dict[str, Any]:
    options = _options(url, STREAM, partitions)
    started = time.perf_counter()
    problems: list[str] = []
    try:
        _batch_into(spark, options, out)
    except Exception as exc:
        problems.append(f"the read failed: {str(exc).splitlines()[0][:500]}")
    elapsed = time.perf_counter() - started
    return {"seconds": elapsed, "problems": problems}


def _child(args: argparse.Namespace) -> dict[str, Any]:
    import headrace_spark
    from headrace.pipeline import tune_gc

    spark, session_s = e2e._start_spark("local[*]")
    jvm = e2e._jvm_pid()
    e2e._JVM[0] = jvm  # e2e's implementations measure their JVM through this
    work = Path(args.work)
    partitions = None if args.partitions == 0 else args.partitions
    label = args.impl if partitions is None else f"{args.impl}-{partitions}"
    try:
        headrace_spark.register(spark)
        warm = work / f"warmup-{label}-{os.getpid()}"
        rows = min(e2e.WARMUP_ROWS, max(1000, args.messages))
        warmup_s = _warm_up(spark, args.url, warm, rows, args.warm_partitions)
        out = work / f"out-{label}-{os.getpid()}"
        tune_gc()
        e2e._reset_peak_rss("self")
        if jvm is not None:
            e2e._reset_peak_rss(jvm)
        clock = _TreeClock(jvm, args.server_pid)
        if args.impl == SOURCE:
            raw = _run_source(spark, args.url, partitions, out)
        elif args.impl == BATCH_READ:
            raw = _run_batch_read(spark, args.url, partitions, out)
        elif args.impl == SPARKSINK:
            raw = trio.run(
                e2e._run_headrace,
                "headrace-e2e",
                args.url,
                args.messages,
                args.batch,
                args.buffer,
                spark,
                out,
            )
        else:
            raw = asyncio.run(e2e._run_naive(args.url, args.messages, args.batch, spark, out))
        spent = clock.spent()
        for key in ("impl", "python_cpu_s", "jvm_cpu_s"):  # e2e's own: ours replace them
            raw.pop(key, None)
        if "msgs" in raw:  # e2e's: the messages acked
            raw["acked"] = raw.pop("msgs")
        raw.update(spent)
        raw["peak_rss_mb"] = _peak_rss_mb()
        raw["jvm_peak_rss_mb"] = _peak_rss_mb(jvm) if jvm is not None else None
        column = "seq" if args.impl in (SOURCE, BATCH_READ) else "stream_seq"
        rows, distinct, verify_s = _read_back(spark, out, column)
        if args.impl == BATCH_READ:
            raw["planned_partitions"] = _planned_partitions(args.url, partitions)
        raw["problems"] += e2e._output_problems(args.messages, rows, distinct)
        raw.update(
            impl=args.impl,
            partitions=partitions,
            rows=rows,
            distinct_seq=distinct,
            output_mb=e2e._output_mb(out),
            session_s=round(session_s, 3),
            warmup_s=round(warmup_s, 3),
            verify_s=round(verify_s, 3),
        )
    finally:
        spark.stop()
    return raw


# -- the parent -------------------------------------------------------------------------------


def _finish(raw: dict[str, Any], n: int, payload: int) -> dict[str, Any]:
    """The child's raw figures as a result line."""
    problems = raw.pop("problems", [])
    seconds = raw.pop("seconds")
    result: dict[str, Any] = {"bench": "spark", "impl": raw.pop("impl")}
    result["partitions"] = raw.pop("partitions", None)
    result["msgs"] = raw.pop("rows", 0)
    result["expected"] = n
    result["verified"] = not problems
    if problems:
        result["error"] = "; ".join(problems)
    else:
        result["seconds"] = round(seconds, 3)
        result["msg_per_s"] = round(n / seconds) if seconds > 0 else 0
        for key in ("python_cpu_s", "jvm_cpu_s", "workers_cpu_s", "server_cpu_s"):
            if key in raw:
                result[f"{key}_per_100k"] = round(raw[key] * 100_000 / n, 3)
        cpu = [raw[k] for k in ("python_cpu_s", "jvm_cpu_s", "workers_cpu_s") if k in raw]
        result["client_cpu_s_per_100k"] = round(sum(cpu) * 100_000 / n, 3)
    result["payload"] = payload
    result.update(raw)
    result["rows"] = result["msgs"]
    return result


def _measure(plan: _Plan, url: str, work: str, args: dict[str, Any]) -> dict[str, Any]:
    n = args["messages"]
    cmd = [*_ME, "child", "--impl", plan.impl, "--url", url, "--work", work]
    cmd += ["--messages", str(n), "--batch", str(args["batch"]), "--buffer", str(args["buffer"])]
    cmd += ["--partitions", str(plan.partitions or 0)]
    cmd += ["--warm-partitions", str(args["warm_partitions"])]
    if args.get("server_pid") is not None:
        cmd += ["--server-pid", str(args["server_pid"])]
    child = _run_child(cmd, timeout=CHILD_TIMEOUT)
    raw = _last_json(child)
    if child.returncode != 0 or raw is None:
        return {
            "bench": "spark",
            "impl": plan.impl,
            "partitions": plan.partitions,
            "msgs": 0,
            "expected": n,
            "verified": False,
            "error": _failure(child),
        }
    return _finish(raw, n, args["payload"])


def _add_ratios(results: list[dict[str, Any]]) -> None:
    peers = {r["impl"]: r for r in results if r["impl"] in (SPARKSINK, NAIVE)}
    for ours in results:
        if ours["impl"] == NAIVE or not ours.get("msg_per_s"):
            continue
        for impl in (SPARKSINK, NAIVE):
            peer = peers.get(impl)
            if peer is None or peer is ours or not peer.get("msg_per_s"):
                continue
            name = "sparksink" if impl == SPARKSINK else "naive"
            ours[f"ratio_vs_{name}"] = round(ours["msg_per_s"] / peer["msg_per_s"], 2)


def _label(r: dict[str, Any]) -> str:
    if r["impl"] in (SOURCE, BATCH_READ):
        return f"{r['impl']} [{r['partitions'] or 'default'}]"
    return str(r["impl"])


def _print_table(results: list[dict[str, Any]], load: dict[str, Any], payload: int) -> None:
    print(
        f"stream loaded: {load['stored']:,} messages x {payload} B at "
        f"{load['load_msg_per_s']:,} msg/s; each line writes all of them into parquet"
    )
    for r in results:
        label = _label(r)
        if "error" in r:
            print(f"{label:>31}: FAILED: {r['error']}")
            continue
        ratios = "  ".join(
            f"{k.removeprefix('ratio_')} {v}x" for k, v in r.items() if k.startswith("ratio_")
        )
        tasks = f"  tasks {r['planned_partitions']}" if r.get("planned_partitions") else ""
        print(
            f"{label:>31}: {r['msg_per_s']:>9,} msg/s  {r['seconds']:7.2f} s{tasks}  {ratios}  "
            f"verified"
        )
        cpu = ", ".join(
            f"{name} {r[f'{name}_cpu_s_per_100k']:.2f}"
            for name in ("python", "jvm", "workers", "server")
            if f"{name}_cpu_s_per_100k" in r
        )
        print(
            f"{'':>31}  CPU s/100k: {cpu}; peak RSS MB: python {r.get('peak_rss_mb')}, JVM "
            f"{r.get('jvm_peak_rss_mb')}, workers (PSS) {r.get('workers_peak_pss_mb')}, all "
            f"{r.get('tree_peak_mb')}"
        )


def run(
    messages: int = MESSAGES,
    *,
    payload: int = PAYLOAD,
    partitions: Sequence[int] = PARTITIONS,
    batch: int = BATCH,
    buffer: int = BUFFER,
    as_json: bool = False,
) -> list[dict[str, Any]]:
    """Load the stream once, run each line in its own process, print JSON lines or a table;
    returns the lines (one that failed, or whose output did not hold every message once, has
    ``error``, ``verified: false`` and no figures)."""
    e2e.check_spark()
    if messages < 1 or payload < 1 or batch < 1 or buffer < 1:
        raise BenchmarkError("--messages, --payload, --batch and --buffer must be at least 1")
    results: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="headrace-bench-spark-") as work,
        LocalServer(jetstream=True) as server,
    ):
        load = trio.run(load_stream, server.url, messages, payload, STREAM, SUBJECTS)
        warm = min(WARM_MESSAGES, messages)
        trio.run(load_stream, server.url, warm, payload, WARM_STREAM, WARM_SUBJECTS)
        settings = {
            "messages": messages,
            "payload": payload,
            "batch": batch,
            "buffer": buffer,
            "server_pid": server.pid,
            # Every process warms as many Python workers as the most partitions of the run.
            "warm_partitions": max(*partitions, *(p or 1 for p in BATCH_PARTITIONS)),
        }
        for plan in plans(partitions):
            result = _measure(plan, server.url, work, settings)
            result["avg_stored_bytes"] = round(load["stream_bytes"] / messages, 1)
            results.append(result)
    _add_ratios(results)
    report(
        "spark",
        results,
        label=_label,
        as_json=as_json,
        table=lambda: _print_table(results, load, payload),
    )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m headrace_bench.spark")
    parser.add_argument("role", nargs="?", choices=["child"])
    parser.add_argument("--impl", choices=IMPLS, default=SOURCE)
    parser.add_argument("--url")
    parser.add_argument("--work")
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--payload", type=int, default=PAYLOAD)
    parser.add_argument("--partitions", default=None, help="child: one count (0: default)")
    parser.add_argument("--batch", type=int, default=e2e.BATCH)
    parser.add_argument("--buffer", type=int, default=e2e.BUFFER)
    parser.add_argument("--server-pid", type=int, default=None)
    parser.add_argument("--warm-partitions", type=int, default=max(PARTITIONS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.role == "child":
        args.partitions = int(args.partitions or 0)
        print(json.dumps(_child(args)), flush=True)
    else:
        counts = parse_partitions(args.partitions) if args.partitions else PARTITIONS
        run(
            args.messages,
            payload=args.payload,
            partitions=counts,
            batch=args.batch,
            buffer=args.buffer,
            as_json=args.json,
        )


if __name__ == "__main__":
    main()
