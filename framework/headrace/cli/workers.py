"""``headrace run TARGET --workers N``: N worker processes of one pipeline, one supervisor.

A pipeline runs on one trio thread, so one process uses one core. To use more, several copies of
the pipeline consume the same durable pull consumer (the server spreads its messages over their
pull requests). This module is the supervisor that runs them on one host as one command: each
worker is an ordinary ``headrace run`` process (``python -m headrace run TARGET ... --json-logs``),
and the supervisor only starts, watches, restarts and stops them, and shows their sum.

Output. Each worker reports JSON lines on its standard error; the supervisor reads them and shows
one view through the usual reporters (:mod:`headrace.cli.progress`): the stats are the workers'
sums, and each worker's state is listed. Its events are re-emitted with a ``worker`` field
(``started`` becomes ``worker_started``; its ``progress`` and ``stopped`` are folded into the
sums, not repeated). A worker's standard output is relayed to the supervisor's, byte for byte but
in whole lines: workers writing straight to a shared stdout could tear a long record in two
(pipe writes are atomic up to 4 KiB only). When the supervisor's stdout is gone, the workers'
pipes are closed too, so that a sink writing there fails as it would in one process.

Sums. A counter of the pipeline (messages, records, acks, ...) is the sum over the workers'
latest reports plus the totals of their finished processes: a restarted worker starts again at
0, and the totals must not go down (Prometheus counters). Levels are not carried over from a
dead process (:data:`LEVELS`): ``ack_pending`` is summed over the live workers (each holds its
own messages); ``lag`` and ``commit_seconds_last`` are the freshest figures, of the workers that
took a message (committed a batch) last (:func:`combine_stats`). Every worker reads the same
consumer's ``num_pending``: a sum would count it N times, and a maximum would keep an idle
worker's stale figure after the backlog is gone. What a worker did after its last report before
it was killed is lost to the sums; reports come at least once a second.

Partitioned pipelines (docs/state.md). Each worker reports the figures of the partitions it
holds, added up as one run's (``PartitionRuns``), and which they are; the sums are made the same
way but for ``lag``, which is summed over the live workers: each partition has its consumer, so
the workers' lags are of different consumers and add up. The stateful operators' figures are
per partition's copy (``per-minute-p3``), each from the worker with its newest snapshot, its
owner, as for any stateful operator; the partitions held are the union of the workers'.

Signals. Workers run in their own process group, so a Ctrl-C on the terminal reaches the
supervisor only; the first SIGINT/SIGTERM to it forwards one SIGTERM to each worker (each drains:
commits and acks what it holds) and waits for them all. A signal within a second of the one
before is the same request (headrace.shutdown's rule, as for one process). A later second
signal forwards another SIGTERM (a worker's second signal stops it at once) and, if some are
still running after
:data:`KILL_GRACE`, kills them; a third kills them at once. (A service manager that signals every
process of the service, as systemd's default ``KillMode=control-group`` does, gives each worker
two signals: use ``KillMode=mixed``.)

Restarts. A worker that exits while the supervisor is not stopping (an error, a signal, even
exit 0) is started again after a backoff (:class:`Backoff`), except one that exits with code 2,
a usage or configuration error: restarting would fail the same way, so the supervisor drains the
others and exits 2 with that worker's message.

Parent death. A worker must not outlive its supervisor, however the supervisor ends (SIGKILL,
the OOM killer). Each worker inherits the read end of a pipe whose only write end the supervisor
holds (never written to); the worker watches it in a thread, and the end of file, which the
kernel delivers once the supervisor's process is gone whatever killed it, makes the worker kill
itself (:func:`watch_supervisor`). It is not ``prctl(PR_SET_PDEATHSIG)``: that signal follows
the *thread* that forked the child, and trio forks from a worker thread of its cache, which exits
after 10 idle seconds: the workers would be killed while the supervisor runs on. The pipe also
has no start-up race (a supervisor dead before the watch starts is seen at once) and works on
every POSIX system. The worker stops hard, not with a drain: nobody reads its output any more,
and what it held is redelivered by the server after the ack wait, as when one ``headrace run``
process is killed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
import trio

from headrace.cli.exits import (
    EXIT_DRAIN_INCOMPLETE,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_POISON_TERMINATED,
    EXIT_USAGE,
    HARD_STOP_GRACE,
)
from headrace.cli.exits import exit_now as _exit_now
from headrace.cli.exits import fail as _fail
from headrace.cli.metrics import Snapshot, start_serving
from headrace.cli.options import PASSWORD_ENV, TOKEN_ENV
from headrace.cli.progress import PartitionsHeld, Reporter, Sample, WorkerStatus
from headrace.pipeline.graph import Pipeline
from headrace.pipeline.stats import (
    FAILURES,
    STATEFUL,
    PipelineStats,
    add_counts,
    is_number,
    merge_states,
)
from headrace.shutdown import (
    SAME_REQUEST_WINDOW,
    STOP_SIGNALS,
    SignalCatcher,
    Step,
    StopLadder,
)

#: The environment of a worker: its index (0..N-1) and N, for pipeline code that splits work.
WORKER_INDEX_ENV = "HEADRACE_WORKER_INDEX"
WORKERS_ENV = "HEADRACE_WORKERS"
#: The descriptor of the supervisor pipe's read end, in a worker (see the module docs).
SUPERVISOR_FD_ENV = "HEADRACE_SUPERVISOR_FD"

#: A worker reports at least this often, so that the sums and metrics are at most this old.
WORKER_INTERVAL_MAX = 1.0
#: After a hard stop, how long the workers get before they are killed: a worker's own hard stop
#: may take HARD_STOP_GRACE before it exits regardless.
KILL_GRACE = HARD_STOP_GRACE + 1.0
#: After a worker exited, how long its pipes may stay open (held by a process it started).
OUTPUT_GRACE = 2.0
#: A line longer than this is relayed in pieces rather than held.
MAX_PENDING = 1 << 20

#: Options of ``headrace run`` the supervisor keeps for itself; every other one is passed on.
#: ``until_caught_up`` (and its ``timeout``) is refused with ``--workers`` before any worker
#: starts (a worker that exits is restarted), so it is never passed on either.
SUPERVISOR_ONLY = frozenset(
    {"workers", "json_logs", "progress", "interval", "metrics_port", "until_caught_up", "timeout"}
)
#: Options passed on to each worker as given: (argparse dest, option).
_VALUES = (
    ("creds", "--creds"),
    ("nkey", "--nkey"),
    ("user", "--user"),
    ("tls_ca", "--tls-ca"),
    ("tls_cert", "--tls-cert"),
    ("tls_key", "--tls-key"),
    ("connect_timeout", "--connect-timeout"),
    ("drain_timeout", "--drain-timeout"),
    ("deliver", "--deliver"),
)
_LISTS = (
    ("sink", "--sink"),
    ("sink_option", "--sink-option"),
    ("durable", "--durable"),
)
_FLAGS = (("tls_first", "--tls-first"),)

#: Stats fields that are levels, not counts: not carried over from a finished worker process.
#: ``ack_pending`` and ``connected`` are summed over the live workers (each holds its own
#: messages and its own connection); the others come from the freshest figures: those of the
#: workers whose counter named here went up last (module docs).
LEVELS = frozenset({"ack_pending", "connected", "lag", "commit_seconds_last", "commit_last_sink"})
SUMMED_LEVELS = ("ack_pending", "connected")
FRESHEST: dict[str, str] = {
    "lag": "messages_in",
    "commit_seconds_last": "batches_committed",
    "commit_last_sink": "batches_committed",
}


# -- the worker's side ------------------------------------------------------------------------


def watch_supervisor() -> None:
    """In a worker: kill this process when its supervisor's process is gone.

    Does nothing in a process that no supervisor started. Called first thing by ``headrace
    run``; the environment variable is removed so that processes the pipeline starts do not take
    it for theirs."""
    raw = os.environ.pop(SUPERVISOR_FD_ENV, None)
    if raw is None:
        return
    try:
        fd = int(raw)
        os.set_inheritable(fd, False)
    except (ValueError, OSError):
        return  # not a descriptor this process has: nothing to watch
    thread = threading.Thread(
        target=_die_with_supervisor, args=(fd,), name="headrace-supervisor-watch", daemon=True
    )
    thread.start()


def _die_with_supervisor(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return  # someone closed it under us: stop watching rather than guess
        if not data:
            break  # end of file: the supervisor process is gone
    os.kill(os.getpid(), signal.SIGKILL)


# -- a worker's command line and environment --------------------------------------------------


def worker_secrets(args: argparse.Namespace) -> dict[str, str]:
    """What a worker is told through its environment rather than its command line, which
    ``ps`` shows to every user of the host: the servers' URLs (they may hold a user and
    password), the password and the token (``connect_kwargs`` reads them back)."""
    env: dict[str, str] = {}
    if args.servers:
        env["NATS_URL"] = ",".join(args.servers)
    if args.password is not None:
        env[PASSWORD_ENV] = args.password
    if args.token is not None:
        env[TOKEN_ENV] = args.token
    return env


def worker_argv(args: argparse.Namespace, interval: float) -> list[str]:
    """``python -m headrace run TARGET`` with the connection and override options of ``args``
    but the secrets (:func:`worker_secrets`), and JSON progress every ``interval`` seconds on
    standard error.

    Values go as ``--option=value``: a password that starts with ``-`` stays a value. ``-P``
    keeps the working directory off ``sys.path``, as for the ``headrace`` script (a module
    TARGET is still looked up there, by the loader)."""
    argv = [sys.executable, "-P", "-m", "headrace", "run", args.target]
    for dest, option in _LISTS:
        argv.extend(f"{option}={value}" for value in getattr(args, dest) or ())
    for dest, option in _VALUES:
        value = getattr(args, dest)
        if value is not None:
            argv.append(f"{option}={value}")
    argv.extend(option for dest, option in _FLAGS if getattr(args, dest))
    argv.extend(["--json-logs", f"--interval={interval}"])
    return argv


@contextlib.contextmanager
def loading_environment(count: int | None) -> Iterator[None]:
    """While the supervisor loads TARGET to check it: worker 0's environment, so that a pipeline
    that reads ``HEADRACE_WORKER_INDEX`` loads in the supervisor as it will in its workers.
    ``count`` ``None`` (no ``--workers``): nothing changes."""
    if count is None:
        yield
        return
    saved = {name: os.environ.get(name) for name in (WORKER_INDEX_ENV, WORKERS_ENV)}
    os.environ[WORKER_INDEX_ENV] = "0"
    os.environ[WORKERS_ENV] = str(count)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# -- restarts and sums ------------------------------------------------------------------------


@attrs.define
class Backoff:
    """Delays before restarting a worker: ``initial``, doubling up to ``maximum``; back to
    ``initial`` once a process has run ``reset_after`` seconds (it was healthy)."""

    initial: float = 0.5
    maximum: float = 30.0
    reset_after: float = 60.0
    _next: float | None = None

    def delay(self, ran: float) -> float:
        """The delay before the next start, after a process that ran ``ran`` seconds."""
        if self._next is None or ran >= self.reset_after:
            self._next = self.initial
        delay = self._next
        self._next = min(delay * 2, self.maximum)
        return delay


def combine_stats(
    workers: Iterable[Worker],
    window: float = WORKER_INTERVAL_MAX,
    *,
    final: bool = False,
    partitioned: bool = False,
) -> dict[str, Any]:
    """One stats snapshot for the pipeline, from each worker's carried counts and its current
    process's last report.

    Levels come from the running processes; ``final`` (all have ended), from each worker's last
    report, as one process's final stats show its last lag and unsettled messages. ``lag``:
    reports are ``window`` seconds apart, so the figures that went up within ``window`` of the
    freshest cannot be ordered; of those, the smallest (a backlog being worked off shrinks: the
    smallest is the latest); ``partitioned`` (each worker reads the consumers of its own
    partitions), their sum. ``commit_seconds_last``: the freshest."""
    workers = list(workers)
    total: dict[str, Any] = PipelineStats().snapshot()  # every field, even before a report
    total[FAILURES] = {}
    for counts in [*(w.carried for w in workers), *(w.stats or {} for w in workers)]:
        add_counts(total, counts, LEVELS)
    reports = [(w.stats, w.fresh) for w in workers if w.stats is not None]
    if final:
        reports = [(w.last, w.last_fresh) for w in workers if w.last is not None]
    summed = (*SUMMED_LEVELS, "lag") if partitioned else SUMMED_LEVELS
    for level in summed:
        total[level] = sum(stats[level] for stats, _ in reports if is_number(stats.get(level)))
    state = _merge_state(stats for stats, _ in reports)
    if state:
        total[STATEFUL] = state
    for key in FRESHEST:
        if key in summed:
            continue
        fresh = [(at[key], stats[key]) for stats, at in reports if key in at]
        if not fresh:
            continue
        newest, value = max(fresh)
        if key == "lag":
            value = min(v for at, v in fresh if at >= newest - window)
        total[key] = value
    return total


def _merge_state(reports: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The stateful operators' figures over the workers: per operator, those of the worker
    with its newest snapshot (the one that owns its state: another is fenced off at its next
    snapshot). Not carried over when a process ends: the next owner's counts start afresh."""
    merged: dict[str, dict[str, Any]] = {}
    for stats in reports:
        found = stats.get(STATEFUL)
        if not isinstance(found, dict):
            continue
        for name, figures in found.items():
            mine = merged.get(name)
            if mine is None or figures.get("epoch", 0) > mine.get("epoch", 0):
                merged[name] = figures
    return merged


@attrs.define
class Worker:
    """One worker slot: its current process and everything kept across its processes."""

    index: int
    backoff: Backoff = attrs.field(factory=Backoff)
    proc: trio.Process | None = None
    pid: int | None = None
    state: str = "starting"
    restarts: int = 0
    spawned_at: float = 0.0
    #: SIGTERMs sent to the current process (the supervisor's stop level it has been told).
    terms_sent: int = 0
    #: The current process's last stats report, and its actors' states.
    stats: dict[str, Any] | None = None
    states: dict[str, str] = attrs.field(factory=dict)
    #: The partitions the current process holds, for a partitioned pipeline (else None).
    partitions: tuple[int, ...] | None = None
    #: Level (FRESHEST) -> when (trio clock) the current process's figure for it was last new.
    fresh: dict[str, float] = attrs.field(factory=dict)
    #: Counts of the processes that ended, summed.
    carried: dict[str, Any] = attrs.field(factory=dict)
    #: The last report of the last process that ended, and its ``fresh``.
    last: dict[str, Any] | None = None
    last_fresh: dict[str, float] = attrs.field(factory=dict)
    #: Why the current process ended: its ``exit_reason`` event (or ``headrace run: ...``).
    message: str | None = None
    #: The exit status of the process that ended while the supervisor was stopping.
    stop_exit: int | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def begin(self, proc: trio.Process, now: float) -> None:
        self.proc, self.pid, self.spawned_at = proc, proc.pid, now
        self.state = "starting"
        self.terms_sent = 0
        self.stats, self.states, self.fresh, self.message = None, {}, {}, None

    def holds(self, partitions: Any) -> None:
        """A progress report's ``partitions`` (``{"count", "held"}``), if it has any."""
        held = partitions.get("held") if isinstance(partitions, dict) else None
        if isinstance(held, list):
            self.partitions = tuple(p for p in held if isinstance(p, int))

    def report(self, stats: dict[str, Any], now: float) -> None:
        """A stats report of the current process, read at ``now``."""
        before = self.stats or {}
        for level, counter in FRESHEST.items():
            if level in stats and stats.get(counter, 0) != before.get(counter, 0):
                self.fresh[level] = now
        self.stats = stats

    def end(self) -> None:
        """The process is gone: carry its counts over; its levels go with it. Its actors' last
        states are kept for the final report (:meth:`Supervisor.states`)."""
        add_counts(self.carried, self.stats or {}, LEVELS)
        self.last, self.last_fresh = self.stats, self.fresh
        self.proc, self.stats, self.fresh = None, None, {}
        self.state = "exited"
        if self.partitions is not None:
            self.partitions = ()  # its leases go with it (released, or left to expire)

    def status(self) -> WorkerStatus:
        messages = self.carried.get("messages_in", 0) + (self.stats or {}).get("messages_in", 0)
        return WorkerStatus(
            index=self.index,
            pid=None if self.state == "restarting" else self.pid,
            state=self.state,
            restarts=self.restarts,
            messages_in=messages,
            partitions=self.partitions,
        )


def _exit_text(code: int) -> str:
    [(key, value)] = _describe_exit(code).items()
    return f"exited with code {value}" if key == "exit_code" else f"killed by {value}"


def _describe_exit(code: int) -> dict[str, Any]:
    if code >= 0:
        return {"exit_code": code}
    try:
        return {"signal": signal.Signals(-code).name}
    except ValueError:
        return {"signal": -code}


# -- the supervisor ---------------------------------------------------------------------------


class _Stdout:
    """The supervisor's standard output, which the workers' relays share.

    Written with ``os.write`` in a thread: a slow reader blocks the relays (and so the workers'
    writes: back pressure), never the event loop; and no Python-level buffer lock is held by a
    thread that may still be blocked when the process exits."""

    def __init__(self, fd: int = 1) -> None:
        self.fd = fd
        self.broken = False
        self._lock = trio.Lock()

    async def write(self, data: bytes) -> None:
        async with self._lock:  # one worker's lines at a time
            if self.broken:
                return
            try:
                await trio.to_thread.run_sync(self._write_all, data, abandon_on_cancel=True)
            except OSError:
                self.broken = True  # nobody reads it any more
            except trio.Cancelled:
                self.broken = True  # left mid-write: whatever follows would be out of order
                raise

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.fd, view)
            except BlockingIOError:
                # Someone made the descriptor non-blocking (a shared pipe): wait until it drains.
                select.select([], [self.fd], [])
                continue
            view = view[written:]


async def _read_lines(stream: trio.abc.ReceiveStream, on_line: Callable[[bytes], None]) -> None:
    pending = b""
    while chunk := await stream.receive_some(65536):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            on_line(line)
    if pending:
        on_line(pending)


class Supervisor:
    """One ``headrace run --workers N``: the workers, signals, progress and metrics."""

    def __init__(
        self,
        *,
        pipeline: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        count: int,
        reporter: Reporter,
        interval: float,
        worker_interval: float = WORKER_INTERVAL_MAX,
        metrics_port: int | None = None,
        details: dict[str, Any] | None = None,
        partitions: int | None = None,
    ) -> None:
        self.pipeline = pipeline
        #: For a pipeline over partitioned keys: how many partitions (else None).
        self.partitions = partitions
        self.argv = argv
        self.env = env or {}
        self.reporter = reporter
        self.interval = interval
        self.worker_interval = worker_interval
        self.metrics_port = metrics_port
        self.details = details or {}
        self.workers = [Worker(index) for index in range(count)]
        #: 0 running, 1 draining (one SIGTERM forwarded), 2 stopping hard (two forwarded).
        self.stop_level = 0
        self.hard_exit: int | None = None
        #: SIGINT and SIGTERM, installed by supervise(); the ladder says what each one asks
        #: for (a signal within a second of the one before is the same request: GNU timeout
        #: and service managers signal the process and then its group).
        self.signals = SignalCatcher(STOP_SIGNALS)
        self.ladder = StopLadder(SAME_REQUEST_WINDOW)
        #: (worker index, message) of the first worker that exited with code 2.
        self.config_error: tuple[int, str] | None = None
        self.started_at = time.time()
        self._stopping = trio.Event()
        self._stdout = _Stdout()
        self._watch_fd = -1
        self._clock0 = 0.0
        self._last_sample: tuple[float, int, int] | None = None

    # -- reporting --------------------------------------------------------------------------

    def event(self, event: str, **fields: Any) -> None:
        self.reporter.event(event, self.pipeline, **fields)

    def states(self) -> dict[str, str]:
        """The actors' states over the live workers; once none is left, over the last report of
        each (the final view shows the actors stopped, as one process's does)."""
        live = [w for w in self.workers if w.alive]
        return merge_states(w.states for w in live or self.workers)

    def stats(self, *, final: bool = False) -> dict[str, Any]:
        # Two intervals: a report is read a little after it was written.
        return combine_stats(
            self.workers,
            2 * self.worker_interval,
            final=final,
            partitioned=self.partitions is not None,
        )

    def held(self) -> PartitionsHeld | None:
        """The partitions the workers hold, together (a partitioned pipeline only)."""
        if self.partitions is None:
            return None
        held = {p for w in self.workers if w.alive for p in w.partitions or ()}
        return PartitionsHeld(count=self.partitions, held=tuple(sorted(held)))

    def sample(self, *, final: bool = False) -> Sample:
        now = trio.current_time()
        stats = self.stats(final=final)
        rate = out_rate = 0.0
        if self._last_sample is not None:
            at, msgs, recs = self._last_sample
            if now > at:
                rate = (stats["messages_in"] - msgs) / (now - at)
                out_rate = (stats["records_out"] - recs) / (now - at)
        self._last_sample = (now, stats["messages_in"], stats["records_out"])
        return Sample(
            pipeline=self.pipeline,
            uptime=now - self._clock0,
            stats=stats,
            states=self.states(),
            rate=rate,
            out_rate=out_rate,
            draining=self.stop_level > 0,
            workers=tuple(w.status() for w in self.workers),
            partitions=self.held(),
        )

    def metrics_snapshot(self) -> Snapshot:
        counts: dict[str, Counter[str]] = {}
        for w in self.workers:
            if not w.alive:
                continue
            for actor, state in w.states.items():
                counts.setdefault(actor, Counter())[state] += 1
        return Snapshot(
            pipeline=self.pipeline,
            stats=self.stats(),
            states=self.states(),
            draining=self.stop_level > 0,
            started_at=self.started_at,
            state_counts={actor: dict(c) for actor, c in counts.items()},
            workers=sum(1 for w in self.workers if w.alive),
            worker_restarts=sum(w.restarts for w in self.workers),
            partitions=self.held(),
        )

    async def _progress(self) -> None:
        while True:
            await trio.sleep(self.interval)
            self.reporter.progress(self.sample())

    # -- a worker's output ------------------------------------------------------------------

    def _on_line(self, worker: Worker, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        obj: Any = None
        if text.startswith("{"):
            try:
                obj = json.loads(text)
            except ValueError:
                obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("event"), str):
            if text.startswith("headrace run: "):
                worker.message = text.removeprefix("headrace run: ")
            if text:
                self.event("worker_stderr", worker=worker.index, line=text)
            return
        event = obj.pop("event")
        fields = {k: v for k, v in obj.items() if k not in ("ts", "pipeline", "worker")}
        if event == "progress":
            if isinstance(fields.get("stats"), dict):
                worker.report(fields["stats"], trio.current_time())
            worker.holds(fields.get("partitions"))
            if isinstance(fields.get("states"), dict):
                worker.states = fields["states"]
        elif event == "stopped":
            if isinstance(fields.get("stats"), dict):
                worker.report(fields["stats"], trio.current_time())  # its final counts
        elif event == "exit_reason":
            if isinstance(fields.get("message"), str):
                worker.message = fields["message"]
            self.event(event, worker=worker.index, **fields)
        elif event == "started":
            if worker.state == "starting":
                worker.state = "running"
            self.event("worker_started", worker=worker.index, **fields)
        else:
            if event == "draining":
                worker.state = "draining"
            self.event(event, worker=worker.index, **fields)

    async def _relay(self, stream: trio.abc.ReceiveStream) -> None:
        """A worker's stdout to ours, in whole lines (module docs)."""
        pending = b""
        async with stream:
            while not self._stdout.broken:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    if pending:
                        await self._stdout.write(pending)
                    return
                pending += chunk
                cut = pending.rfind(b"\n") + 1 or (
                    len(pending) if len(pending) > MAX_PENDING else 0
                )
                if cut:
                    await self._stdout.write(pending[:cut])
                    pending = pending[cut:]
        # Ours is gone: closing the pipe makes the worker's next write fail, as it would alone.

    # -- signals and stopping ---------------------------------------------------------------

    def _forward(self, worker: Worker) -> None:
        """Bring a worker's process to the stop level: one SIGTERM drains, two stop hard."""
        proc = worker.proc
        if proc is None or proc.returncode is not None:
            return
        while worker.terms_sent < self.stop_level:
            worker.terms_sent += 1
            proc.send_signal(signal.SIGTERM)
        if self.stop_level and worker.state in ("starting", "running"):
            worker.state = "draining"

    def _stop(self, level: int) -> None:
        self.stop_level = max(self.stop_level, level)
        self._stopping.set()
        for worker in self.workers:
            self._forward(worker)

    def _kill_all(self) -> None:
        for worker in self.workers:
            if worker.proc is not None and worker.proc.returncode is None:
                worker.proc.kill()

    async def _kill_after(self, seconds: float) -> None:
        await trio.sleep(seconds)
        self._kill_all()

    async def _signals(self, nursery: trio.Nursery) -> None:
        while True:
            taken = self.ladder.feed(await self.signals.receive())
            name = taken.signal.name
            if taken.step is Step.DRAIN:
                self.event("draining", signal=name)
                self._stop(1)
            elif taken.step is Step.REPEAT:
                assert taken.since is not None
                self.event("signal_repeated", signal=name, after=round(taken.since, 3))
            elif taken.step is Step.HARD:
                self.hard_exit = 128 + taken.signal
                self.event("stopping", signal=name, hard=True)
                self._stop(2)
                nursery.start_soon(self._kill_after, KILL_GRACE)
            else:
                self._kill_all()

    # -- running the workers ----------------------------------------------------------------

    def _environment(self, index: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        env[WORKER_INDEX_ENV] = str(index)
        env[WORKERS_ENV] = str(len(self.workers))
        env[SUPERVISOR_FD_ENV] = str(self._watch_fd)
        return env

    async def _run_once(self, worker: Worker, relays: trio.Nursery) -> tuple[int, float]:
        """Start the worker's process and wait for its end: (exit status, seconds it ran)."""
        try:
            proc = await trio.lowlevel.open_process(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._environment(worker.index),
                pass_fds=(self._watch_fd,),
                # Its own process group: a Ctrl-C on the terminal signals the supervisor only.
                process_group=0,
            )
        except OSError as exc:
            self.event("error", worker=worker.index, error=f"cannot start: {exc}", fatal=False)
            return EXIT_FAILED, 0.0
        worker.begin(proc, trio.current_time())
        self._forward(worker)  # a stop that came while it was being started
        assert proc.stdout is not None and proc.stderr is not None
        relays.start_soon(self._relay, proc.stdout)
        try:
            async with trio.open_nursery() as output:
                output.start_soon(
                    _read_lines, proc.stderr, lambda line: self._on_line(worker, line)
                )
                code = await proc.wait()
                # Its last lines (the final stats) are read before its counts are carried over.
                output.cancel_scope.deadline = trio.current_time() + OUTPUT_GRACE
        finally:
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.kill()  # the supervisor itself is failing: no worker is left behind
                await proc.wait()
                await proc.stderr.aclose()
        ran = trio.current_time() - worker.spawned_at
        worker.end()
        self.event(
            "worker_exited",
            worker=worker.index,
            pid=proc.pid,
            **_describe_exit(code),
            ran=round(ran, 3),
        )
        return code, ran

    async def _keep_running(self, worker: Worker, relays: trio.Nursery) -> None:
        """Run the worker, again and again, until the supervisor stops."""
        while self.stop_level == 0:
            code, ran = await self._run_once(worker, relays)
            if code == EXIT_USAGE and self.config_error is None:
                message = worker.message or f"exited with code {code}"
                self.config_error = (worker.index, message)
                if self.stop_level == 0:
                    self.event("draining", reason=f"worker {worker.index}: configuration error")
                    self._stop(1)
            if self.stop_level:
                worker.stop_exit = code
                break
            delay = worker.backoff.delay(ran)
            worker.state = "restarting"
            self.event("worker_restarting", worker=worker.index, delay=delay)
            with trio.move_on_after(delay):
                await self._stopping.wait()
            if self.stop_level:
                worker.state = "exited"
                break
            worker.restarts += 1

    def _outcome(self) -> tuple[int, str | None]:
        """The exit code, and the message that explains one that is not 0."""
        if self.config_error is not None:
            index, message = self.config_error
            return EXIT_USAGE, f"worker {index}: {message}"
        if self.hard_exit is not None:
            return self.hard_exit, None
        failed: list[Worker] = []
        poisoned: list[Worker] = []
        incomplete: list[Worker] = []
        for w in self.workers:
            code = w.stop_exit
            # Terminated by our SIGTERM before it set up its handlers: it had taken nothing.
            if code is None or code in (EXIT_OK, -signal.SIGTERM):
                continue
            if code == EXIT_DRAIN_INCOMPLETE:
                incomplete.append(w)
            elif code == EXIT_POISON_TERMINATED:
                poisoned.append(w)
            else:
                failed.append(w)
        for group, code in (
            (failed, EXIT_FAILED),
            (poisoned, EXIT_POISON_TERMINATED),
            (incomplete, EXIT_DRAIN_INCOMPLETE),
        ):
            if group:
                w = group[0]
                assert w.stop_exit is not None
                return code, f"worker {w.index}: {w.message or _exit_text(w.stop_exit)}"
        return EXIT_OK, None

    async def main(self) -> int:
        self._clock0 = trio.current_time()
        read_fd, write_fd = os.pipe()  # see the module docs: the workers watch read_fd
        self._watch_fd = read_fd
        try:
            async with trio.open_nursery() as aux:
                aux.start_soon(self._signals, aux)
                if self.metrics_port is not None:
                    problem = await start_serving(
                        aux, self.metrics_port, self.metrics_snapshot, self.event
                    )
                    if problem is not None:
                        aux.cancel_scope.cancel()
                        return _fail(problem)
                self.event("started", pid=os.getpid(), workers=len(self.workers), **self.details)
                self._last_sample = (trio.current_time(), 0, 0)
                aux.start_soon(self._progress)
                async with trio.open_nursery() as relays:
                    async with trio.open_nursery() as running:
                        for worker in self.workers:
                            running.start_soon(self._keep_running, worker, relays)
                    relays.cancel_scope.deadline = trio.current_time() + OUTPUT_GRACE
                code, message = self._outcome()
                if message is not None:
                    _fail(message, code)
                self.reporter.progress(self.sample(final=True))
                self.event(
                    "stopped",
                    exit_code=code,
                    stats=self.stats(final=True),
                    restarts=sum(w.restarts for w in self.workers),
                )
                self.signals.settle(self.ladder.after_stopped(lambda: _exit_now(code)))
                aux.cancel_scope.cancel()
            return code
        finally:
            os.close(read_fd)
            os.close(write_fd)


def sharing_problem(pipe: Pipeline, count: int) -> str | None:
    """Why ``count`` workers of ``pipe`` would not share its messages, or ``None``.

    Each worker binds its own copy of every source: only a durable pull consumer is shared (the
    server spreads its messages over the workers' pull requests). An ephemeral consumer per
    worker would deliver every message to every worker; a push consumer takes one subscriber.
    One worker (``--workers 1``) shares with nobody."""
    if count < 2:
        return None
    for node in pipe.sources:
        source = node.source
        if source is None:
            continue
        if not source.durable:
            return (
                f"--workers {count}: source {node.name!r} has no durable consumer, so each "
                "worker would get its own and every message; name one with --durable or "
                "JetStreamSource(durable=...)"
            )
        if not source.pull:
            return (
                f"--workers {count}: source {node.name!r} is a push consumer, which takes one "
                "subscriber; workers share a pull consumer (JetStreamSource(pull=True))"
            )
    return None


def supervise(
    args: argparse.Namespace, pipe: Pipeline, reporter: Reporter, *, interval: float
) -> int:
    """Run ``args.workers`` workers of the pipeline ``pipe`` (loaded and validated from
    ``args.target``) until a signal; the exit code."""
    problem = sharing_problem(pipe, args.workers)
    if problem is not None:
        return _fail(problem)
    worker_interval = min(interval, WORKER_INTERVAL_MAX)
    details: dict[str, Any] = {
        "sources": [n.source.describe() for n in pipe.sources if n.source],
        "sinks": [n.name for n in pipe.sinks],
    }
    partitions = pipe.partitioning.count if pipe.partitioning is not None else None
    if partitions is not None:
        details["partitions"] = partitions
    supervisor = Supervisor(
        pipeline=pipe.name,
        argv=worker_argv(args, worker_interval),
        env=worker_secrets(args),
        count=args.workers,
        reporter=reporter,
        interval=interval,
        worker_interval=worker_interval,
        metrics_port=args.metrics_port,
        details=details,
        partitions=partitions,
    )
    # Caught until the process exits, never uninstalled: after the last `stopped` event a
    # signal cannot change the exit status (see StopLadder.after_stopped).
    supervisor.signals.install()
    return trio.run(supervisor.main)
