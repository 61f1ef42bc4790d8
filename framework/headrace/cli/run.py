"""``headrace run TARGET``: run a pipeline until a signal, with progress and metrics.

The first SIGINT or SIGTERM drains the pipeline (sources stop pulling; what was taken is
committed and acked, within the drain timeout). Another signal within a second is the same
request (GNU ``timeout`` and service managers often signal twice); one after that stops it at
once. The signal handling is :mod:`headrace.shutdown`'s, shared with ``run_until_signal``; its
handlers stay until the process exits, so that the exit status is always the ``exit_code`` of
the last ``stopped`` event. Exit codes:

- 0: stopped as asked (drained after a signal), or the pipeline finished on its own;
- 1: the pipeline failed at run time (an actor failed for good; the connection was lost for good);
- 2: a usage or configuration error: bad options, a TARGET that does not load or is not a
  pipeline, an invalid pipeline (PipelineError), an unknown sink plugin, no server to connect
  to, credentials or TLS refused, a stream or consumer the pipeline cannot use, an output it
  must not write (another pipeline's, or one holding the commits of a stream since recreated:
  see ``headrace outputs``);
- 3: the drain timed out: messages taken were not all committed and acked (the server redelivers
  them after their ack wait);
- 4: poison messages were terminated without a dead-letter copy (the pipeline has no
  ``dead_letter`` and does not ``allow_termination``): the run ended, but those messages are
  only in the stream now (each was reported as an error event);
- 128 + the signal number (130 for SIGINT, 143 for SIGTERM): stopped at once by a second signal;
  what was not committed is redelivered.

With ``--workers N`` this process supervises N worker processes of the pipeline instead of
running it (:mod:`headrace.cli.workers`), with the same signals and exit codes.

With ``--until-caught-up`` the run drains by itself once it has caught up with what its
sources' streams held when it started (``PipelineRun.wait_caught_up``: every such message
acked, terminated or dead-lettered; one waiting for its redelivery is not), for backfills and
cron jobs; the exit codes are the same (0 only when it caught up and drained cleanly).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time
import warnings
from collections.abc import Iterator
from typing import Any

import trio

from headrace.cli import jsonlogs
from headrace.cli.connection import ConnectionEvents
from headrace.cli.exits import (
    EXIT_DRAIN_INCOMPLETE,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_POISON_TERMINATED,
    EXIT_TIMED_OUT,
    HARD_STOP_GRACE,
)
from headrace.cli.exits import exit_now as _exit_now
from headrace.cli.exits import fail as _fail
from headrace.cli.failures import FailureEvents
from headrace.cli.metrics import Snapshot, start_serving
from headrace.cli.options import add_connection_arguments, connect_kwargs
from headrace.cli.overrides import DELIVER_CHOICES, OverrideError, Overrides
from headrace.cli.progress import LiveView, PartitionsHeld, Reporter, Sample, make_reporter
from headrace.cli.target import TargetError, load_target
from headrace.commits.errors import OutputConflict
from headrace.errors import NatsError
from headrace.jetstream.errors import (
    AckRefused,
    ConsumerNotFound,
    JetStreamNotEnabled,
    StreamNotFound,
    SubscribeError,
)
from headrace.nats.connection import connect
from headrace.nats.servers import redact_url
from headrace.pipeline.caught_up import NotCaughtUp
from headrace.pipeline.errors import PipelineError
from headrace.pipeline.gc_tuning import restore_gc, tune_gc
from headrace.pipeline.graph import Pipeline
from headrace.pipeline.partitioning import Partitioning
from headrace.pipeline.partitions import PartitionRuns, run_partitioned
from headrace.pipeline.runtime import PipelineRun, StageError
from headrace.pipeline.stats import STATEFUL, Failure, PipelineStats, state_figures
from headrace.shutdown import (
    SAME_REQUEST_WINDOW,
    STOP_SIGNALS,
    SignalCatcher,
    Step,
    StopLadder,
)
from headrace.sinks.errors import SinkLoadError, UnknownSink

#: Errors at run time that come from configuration, not from a failure: exit code 2. An
#: output the pipeline must not write (another pipeline's, a recreated stream's) is one: the
#: user decides (docs/scaling.md), and restarting a worker would not change the answer.
CONFIG_ERRORS: tuple[type[BaseException], ...] = (
    PipelineError,
    AckRefused,  # the user's permissions: a restart would be refused the same way
    OutputConflict,
    StreamNotFound,
    ConsumerNotFound,
    JetStreamNotEnabled,
    SubscribeError,
)


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "run",
        help="run a pipeline until SIGINT/SIGTERM, with live progress and metrics",
        description=(
            "Run the pipeline TARGET names (path/to/file.py:name or package.module:name: a "
            "Pipeline, or a function of no arguments returning one). The first SIGINT/SIGTERM "
            "drains it; another, a second or more later, stops it at once. Progress and events go "
            "to standard error. "
            "Exit codes: 0 stopped cleanly, 1 failed, 2 usage or configuration error, 3 drain "
            "timed out, 4 poison messages terminated without a dead letter, 128+N stopped hard "
            "by signal N. With --until-caught-up it drains by itself once caught up."
        ),
    )
    parser.add_argument("target", metavar="TARGET", help="path/to/file.py:name or module:name")
    add_connection_arguments(parser)
    over = parser.add_argument_group("overrides")
    over.add_argument(
        "--sink",
        metavar="NAME=PLUGIN",
        action="append",
        default=[],
        help="replace sink NAME's sink with the registered sink plugin PLUGIN (repeatable)",
    )
    over.add_argument(
        "--sink-option",
        metavar="NAME.KEY=VALUE",
        action="append",
        default=[],
        help="an option for the plugin that replaces sink NAME; VALUE is JSON or a string",
    )
    over.add_argument(
        "--durable",
        metavar="[SOURCE=]NAME",
        action="append",
        default=[],
        help="the durable consumer name of a source (SOURCE may be left out with one source)",
    )
    over.add_argument(
        "--deliver",
        choices=DELIVER_CHOICES,
        help=(
            "where the durable consumers this run creates start: all (the stream from its "
            "first message, the default), new (messages stored from now on), last, or "
            "last_per_subject; a durable that exists goes on from where it is"
        ),
    )
    over.add_argument(
        "--drain-timeout",
        type=float,
        metavar="SECONDS",
        help="how long a drain may take before the pipeline is stopped hard",
    )
    out = parser.add_argument_group("progress and metrics")
    out.add_argument(
        "--json-logs",
        action="store_true",
        help="one JSON object per line on stderr: progress and events",
    )
    out.add_argument(
        "--progress",
        choices=["auto", "live", "plain", "none"],
        default="auto",
        help="live view (terminal), plain lines, or events only; auto: live on a terminal",
    )
    out.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help="seconds between progress reports (default 1 live, 5 otherwise)",
    )
    out.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on http://127.0.0.1:PORT/metrics (0: a free port)",
    )
    scale = parser.add_argument_group("workers")
    scale.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help=(
            "run N worker processes of the pipeline on this host, sharing its durable "
            "consumers: one progress view and metrics endpoint with their sums, one drain; a "
            "worker that dies is restarted"
        ),
    )
    parser.add_argument(
        "--until-caught-up",
        action="store_true",
        help=(
            "drain and exit once every message the sources' streams held at the start is "
            "acked, terminated or dead-lettered (a backfill, a cron job): exit 0 when caught up "
            "and drained, the usual codes otherwise"
        ),
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help=(
            "with --until-caught-up: drain and exit 5 if not caught up within SECONDS (a sink "
            "stuck, a source that cannot keep up), instead of running on"
        ),
    )
    parser.set_defaults(func=command)


def prepare(target: str, overrides: Overrides) -> Pipeline:
    """Load, override and validate the pipeline (raises the errors :func:`command` maps to 2)."""
    pipe = load_target(target)
    overrides.apply(pipe)
    pipe.validate()
    return pipe


def command(args: argparse.Namespace) -> int:
    # Imported here, not at the top: only `headrace run` needs the workers' supervisor.
    from headrace.cli import workers

    # A worker's signals come from its supervisor, one per step it means: no window for them.
    window = 0.0 if workers.SUPERVISOR_FD_ENV in os.environ else SAME_REQUEST_WINDOW
    if args.workers is None:
        workers.watch_supervisor()  # in a worker of `--workers N`: end with the supervisor
    elif args.workers < 1:
        return _fail(f"--workers must be at least 1, not {args.workers}")
    elif args.until_caught_up:
        # Workers that share a consumer would each have to agree that all of them are done,
        # and the supervisor restarts a worker that exits: not supported yet.
        return _fail("--until-caught-up cannot be combined with --workers: run one process")
    if args.interval is not None and not args.interval > 0:
        return _fail("--interval must be positive")
    if args.timeout is not None:
        if not args.until_caught_up:
            return _fail("--timeout is how long --until-caught-up may take: give both")
        if not args.timeout > 0:
            return _fail(f"--timeout must be a positive number of seconds, not {args.timeout:g}")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        return _fail(f"--metrics-port {args.metrics_port}: not a port number")
    try:
        overrides = Overrides.parse(
            sinks=args.sink,
            sink_options=args.sink_option,
            durables=args.durable,
            drain_timeout=args.drain_timeout,
            deliver=args.deliver,
        )
        with workers.loading_environment(args.workers):
            pipe = prepare(args.target, overrides)
    except (TargetError, OverrideError, UnknownSink, SinkLoadError) as exc:
        return _fail(str(exc))
    except PipelineError as exc:
        return _fail(f"invalid pipeline: {exc}")
    stateful = [n.name for n in pipe.nodes if n.kind == "stateful"]
    if args.workers is not None and args.workers > 1 and stateful and pipe.partitioning is None:
        # Each key's state lives in one process: a second worker would be fenced off at its
        # first snapshot, fail, be restarted, and be fenced again (docs/state.md, "Limits").
        return _fail(
            f"--workers {args.workers}: pipeline {pipe.name!r} keeps state "
            f"({', '.join(stateful)}), which one worker owns; partition its keys "
            "(Pipeline(partitioning=...), docs/state.md) or run one worker"
        )
    logs = jsonlogs.active()
    if logs is not None:
        logs.pipeline = pipe.name
        logs.adopt_logging()  # the handlers TARGET's code may have set up
    try:
        kwargs = connect_kwargs(args, f"headrace run {pipe.name}")
    except ValueError as exc:
        return _fail(str(exc))
    mode = "json" if args.json_logs else args.progress
    reporter = make_reporter(mode, jsonlogs.stderr())
    interval = args.interval or (1.0 if isinstance(reporter, LiveView) else 5.0)
    with contextlib.ExitStack() as stack:
        if logs is None:
            # (With --json-logs, jsonlogs makes them ``warning`` events already.)
            stack.enter_context(warnings_as_events(reporter, pipe.name))
        return _run(args, pipe, reporter, kwargs, interval, window)


def _run(
    args: argparse.Namespace,
    pipe: Pipeline,
    reporter: Reporter,
    kwargs: dict[str, Any],
    interval: float,
    window: Any,
) -> int:
    if args.workers is not None:
        from headrace.cli import workers

        try:
            supervised: int = workers.supervise(args, pipe, reporter, interval=interval)
            return supervised
        finally:
            reporter.close()
    runner = Runner(
        pipe,
        kwargs,
        reporter,
        interval=interval,
        metrics_port=args.metrics_port,
        window=window,
        until_caught_up=getattr(args, "until_caught_up", False),
        timeout=getattr(args, "timeout", None),
    )
    # Caught from now until the process exits, never uninstalled: after the last `stopped`
    # event a signal cannot change the exit status any more (Runner.main). This function is
    # the process's last act (main() exits with its code).
    runner.signals.install()
    # The collector settings for streaming (gc_tuning.py), put back for in-process callers.
    gc_settings = tune_gc()
    try:
        code = trio.run(runner.main)
    finally:
        restore_gc(gc_settings)
        reporter.close()
    return code


@contextlib.contextmanager
def warnings_as_events(reporter: Reporter, pipeline: str) -> Iterator[None]:
    """Show Python warnings as ``warning`` event lines of the run (``category``, ``message``,
    ``where``) inside the block: a warning the framework gave while the server was away (a
    commit state's watch ending, a sweep put off) was printed as Python's two raw lines between
    the progress lines (issue 23)."""
    show = jsonlogs.warning_events(lambda **fields: reporter.event("warning", pipeline, **fields))
    saved, warnings.showwarning = warnings.showwarning, show
    try:
        yield
    finally:
        warnings.showwarning = saved


class Runner:
    """One ``headrace run``: the connection, the pipeline, signals, progress, metrics."""

    def __init__(
        self,
        pipe: Pipeline,
        connect_kwargs: dict[str, Any],
        reporter: Reporter,
        *,
        interval: float,
        metrics_port: int | None = None,
        window: float = SAME_REQUEST_WINDOW,
        until_caught_up: bool = False,
        timeout: float | None = None,
    ) -> None:
        self.pipe = pipe
        #: Drain once caught up (``--until-caught-up``), or once ``timeout`` seconds passed
        #: without (``--timeout``: then exit 5).
        self.until_caught_up = until_caught_up
        self.timeout = timeout
        self.timed_out = False
        self.connect_kwargs = connect_kwargs
        self.reporter = reporter
        self.interval = interval
        self.metrics_port = metrics_port
        self.run: PipelineRun | None = None
        #: The partitions' copies, for a pipeline over partitioned keys (instead of ``run``).
        self.partitions: PartitionRuns | None = None
        self.started_at = time.time()
        self.stop_requested = trio.Event()
        #: SIGINT and SIGTERM, installed by command(); the ladder says what each one asks for.
        self.signals = SignalCatcher(STOP_SIGNALS)
        self.ladder = StopLadder(window)
        self.hard_exit: int | None = None
        self._main_scope: trio.CancelScope | None = None
        self._last_error: StageError | None = None
        self._last_sample: tuple[float, int, int] | None = None
        self._started_clock = 0.0
        #: Operator and sink failures as events, at most one per actor per second.
        self.failures = FailureEvents(self.event, trio.current_time)
        #: Disconnects, reconnects, lame duck, server errors: events and the figures.
        self.connection = ConnectionEvents(self.event, trio.current_time)

    # -- reporting --------------------------------------------------------------------------

    def event(self, event: str, **fields: Any) -> None:
        self.reporter.event(event, self.pipe.name, **fields)

    def _stats(self) -> dict[str, Any]:
        """The run's stats snapshot and the connection's figures, with the stateful
        operators' under ``stateful`` (only for pipelines that have some): of the one run, or
        of the partitions' copies added up (``PartitionRuns``), in the same form."""
        now = time.time()
        if self.partitions is not None:
            counts, state = self.partitions.snapshot(), self.partitions.state_figures(now)
        elif self.run is not None:
            counts, state = self.run.stats.snapshot(), state_figures(self.run.stages, now)
        else:
            counts, state = PipelineStats().snapshot(), {}
        found = {**counts, **self.connection.figures()}
        if state:
            found[STATEFUL] = state
        return found

    def _states(self) -> dict[str, str]:
        if self.partitions is not None:
            return self.partitions.states()
        return self.run.states() if self.run is not None else {}

    def _draining(self) -> bool:
        if self.partitions is not None:
            return self.partitions.draining
        return self.run is not None and self.run.draining

    def _held(self) -> PartitionsHeld | None:
        """The partitions this process holds, for a pipeline over partitioned keys."""
        partitioning = self.pipe.partitioning
        if self.partitions is None or partitioning is None:
            return None
        return PartitionsHeld(count=partitioning.count, held=tuple(sorted(self.partitions.held)))

    def sample(self) -> Sample:
        now = trio.current_time()
        stats = self._stats()
        rate = out_rate = 0.0
        if self._last_sample is not None:
            at, msgs, recs = self._last_sample
            elapsed = now - at
            if elapsed > 0:
                rate = (stats["messages_in"] - msgs) / elapsed
                out_rate = (stats["records_out"] - recs) / elapsed
        self._last_sample = (now, stats["messages_in"], stats["records_out"])
        return Sample(
            pipeline=self.pipe.name,
            uptime=now - self._started_clock,
            stats=stats,
            states=self._states(),
            rate=rate,
            out_rate=out_rate,
            draining=self._draining(),
            partitions=self._held(),
        )

    def metrics_snapshot(self) -> Snapshot:
        return Snapshot(
            pipeline=self.pipe.name,
            stats=self._stats(),
            states=self._states(),
            draining=self._draining(),
            started_at=self.started_at,
            partitions=self._held(),
        )

    def _on_failure(self, failure: Failure) -> None:
        """The pipeline's ``stats.on_failure``: an operator or sink failure, as it happens."""
        self.failures(failure)

    def _say_held(self) -> None:
        """The events held back by the rate limits, and the stage errors not said yet."""
        self.failures.flush(final=True)
        self.connection.flush(final=True)
        self.report_errors()

    def report_errors(self) -> None:
        """Events for the stage errors reported since the last look (a poison message
        terminated without a dead letter), but for the sinks': their failed writes and rejected
        records were said as they happened, one by one (:meth:`_on_failure`)."""
        run = self.run
        if run is None or not run.errors:
            return
        errors = run.errors
        start = 0
        if self._last_error is not None:
            for i in range(len(errors) - 1, -1, -1):
                if errors[i] is self._last_error:
                    start = i + 1
                    break
        sinks = {node.name for node in self.pipe.sinks}
        for error in errors[start:]:
            if error.stage in sinks:
                continue
            self.event("error", stage=error.stage, error=_one_line(error.error), fatal=False)
        self._last_error = errors[-1]

    async def _progress(self) -> None:
        while True:
            await trio.sleep(self.interval)
            if self.run is not None or self.partitions is not None:
                self.report_errors()
                self.reporter.progress(self.sample())

    async def _held_events(self) -> None:
        """Say what the rate limits held back, once their second has passed."""
        while True:
            await trio.sleep(self.failures.per)
            self.failures.flush()
            self.connection.flush()

    async def _drain_when_caught_up(self, run: PipelineRun) -> None:
        """``--until-caught-up``: drain once the run has caught up with what the streams held
        at the start. A run that ends first (a signal, a failure) decides the exit code
        itself."""
        with trio.move_on_after(math.inf if self.timeout is None else self.timeout) as scope:
            try:
                stats = await run.wait_caught_up()
            except NotCaughtUp:
                return
        if scope.cancelled_caught:
            self.timed_out = True
            now = run.stats.snapshot()
            self.event(
                "not_caught_up",
                timeout=self.timeout,
                lag=now.get("lag"),
                ack_pending=now.get("ack_pending"),
                retrying=now.get("retrying"),
            )
            self.stop_requested.set()
            run.drain()
            return
        self.event("caught_up", messages=stats.messages_in, acks=stats.acks)
        self.stop_requested.set()
        run.drain()

    # -- signals ----------------------------------------------------------------------------

    async def _signals(self, nursery: trio.Nursery) -> None:
        while True:
            taken = self.ladder.feed(await self.signals.receive())
            name = taken.signal.name
            if taken.step is Step.DRAIN:
                self.event("draining", signal=name)
                self.stop_requested.set()  # a partitioned run drains on it (_run_partitioned)
                if self.run is not None:
                    self.run.drain()
                elif self.partitions is None and self._main_scope is not None:
                    self._main_scope.cancel()  # not running yet: nothing to drain
            elif taken.step is Step.REPEAT:
                assert taken.since is not None
                self.event("signal_repeated", signal=name, after=round(taken.since, 3))
            elif taken.step is Step.HARD:
                code = self.hard_exit = 128 + taken.signal
                self.event("stopping", signal=name, hard=True)
                if self.run is not None:
                    self.run.stop()
                elif self._main_scope is not None:
                    self._main_scope.cancel()
                    if self.partitions is not None:
                        self.partitions.stop()  # the copies' drains too
                nursery.start_soon(self._exit_after, HARD_STOP_GRACE, code)
            else:  # a signal after the hard stop: at once, with the hard stop's status
                assert self.hard_exit is not None
                self.event("stopped", exit_code=self.hard_exit, hard=True, forced=True)
                _exit_now(self.hard_exit)

    async def _exit_after(self, seconds: float, code: int) -> None:
        await trio.sleep(seconds)
        # The hard stop is waiting for something that does not cancel (a sink's write in a
        # worker thread): the process ends without it; the server redelivers.
        self.event("stopped", exit_code=code, hard=True, forced=True)
        _exit_now(code)

    # -- the run ----------------------------------------------------------------------------

    async def main(self) -> int:
        self._started_clock = trio.current_time()
        async with trio.open_nursery() as aux:
            aux.start_soon(self._signals, aux)
            if self.metrics_port is not None:
                problem = await start_serving(
                    aux, self.metrics_port, self.metrics_snapshot, self.event
                )
                if problem is not None:
                    aux.cancel_scope.cancel()
                    return _fail(problem)
            code = await self._guarded()
            if self.hard_exit is not None:
                code = self.hard_exit
            self.event("stopped", exit_code=code, stats=self._stats())
            # Said: from here on no signal may change the status (no checkpoint in between,
            # so the signals task cannot take one first).
            self.signals.settle(self.ladder.after_stopped(lambda: _exit_now(code)))
            aux.cancel_scope.cancel()
        return code

    async def _guarded(self) -> int:
        """Run; map errors to exit codes and messages."""
        connected = False
        try:
            with trio.CancelScope() as scope:
                self._main_scope = scope
                async with connect(**self.connect_kwargs) as nc:
                    connected = True
                    return await self._run(nc)
            return EXIT_OK  # cancelled by a signal before the pipeline ran, or stopped hard
        except BaseException as exc:
            error = _leaf(exc)
            if isinstance(error, KeyboardInterrupt | SystemExit | trio.Cancelled):
                raise
            self._say_held()  # what led up to it, before the error that ends the run
            if not connected and isinstance(error, NatsError | ValueError | OSError):
                # As given, but never with the password or token a URL may hold.
                servers = ", ".join(redact_url(url) for url in self.connect_kwargs["servers"])
                self.event("error", error=_one_line(error), fatal=True)
                return _fail(f"cannot connect to NATS ({servers}): {_one_line(error)}")
            fatal = _one_line(error)
            notes = getattr(error, "__notes__", None) or []
            if isinstance(error, CONFIG_ERRORS):
                self.event("error", error=fatal, fatal=True, notes=notes)
                return _fail(f"{fatal}{_notes(notes)}{self._hint(error)}")
            self.event("error", error=fatal, fatal=True, notes=notes)
            if isinstance(error, Exception):
                return _fail(f"pipeline failed: {fatal}{_notes(notes)}", EXIT_FAILED)
            raise

    async def _run_partitioned(self, nc: Any, partitioning: Partitioning) -> int:
        """A pipeline over partitioned keys: the partitions this process leases, one copy of
        the pipeline each (``run_partitioned``, pipeline/partitions.py), until a signal; each
        change of the partitions held is an event. Progress, failures and metrics are those
        of a single run, from the copies added up (``PartitionRuns``), with the partitions
        held."""
        self.connection.nc = nc
        watcher = nc.events()
        partitions = self.partitions = PartitionRuns(on_failure=self._on_failure)
        self._last_sample = (trio.current_time(), 0, 0)
        connected_to = nc.connected_server
        self.event(
            "started",
            pid=os.getpid(),
            server=str(connected_to) if connected_to is not None else None,
            sources=[n.source.describe() for n in self.pipe.sources if n.source],
            sinks=[n.name for n in self.pipe.sinks],
            partitions=partitioning.count,
        )

        def changed(gained: frozenset[int], lost: frozenset[int]) -> None:
            self.event(
                "partitions",
                gained=sorted(gained),
                lost=sorted(lost),
                held=sorted(partitions.held),
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._progress)
            nursery.start_soon(self._held_events)
            nursery.start_soon(self.connection.watch, watcher)
            async with trio.open_nursery() as running:

                async def until_stopped() -> None:
                    await self.stop_requested.wait()
                    running.cancel_scope.cancel()  # each copy drains, then the leases go

                running.start_soon(until_stopped)
                await run_partitioned(
                    self.pipe, nc, partitioning, on_change=changed, runs=partitions
                )
            nursery.cancel_scope.cancel()
        self._say_held()
        self.reporter.progress(self.sample())
        return EXIT_OK

    @staticmethod
    def _hint(error: BaseException) -> str:
        """What to fix, for a source that could not bind its consumer (the source's note says
        which one, and which stream)."""
        if isinstance(error, StreamNotFound):
            return ". Create the stream, or fix the pipeline"
        if isinstance(error, ConsumerNotFound):
            return ". Check the consumer, or fix the pipeline"
        return ""

    async def _run(self, nc: Any) -> int:
        if self.pipe.partitioning is not None:
            return await self._run_partitioned(nc, self.pipe.partitioning)
        self.connection.nc = nc
        watcher = nc.events()  # from now on: what happens while the pipeline binds is said too
        # `pipe.running(nc)`, with the failure hook in place before any actor runs.
        self.pipe.validate()
        run = PipelineRun(self.pipe, nc)
        run.stats.on_failure = self._on_failure
        async with run.lifetime():
            self.run = run
            self._last_sample = (trio.current_time(), 0, 0)
            connected_to = nc.connected_server
            self.event(
                "started",
                pid=os.getpid(),
                server=str(connected_to) if connected_to is not None else None,
                sources=[n.source.describe() for n in self.pipe.sources if n.source],
                sinks=[n.name for n in self.pipe.sinks],
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._progress)
                nursery.start_soon(self._held_events)
                nursery.start_soon(self.connection.watch, watcher)

                async def finished() -> None:
                    await run.wait_finished()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(finished)
                if self.until_caught_up:
                    nursery.start_soon(self._drain_when_caught_up, run)
                if self.stop_requested.is_set():  # a signal came while starting
                    run.drain()
                await self.stop_requested.wait()
                # Leaving the block drains; progress goes on meanwhile.
                await run.wait_finished()
                nursery.cancel_scope.cancel()
        self._say_held()
        self.reporter.progress(self.sample())
        if self.hard_exit is not None:
            return self.hard_exit
        if run.drain_timed_out:
            self.event("drain_incomplete", ack_pending=run.stats.ack_pending)
        if self.timed_out:
            incomplete = (
                f"; the drain did not finish either: {run.stats.ack_pending} messages taken "
                "were not acked, the server redelivers them after their ack wait"
                if run.drain_timed_out
                else ""
            )
            return _fail(
                f"not caught up within --timeout {self.timeout:g}s: drained and stopped (the "
                "not_caught_up event says what was left; sink_stuck events say why a sink "
                f"held it up){incomplete}",
                EXIT_TIMED_OUT,
            )
        if run.drain_timed_out:
            return _fail(
                f"the drain did not finish within {self.pipe.drain_timeout}s: "
                f"{run.stats.ack_pending} messages taken were not acked; the server redelivers "
                "them after their ack wait",
                EXIT_DRAIN_INCOMPLETE,
            )
        unkept = run.stats.terminated_unkept
        if unkept and not self.pipe.allow_termination:
            self.event("poison_terminated", messages=unkept)
            return _fail(
                f"{unkept} poison messages were terminated without a dead-letter "
                "copy (their error events say which): set the pipeline's dead_letter to keep "
                "them, or allow_termination=True to accept it",
                EXIT_POISON_TERMINATED,
            )
        return EXIT_OK


def _leaf(exc: BaseException) -> BaseException:
    """The first non-group exception of ``exc`` (Cancelled ones last)."""
    while isinstance(exc, BaseExceptionGroup):
        inner = [e for e in exc.exceptions if not isinstance(e, trio.Cancelled)]
        exc = (inner or list(exc.exceptions))[0]
    return exc


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _notes(notes: list[str]) -> str:
    return "".join(f"; {note.removeprefix('headrace: ')}" for note in notes)
