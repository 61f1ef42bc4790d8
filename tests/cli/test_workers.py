"""`headrace run TARGET --workers N`: worker processes of one pipeline on one durable consumer,
one view of their sums, one metrics endpoint, one drain, restarts, and no worker left behind.

Real processes against a real nats-server; nats-py (the independent peer) publishes and reads the
consumer's state. Every wait is for an event: a line, an exit, a consumer state, a pidfd.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.cli.main import build_parser
from headrace.cli.metrics import Snapshot, render
from headrace.cli.progress import JsonLines, LiveView, PartitionsHeld, PlainLines, Sample
from headrace.cli.workers import (
    SUPERVISOR_ONLY,
    Backoff,
    Worker,
    combine_stats,
    worker_argv,
    worker_secrets,
)

from tests.cli.cli_support import (
    HeadraceProcess,
    ProcessWatch,
    consumer_info,
    create_stream,
    headrace,
    metrics_samples,
    publish,
    read_jsonl,
    run_headrace,
    write_pipeline,
)
from tests.natspy_peer import wait_consumer
from tests.servers import free_port, user_password_auth

#: Every worker writes into one JsonlSink directory, shared through the commit protocol
#: (docs/scaling.md), as the pipeline's workers normally do.
SCALED = """\
import os
import time
from headrace.jetstream.consume import ConsumeOptions


INDEX = int(os.environ["HEADRACE_WORKER_INDEX"])  # (every worker is told its index)


class PacedJsonl(JsonlSink):
    # Each write takes DELAY seconds more (simulated work, not a wait for anything), so that no
    # worker takes the whole stream before the others pull.
    def write_batch(self, batch):
        time.sleep(DELAY)
        super().write_batch(batch)


pipeline = Pipeline("scaled")
pipeline.source(
    JetStreamSource(
        stream="ORDERS",
        durable="lake",
        config=ConsumerConfig(ack_wait=ACK_WAIT, max_ack_pending=400),
        consume=ConsumeOptions(max_messages=50),
    )
).sink(
    PacedJsonl(OUT, fsync=False),
    name="lake",
    batch=BatchPolicy(max_messages=50, max_age=0.2),
)
"""

MEMORY = """\
from headrace.jetstream.consume import ConsumeOptions

pipeline = Pipeline("mem")
pipeline.source(
    JetStreamSource(stream="ORDERS", durable="mem", consume=ConsumeOptions(max_messages=20))
).map(json.loads).sink(MemorySink(), name="out", batch=BatchPolicy(max_messages=10, max_age=0.1))
"""

#: A sink whose writes never finish: the drain cannot complete. Small pulls: the server spreads
#: the messages over both workers' requests.
STUCK = """\
from headrace.jetstream.consume import ConsumeOptions

class Stuck:
    async def write_batch(self, batch):
        await trio.sleep_forever()

pipeline = Pipeline("stuck", drain_timeout=60)
pipeline.source(
    JetStreamSource(stream="ORDERS", durable="stuck", consume=ConsumeOptions(max_messages=5))
).sink(Stuck(), name="stuck", batch=BatchPolicy(max_messages=5, max_age=0.1))
"""


def _scaled(tmp_path: Path, out: Path, *, delay: float, ack_wait: float) -> Path:
    settings = f"OUT = {str(out)!r}\nDELAY = {delay}\nACK_WAIT = {ack_wait}\n"
    return write_pipeline(tmp_path, settings + SCALED)


async def _started_workers(proc: HeadraceProcess, count: int) -> dict[int, int]:
    """Worker index -> pid, from the first ``count`` ``worker_started`` events."""
    pids: dict[int, int] = {}
    start = 0
    while len(pids) < count:
        index, event = await proc.wait_event("worker_started", start=start)
        pids[event["worker"]] = event["pid"]
        start = index + 1
    return pids


def _final(proc: HeadraceProcess) -> tuple[dict[str, Any], dict[str, Any]]:
    """The last progress event and the ``stopped`` event, which must be the last line."""
    events = proc.events()
    assert events[-1]["event"] == "stopped", proc.transcript()
    progress = [e for e in events if e["event"] == "progress"][-1]
    return progress, events[-1]


# -- in process: the pieces -------------------------------------------------------------------


def test_worker_command_line_keeps_every_option() -> None:
    """Every `run` option but the supervisor's own reaches the workers unchanged, including
    options added later (this walks the parser), and values that start with '-'."""
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run_parser = subparsers.choices["run"]
    argv = ["run", "pipes/orders.py:make"]
    for action in run_parser._actions:
        if not action.option_strings or action.dest in {*SUPERVISOR_ONLY, "help"}:
            continue
        option = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(option)
        elif isinstance(action, argparse._AppendAction):
            argv += [f"{option}=-a {action.dest}", f"{option}=b={action.dest}"]
        elif action.type in (int, float):
            argv.append(f"{option}=2.5")
        elif action.choices is not None:
            argv.append(f"{option}={list(action.choices)[-1]}")
        else:
            argv.append(f"{option}=-x {action.dest}")
    argv += ["--workers", "3", "--progress", "live", "--interval", "7", "--metrics-port", "0"]
    args = parser.parse_args(argv)

    child = worker_argv(args, 0.25)
    assert child[:5] == [sys.executable, "-P", "-m", "headrace", "run"]
    again = parser.parse_args(child[4:])
    secret = {"servers", "password", "token"}  # in the environment, not on the command line
    forwarded = {k: v for k, v in vars(args).items() if k not in SUPERVISOR_ONLY | secret}
    assert forwarded == {k: v for k, v in vars(again).items() if k not in SUPERVISOR_ONLY | secret}
    assert (again.servers, again.password, again.token) == (None, None, None)
    assert worker_secrets(args) == {
        "NATS_URL": ",".join(args.servers),
        "NATS_PASSWORD": "-x password",
        "NATS_TOKEN": "-x token",
    }
    assert not any("-x password" in a or "-x token" in a or "-a servers" in a for a in child)
    assert args.tls_first and args.password == "-x password" and len(args.servers) == 2
    assert again.workers is None and again.metrics_port is None
    assert again.json_logs and again.interval == 0.25


def test_sums_carry_counts_over_restarts_not_levels() -> None:
    finished = Worker(0, carried={"messages_in": 70, "acks": 60, "commit_seconds_total": 0.5})
    idle = Worker(1)  # took messages and committed long ago: its figures are stale
    idle.report(
        {"messages_in": 5, "acks": 5, "ack_pending": 3, "lag": 40, "batches_committed": 1,
         "commit_seconds_last": 0.9, "commit_last_sink": "slow"},
        now=1.0,
    )  # fmt: skip
    busy = Worker(2)
    busy.report({"messages_in": 4, "lag": 9}, now=1.0)
    busy.report(
        {"messages_in": 10, "acks": 8, "ack_pending": 2, "lag": 7, "batches_committed": 2,
         "commit_seconds_last": 0.3, "commit_last_sink": "fast"},
        now=2.0,
    )  # fmt: skip
    new = Worker(3)  # started, took nothing yet
    new.report({"messages_in": 0, "lag": 0, "ack_pending": 0}, now=3.0)
    total = combine_stats([finished, idle, busy, new], window=0.5)
    assert total["messages_in"] == 85 and total["acks"] == 73 and total["batches_committed"] == 3
    assert total["commit_seconds_total"] == 0.5
    assert total["ack_pending"] == 5  # each worker's own unsettled messages
    assert total["lag"] == 7  # the freshest figure of the one consumer, not a sum or the max
    assert total["commit_seconds_last"] == 0.3  # the last commit, not the slowest
    assert total["commit_last_sink"] == "fast"  # and its sink
    assert total["naks"] == 0  # every field, reported or not
    # Figures less than a reporting interval apart cannot be ordered: the smallest of them.
    early, late = Worker(4), Worker(5)
    early.report({"messages_in": 1, "lag": 2}, now=1.0)
    late.report({"messages_in": 3, "lag": 12}, now=1.5)
    assert combine_stats([early, late], window=0.1)["lag"] == 12  # early's is older: left out
    assert combine_stats([early, late], window=1.0)["lag"] == 2
    idle.end()  # a worker whose process ended keeps its counts, drops its levels ...
    total = combine_stats([finished, idle, busy])
    assert total["messages_in"] == 85 and total["ack_pending"] == 2 and total["lag"] == 7
    busy.end()
    total = combine_stats([finished, idle, busy])
    assert total["messages_in"] == 85 and total["ack_pending"] == 0 and total["lag"] == 0
    # ... but the final view, once all have ended, shows their last figures.
    total = combine_stats([finished, idle, busy], final=True)
    assert total["messages_in"] == 85 and total["ack_pending"] == 5 and total["lag"] == 7


def test_partitioned_workers_sum_their_lags_and_list_their_partitions() -> None:
    """Workers of a partitioned pipeline read the consumers of their own partitions: their
    lags add up; the partitions each holds are shown, and in the metrics how many."""
    one, two = Worker(0), Worker(1)
    one.report({"messages_in": 10, "lag": 30, "ack_pending": 2}, now=1.0)
    two.report({"messages_in": 20, "lag": 12, "ack_pending": 1}, now=5.0)
    one.holds({"count": 4, "held": [0, 2]})
    two.holds({"count": 4, "held": [1, 3]})
    total = combine_stats([one, two], partitioned=True)
    assert total["lag"] == 42 and total["ack_pending"] == 3 and total["messages_in"] == 30
    assert combine_stats([one, two])["lag"] == 12  # one shared consumer: the freshest
    assert one.status().partitions == (0, 2) and two.status().partitions == (1, 3)
    assert Worker(2).status().partitions is None  # not a partitioned pipeline
    one.end()  # its leases go with it; its counts stay
    assert one.status().partitions == () and one.status().messages_in == 10
    assert combine_stats([one, two], partitioned=True)["lag"] == 12

    held = PartitionsHeld(count=4, held=(1, 3))
    lines = render(Snapshot(pipeline="p", stats=total, states={}, partitions=held)).splitlines()
    assert 'headrace_partitions{pipeline="p"} 4' in lines
    assert 'headrace_partitions_held{pipeline="p"} 2' in lines
    assert "headrace_partitions" not in render(Snapshot(pipeline="p", stats=total, states={}))
    sample = Sample(
        pipeline="p",
        uptime=1.0,
        stats=total,
        states={},
        rate=0.0,
        out_rate=0.0,
        workers=(one.status(), two.status()),
        partitions=held,
    )
    out = io.StringIO()
    PlainLines(out).progress(sample)
    assert " partitions=2/4 partitions_held=1,3" in out.getvalue()
    out = io.StringIO()
    JsonLines(out).progress(sample)
    report = json.loads(out.getvalue())
    assert report["partitions"] == {"count": 4, "held": [1, 3]}
    assert [w["partitions"] for w in report["workers"]] == [[], [1, 3]]
    view = LiveView(io.StringIO())
    view._width = lambda: 200  # type: ignore[method-assign]
    block = view._block(sample)
    assert "  leased             2 of 4 partitions: 1, 3" in block
    [worker] = [line for line in block if line.startswith("    #1 ")]
    assert worker.endswith("partitions 1, 3")


def test_backoff_doubles_and_resets_after_a_healthy_run() -> None:
    backoff = Backoff()
    assert [backoff.delay(1.0) for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert backoff.delay(61.0) == 0.5
    assert backoff.delay(0.1) == 1.0


def test_metrics_of_workers() -> None:
    snap = Snapshot(
        pipeline="p",
        stats=combine_stats([]),
        states={"sink:a": "running"},
        state_counts={"sink:a": {"running": 2, "restarting": 1}},
        workers=3,
        worker_restarts=4,
    )
    lines = render(snap).splitlines()
    assert 'headrace_workers{pipeline="p"} 3' in lines
    assert 'headrace_worker_restarts_total{pipeline="p"} 4' in lines
    assert "# TYPE headrace_worker_restarts_total counter" in lines
    assert 'headrace_actor_state{pipeline="p",actor="sink:a",state="running"} 2' in lines
    assert 'headrace_actor_state{pipeline="p",actor="sink:a",state="restarting"} 1' in lines
    assert 'headrace_actor_state{pipeline="p",actor="sink:a",state="failed"} 0' in lines
    single = render(Snapshot(pipeline="p", stats={}, states={"sink:a": "running"}))
    assert "headrace_workers" not in single


# -- the command ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "0"], "^--workers must be at least 1, not 0$"),
        (["--workers=-3"], "^--workers must be at least 1, not -3$"),
        (["--workers"], "argument --workers: expected one argument"),
        (["--workers", "two"], "argument --workers: invalid int value: 'two'"),
        (["--workers", "2", "--sink", "lake=jsonl"], "has no sink named 'lake'"),
    ],
)
async def test_invalid_workers_and_targets_exit_2_at_once(
    tmp_path: Path, args: list[str], message: str
) -> None:
    """Checked before any worker starts: no other event, the one reason (JSON, as asked)."""
    path = write_pipeline(tmp_path, MEMORY)
    url = f"nats://127.0.0.1:{free_port()}"
    result = await run_headrace("run", str(path), "--nats", url, "--json-logs", *args)
    assert result.returncode == 2
    err = result.stderr.decode()
    [reason] = [json.loads(line) for line in err.splitlines()]
    assert reason["event"] == "exit_reason" and reason["exit_code"] == 2, err
    assert re.search(message, reason["message"]), err
    assert "Traceback" not in err


@pytest.mark.slow  # 2.3 s or more each (worker processes): the full suite runs it
@pytest.mark.parametrize(
    ("source", "message"),
    [
        ('JetStreamSource(stream="ORDERS")', "source 'eph' has no durable consumer"),
        (
            'JetStreamSource(stream="ORDERS", durable="p", pull=False)',
            "source 'eph' is a push consumer",
        ),
    ],
)
async def test_workers_need_a_shared_pull_consumer(
    tmp_path: Path, source: str, message: str
) -> None:
    path = write_pipeline(
        tmp_path,
        f'pipeline = Pipeline("e")\npipeline.source({source}, name="eph").sink(MemorySink())\n',
    )
    url = f"nats://127.0.0.1:{free_port()}"
    result = await run_headrace("run", str(path), "--nats", url, "--workers", "2")
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.startswith(f"headrace run: --workers 2: {message}") and err.count("\n") == 1, err
    # One worker shares with nobody: it starts (and finds no server here).
    result = await run_headrace(
        "run", str(path), "--nats", url, "--workers", "1", "--connect-timeout", "1"
    )
    err = result.stderr.decode()
    assert result.returncode == 2
    assert "headrace run: worker 0: cannot connect to NATS" in err, err


async def test_configuration_error_stops_all_workers_with_exit_2(
    nats_server, tmp_path: Path
) -> None:
    """The stream does not exist: both workers exit 2; none is restarted; the supervisor exits 2
    with the worker's message."""
    path = write_pipeline(tmp_path, MEMORY)
    began = trio.current_time()
    result = await run_headrace(
        "run", str(path), "--nats", nats_server.url, "--workers", "2", "--json-logs", timeout=20
    )
    assert trio.current_time() - began < 10
    assert result.returncode == 2
    lines = result.stderr.decode().splitlines()
    events = [json.loads(line) for line in lines]  # JSON lines only
    [message] = [e["message"] for e in events if e["event"] == "exit_reason" and "worker" not in e]
    assert re.match(r"worker [01]: StreamNotFound: stream not found", message)
    assert "source 'mem' reads stream 'ORDERS'" in message
    assert message.endswith(". Create the stream, or fix the pipeline"), message
    names = [e["event"] for e in events]
    assert "worker_restarting" not in names
    assert names.count("worker_exited") == 2  # each worker ran once
    assert any(e["event"] == "worker_exited" and e.get("exit_code") == 2 for e in events)
    assert events[-1]["event"] == "stopped" and events[-1]["exit_code"] == 2


@pytest.mark.slow
async def test_workers_end_with_their_supervisor(nats_server, natspy, tmp_path: Path) -> None:
    """The supervisor SIGKILLed (no chance to stop anything): its workers end too."""
    await create_stream(natspy, nats_server.url)
    path = write_pipeline(tmp_path, MEMORY)
    async with headrace(
        "run", str(path), "--nats", nats_server.url, "--workers", "2", "--json-logs"
    ) as proc:
        pids = await _started_workers(proc, 2)
        watches = [ProcessWatch(pid) for pid in pids.values()]
        try:
            proc.signal(signal.SIGKILL)
            assert await proc.wait_exit() == -signal.SIGKILL
            for watch in watches:
                await watch.wait_gone(timeout=10)
        finally:
            for watch in watches:
                watch.close()


async def test_workers_get_secrets_through_their_environment_not_their_command_line(
    nats_server_factory, natspy, tmp_path: Path
) -> None:
    """``ps`` shows a process's command line to every user of the host: the URL with its
    password, and ``--token``, reach the workers in their environment, which it does not."""
    auth = user_password_auth(password="pw-not-in-ps-9c1e")
    server = nats_server_factory(auth=auth.config)
    url = f"nats://{auth.user}:{auth.password}@127.0.0.1:{server.port}"
    await create_stream(natspy, url)
    await publish(natspy, 20)
    path = write_pipeline(tmp_path, MEMORY)
    async with headrace("run", str(path), "--nats", url, "--workers", "2", "--json-logs") as proc:
        pids = await _started_workers(proc, 2)
        for pid in pids.values():
            command_line = await trio.Path(f"/proc/{pid}/cmdline").read_bytes()
            assert b"run" in command_line and auth.password.encode() not in command_line
        await wait_consumer(
            natspy, lambda i: i.ack_floor.stream_seq == 20, stream="ORDERS", durable="mem"
        )  # the workers connected with the password they were given
        proc.signal(signal.SIGTERM)
        assert await proc.wait_exit() == 0, proc.transcript()


@pytest.mark.slow
async def test_stdout_passes_through_and_plain_progress_sums(
    nats_server, natspy, tmp_path: Path
) -> None:
    """Records a sink prints reach the supervisor's stdout whole; its plain progress lines show
    the sums and the workers."""
    await create_stream(natspy, nats_server.url)
    path = write_pipeline(tmp_path, MEMORY)
    async with headrace(
        "run",
        str(path),
        "--nats",
        nats_server.url,
        "--workers",
        "2",
        "--sink",
        "out=stdout",
        "--interval",
        "0.1",
    ) as proc:
        first, _ = await proc.wait_line(lambda line: " worker_started " in line)
        await proc.wait_line(lambda line: " worker_started " in line, start=first + 1)
        await publish(natspy, 200)
        await proc.wait_line(lambda _line: True, stream="out", start=199)
        await proc.wait_line(
            lambda line: (
                " progress " in line
                and " in=200 " in line
                and " acks=200 " in line
                and " workers_running=2/2 " in line
            )
        )
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit() == 0
    records = [json.loads(line) for line in proc.out]
    assert sorted(r["stream_seq"] for r in records) == list(range(1, 201))
    assert " stopped " in proc.err[-1] and "exit_code=0" in proc.err[-1]


@pytest.mark.slow  # a few seconds of timers: the full suite runs it
async def test_second_signal_stops_the_workers_hard(nats_server, natspy, tmp_path: Path) -> None:
    await create_stream(natspy, nats_server.url)
    path = write_pipeline(tmp_path, STUCK)
    async with headrace(
        "run",
        str(path),
        "--nats",
        nats_server.url,
        "--workers",
        "2",
        "--json-logs",
        "--interval",
        "0.1",
    ) as proc:
        await _started_workers(proc, 2)
        await publish(natspy, 20)
        # Both workers took some of the messages, which their sink never commits.
        await proc.wait_event("progress", lambda e: all(w["messages_in"] for w in e["workers"]))
        proc.signal(signal.SIGTERM)
        await proc.wait_event("draining", lambda e: "worker" not in e)
        # Each worker drains, waiting for a write that never ends (drain timeout 60 s) ...
        for worker in (0, 1):
            await proc.wait_event("draining", lambda e, w=worker: e.get("worker") == w)
        # A signal within a second of the first is the same request (GNU timeout signals the
        # process and its group): the same signal again at once changes nothing ...
        proc.signal(signal.SIGTERM)
        await proc.wait_event("signal_repeated", lambda e: "worker" not in e)
        await trio.sleep(1.1)  # the window of "the same request": a later signal is another
        proc.signal(signal.SIGINT)
        # ... and the second signal stops them at once.
        assert await proc.wait_exit(timeout=10) == 130
    events = proc.events()
    stopping = [e for e in events if e["event"] == "stopping"]
    [own] = [e for e in stopping if "worker" not in e]
    assert own["signal"] == "SIGINT" and own["hard"] is True
    assert sorted(e["worker"] for e in stopping if "worker" in e) == [0, 1]
    exits = {e["worker"]: e.get("exit_code") for e in events if e["event"] == "worker_exited"}
    assert exits == {0: 143, 1: 143}  # each stopped hard by its second SIGTERM
    assert events[-1]["event"] == "stopped" and events[-1]["exit_code"] == 130
    info = await consumer_info(natspy, "stuck")
    assert info.ack_floor.stream_seq == 0


@pytest.mark.slow  # a few seconds of timers: the full suite runs it
async def test_a_failed_worker_is_restarted_with_backoff(
    nats_server, natspy, tmp_path: Path
) -> None:
    """`--workers 1`: a worker whose pipeline fails (exit 1) is started again, after 0.5 s, then
    1 s; a signal during the backoff ends the run cleanly."""
    await create_stream(natspy, nats_server.url)
    path = write_pipeline(
        tmp_path,
        """\
        def boom(order):
            raise ValueError(f"cannot handle {order}")

        pipeline = Pipeline("fails")
        pipeline.source(
            JetStreamSource(stream="ORDERS", durable="f", config=ConsumerConfig(ack_wait=0.5))
        ).map(boom, on_error="crash").sink(MemorySink())
        """,
    )
    async with headrace(
        "run", str(path), "--nats", nats_server.url, "--workers", "1", "--json-logs"
    ) as proc:
        await proc.wait_event("worker_started")
        await publish(natspy, 1)
        index, first = await proc.wait_event("worker_restarting")
        _, second = await proc.wait_event("worker_restarting", start=index + 1)
        assert (first["delay"], second["delay"]) == (0.5, 1.0)
        proc.signal(signal.SIGTERM)
        assert await proc.wait_exit() == 0
    events = proc.events()
    exits = [e for e in events if e["event"] == "worker_exited"]
    assert [e["exit_code"] for e in exits] == [1, 1]
    assert len({e["pid"] for e in exits}) == 2
    errors = [e for e in events if e["event"] == "error" and e.get("fatal")]
    assert errors and all(e["worker"] == 0 for e in errors)
    assert "ValueError: cannot handle" in errors[0]["error"]
    reasons = [e for e in events if e["event"] == "exit_reason"]
    assert reasons and all(e["worker"] == 0 for e in reasons)
    assert reasons[0]["message"].startswith("pipeline failed: ValueError")
    assert not [e for e in events if e["event"] == "worker_stderr"]
    assert events[-1]["event"] == "stopped" and events[-1]["exit_code"] == 0
    assert events[-1]["restarts"] == 1  # the second restart was still waiting out its delay


@pytest.mark.slow
async def test_three_workers_share_one_durable_consumer(
    nats_server, natspy, tmp_path: Path
) -> None:
    n = 3000
    await create_stream(natspy, nats_server.url)
    out = tmp_path / "out"
    path = _scaled(tmp_path, out, delay=0.005, ack_wait=30)
    async with headrace(
        "run",
        str(path),
        "--nats",
        nats_server.url,
        "--workers",
        "3",
        "--json-logs",
        "--interval",
        "0.1",
    ) as proc:
        pids = await _started_workers(proc, 3)
        assert sorted(pids) == [0, 1, 2] and len(set(pids.values())) == 3
        await publish(natspy, n)  # once all three pull: each gets a share
        await wait_consumer(
            natspy,
            lambda i: i.ack_floor.stream_seq == n and i.num_ack_pending == 0,
            stream="ORDERS",
            durable="lake",
            timeout=60,
        )
        proc.signal(signal.SIGTERM)
        assert await proc.wait_exit() == 0
    progress, stopped = _final(proc)
    assert stopped["exit_code"] == 0 and stopped["restarts"] == 0
    stats = stopped["stats"]
    assert stats["records_out"] == n and stats["messages_in"] >= n and stats["acks"] >= n
    assert stats["ack_pending"] == 0 and stats["lag"] == 0  # the last message left none
    workers = progress["workers"]
    assert [w["index"] for w in workers] == [0, 1, 2]
    assert {w["state"] for w in workers} == {"exited"}
    assert sum(w["messages_in"] for w in workers) == progress["stats"]["messages_in"]
    assert all(w["messages_in"] > 0 for w in workers), workers  # every worker took some
    # Every message written exactly once, in the one directory the workers share.
    seqs = collections.Counter(r["stream_seq"] for r in read_jsonl(out))
    assert sorted(seqs) == list(range(1, n + 1)) and set(seqs.values()) == {1}
    events = proc.events()
    drained = {e["worker"] for e in events if e["event"] == "draining" and "worker" in e}
    assert drained == {0, 1, 2}
    exits = [e for e in events if e["event"] == "worker_exited"]
    assert sorted((e["worker"], e["exit_code"]) for e in exits) == [(0, 0), (1, 0), (2, 0)]


@pytest.mark.slow
async def test_a_killed_worker_is_restarted(nats_server, natspy, tmp_path: Path) -> None:
    n = 2000
    await create_stream(natspy, nats_server.url)
    out = tmp_path / "out"
    # Deliveries the killed worker held come back after 2 s.
    path = _scaled(tmp_path, out, delay=0.05, ack_wait=2.0)
    async with headrace(
        "run",
        str(path),
        "--nats",
        nats_server.url,
        "--workers",
        "2",
        "--json-logs",
        "--interval",
        "0.1",
    ) as proc:
        pids = await _started_workers(proc, 2)
        await publish(natspy, n)
        index, _ = await proc.wait_event("progress", lambda e: e["stats"]["batches_committed"] >= 4)
        os.kill(pids[0], signal.SIGKILL)
        index, exited = await proc.wait_event(
            "worker_exited", lambda e: e["worker"] == 0, start=index
        )
        assert exited["pid"] == pids[0] and exited["signal"] == "SIGKILL"
        index, restarting = await proc.wait_event(
            "worker_restarting", lambda e: e["worker"] == 0, start=index
        )
        assert restarting["delay"] == 0.5
        _, again = await proc.wait_event("worker_started", lambda e: e["worker"] == 0, start=index)
        assert again["pid"] != pids[0]
        await wait_consumer(
            natspy,
            lambda i: i.ack_floor.stream_seq == n and i.num_ack_pending == 0,
            stream="ORDERS",
            durable="lake",
            timeout=60,
        )
        proc.signal(signal.SIGTERM)
        assert await proc.wait_exit() == 0
    progress, stopped = _final(proc)
    # (The sums may miss what the killed worker did after its last report: not checked here.)
    assert stopped["exit_code"] == 0 and stopped["restarts"] == 1
    assert [w["restarts"] for w in progress["workers"]] == [1, 0]
    info = await consumer_info(natspy, "lake")
    assert info.num_pending == 0 and info.num_ack_pending == 0
    # Every message written exactly once: what the killed worker committed and had not acked
    # came again and was found committed (the shared commit state), not written twice.
    seqs = collections.Counter(r["stream_seq"] for r in read_jsonl(out))
    assert sorted(seqs) == list(range(1, n + 1)) and set(seqs.values()) == {1}


@pytest.mark.slow
async def test_one_metrics_endpoint_sums_the_workers(nats_server, natspy, tmp_path: Path) -> None:
    """Counters are sums over the workers, and keep the counts of a worker that was killed and
    restarted (its new process counts from 0)."""
    await create_stream(natspy, nats_server.url)
    path = write_pipeline(tmp_path, MEMORY)
    p = 'pipeline="mem"'
    async with headrace(
        "run",
        str(path),
        "--nats",
        nats_server.url,
        "--workers",
        "2",
        "--metrics-port",
        "0",
        "--json-logs",
        "--interval",
        "0.1",
    ) as proc:
        _, metrics = await proc.wait_event("metrics")
        port = metrics["port"]
        await _started_workers(proc, 2)
        await publish(natspy, 500)
        index, progress = await proc.wait_event(
            "progress", lambda e: e["stats"]["acks"] == 500 and e["stats"]["ack_pending"] == 0
        )
        samples = await metrics_samples(port)
        assert samples[f"headrace_messages_total{{{p}}}"] == 500
        assert samples[f"headrace_acks_total{{{p}}}"] == 500
        assert samples[f"headrace_records_committed_total{{{p}}}"] == 500
        assert samples[f"headrace_workers{{{p}}}"] == 2
        assert samples[f"headrace_worker_restarts_total{{{p}}}"] == 0
        assert samples[f'headrace_actor_state{{{p},actor="sink:out",state="running"}}'] == 2

        # Kill a worker that took messages: its counts must stay in the totals.
        victim = next(w for w in progress["workers"] if w["messages_in"] > 0)
        os.kill(victim["pid"], signal.SIGKILL)
        _, again = await proc.wait_event(
            "worker_started", lambda e: e["worker"] == victim["index"], start=index
        )
        assert again["pid"] != victim["pid"]
        await publish(natspy, 100, start=500)
        await proc.wait_event("progress", lambda e: e["stats"]["acks"] >= 600)
        samples = await metrics_samples(port)
        assert samples[f"headrace_acks_total{{{p}}}"] >= 600
        assert samples[f"headrace_messages_total{{{p}}}"] >= 600
        assert samples[f"headrace_worker_restarts_total{{{p}}}"] == 1
        assert samples[f"headrace_workers{{{p}}}"] == 2
        proc.signal(signal.SIGTERM)
        assert await proc.wait_exit() == 0
    _, stopped = _final(proc)
    assert stopped["exit_code"] == 0 and stopped["stats"]["acks"] >= 600
