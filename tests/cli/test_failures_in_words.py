"""`headrace run` says every failure in words: operator and sink errors with their text, actor,
stream and sequence (rate-limited), connection events, JSON lines that stay JSON whatever fails,
and never a password or token from a server URL.

Real nats-server processes throughout; every wait is for an event (a line, an exit, a scrape).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from headrace.cli.failures import FailureEvents
from headrace.nats.servers import ServerAddress, redact_url
from headrace.pipeline.stats import PipelineStats

from tests.cli.cli_support import (
    create_stream,
    headrace,
    metrics_samples,
    publish,
    run_headrace,
    write_pipeline,
)
from tests.servers import UserPasswordAuth, free_port, user_password_auth

N = 30
NAME_ERROR = "NameError: name 'undefined_name' is not defined"

#: A filter with a bug: every record fails. Two deliveries each, then the dead letter.
BUGGY = """\
def bad(order):
    return undefined_name > 3

pipeline = Pipeline(
    "words", nak_delay=0.01, nak_delay_max=0.01, max_deliveries=2, dead_letter="dlq.words"
)
pipeline.source(JetStreamSource(stream="ORDERS", durable="words")).map(json.loads).filter(
    bad
).sink(MemorySink(), name="out", batch=BatchPolicy(max_messages=10, max_age=0.1))
"""

MEMORY = """\
pipeline = Pipeline("mem")
pipeline.source(JetStreamSource(stream="ORDERS", durable="mem")).map(json.loads).sink(
    MemorySink(), name="out", batch=BatchPolicy(max_messages=10, max_age=0.1)
)
"""


def _plain_fields(line: str) -> dict[str, str]:
    return {k: v.strip('"') for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', line)}


def _ts(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()


async def _buggy_run(nats_server: Any, natspy: Any, tmp_path: Path) -> Path:
    await create_stream(natspy, nats_server.url)
    await create_stream(natspy, nats_server.url, "DLQ")
    await publish(natspy, N)
    return write_pipeline(tmp_path, BUGGY)


# -- 1. operator and sink failures ------------------------------------------------------------


async def test_a_buggy_filter_is_said_in_words_rate_limited_and_counted(
    nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    """Before: ``errors=60`` and nothing else. Now: the NameError's text, the actor, the stream
    and sequence; at most one event per actor per second, the rest counted in ``suppressed``;
    per-actor counts in the stats and the metrics."""
    path = await _buggy_run(nats_server, natspy, tmp_path)
    async with headrace(
        "run",
        str(path),
        "--nats",
        nats_server.url,
        "--json-logs",
        "--interval",
        "0.2",
        "--metrics-port",
        "0",
    ) as proc:
        _, announced = await proc.wait_event("metrics")
        _, progress = await proc.wait_event("progress", lambda e: e["stats"]["dead_lettered"] == N)
        samples = await metrics_samples(announced["port"])
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit() == 0, proc.transcript()
    events = proc.events()  # every line is JSON
    stats = progress["stats"]
    assert stats["errors"] == 2 * N and stats["terms"] == N, stats
    assert stats["failures"] == {"filter:bad": {"NameError": 2 * N}}
    assert stats["connected"] == 1 and stats["reconnects"] == 0

    errors = [e for e in events if e["event"] == "error"]
    assert errors, proc.transcript()
    for e in errors:
        assert e["actor"] == "filter:bad" and e["stage"] == "bad", e
        assert e["error"] == NAME_ERROR and e["fatal"] is False, e
        assert e["stream"] == "ORDERS" and 1 <= e["seq"] <= N and e["delivered"] in (1, 2), e
    # Every failure shown or counted; most of them counted (30 fail in one batch at once).
    assert sum(1 + e["suppressed"] for e in errors) == 2 * N
    assert len(errors) < N
    # One a second at most: the last may come sooner, said when the run ends.
    gaps = [_ts(b) - _ts(a) for a, b in itertools.pairwise(errors)]
    assert all(gap >= 0.9 for gap in gaps[:-1]), gaps

    p = 'pipeline="words"'
    assert samples[f'headrace_failures_total{{{p},actor="filter:bad",error="NameError"}}'] == 2 * N
    assert samples[f"headrace_errors_total{{{p}}}"] == 2 * N
    assert samples[f"headrace_dead_lettered_total{{{p}}}"] == N
    assert samples[f"headrace_terms_total{{{p}}}"] == N
    assert samples[f"headrace_terminated_unkept_total{{{p}}}"] == 0
    assert samples[f"headrace_connected{{{p}}}"] == 1
    assert samples[f"headrace_reconnects_total{{{p}}}"] == 0


async def test_plain_lines_say_the_error_and_the_poison_counters(
    nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    path = await _buggy_run(nats_server, natspy, tmp_path)
    async with headrace("run", str(path), "--nats", nats_server.url, "--interval", "0.2") as proc:

        def done(line: str) -> bool:
            fields = _plain_fields(line)
            return " progress " in line and fields.get("dead_lettered") == str(N)

        _, line = await proc.wait_line(done)
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit() == 0, proc.transcript()
    fields = _plain_fields(line)
    assert fields["terms"] == str(N) and fields["errors"] == str(2 * N), line
    assert fields["terminated_unkept"] == "0" and fields["retrying"] == "0", line
    assert fields["sink_retries"] == "0" and fields["dropped"] == "0", line
    assert fields["connected"] == "1" and fields["reconnects"] == "0", line
    said = [_plain_fields(x) for x in proc.err if " error " in x]
    assert said, proc.transcript()
    first = said[0]
    assert first["actor"] == "filter:bad" and first["error"] == NAME_ERROR, first
    assert first["stream"] == "ORDERS" and 1 <= int(first["seq"]) <= N, first


WARNING = """\
import warnings


class Warns(MemorySink):
    async def write_batch(self, batch):
        warnings.warn("the lake is slow today", RuntimeWarning)
        await super().write_batch(batch)


pipeline = Pipeline("warns")
pipeline.source(JetStreamSource(stream="ORDERS", durable="warns")).sink(Warns(), name="out")
"""


@pytest.mark.slow
async def test_a_warning_is_an_event_line(nats_server: Any, natspy: Any, tmp_path: Path) -> None:
    """Issue 23: a warning given while the run went on (the framework's, while the server was
    away) was printed as Python's two raw lines between the progress lines."""
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 5)
    path = write_pipeline(tmp_path, WARNING)
    async with headrace("run", str(path), "--nats", nats_server.url) as proc:
        _, line = await proc.wait_line(lambda line: " warning " in line)
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit() == 0, proc.transcript()
    fields = _plain_fields(line)
    assert fields["pipeline"] == "warns" and fields["category"] == "RuntimeWarning", line
    assert fields["message"] == "the lake is slow today", line
    assert not [x for x in proc.err if "RuntimeWarning:" in x or "warnings.warn" in x]


async def test_the_live_view_shows_the_last_error_and_the_connection(
    nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    path = await _buggy_run(nats_server, natspy, tmp_path)
    async with headrace(
        "run", str(path), "--nats", nats_server.url, "--interval", "0.1", stderr_terminal=True
    ) as proc:
        _, last = await proc.wait_line(lambda line: line.startswith("  last "))
        await proc.wait_line(lambda line: line.startswith("  nats    connected   reconnects 0"))
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit() == 0, proc.transcript()
    assert re.fullmatch(
        r"  last    \d\d:\d\d:\d\d filter:bad: " + re.escape(NAME_ERROR) + r" \(ORDERS #\d+.*",
        last,
    ), last


async def test_a_failed_sink_write_names_its_batch(
    nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 10)
    path = write_pipeline(
        tmp_path,
        """\
        pipeline = Pipeline("flaky")
        pipeline.source(JetStreamSource(stream="ORDERS", durable="flaky")).sink(
            MemorySink(fail_times=1), name="out", batch=BatchPolicy(max_messages=10, max_age=5)
        )
        """,
    )
    async with headrace(
        "run", str(path), "--nats", nats_server.url, "--json-logs", "--interval", "0.1"
    ) as proc:
        await proc.wait_event("progress", lambda e: e["stats"]["acks"] == 10)
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit() == 0
    [error] = [e for e in proc.events() if e["event"] == "error"]  # said once
    assert error["actor"] == "sink:out" and error["stage"] == "out"
    assert error["error"].startswith("RuntimeError: MemorySink: injected failure #1")
    assert (error["stream"], error["seq"], error["records"]) == ("ORDERS", 1, 10)
    assert error["suppressed"] == 0 and error["fatal"] is False


# -- 2. and 4. connection events; no credentials anywhere -------------------------------------


def _url_with(auth: UserPasswordAuth, server: Any, password: str | None = None) -> str:
    return f"nats://{auth.user}:{password or auth.password}@127.0.0.1:{server.port}"


def _assert_never_shown(secret: str, *texts: str | bytes) -> None:
    for text in texts:
        shown = text.decode() if isinstance(text, bytes) else text
        assert secret not in shown, shown


@pytest.mark.slow
async def test_a_server_going_away_and_back_is_said_and_counted(
    nats_server_factory: Any, natspy: Any, tmp_path: Path
) -> None:
    """Disconnected, reconnected, lame duck: events, the live figures, metrics; and the password
    in the URL given is in none of it."""
    auth = user_password_auth(password="pw-never-shown-7f3a")
    server = nats_server_factory(auth=auth.config)
    url = _url_with(auth, server)
    await create_stream(natspy, url)
    await publish(natspy, 10)
    await natspy.call(natspy.nc.close)  # the lame duck server then has only headrace to close
    path = write_pipeline(tmp_path, MEMORY)
    shown = f"nats://127.0.0.1:{server.port}"
    scrapes: list[str] = []
    async with headrace(
        "run",
        str(path),
        "--nats",
        url,
        "--json-logs",
        "--interval",
        "0.1",
        "--metrics-port",
        "0",
    ) as proc:
        _, announced = await proc.wait_event("metrics")
        port = announced["port"]
        _, started = await proc.wait_event("started")
        assert started["server"] == shown
        at, _ = await proc.wait_event("progress", lambda e: e["stats"]["acks"] == 10)

        async def scrape() -> dict[str, float]:
            samples = await metrics_samples(port)
            scrapes.append(json.dumps(samples))
            return samples

        p = 'pipeline="mem"'
        assert (await scrape())[f"headrace_connected{{{p}}}"] == 1

        server.stop()
        at, lost = await proc.wait_event("disconnected", start=at)
        assert lost["server"] == shown and lost["error"], lost
        assert (await scrape())[f"headrace_connected{{{p}}}"] == 0
        server.start()
        at, back = await proc.wait_event("reconnected", start=at)
        assert back["server"] == shown and back["after"] > 0, back
        samples = await scrape()
        assert samples[f"headrace_connected{{{p}}}"] == 1
        assert samples[f"headrace_reconnects_total{{{p}}}"] == 1
        _, progress = await proc.wait_event(
            "progress", lambda e: e["stats"]["reconnects"] == 1, start=at
        )
        assert progress["stats"]["connected"] == 1

        server.lame_duck()
        at, duck = await proc.wait_event("lame_duck", start=at)
        assert duck["server"] == shown
        at, _ = await proc.wait_event("disconnected", start=at)  # it closes us, then exits
        server.wait_exited()
        server.start()
        at, _ = await proc.wait_event("reconnected", start=at)
        assert (await scrape())[f"headrace_reconnects_total{{{p}}}"] == 2
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit() == 0, proc.transcript()
    proc.events()  # all JSON
    assert scrapes
    _assert_never_shown(auth.password, *proc.err, *proc.out, *scrapes)


async def _refusing_acks(
    nats_server_factory: Any, natspy: Any, tmp_path: Path, password: str
) -> tuple[str, Path]:
    """A server whose user ``acker`` may not publish acks, 20 orders on it, and a pipeline
    file: the URL (with the password) and the file."""
    config = (
        "authorization {\n  users: [\n"
        f'    {{ user: "acker", password: "{password}", permissions: {{\n'
        '        publish: { deny: ["$JS.ACK.>"] }\n'
        "    } }\n  ]\n}\n"
    )
    server = nats_server_factory(auth=config)
    url = f"nats://acker:{password}@127.0.0.1:{server.port}"
    await create_stream(natspy, url)
    await publish(natspy, 20)
    return url, write_pipeline(tmp_path, MEMORY)


async def test_a_server_error_is_said(
    nats_server_factory: Any, natspy: Any, tmp_path: Path
) -> None:
    """The server refuses our acks (a permission the user lacks): ``server_error`` events, at
    most one a second, with the server's words. (What the pipeline then does is not this
    test's business: it may stop on its own, or drain at the signal.)"""
    password = "acker-secret-9c1d"
    url, path = await _refusing_acks(nats_server_factory, natspy, tmp_path, password)
    async with headrace("run", str(path), "--nats", url, "--json-logs") as proc:
        _, refused = await proc.wait_event("server_error")
        proc.signal(signal.SIGINT)
        await proc.wait_exit()
    assert refused["error"].startswith("PermissionViolation: "), refused
    assert "$JS.ACK." in refused["error"] and refused["suppressed"] == 0  # the first, at once
    said = [e for e in proc.events() if e["event"] == "server_error"]
    assert all(e["error"].startswith("PermissionViolation: ") for e in said), said
    gaps = [_ts(b) - _ts(a) for a, b in itertools.pairwise(said)]
    assert all(gap >= 0.9 for gap in gaps[:-1]), gaps  # one a second, the last said at the end
    _assert_never_shown(password, *proc.err, *proc.out)


async def test_refused_acks_stop_the_run_as_a_configuration_error(
    nats_server_factory: Any, natspy: Any, tmp_path: Path
) -> None:
    """Acks the user may not send would be redelivered for ever: the run stops by itself, with
    exit code 2 (a restart, by a supervisor or --workers, would be refused the same way)."""
    password = "acker-secret-2b7e"
    url, path = await _refusing_acks(nats_server_factory, natspy, tmp_path, password)
    async with headrace("run", str(path), "--nats", url, "--json-logs") as proc:
        assert await proc.wait_exit() == 2, proc.transcript()
    fatal = [e for e in proc.events() if e["event"] == "error" and e.get("fatal")]
    assert fatal and fatal[-1]["error"].startswith("AckRefused: "), fatal
    assert [e["exit_code"] for e in proc.events() if e["event"] == "stopped"] == [2]
    _assert_never_shown(password, *proc.err, *proc.out)


@pytest.mark.slow
async def test_credentials_are_never_shown_when_connecting_fails(
    nats_server_factory: Any, tmp_path: Path
) -> None:
    auth = user_password_auth(password="right-secret-41ab")
    server = nats_server_factory(auth=auth.config)
    path = write_pipeline(tmp_path, MEMORY)
    wrong = "wrong-secret-5e02"
    runs = {
        # a wrong password, in the URL and as an option
        "wrong password": (
            ["--nats", _url_with(auth, server, wrong)],
            f"nats://{auth.user}:***@127.0.0.1:{server.port}",
        ),
        "wrong --password": (
            [
                "--nats",
                f"nats://127.0.0.1:{server.port}",
                "--user",
                auth.user,
                f"--password={wrong}",
            ],
            "Authorization Violation",
        ),
        # a token for a server that is not there, and a URL that does not parse
        "unreachable": (
            ["--nats", f"nats://{wrong}@127.0.0.1:{free_port()}", "--connect-timeout", "1"],
            "nats://***@127.0.0.1:",
        ),
        "bad port": (["--nats", f"nats://{auth.user}:{wrong}@127.0.0.1:port"], ":***@127"),
        # through a supervisor, which relays its worker's message
        "worker": (
            ["--nats", _url_with(auth, server, wrong), "--workers", "1"],
            f"worker 0: cannot connect to NATS (nats://{auth.user}:***@",
        ),
    }
    for name, (args, expected) in runs.items():
        for logs in ([], ["--json-logs"]):
            result = await run_headrace("run", str(path), *args, *logs)
            err = result.stderr.decode()
            assert result.returncode == 2, (name, logs, err)
            assert expected in err, (name, logs, err)
            _assert_never_shown(wrong, result.stdout, err)
            _assert_never_shown(auth.password, result.stdout, err)


# -- 3. --json-logs: JSON lines, whatever fails -----------------------------------------------

#: A pipeline whose module warns, logs (as py4j would), prints to stderr, starts a thread that
#: fails, and whose operator raises what is not an Exception: it escapes `headrace run`.
NOISY = """\
import logging
import sys
import threading
import warnings

logging.basicConfig()
warnings.warn("an old API")
logging.getLogger("py4j.java_gateway").warning("gateway noise from py4j")
print("a stray line", file=sys.stderr)


class Fatal(BaseException):
    pass


def boom(order):
    helper = threading.Thread(target=lambda: 1 / 0, name="helper")
    helper.start()
    helper.join()
    logging.getLogger("mine").error("about to fail", exc_info=ValueError("inner"))
    raise Fatal("not an Exception")


pipeline = Pipeline("noisy")
pipeline.source(JetStreamSource(stream="ORDERS", durable="noisy")).map(
    boom, on_error="crash"
).sink(MemorySink())
"""


def _json_lines(result: Any) -> list[dict[str, Any]]:
    """Every line of stdout and stderr, parsed; anything that is not a JSON object fails."""
    found = []
    for stream in (result.stdout, result.stderr):
        for line in stream.decode().splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                raise AssertionError(f"not JSON: {line!r}\n{result.stderr.decode()}") from None
            assert isinstance(obj, dict) and "event" in obj and "ts" in obj, line
            found.append(obj)
    return found


@pytest.mark.slow
async def test_json_logs_stay_json_whatever_fails(
    nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 1)
    path = write_pipeline(tmp_path, MEMORY)
    noisy = write_pipeline(tmp_path, NOISY, name="noisy.py")
    nostream = write_pipeline(tmp_path, MEMORY.replace('"ORDERS"', '"MISSING"'), "nostream.py")
    dead = f"nats://127.0.0.1:{free_port()}"
    failing = {
        "usage": (["run", str(path), "--json-logs", "--interval"], 2),
        "option": (["run", str(path), "--json-logs", "--interval", "0", "--nats", dead], 2),
        "target": (["run", f"{tmp_path}/missing.py", "--json-logs"], 2),
        "no server": (["run", str(path), "--json-logs", "--nats", dead], 2),
        "no stream": (["run", str(nostream), "--json-logs", "--nats", nats_server.url], 2),
        "worker": (["run", str(path), "--json-logs", "--nats", dead, "--workers", "1"], 2),
        "uncaught": (["run", str(noisy), "--json-logs", "--nats", nats_server.url], 1),
    }
    said: dict[str, list[dict[str, Any]]] = {}
    reason: dict[str, str] = {}
    for name, (args, code) in failing.items():
        result = await run_headrace(*args, cwd=tmp_path)
        assert result.returncode == code, (name, result.stderr.decode())
        said[name] = _json_lines(result)
        if name == "uncaught":
            continue
        # (a worker's own reason is relayed too, with its index)
        [why] = [e for e in said[name] if e["event"] == "exit_reason" and "worker" not in e]
        assert why["exit_code"] == code
        reason[name] = why["message"]
    assert "expected one argument" in reason["usage"]
    assert reason["option"] == "--interval must be positive"
    assert "missing.py" in reason["target"]
    assert reason["no server"].startswith("cannot connect to NATS")
    assert reason["no stream"].startswith("StreamNotFound")
    assert reason["worker"].startswith("worker 0: cannot connect to NATS")
    assert said["worker"][-1]["event"] == "stopped"

    events = said["uncaught"]
    kinds = {e["event"] for e in events}
    assert {"warning", "log", "stderr", "error"} <= kinds, events
    [warned] = [e for e in events if e["event"] == "warning"]
    assert warned["category"] == "UserWarning" and warned["message"] == "an old API"
    text = json.dumps(events)
    assert "gateway noise from py4j" in text and "a stray line" in text
    [mine] = [e for e in events if e["event"] == "log" and e["logger"] == "mine"]
    assert mine["level"] == "ERROR" and "ValueError: inner" in mine["traceback"]
    [thread] = [e for e in events if e.get("thread") == "helper"]
    assert thread["error"] == "ZeroDivisionError: division by zero"
    [uncaught] = [e for e in events if e.get("uncaught")]
    assert uncaught["error"] == "Fatal: not an Exception" and uncaught["fatal"] is True
    assert "Traceback (most recent call last)" in uncaught["traceback"]


# -- the parts, alone ---------------------------------------------------------------------------


def test_redact_url() -> None:
    assert redact_url("nats://alice:s3cret@host:4222") == "nats://alice:***@host:4222"
    assert redact_url("nats://tok3n@host") == "nats://***@host"
    assert redact_url("tls://a:b:c@host") == "tls://a:***@host"
    assert redact_url("alice:pw/with/slash@host") == "alice:***@host"
    assert redact_url("nats://host:4222") == "nats://host:4222"
    address = ServerAddress.parse("nats://alice:s3cret@host")
    assert "s3cret" not in repr(address) and "s3cret" not in str(address)
    assert "tok3n" not in repr(ServerAddress.parse("nats://tok3n@host"))
    with pytest.raises(ValueError, match=r"'nats://alice:\*\*\*@host:x': invalid port") as info:
        ServerAddress.parse("nats://alice:s3cret@host:x")
    assert "s3cret" not in str(info.value)


def test_failure_events_show_or_count_every_failure() -> None:
    now = [0.0]
    said: list[dict[str, Any]] = []
    events = FailureEvents(lambda event, **fields: said.append(fields), lambda: now[0])
    stats = PipelineStats(on_failure=events)
    for i in range(5):
        now[0] = i * 0.1  # five within the first second
        stats.failure("map:parse", "parse", KeyError("id"))
    stats.failure("sink:lake", "lake", OSError("disk full"))
    assert [(e["actor"], e["suppressed"]) for e in said] == [
        ("map:parse", 0),
        ("sink:lake", 0),
    ]
    events.flush()  # not a second yet since the last shown
    assert len(said) == 2 and events.held == 4
    now[0] = 1.0
    events.flush()
    assert said[-1]["actor"] == "map:parse" and said[-1]["suppressed"] == 3
    now[0] = 1.5
    stats.failure("map:parse", "parse", KeyError("id"))  # within a second of the flushed one
    events.flush(final=True)
    assert said[-1]["suppressed"] == 0 and events.held == 0
    shown = [e for e in said if e["actor"] == "map:parse"]
    assert sum(1 + e["suppressed"] for e in shown) == 6
    assert said[0]["error"] == "KeyError: 'id'" and stats.errors == 7
    assert stats.failures == {"map:parse": {"KeyError": 6}, "sink:lake": {"OSError": 1}}
    assert "last_failure" not in stats.snapshot()


def test_workers_sum_failures_and_connections() -> None:
    """With --workers, the supervisor's stats add the workers' failures actor by actor and type
    by type (a finished process's too), and count the workers connected."""
    from headrace.cli.workers import Worker, combine_stats

    gone = Worker(0)
    gone.report({"errors": 3, "failures": {"map:parse": {"KeyError": 3}}, "connected": 1}, 0.0)
    gone.end()  # its counts are carried over; its connection is gone with it
    gone.report({"errors": 1, "failures": {"map:parse": {"ValueError": 1}}, "connected": 0}, 1.0)
    other = Worker(1)
    other.report(
        {"errors": 2, "failures": {"map:parse": {"KeyError": 2}}, "connected": 1, "reconnects": 1},
        1.0,
    )
    total = combine_stats([gone, other])
    assert total["failures"] == {"map:parse": {"KeyError": 5, "ValueError": 1}}
    assert total["errors"] == 6 and total["connected"] == 1 and total["reconnects"] == 1
