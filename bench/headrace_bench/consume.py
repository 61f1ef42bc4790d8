"""``headrace bench consume``: JetStream consume throughput, headrace against nats-py (and, with
``--anchors``, the C client libnats and nats.js).

One private nats-server with JetStream. A loader process fills stream ``BENCH`` (subjects
``bench.>``, file storage, the server's defaults) with N messages, each publish acknowledged by
the stream, and checks that the stream holds exactly N. Then, for each mode (ack policy
``none``, then ``explicit`` with every message acked) and each implementation, a fresh process
creates its own durable pull consumer (deliver all, ``max_ack_pending`` 100,000), so every
implementation reads all N messages from the start of the same stream, and times:

- from just before its first pull request to its N-th message;
- in ack mode, also until its acks are out: the clock stops after a flush (PING/PONG), so the
  server has read every ack. The peers' own scripts stop at the N-th message, with their last
  acks possibly still in a buffer, so this is at most one round trip against headrace.

headrace uses ``consume(max_messages=10000)`` and ``next_batch()``, acking each batch with
``ack_all()`` (one encoded write per batch, as the pipeline's ack tracker does). The window is
deeper than the ADR-37 default of 1000 (``--buffer`` changes it): in Python each pull round
costs scheduling and system calls that a deeper window spreads over more messages, and
pipelines size their consume to their batches anyway. bench/README.md gives both figures;
nats-py uses ``pull_subscribe`` + ``fetch(500)`` and ``await msg.ack()``, the loop its users
write. With ``--anchors`` the anchor programs of ``../shared/anchors`` (libnats
``natsSubscription_Fetch(1000)``, nats.js ``consume(max_messages: 1000)``) run against the same
server and stream, as subprocesses.

Correctness is checked for headrace and nats-py; a run that fails a check reports ``error``
instead of a figure. The client must receive exactly N messages, in batches that each hold
consecutive stream sequences continuing the previous batch (the first and last message of each
batch are parsed, on the clock: a few microseconds per batch). The server must agree: the
consumer made exactly N deliveries (consumer sequence N), up to stream sequence N, none
redelivered; in ack mode ``num_ack_pending`` is 0 and the ack floor is stream sequence N. In
ack mode these prove N distinct stream sequences: every one of 1..N was acked, acks come only
from received messages, and exactly N were received.

Why not parse every message's sequence: it costs 0.4 to 3 microseconds per message (split and
int, or ``JsMsg.metadata``), 12-100% of what consuming costs; taking that time off the clock
does not help either, as the server and the socket keep working during the pause (measured: ack
mode reads 14% faster that way).

Peak RSS is ``VmHWM`` of the consuming process: the Python children read their own at the end
of the measurement; the anchor programs are sampled from here every 20 ms and when they print
their result. Not ``ru_maxrss``, which Linux carries over ``exec`` from the forking parent (see
:func:`_peak_rss_mb`).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio
from headrace.errors import HeadraceError
from headrace.localserver import LocalServer

STREAM = "BENCH"
SUBJECTS = "bench.>"
IMPLS = ("headrace", "nats-py")
ANCHORS = ("libnats", "nats.js")
#: headrace's consume buffer (see the module docs for why not the ADR-37 default of 1000).
HEADRACE_BUFFER = 10_000
NATSPY_BATCH = 500
MAX_ACK_PENDING = 100_000
#: Stream publishes the loader keeps unacknowledged at once.
LOAD_WINDOW = 2000
#: How long the server may take to record the last acks before the checks give up.
SETTLE = 10.0
CHILD_TIMEOUT = 600.0
ANCHORS_DIR_ENV = "HEADRACE_ANCHORS"
_ME = [sys.executable, "-m", "headrace_bench.consume"]


class BenchmarkError(HeadraceError):
    """The benchmark could not be set up (the stream did not load)."""


def default_anchors_dir() -> Path:
    """``$HEADRACE_ANCHORS``, else ``../shared/anchors`` next to the repository."""
    env = os.environ.get(ANCHORS_DIR_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "anchors"


def _mode(ack: bool) -> str:
    return "ack" if ack else "noack"


def _consumer_name(impl: str, ack: bool) -> str:
    return f"{impl.replace('-', '')}_{_mode(ack)}_{os.getpid()}"


def _peak_rss_mb(pid: int | str = "self") -> float | None:
    """Peak RSS (``VmHWM``) of a live process, in MB; ``None`` once it is gone.

    Not ``ru_maxrss``: Linux carries a process's ``ru_maxrss`` over ``exec`` from the memory
    it was forked with, so a small program started by a 30 MB Python parent reports at least
    30 MB. ``VmHWM`` belongs to the process's own address space.
    """
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    if pid == "self":  # not Linux: the best there is (bytes on macOS, KiB elsewhere)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)
    return None


# -- checks shared by the children ------------------------------------------------------------


class _Order:
    """Checks that batches hold consecutive stream sequences continuing from the last batch.

    Only each batch's first and last message are looked at (two metadata parses per batch, on
    the clock): per-message bookkeeping would change the figure (see the module docs).
    """

    def __init__(self) -> None:
        self.next = 1
        self.problems: list[str] = []

    def add(self, first: int, last: int, count: int) -> None:
        if (first != self.next or last - first + 1 != count) and len(self.problems) < 3:
            self.problems.append(
                f"a batch of {count} held stream sequences {first}..{last}, "
                f"expected {self.next}..{self.next + count - 1}"
            )
        self.next = last + 1


def _client_problems(n: int, got: int, order: _Order) -> list[str]:
    problems = []
    if got != n:
        problems.append(f"received {got} messages, expected {n}")
    return problems + order.problems


def _server_problems(n: int, ack: bool, info: Any) -> list[str]:
    """What the server's consumer ``info`` (headrace's or nats-py's, which name the fields
    alike) says is wrong after a run over N messages."""
    delivered = info.delivered.stream_seq
    deliveries = info.delivered.consumer_seq
    redelivered = info.num_redelivered or 0
    problems = []
    if delivered != n:
        problems.append(f"consumer delivered up to stream sequence {delivered}, not {n}")
    if deliveries != n:
        problems.append(f"consumer made {deliveries} deliveries, not {n}")
    if redelivered:
        problems.append(f"{redelivered} messages were redelivered")
    if ack:
        ack_pending = info.num_ack_pending or 0
        ack_floor = info.ack_floor.stream_seq
        if ack_pending:
            problems.append(f"num_ack_pending is {ack_pending}, not 0")
        if ack_floor != n:
            problems.append(f"ack floor is stream sequence {ack_floor}, not {n}")
    return problems


async def _settled_problems(
    n: int,
    ack: bool,
    fetch_info: Callable[[], Awaitable[Any]],
    sleep: Callable[[float], Awaitable[Any]],
    settle: float = SETTLE,
) -> list[str]:
    """:func:`_server_problems`, asked again until none remain or ``settle`` seconds passed:
    the last acks may still be on their way when a run stops its clock. ``sleep`` is the event
    loop's (trio or asyncio: the nats-py side runs under asyncio)."""
    settle_by = time.monotonic() + settle
    while True:
        problems = _server_problems(n, ack, await fetch_info())
        if not problems or time.monotonic() > settle_by:
            return problems
        await sleep(0.05)


def _result(
    impl: str, ack: bool, n: int, got: int, elapsed: float, problems: list[str], **extra: Any
) -> dict[str, Any]:
    result: dict[str, Any] = {"bench": "js-consume", "impl": impl, "ack": ack, "msgs": got}
    result["expected"] = n
    if problems:
        result["error"] = "; ".join(problems)
    else:
        result["seconds"] = round(elapsed, 3)
        result["msg_per_s"] = round(got / elapsed) if elapsed > 0 else 0
    result.update(extra)
    return result


# -- the children -----------------------------------------------------------------------------


async def _load(url: str, n: int, size: int) -> None:
    """Create the stream and publish N messages, at most LOAD_WINDOW unacknowledged."""
    from headrace.jetstream import JetStream, StreamConfig, publish_acked
    from headrace.nats import connect

    payload = b"x" * size
    subjects = [f"bench.{i}" for i in range(100)]
    async with connect(url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECTS]))
        messages = ((subjects[i % 100], payload, None) for i in range(n))
        load = await publish_acked(nc, messages, window=LOAD_WINDOW)
        stored = await _stored(js, n, load.refused)
    print(json.dumps({"load_msg_per_s": round(load.msg_per_s), "stored": stored}), flush=True)


async def _stored(js: Any, n: int, refused: int, stream: str = STREAM) -> int:
    """What ``stream`` holds after loading N messages; :class:`BenchmarkError` unless N."""
    stored: int = (await js.stream_info(stream)).state.messages
    if refused or stored != n:
        raise BenchmarkError(f"loading failed: {refused} publishes refused, {stored} of {n} stored")
    return stored


async def _consume_headrace(
    url: str, n: int, ack: bool, idle: float, buffer: int = HEADRACE_BUFFER
) -> dict[str, Any]:
    from headrace.jetstream import (
        AckPolicy,
        ConsumerConfig,
        HeartbeatsMissed,
        JetStream,
        JsMsg,
        ack_all,
    )
    from headrace.nats import connect

    name = _consumer_name("headrace", ack)
    order = _Order()
    got = 0
    async with connect(url) as nc:
        js = JetStream(nc)
        policy = AckPolicy.EXPLICIT if ack else AckPolicy.NONE
        config = ConsumerConfig(
            durable_name=name, ack_policy=policy, max_ack_pending=MAX_ACK_PENDING
        )
        await js.create_consumer(STREAM, config)
        consumer = await js.pull_consumer(STREAM, name)
        started = time.perf_counter()
        cpu_started = time.process_time()
        async with consumer.consume(max_messages=buffer) as messages:
            events = messages.events(100_000)  # read once the consume has ended
            while got < n:
                batch: list[JsMsg] = []
                with trio.move_on_after(idle):
                    batch = await messages.next_batch()
                if not batch:
                    break  # stalled: reported below
                if ack:
                    ack_all(batch)  # every message acked, encoded and queued as one write
                got += len(batch)
                order.add(batch[0].metadata.stream_seq, batch[-1].metadata.stream_seq, len(batch))
            if ack:
                await nc.flush(30)  # the acks are out: the server has read them all
            elapsed = time.perf_counter() - started
            cpu = time.process_time() - cpu_started
        peak = _peak_rss_mb()
        alarms = warnings = 0
        async for event in events:
            if isinstance(event, HeartbeatsMissed):
                alarms += 1
            else:
                warnings += 1
        problems = _client_problems(n, got, order)
        server = await _settled_problems(n, ack, consumer.info, trio.sleep)
        await consumer.delete()
    return _result(
        "headrace",
        ack,
        n,
        got,
        elapsed,
        problems + server,
        peak_rss_mb=peak,
        client_cpu_s=round(cpu, 3),
        buffer=buffer,
        pull_requests=messages.requests_sent,
        heartbeat_alarms=alarms,
        pull_warnings=warnings,
    )


async def _consume_natspy(url: str, n: int, ack: bool, idle: float) -> dict[str, Any]:
    import nats  # type: ignore[import-not-found,unused-ignore]
    from nats.js.api import (  # type: ignore[import-not-found,unused-ignore]
        AckPolicy,
        ConsumerConfig,
    )

    name = _consumer_name("nats-py", ack)
    order = _Order()
    got = 0
    nc = await nats.connect(url, pending_size=256 * 1024 * 1024)
    js = nc.jetstream()
    policy = AckPolicy.EXPLICIT if ack else AckPolicy.NONE
    config = ConsumerConfig(ack_policy=policy, max_ack_pending=MAX_ACK_PENDING)
    sub = await js.pull_subscribe(SUBJECTS, durable=name, stream=STREAM, config=config)
    started = time.perf_counter()
    cpu_started = time.process_time()
    while got < n:
        try:
            batch = await sub.fetch(NATSPY_BATCH, timeout=idle)
        except TimeoutError:
            break  # stalled: reported below
        if ack:
            for msg in batch:
                await msg.ack()
        got += len(batch)
        first, last = batch[0].metadata.sequence.stream, batch[-1].metadata.sequence.stream
        order.add(first, last, len(batch))
    if ack:
        await nc.flush(30)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    peak = _peak_rss_mb()
    problems = _client_problems(n, got, order)
    server = await _settled_problems(n, ack, lambda: js.consumer_info(STREAM, name), asyncio.sleep)
    await js.delete_consumer(STREAM, name)
    await nc.close()
    return _result(
        "nats-py",
        ack,
        n,
        got,
        elapsed,
        problems + server,
        peak_rss_mb=peak,
        client_cpu_s=round(cpu, 3),
        batch=NATSPY_BATCH,
    )


def _profiled(fn: Callable[[], Any], path: str | None) -> Any:
    if path is None:
        return fn()
    profiler = cProfile.Profile()
    try:
        return profiler.runcall(fn)
    finally:
        profiler.dump_stats(path)


def _child(args: argparse.Namespace) -> None:
    if args.role == "load":
        trio.run(_load, args.url, args.messages, args.payload)
        return
    ack = args.mode == "ack"

    def go() -> dict[str, Any]:
        if args.impl == "headrace":
            result: dict[str, Any] = trio.run(
                _consume_headrace, args.url, args.messages, ack, args.idle, args.buffer
            )
        else:
            result = asyncio.run(_consume_natspy(args.url, args.messages, ack, args.idle))
        return result

    print(json.dumps(_profiled(go, args.profile)), flush=True)


# -- the parent: processes, peers, report -----------------------------------------------------


@attrs.define
class _Child:
    """What one child process printed, how it ended and its peak RSS as sampled from here."""

    stdout: str
    stderr: str
    returncode: int
    peak_rss_mb: float | None
    timed_out: bool


def _run_child(
    cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = CHILD_TIMEOUT
) -> _Child:
    """Run ``cmd`` to completion. Its peak RSS is sampled every 20 ms and whenever it prints a
    line (programs that do not report their own print their result before cleaning up)."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        samples: list[float] = []
        killed: list[bool] = []
        stop = threading.Event()

        def sample() -> None:
            value = _peak_rss_mb(proc.pid)
            if value is not None:
                samples.append(value)

        def sampler() -> None:
            while not stop.wait(0.02):
                sample()

        def kill() -> None:
            killed.append(True)
            proc.kill()

        thread = threading.Thread(target=sampler, daemon=True)
        timer = threading.Timer(timeout, kill)
        thread.start()
        timer.start()
        lines = []
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                sample()
                lines.append(line)
        finally:
            stop.set()
            thread.join()
            proc.wait()
            timer.cancel()
        err.seek(0)
        return _Child(
            "".join(lines),
            err.read(),
            proc.returncode,
            max(samples) if samples else None,
            bool(killed),
        )


def report(
    bench: str,
    results: list[dict[str, Any]],
    *,
    label: Callable[[dict[str, Any]], str],
    as_json: bool,
    table: Callable[[], None],
) -> None:
    """A run's lines: a ``MISMATCH`` on stderr for each that failed its check (``label``
    names it), then the lines as JSON objects, one a line, or ``table()``."""
    for r in results:
        if not r.get("verified"):
            print(
                f"headrace bench {bench}: MISMATCH: {label(r)}: {r.get('error')}",
                file=sys.stderr,
                flush=True,
            )
    if as_json:
        for r in results:
            print(json.dumps(r), flush=True)
    else:
        table()


def _last_json(child: _Child) -> dict[str, Any] | None:
    for line in reversed(child.stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _failure(child: _Child) -> str:
    if child.timed_out:
        return f"timed out after {CHILD_TIMEOUT:.0f}s"
    tail = [line for line in child.stderr.strip().splitlines() if line.strip()][-3:]
    return f"exited with {child.returncode}: " + " | ".join(tail or ["no output"])


@attrs.define
class _Peer:
    """An anchor program ready to run (``command``), or why it cannot (``skipped``)."""

    impl: str
    command: list[str] = attrs.field(factory=list)
    env: dict[str, str] | None = None
    skipped: str | None = None


def _quiet(cmd: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, -1, "", f"timed out after {timeout:.0f}s")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


def _libnats_headers(*, install: bool) -> str | None:
    """None once libnats' headers are there (installed with apt-get if ``install``), else
    why they are not: the reason a libnats peer is skipped (shared by the benchmarks that
    build one)."""
    if Path("/usr/include/nats/nats.h").exists():
        return None
    if not install:
        return "libnats-dev not installed (--anchors installs it)"
    apt = shutil.which("apt-get")
    if apt is None:
        return "no /usr/include/nats/nats.h and no apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = _quiet([apt, "install", "-y", "libnats-dev"], 600, env=env)
    if done.returncode != 0:
        _quiet([apt, "update"], 600, env=env)
        done = _quiet([apt, "install", "-y", "libnats-dev"], 600, env=env)
    if done.returncode != 0:
        return f"libnats-dev not installable: {_last_line(done.stderr or done.stdout)}"
    return None


def _prepare_libnats(anchors: Path, work: Path) -> _Peer:
    source = anchors / "libnats_fetch.c"
    if not source.is_file():
        return _Peer("libnats", skipped=f"no {source}")
    gcc = shutil.which("gcc")
    if gcc is None:
        return _Peer("libnats", skipped="no gcc")
    missing = _libnats_headers(install=True)
    if missing is not None:
        return _Peer("libnats", skipped=missing)
    binary = work / "libnats_fetch"
    built = _quiet([gcc, "-O2", str(source), "-o", str(binary), "-lnats"], 300)
    if built.returncode != 0:
        return _Peer("libnats", skipped=f"gcc failed: {_last_line(built.stderr)}")
    return _Peer("libnats", [str(binary)])


def _prepare_natsjs(anchors: Path, work: Path) -> _Peer:
    script = anchors / "natsjs_consume.js"
    if not script.is_file():
        return _Peer("nats.js", skipped=f"no {script}")
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        return _Peer("nats.js", skipped="no node" if node is None else "no npm")
    project = work / "node"
    project.mkdir()
    _quiet([npm, "init", "-y"], 120, cwd=project)
    installed = _quiet(
        [npm, "install", "--no-audit", "--no-fund", "--silent", "nats@2"], 600, cwd=project
    )
    modules = project / "node_modules"
    if installed.returncode != 0 or not (modules / "nats").is_dir():
        reason = _last_line(installed.stderr or installed.stdout)
        return _Peer("nats.js", skipped=f"npm install nats@2 failed: {reason}")
    # The script stays where it is; NODE_PATH lets its require("nats") find the package.
    return _Peer("nats.js", [node, str(script)], env={**os.environ, "NODE_PATH": str(modules)})


def _measure_peer(peer: _Peer, url: str, n: int, ack: bool, window: int) -> dict[str, Any]:
    # The anchors read their pull window from $ANCHOR_BATCH (../shared/anchors/README.md).
    env = {**(peer.env or os.environ), "ANCHOR_BATCH": str(window)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = _run_child([*peer.command, url, str(n), _mode(ack)], env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The whole program's CPU (start-up included: a few ms for libnats, ~0.1 s for node).
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    line = _last_json(child)
    if child.returncode != 0 or line is None:
        return {"impl": peer.impl, "ack": ack, "msgs": 0, "expected": n, "error": _failure(child)}
    result: dict[str, Any] = {"bench": "js-consume", "impl": peer.impl, "ack": ack}
    result["msgs"] = got = int(line.get("msgs", 0))
    result["expected"] = n
    if got != n:
        result["error"] = f"received {got} messages, expected {n}"
    else:
        result["msg_per_s"] = line.get("msg_per_s")
    result["what"] = line.get("anchor")
    result["window"] = window
    result["client_cpu_s"] = round(cpu, 3)
    result["peak_rss_mb"] = child.peak_rss_mb
    return result


def _measure_python(
    impl: str, url: str, n: int, ack: bool, idle: float, buffer: int, profile_dir: Path | None
) -> dict[str, Any]:
    cmd = [*_ME, "consume", "--impl", impl, "--mode", _mode(ack), "--url", url]
    cmd += ["--messages", str(n), "--idle", str(idle), "--buffer", str(buffer)]
    if profile_dir is not None:
        cmd += ["--profile", str(profile_dir / f"{impl}-{_mode(ack)}.prof")]
    child = _run_child(cmd)
    result = _last_json(child)
    if child.returncode != 0 or result is None:
        return {"impl": impl, "ack": ack, "msgs": 0, "expected": n, "error": _failure(child)}
    own, sampled = result.get("peak_rss_mb"), child.peak_rss_mb
    result["peak_rss_mb"] = max((v for v in (own, sampled) if v is not None), default=None)
    result["window"] = buffer if impl == "headrace" else NATSPY_BATCH
    return result


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds a process has used so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _with_server_cpu(pid: int | None, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``measure()``, with the CPU seconds nats-server spent meanwhile (``server_cpu_s``) and
    both processes' CPU per 100k messages: where the time goes, process by process."""
    before = _cpu_seconds(pid) if pid is not None else None
    result = measure()
    if before is not None and pid is not None:
        result["server_cpu_s"] = round(_cpu_seconds(pid) - before, 3)
    msgs = result.get("msgs") or 0
    if msgs and "error" not in result:
        for key in ("client_cpu_s", "server_cpu_s"):
            if key in result:
                result[f"{key}_per_100k"] = round(result[key] * 100_000 / msgs, 3)
    return result


def _add_ratios(results: list[dict[str, Any]]) -> None:
    for ours in results:
        if ours.get("impl") != "headrace" or not ours.get("msg_per_s"):
            continue
        for peer in results:
            if peer.get("impl") == "headrace" or peer.get("ack") != ours["ack"]:
                continue
            if peer.get("msg_per_s"):
                ours[f"ratio_vs_{peer['impl']}"] = round(ours["msg_per_s"] / peer["msg_per_s"], 2)


def _print_table(results: list[dict[str, Any]], load: dict[str, Any] | None) -> None:
    if load is not None:
        print(f"stream loaded: {load['stored']:,} messages at {load['load_msg_per_s']:,} msg/s")
    for r in results:
        if "skipped" in r:
            print(f"{r['impl']:>9}: skipped ({r['skipped']})")
            continue
        mode = _mode(r["ack"])
        rss = f"peak RSS {r['peak_rss_mb']} MB" if "peak_rss_mb" in r else ""
        if "error" in r:
            print(f"{r['impl']:>9} {mode:>5}: FAILED: {r['error']}  {rss}")
            continue
        ratios = " ".join(f"{k[6:]}={v}" for k, v in r.items() if k.startswith("ratio_"))
        if r.get("heartbeat_alarms") or r.get("pull_warnings"):
            ratios += (
                f"  [{r['pull_requests']} pulls, {r['heartbeat_alarms']} heartbeat alarms, "
                f"{r['pull_warnings']} pull warnings]"
            )
        window = f"window {r['window']:>5}  " if "window" in r else ""
        if "client_cpu_s_per_100k" in r and "server_cpu_s_per_100k" in r:
            ratios += (
                f"  CPU s/100k: client {r['client_cpu_s_per_100k']:.2f}"
                f" server {r['server_cpu_s_per_100k']:.2f}"
            )
        print(
            f"{r['impl']:>9} {mode:>5}: {r['msg_per_s']:>9,} msg/s  {window}"
            f"{r['msgs']:,}/{r['expected']:,} msgs  {rss}  {ratios}".rstrip()
        )


def run(
    messages: int,
    payload: int,
    *,
    anchors: bool = False,
    as_json: bool = False,
    anchors_dir: Path | None = None,
    idle: float = 5.0,
    buffer: int = HEADRACE_BUFFER,
    profile_dir: Path | None = None,
    anchor_window: int | None = None,
) -> list[dict[str, Any]]:
    """Run the benchmark; print one JSON line per implementation and mode, or a table.

    The anchors pull ``anchor_window`` messages at a time (default: ``buffer``, headrace's
    window, so the comparison is at equal windows); every line says its ``window``. Returns
    every line (failures carry ``error``, unavailable anchors ``skipped``).
    """
    window = buffer if anchor_window is None else anchor_window
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="headrace-bench-") as tmp:
        peers: list[_Peer] = []
        if anchors:
            where = anchors_dir if anchors_dir is not None else default_anchors_dir()
            peers = [_prepare_libnats(where, Path(tmp)), _prepare_natsjs(where, Path(tmp))]
        with LocalServer(jetstream=True) as server:
            url = server.url
            sizes = ["--messages", str(messages), "--payload", str(payload)]
            loader = _run_child([*_ME, "load", "--url", url, *sizes])
            load = _last_json(loader)
            if loader.returncode != 0 or load is None:
                raise BenchmarkError(f"loading the stream failed: {_failure(loader)}")
            pid = server.pid
            for ack in (False, True):  # per mode, so that compared figures are close in time
                results.extend(
                    _with_server_cpu(
                        pid,
                        partial(_measure_python, i, url, messages, ack, idle, buffer, profile_dir),
                    )
                    for i in IMPLS
                )
                results.extend(
                    _with_server_cpu(pid, partial(_measure_peer, p, url, messages, ack, window))
                    for p in peers
                    if p.command
                )
    for r in results:
        r["payload"] = payload
    results.extend({"impl": p.impl, "skipped": p.skipped} for p in peers if not p.command)
    _add_ratios(results)
    if as_json:
        for r in results:
            print(json.dumps(r), flush=True)
    else:
        _print_table(results, load)
    return results


def print_profile(path: Path, top: int = 15) -> None:
    """The ``top`` functions by self time of one child's profile."""
    stats = pstats.Stats(str(path))
    stats.sort_stats(pstats.SortKey.TIME).print_stats(top)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m headrace_bench.consume")
    parser.add_argument("role", nargs="?", choices=["load", "consume"])
    parser.add_argument("--impl", choices=IMPLS, default="headrace")
    parser.add_argument("--mode", choices=["ack", "noack"], default="noack")
    parser.add_argument("--url")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--payload", type=int, default=128)
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument(
        "--buffer", type=int, default=HEADRACE_BUFFER, help="headrace consume max_messages"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--anchors", action="store_true")
    parser.add_argument("--anchors-dir", type=Path)
    parser.add_argument(
        "--anchor-window", type=int, help="the anchors' pull window (default: --buffer)"
    )
    parser.add_argument(
        "--profile",
        help="consume role: cProfile stats file; whole run: a folder for one file per child",
    )
    args = parser.parse_args(argv)
    if args.role:
        _child(args)
        return
    profile_dir = Path(args.profile) if args.profile else None
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    run(
        args.messages,
        args.payload,
        anchors=args.anchors,
        as_json=args.json,
        anchors_dir=args.anchors_dir,
        idle=args.idle,
        buffer=args.buffer,
        profile_dir=profile_dir,
        anchor_window=args.anchor_window,
    )
    if profile_dir is not None:
        for path in sorted(profile_dir.glob("*.prof")):
            print(f"\n== {path.name}")
            print_profile(path)


if __name__ == "__main__":
    main()
