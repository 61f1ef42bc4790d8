"""Prometheus metrics of a running pipeline, and the small HTTP server that serves them.

:func:`render` writes the text exposition format 0.0.4; :func:`serve` answers ``GET /metrics``
(and ``HEAD``) on a TCP port of 127.0.0.1 with it, 404 for every other path, 405 for other
methods, over HTTP/1.1 with ``Connection: close`` (one request per connection; Prometheus
scrapes are one request each anyway). Every metric is named ``headrace_...`` and labelled with
the pipeline's name; see docs/cli.md for the list.

With ``headrace run --workers N`` one endpoint, in the supervisor, serves the whole pipeline: the
:class:`Snapshot` then holds the workers' summed stats, ``state_counts`` (how many workers have
each actor in each state: the actor-state gauges become counts, 1/0 being the one-process case)
and the worker gauges ``headrace_workers`` and ``headrace_worker_restarts_total``.

A pipeline over partitioned keys has the same metrics, its partitions' copies added up (the
stateful operators' under each copy's name, ``operator="per-minute-p3"``), and two gauges:
``headrace_partitions`` (how many its keys are split into) and ``headrace_partitions_held``
(how many this process, or the workers together, hold).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import trio

from headrace._version import __version__
from headrace.actors.actor import ActorState
from headrace.cli.progress import PartitionsHeld
from headrace.pipeline.stats import STATEFUL

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_REQUEST_HEAD = 16 * 1024
REQUEST_TIMEOUT = 10.0

#: Stats snapshot key -> (counter name, help).
COUNTERS: dict[str, tuple[str, str]] = {
    "messages_in": ("headrace_messages_total", "JetStream messages taken from the sources."),
    "redeliveries": (
        "headrace_redeliveries_total",
        "Messages taken that had been delivered before.",
    ),
    "records_out": ("headrace_records_committed_total", "Records committed by the sinks."),
    "records_skipped": (
        "headrace_records_skipped_total",
        "Records sinks left out as committed already (redeliveries of what they wrote).",
    ),
    "redelivered_held": (
        "headrace_redeliveries_held_total",
        "Redeliveries of messages the pipeline still held (a +WPI came too late): not taken.",
    ),
    "dropped": ("headrace_records_dropped_total", "Records dropped by filters (acked)."),
    "batches_committed": ("headrace_batches_committed_total", "Batches committed by the sinks."),
    "batches_failed": (
        "headrace_batches_failed_total",
        "Sink writes that failed (retried, or their bad records isolated).",
    ),
    "sink_retries": (
        "headrace_sink_retries_total",
        "Pauses before writing a failed batch again (a sink down is retried, not naked).",
    ),
    "acks": ("headrace_acks_total", "Messages acked."),
    "naks": ("headrace_naks_total", "Messages naked (redelivered later)."),
    "terms": ("headrace_terms_total", "Poison messages terminated."),
    "dead_lettered": ("headrace_dead_lettered_total", "Poison messages sent to the dead letter."),
    "terminated_unkept": (
        "headrace_terminated_unkept_total",
        "Poison messages terminated without a dead-letter copy.",
    ),
    "in_progress": ("headrace_in_progress_total", "Work-in-progress (+WPI) acks sent."),
    "errors": ("headrace_errors_total", "Operator and sink failures."),
    "reconnects": (
        "headrace_reconnects_total",
        "Times the NATS connection was made again after it was lost.",
    ),
}

STATES = [s.value for s in ActorState]


@attrs.frozen(slots=True, kw_only=True)
class Snapshot:
    """What the metrics show: the stats, the actor states, and the run's status."""

    pipeline: str
    stats: dict[str, Any]
    states: dict[str, str]
    draining: bool = False
    started_at: float = 0.0  # Unix time
    #: With ``--workers``: actor -> state -> how many workers have the actor in that state
    #: (rendered instead of ``states``).
    state_counts: dict[str, dict[str, int]] | None = None
    #: With ``--workers``: worker processes running; ``None`` for a single process (no worker
    #: metrics are rendered).
    workers: int | None = None
    #: With ``--workers``: times a dead worker was replaced.
    worker_restarts: int = 0
    #: For a pipeline over partitioned keys: the partitions held (else None).
    partitions: PartitionsHeld | None = None


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def render(snap: Snapshot) -> str:
    """The metrics of ``snap`` in the Prometheus text format 0.0.4."""
    label = f'pipeline="{_escape(snap.pipeline)}"'
    stats = snap.stats
    out: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{{{labels}}} {_number(value)}" for labels, value in samples)

    metric(
        "headrace_info",
        "gauge",
        "The pipeline and the headrace version running it.",
        [(f'{label},version="{_escape(__version__)}"', 1)],
    )
    for key, (name, help_) in COUNTERS.items():
        metric(name, "counter", help_, [(label, stats.get(key, 0))])
    name = "headrace_commit_seconds"
    out.append(f"# HELP {name} Time sinks took to commit a batch (write_batch), summed.")
    out.append(f"# TYPE {name} summary")
    out.append(f"{name}_sum{{{label}}} {_number(float(stats.get('commit_seconds_total', 0.0)))}")
    out.append(f"{name}_count{{{label}}} {_number(stats.get('batches_committed', 0))}")
    metric(
        "headrace_commit_last_seconds",
        "gauge",
        "Time the last committed batch took.",
        [(label, float(stats.get("commit_seconds_last", 0.0)))],
    )
    metric(
        "headrace_lag_messages",
        "gauge",
        "Messages the consumer still holds for the pipeline (num_pending of the last message).",
        [(label, stats.get("lag", 0))],
    )
    metric(
        "headrace_connected",
        "gauge",
        "1 while connected to a NATS server, else 0 (with --workers: workers connected).",
        [(label, stats.get("connected", 0))],
    )
    failures = stats.get("failures") or {}
    metric(
        "headrace_failures_total",
        "counter",
        "Operator and sink failures by actor and error type (the pipeline carried on).",
        [
            (f'{label},actor="{_escape(actor)}",error="{_escape(kind)}"', count)
            for actor, by_type in sorted(failures.items())
            for kind, count in sorted(by_type.items())
        ],
    )
    metric(
        "headrace_sinks_retrying",
        "gauge",
        "Sinks failing right now: no write has succeeded since their last failure.",
        [(label, stats.get("retrying", 0))],
    )
    metric(
        "headrace_ack_pending_messages",
        "gauge",
        "Messages taken and not yet acked, naked or terminated.",
        [(label, stats.get("ack_pending", 0))],
    )
    metric(
        "headrace_draining",
        "gauge",
        "1 while the pipeline drains (after SIGINT/SIGTERM), else 0.",
        [(label, 1 if snap.draining else 0)],
    )
    metric(
        "headrace_start_time_seconds",
        "gauge",
        "When the pipeline started, in seconds since the Unix epoch.",
        [(label, snap.started_at)],
    )
    counts = snap.state_counts
    help_ = "How many workers have each actor in each state."
    if counts is None:
        counts = {actor: {current: 1} for actor, current in snap.states.items()}
        help_ = "1 for the state each actor is in, 0 for the others."
    samples: list[tuple[str, float]] = []
    for actor, by_state in counts.items():
        states = STATES + [s for s in by_state if s not in STATES]
        samples.extend(
            (f'{label},actor="{_escape(actor)}",state="{_escape(state)}"', by_state.get(state, 0))
            for state in states
        )
    metric("headrace_actor_state", "gauge", help_, samples)
    state = stats.get(STATEFUL) or {}
    if state:
        _state_metrics(out, metric, label, state)
    if snap.partitions is not None:
        metric(
            "headrace_partitions",
            "gauge",
            "Partitions the pipeline's keys are split into.",
            [(label, snap.partitions.count)],
        )
        metric(
            "headrace_partitions_held",
            "gauge",
            "Partitions held (leased) by this process; with --workers, by its workers.",
            [(label, len(snap.partitions.held))],
        )
    if snap.workers is not None:
        metric(
            "headrace_workers",
            "gauge",
            "Worker processes running (headrace run --workers).",
            [(label, snap.workers)],
        )
        metric(
            "headrace_worker_restarts_total",
            "counter",
            "Worker processes started again after one died.",
            [(label, snap.worker_restarts)],
        )
    return "\n".join(out) + "\n"


#: Stateful operator figure -> (metric, type, help); each labelled with the operator.
STATE_METRICS: dict[str, tuple[str, str, str]] = {
    "keys": (
        "headrace_state_keys",
        "gauge",
        "Keys a stateful operator holds state of (windows: keys with an open window).",
    ),
    "open_windows": ("headrace_state_open_windows", "gauge", "Windows not closed yet."),
    "watermark_lag": (
        "headrace_state_watermark_lag_seconds",
        "gauge",
        "The newest event time less the watermark (about the lateness).",
    ),
    "event_time_lag": (
        "headrace_state_event_time_lag_seconds",
        "gauge",
        "The wall clock less the watermark: how far event time is behind.",
    ),
    "late": (
        "headrace_state_late_records_total",
        "counter",
        "Records that came behind the watermark (dead-lettered, never counted).",
    ),
    "held": (
        "headrace_state_held_messages",
        "gauge",
        "Messages taken into the state and not yet in a snapshot (acked after the next).",
    ),
    "results_pending": (
        "headrace_state_results_pending",
        "gauge",
        "Results (window results, map outputs) not yet known to be committed by the sinks.",
    ),
    "snapshots": ("headrace_state_snapshots_total", "counter", "Snapshots saved to KV."),
    "snapshot_bytes": (
        "headrace_state_snapshot_bytes",
        "gauge",
        "The size of the last snapshot saved (compressed).",
    ),
}


def _state_metrics(
    out: list[str],
    metric: Callable[[str, str, str, list[tuple[str, float]]], None],
    label: str,
    state: dict[str, dict[str, Any]],
) -> None:
    """The stateful operators' metrics, labelled ``operator``; a figure that is None (no
    watermark yet) leaves its sample out."""
    operators = sorted(state.items())
    for key, (name, kind, help_) in STATE_METRICS.items():
        samples = [
            (f'{label},operator="{_escape(op)}"', figures[key])
            for op, figures in operators
            if figures.get(key) is not None
        ]
        metric(name, kind, help_, samples)
    name = "headrace_state_snapshot_seconds"
    out.append(f"# HELP {name} Time stateful operators took to save snapshots, summed.")
    out.append(f"# TYPE {name} summary")
    for op, figures in operators:
        labels = f'{label},operator="{_escape(op)}"'
        out.append(f"{name}_sum{{{labels}}} {_number(float(figures.get('snapshot_seconds', 0.0)))}")
        out.append(f"{name}_count{{{labels}}} {_number(figures.get('snapshots', 0))}")


# -- the HTTP server --------------------------------------------------------------------------


def _response(
    status: str, body: bytes, content_type: str, extra: str = "", head: bool = False
) -> bytes:
    headers = (
        f"HTTP/1.1 {status}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"{extra}"
        "Connection: close\r\n"
        "\r\n"
    )
    return headers.encode("ascii") + (b"" if head else body)


def _text(status: str, text: str, extra: str = "", head: bool = False) -> bytes:
    return _response(status, text.encode(), "text/plain; charset=utf-8", extra, head)


async def _read_head(stream: trio.abc.Stream) -> bytes | None:
    data = bytearray()
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        if len(data) > MAX_REQUEST_HEAD:
            return None
        chunk = await stream.receive_some(4096)
        if not chunk:
            return bytes(data) if data else None
        data += chunk
    return bytes(data)


def answer(head: bytes | None, body: Callable[[], str]) -> bytes:
    """The response to a request whose head (request line and headers) is ``head``."""
    if head is None:
        return _text("400 Bad Request", "bad request\n")
    line = head.split(b"\n", 1)[0].rstrip(b"\r")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return _text("400 Bad Request", "bad request\n")
    method, target = parts[0], parts[1]
    path = target.split(b"?", 1)[0]
    is_head = method == b"HEAD"
    if method not in (b"GET", b"HEAD"):
        return _text("405 Method Not Allowed", "method not allowed\n", "Allow: GET, HEAD\r\n")
    if path != b"/metrics":
        return _text("404 Not Found", "not found: try /metrics\n", head=is_head)
    try:
        text = body()
    except Exception as exc:
        return _text("500 Internal Server Error", f"{type(exc).__name__}: {exc}\n", head=is_head)
    return _response("200 OK", text.encode(), CONTENT_TYPE, head=is_head)


async def serve(
    port: int,
    snapshot: Callable[[], Snapshot],
    *,
    host: str = "127.0.0.1",
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``GET /metrics`` on ``host:port`` until cancelled; ``started()`` with the port
    (useful with ``port=0``, which picks a free one)."""
    listeners = await trio.open_tcp_listeners(port, host=host)

    async def handle(stream: trio.SocketStream) -> None:
        try:
            head: bytes | None = None
            with trio.move_on_after(REQUEST_TIMEOUT):
                head = await _read_head(stream)
            await stream.send_all(answer(head, lambda: render(snapshot())))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the client went away
        finally:
            await trio.aclose_forcefully(stream)

    bound = listeners[0].socket.getsockname()[1]
    task_status.started(bound)
    await trio.serve_listeners(handle, listeners)


async def start_serving(
    nursery: trio.Nursery,
    port: int,
    snapshot: Callable[[], Snapshot],
    event: Callable[..., None],
) -> str | None:
    """Serve the metrics on ``port`` in ``nursery`` and announce where (``event("metrics",
    port=, url=)``); the message for the user when the port cannot be had, else None."""
    try:
        bound = await nursery.start(serve, port, snapshot)
    except OSError as exc:
        return f"--metrics-port {port}: {exc.strerror or exc}"
    event("metrics", port=bound, url=f"http://127.0.0.1:{bound}/metrics")
    return None
