"""What ``headrace run`` shows while it runs: a live view, plain lines, or JSON lines.

All three take the same calls: :meth:`Reporter.progress` with a :class:`Sample` once per
interval, and :meth:`Reporter.event` for what happens in between (``started``, ``metrics``,
``draining``, ``error``, ``stopping``, ``stopped``). They write to one text stream, standard
error by default, so that standard output stays free for a sink that writes there.

- :class:`LiveView` (a terminal): a block of lines redrawn in place; events are printed above it.
  It keeps the last ``error`` (:mod:`headrace.cli.failures`) and the last connection event
  (:mod:`headrace.cli.connection`) in words, in its ``last`` and ``nats`` lines, and shows the
  stateful operators (``stats["stateful"]``, :func:`headrace.pipeline.stats.state_figures`) in
  its ``state`` lines when the pipeline has any.
- :class:`PlainLines`: one ``key=value`` line per interval and per event, for log files
  (:class:`EventsOnly`: the event lines alone).
- :class:`JsonLines`: one JSON object per line, ``{"ts", "event", "pipeline", ...}``; progress
  objects carry the stats snapshot, the rates and the actor states.

A pipeline over partitioned keys (docs/state.md) shows the same figures, those of its
partitions' copies added up, and which partitions the process holds (``Sample.partitions``,
:class:`PartitionsHeld`): a ``leased`` line in the live view, ``partitions=`` in plain lines,
``partitions`` in JSON progress objects.

With ``--workers N`` the same reporters show the supervisor's view (:mod:`headrace.cli.workers`):
a :class:`Sample` whose stats are the workers' sums and whose ``workers`` lists each worker
process (:class:`WorkerStatus`). Without workers, ``workers`` is empty and nothing about workers
is shown: a single process's output is unchanged.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from collections import Counter
from typing import Any, TextIO

import attrs

from headrace.cli.session import bytes_words
from headrace.pipeline.stats import STATEFUL


@attrs.frozen(slots=True, kw_only=True)
class PartitionsHeld:
    """The partitions a run of a partitioned pipeline holds (with ``--workers``: all its
    workers together), of the ``count`` its keys are split into."""

    count: int
    held: tuple[int, ...]


@attrs.frozen(slots=True, kw_only=True)
class WorkerStatus:
    """One worker process of ``headrace run --workers N``, as its supervisor sees it."""

    index: int
    #: The current process, ``None`` between two (while waiting to restart it).
    pid: int | None
    #: ``starting`` (spawned, pipeline not running yet), ``running``, ``draining``,
    #: ``restarting`` (waiting out the backoff) or ``exited``.
    state: str
    #: Times a new process replaced a dead one.
    restarts: int
    #: Messages this worker took, over all its processes.
    messages_in: int
    #: The partitions it holds, for a pipeline over partitioned keys (else None).
    partitions: tuple[int, ...] | None = None


@attrs.frozen(slots=True, kw_only=True)
class Sample:
    """One look at a running pipeline."""

    pipeline: str
    uptime: float
    stats: dict[str, Any]
    states: dict[str, str]
    #: JetStream messages taken per second since the previous sample.
    rate: float
    #: Records committed by sinks per second since the previous sample.
    out_rate: float
    draining: bool = False
    #: With ``--workers``: every worker process, by index (``stats`` are then their sums).
    workers: tuple[WorkerStatus, ...] = ()
    #: For a pipeline over partitioned keys: the partitions held (else None).
    partitions: PartitionsHeld | None = None


def _workers_running(workers: tuple[WorkerStatus, ...]) -> int:
    return sum(1 for w in workers if w.state == "running")


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _by(stats: dict[str, Any]) -> str:
    """`` by <sink>``: the sink of the last commit, if any."""
    sink = stats.get("commit_last_sink")
    return f" by {sink}" if sink else ""


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}ms"


def _commit_avg(stats: dict[str, Any]) -> float:
    n = stats.get("batches_committed", 0)
    return stats.get("commit_seconds_total", 0.0) / n if n else 0.0


def span_words(seconds: float) -> str:
    """``0.5s``, ``42s``, ``3m20s``, ``5h12m``, ``3d4h``: a span in two units at most."""
    if seconds < 0:
        return "-" + span_words(-seconds)
    if seconds < 10:
        return f"{seconds:.1f}".rstrip("0").rstrip(".") + "s"
    s = int(seconds)
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if s >= size:
            rest = (s % size) // subsize
            return f"{s // size}{unit}" + (f"{rest}{sub}" if rest else "")
    if s >= 60:
        return f"{s // 60}m" + (f"{s % 60}s" if s % 60 else "")
    return f"{s}s"


def _state_of(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The stateful operators' figures in ``stats`` (``headrace.pipeline.stats.STATEFUL``)."""
    found = stats.get(STATEFUL)
    return found if isinstance(found, dict) else {}


def _max_of(state: dict[str, dict[str, Any]], key: str) -> float | None:
    values = [f[key] for f in state.values() if f.get(key) is not None]
    return max(values) if values else None


def _state_plain(state: dict[str, dict[str, Any]]) -> list[str]:
    """The stateful operators in ``key=value`` fields: summed over them, the lags their
    largest (left out before any watermark)."""
    if not state:
        return []

    def total(key: str) -> int:
        return sum(int(f.get(key) or 0) for f in state.values())

    parts = [f"state_keys={total('keys')}", f"windows_open={total('open_windows')}"]
    for key, field in (("watermark_lag", "wm_lag"), ("event_time_lag", "event_lag")):
        value = _max_of(state, key)
        if value is not None:
            parts.append(f"{field}={value:.1f}s")
    parts += [
        f"late={total('late')}",
        f"state_held={total('held')}",
        f"results_pending={total('results_pending')}",
        f"snapshots={total('snapshots')}",
    ]
    return parts


def _state_line(name: str, f: dict[str, Any], width: int) -> str:
    """One stateful operator in the live view: what matters most first, as the line may be
    cut to the terminal's width."""
    parts = [f"{f.get('keys', 0):,} keys"]
    if f.get("kind") == "window":
        parts.append(f"{f.get('open_windows', 0):,} windows open")
        lag, behind = f.get("watermark_lag"), f.get("event_time_lag")
        if lag is None:
            parts.append("no watermark yet")
        else:
            clock = f" ({span_words(behind)} behind the clock)" if behind is not None else ""
            parts.append(f"wm lag {span_words(lag)}{clock}")
    snapshots = f.get("snapshots", 0)
    avg = f.get("snapshot_seconds", 0.0) / snapshots if snapshots else 0.0
    parts += [
        f"late {f.get('late', 0):,}",
        f"held {f.get('held', 0):,}",
        f"pending {f.get('results_pending', 0):,}",
        f"snapshots {snapshots:,} (last {bytes_words(f.get('snapshot_bytes', 0))}, avg {_ms(avg)})",
    ]
    return f"    {name:<{width}}  " + ", ".join(parts)


def _plain_value(value: Any) -> str:
    text = ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        return json.dumps(text)
    return text


class Reporter:
    """Base class: writes to ``out`` and flushes after each report."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def progress(self, sample: Sample) -> None:
        raise NotImplementedError

    def event(self, event: str, pipeline: str, **fields: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """The run is over: leave the output tidy."""

    def _write(self, text: str) -> None:
        try:
            self.out.write(text)
            self.out.flush()
        except (BrokenPipeError, ValueError):
            pass  # nobody reads any more (a closed pipe): the run goes on regardless


class JsonLines(Reporter):
    """One JSON object per line."""

    def progress(self, sample: Sample) -> None:
        extra: dict[str, Any] = {}
        if sample.partitions is not None:
            extra["partitions"] = attrs.asdict(sample.partitions)
        if sample.workers:
            extra["workers"] = [attrs.asdict(w) for w in sample.workers]
        self.event(
            "progress",
            sample.pipeline,
            uptime=round(sample.uptime, 3),
            rate=round(sample.rate, 1),
            out_rate=round(sample.out_rate, 1),
            draining=sample.draining,
            stats=sample.stats,
            states=sample.states,
            **extra,
        )

    def event(self, event: str, pipeline: str, **fields: Any) -> None:
        obj = {"ts": _now(), "event": event, "pipeline": pipeline, **fields}
        self._write(json.dumps(obj, default=str, separators=(",", ":")) + "\n")


class PlainLines(Reporter):
    """``key=value`` lines: one per interval, one per event."""

    def progress(self, sample: Sample) -> None:
        s = sample.stats
        states = sample.states
        running = sum(1 for v in states.values() if v == "running")
        others = ",".join(f"{k}:{v}" for k, v in states.items() if v != "running")
        parts = [
            f"in={s['messages_in']}",
            f"rate={sample.rate:.1f}/s",
            f"out={s['records_out']}",
            f"skipped={s.get('records_skipped', 0)}",
            f"lag={s['lag']}",
            f"ack_pending={s['ack_pending']}",
            f"batches={s['batches_committed']}",
            f"batches_failed={s['batches_failed']}",
            f"acks={s['acks']}",
            f"naks={s['naks']}",
            f"redelivered={s['redeliveries']}",
            f"redelivered_held={s.get('redelivered_held', 0)}",
            f"errors={s['errors']}",
            f"dropped={s.get('dropped', 0)}",
            f"terms={s.get('terms', 0)}",
            f"dead_lettered={s.get('dead_lettered', 0)}",
            f"terminated_unkept={s.get('terminated_unkept', 0)}",
            f"retrying={s.get('retrying', 0)}",
            f"sink_retries={s.get('sink_retries', 0)}",
            f"commit_last={_ms(s['commit_seconds_last'])}",
            f"commit_sink={s.get('commit_last_sink') or '-'}",
            f"commit_avg={_ms(_commit_avg(s))}",
            f"actors_running={running}/{len(states)}",
        ]
        parts[-1:-1] = _state_plain(_state_of(s))
        if "connected" in s:
            parts[-1:-1] = [f"connected={s['connected']}", f"reconnects={s.get('reconnects', 0)}"]
        if others:
            parts.append(f"actors_other={others}")
        if sample.partitions is not None:
            held = sample.partitions
            parts.append(f"partitions={len(held.held)}/{held.count}")
            parts.append(f"partitions_held={','.join(map(str, held.held)) or '-'}")
        if sample.workers:
            workers = sample.workers
            parts.append(f"workers_running={_workers_running(workers)}/{len(workers)}")
            parts.append(f"worker_restarts={sum(w.restarts for w in workers)}")
            idle = ",".join(f"{w.index}:{w.state}" for w in workers if w.state != "running")
            if idle:
                parts.append(f"workers_other={idle}")
        self._line("progress", sample.pipeline, " ".join(parts))

    def event(self, event: str, pipeline: str, **fields: Any) -> None:
        text = " ".join(
            f"{k}={_plain_value(v)}" for k, v in fields.items() if not isinstance(v, dict)
        )
        self._line(event, pipeline, text)

    def _line(self, event: str, pipeline: str, text: str) -> None:
        self._write(f"{_now()} {event} pipeline={_plain_value(pipeline)} {text}".rstrip() + "\n")


class EventsOnly(PlainLines):
    """Plain event lines, no progress (``--progress none``)."""

    def progress(self, sample: Sample) -> None:
        pass


class LiveView(Reporter):
    """A block of lines redrawn in place on a terminal (ANSI cursor movement)."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(out)
        self._drawn = 0
        self._last: Sample | None = None
        #: The last failure, and the last thing that happened to the connection, in words.
        self._last_error = ""
        self._last_connection = ""

    def _width(self) -> int:
        try:
            columns = os.get_terminal_size(self.out.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
        if columns <= 0:
            columns = shutil.get_terminal_size((100, 24)).columns
        # One column spare: a line that fills the row exactly wraps on some terminals.
        return max(columns - 1, 20)

    def _erase(self) -> str:
        if not self._drawn:
            return ""
        # To the start of the first line of the block, then clear to the end of the screen.
        return f"\x1b[{self._drawn}F\x1b[J"

    def _block(self, sample: Sample) -> list[str]:
        s = sample.stats
        width = self._width()
        status = "draining" if sample.draining else "running"
        lines = [
            f"headrace run {sample.pipeline}   up {_duration(sample.uptime)}   {status}",
            f"  in      {s['messages_in']:>12,} msg   {sample.rate:>10,.1f} msg/s"
            f"   redelivered {s['redeliveries']:,} (held {s.get('redelivered_held', 0):,})",
            f"  out     {s['records_out']:>12,} rec   {sample.out_rate:>10,.1f} rec/s"
            f"   dropped {s['dropped']:,}   skipped {s.get('records_skipped', 0):,}",
            f"  lag     {s['lag']:>12,} pending    ack pending {s['ack_pending']:,}",
            f"  batches {s['batches_committed']:>12,} committed  failed {s['batches_failed']:,}"
            f"   commit {_ms(s['commit_seconds_last'])}{_by(s)} (avg {_ms(_commit_avg(s))})",
            f"  acks    {s['acks']:>12,}   naks {s['naks']:,}   terms {s['terms']:,}"
            f"   dead-lettered {s['dead_lettered']:,}   in progress {s['in_progress']:,}",
            f"  errors  {s['errors']:>12,}   sinks retrying {s.get('retrying', 0):,}"
            f"   sink retries {s.get('sink_retries', 0):,}"
            f"   terminated unkept {s.get('terminated_unkept', 0):,}",
            *([f"  last    {self._last_error}"] if self._last_error else []),
            *self._state_lines(_state_of(s)),
            *self._partition_lines(sample.partitions),
            *self._connection_lines(s, len(sample.workers)),
            *self._worker_lines(sample.workers),
            "  actors",
        ]
        counts = Counter(sample.states.values())
        summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        lines[-1] += f"  ({summary})"
        name_width = max((len(n) for n in sample.states), default=0)
        for name, state in sample.states.items():
            lines.append(f"    {name:<{name_width}}  {state}")
        return [line[:width] for line in lines]

    @staticmethod
    def _state_lines(state: dict[str, dict[str, Any]]) -> list[str]:
        if not state:
            return []
        windows = sum(int(f.get("open_windows") or 0) for f in state.values())
        late = sum(int(f.get("late") or 0) for f in state.values())
        head = f"  state   {len(state):>12,} stateful   windows {windows:,} open"
        lag = _max_of(state, "watermark_lag")
        if lag is not None:
            head += f", wm lag {span_words(lag)}"
        lines = [head + f", late {late:,}"]
        width = max(len(name) for name in state)
        lines.extend(_state_line(name, f, width) for name, f in sorted(state.items()))
        return lines

    @staticmethod
    def _partition_lines(partitions: PartitionsHeld | None) -> list[str]:
        if partitions is None:
            return []
        listed = ", ".join(map(str, partitions.held)) or "none"
        return [f"  leased  {len(partitions.held):>12,} of {partitions.count} partitions: {listed}"]

    def _connection_lines(self, s: dict[str, Any], workers: int) -> list[str]:
        if "connected" not in s:
            return []
        connected = s["connected"]
        if workers:
            status = f"{connected} of {workers} workers connected"
        else:
            status = "connected" if connected else "DISCONNECTED"
        line = f"  nats    {status}   reconnects {s.get('reconnects', 0):,}"
        if self._last_connection:
            line += f"   last: {self._last_connection}"
        return [line]

    @staticmethod
    def _worker_lines(workers: tuple[WorkerStatus, ...]) -> list[str]:
        if not workers:
            return []
        restarts = sum(w.restarts for w in workers)
        lines = [
            f"  workers {_workers_running(workers):>12,} running of {len(workers)}"
            f"   restarts {restarts:,}"
        ]
        for w in workers:
            pid = str(w.pid) if w.pid is not None else "-"
            line = (
                f"    #{w.index:<3} pid {pid:>8}  {w.state:<10}  in {w.messages_in:>12,}"
                f"   restarts {w.restarts:,}"
            )
            if w.partitions is not None:
                line += f"   partitions {', '.join(map(str, w.partitions)) or '-'}"
            lines.append(line)
        return lines

    def _draw(self, prefix: str = "") -> None:
        if self._last is None:
            self._write(self._erase() + prefix)
            self._drawn = 0
            return
        block = self._block(self._last)
        self._write(self._erase() + prefix + "".join(line + "\n" for line in block))
        self._drawn = len(block)

    def progress(self, sample: Sample) -> None:
        self._last = sample
        self._draw()

    def event(self, event: str, pipeline: str, **fields: Any) -> None:
        if event == "error":
            self._last_error = _failure_words(fields)
        elif event in CONNECTION_EVENTS:
            self._last_connection = _connection_words(event, fields)
        details = " ".join(
            f"{k}={_plain_value(v)}" for k, v in fields.items() if not isinstance(v, dict)
        )
        # Not cut to the terminal's width: the block is redrawn below it, whatever its height.
        self._draw(f"{_now()} {event} {pipeline} {details}".rstrip() + "\n")

    def close(self) -> None:
        self._drawn = 0  # leave the last view on the screen


#: The connection events the live view keeps the last of (headrace.cli.connection).
CONNECTION_EVENTS = frozenset(
    {"disconnected", "reconnected", "lame_duck", "server_error", "connection_closed"}
)


def _clock_time() -> str:
    return dt.datetime.now().strftime("%H:%M:%S")


def _failure_words(fields: dict[str, Any]) -> str:
    """``12:00:01 filter:valid: NameError: ... (ORDERS #17; 41 more not shown)``."""
    where = fields.get("actor") or fields.get("stage")
    text = f"{_clock_time()} "
    if "worker" in fields:
        text += f"worker {fields['worker']} "
    text += f"{where}: " if where else ""
    text += str(fields.get("error", ""))
    notes = []
    if fields.get("stream") is not None and fields.get("seq") is not None:
        notes.append(f"{fields['stream']} #{fields['seq']}")
    if fields.get("suppressed"):
        notes.append(f"{fields['suppressed']:,} more not shown")
    if fields.get("fatal"):
        notes.append("fatal")
    return text + (f" ({'; '.join(notes)})" if notes else "")


def _connection_words(event: str, fields: dict[str, Any]) -> str:
    """``12:00:01 disconnected nats://127.0.0.1:4222: ConnectionResetError: ...``."""
    text = f"{_clock_time()} "
    if "worker" in fields:
        text += f"worker {fields['worker']} "
    text += event.replace("_", " ")
    if fields.get("server"):
        text += f" {fields['server']}"
    if fields.get("error"):
        text += f": {fields['error']}"
    return text


def make_reporter(mode: str, out: TextIO) -> Reporter:
    """``mode``: ``json``, ``plain``, ``live``, ``none`` (events only), or ``auto`` (live on a
    terminal, else plain)."""
    if mode == "json":
        return JsonLines(out)
    if mode == "none":
        return EventsOnly(out)
    if mode == "live" or (mode == "auto" and _isatty(out)):
        return LiveView(out)
    return PlainLines(out)


def _isatty(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False
