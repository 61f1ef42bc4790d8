"""`headrace run` as a process against a real nats-server: progress (plain, JSON), signals and
drain, exit codes, metrics, overrides, connection options and errors.

Every wait is for an event: a line the process prints, its exit, or a nats-py answer.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.shutdown import SAME_REQUEST_WINDOW

from tests.cli.cli_support import (
    consumer_info,
    create_stream,
    headrace,
    publish,
    read_jsonl,
    run_headrace,
    write_pipeline,
)
from tests.servers import free_port, token_auth, user_password_auth

MEMORY = """\
pipeline = Pipeline("mem")
pipeline.source(JetStreamSource(stream="ORDERS", durable="mem")).map(json.loads).sink(
    MemorySink(), name="out", batch=BatchPolicy(max_messages=10, max_age=0.2)
)
"""

#: One batch that only a drain cuts (no size or age limit is reached).
DRAIN = """\
def make(out):
    pipe = Pipeline("drain")
    pipe.source(JetStreamSource(stream="ORDERS", durable="drain")).sink(
        JsonlSink(out), name="files", batch=BatchPolicy(max_messages=1000, max_age=3600)
    )
    return pipe

pipeline = make(OUT)
"""

#: A sink whose writes never finish: a drain cannot complete.
STUCK = """\
class Stuck:
    async def write_batch(self, batch):
        await trio.sleep_forever()

pipeline = Pipeline("stuck", drain_timeout=60)
pipeline.source(JetStreamSource(stream="ORDERS", durable="stuck")).sink(
    Stuck(), name="stuck", batch=BatchPolicy(max_messages=5, max_age=0.1)
)
"""


def _plain_fields(line: str) -> dict[str, str]:
    """``key=value`` fields of a plain progress line."""
    return dict(re.findall(r"(\w+)=(\S+)", line))


def _progress_with(**expected: int) -> object:
    def check(line: str) -> bool:
        if " progress " not in line:
            return False
        fields = _plain_fields(line)
        return all(fields.get(k) == str(v) for k, v in expected.items())

    return check


async def test_plain_progress_and_sigint(nats_server, natspy, tmp_path: Path) -> None:
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 50)
    path = write_pipeline(tmp_path, MEMORY)
    async with headrace(
        "run", f"{path}:pipeline", "--nats", nats_server.url, "--interval", "0.1"
    ) as proc:
        _, started = await proc.wait_line(lambda line: " started " in line)
        assert "pipeline=mem" in started
        assert f"server={nats_server.url}" in started
        # Not a terminal: plain lines, one per interval.
        _, line = await proc.wait_line(_progress_with(acks=50, ack_pending=0, lag=0))
        fields = _plain_fields(line)
        assert line[:4].isdigit() and line.split()[1] == "progress"
        assert fields["pipeline"] == "mem"
        assert fields["in"] == "50" and fields["out"] == "50" and fields["skipped"] == "0"
        assert fields["commit_sink"] == "out" and fields["redelivered_held"] == "0"
        assert int(fields["batches"]) >= 5
        assert fields["errors"] == "0" and fields["naks"] == "0"
        assert re.fullmatch(r"\d+\.\d/s", fields["rate"])
        assert re.fullmatch(r"(\d+)/\1", fields["actors_running"]), line
        proc.signal(signal.SIGINT)
        await proc.wait_line(lambda line: " draining " in line and "signal=SIGINT" in line)
        assert await proc.wait_exit() == 0
    assert " stopped " in proc.err[-1] and "exit_code=0" in proc.err[-1]
    assert proc.out == []  # stdout is left to sinks
    assert not any("Traceback" in line for line in proc.err)


async def test_json_logs(nats_server, natspy, tmp_path: Path) -> None:
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 30)
    path = write_pipeline(tmp_path, MEMORY)
    async with headrace(
        "run", str(path), "--nats", nats_server.url, "--json-logs", "--interval", "0.1"
    ) as proc:
        _, started = await proc.wait_event("started")
        assert started["pipeline"] == "mem"
        assert started["sources"] == ["ORDERS/mem (pull)"]
        assert started["sinks"] == ["out"]
        _, progress = await proc.wait_event("progress", lambda e: e["stats"]["acks"] == 30)
        stats = progress["stats"]
        assert stats["messages_in"] == 30 and stats["records_out"] == 30
        assert stats["ack_pending"] == 0 and stats["lag"] == 0
        assert stats["batches_committed"] >= 3
        assert set(stats) >= {"redeliveries", "naks", "errors", "commit_seconds_total"}
        states = progress["states"]
        assert states["sink:out"] == "running"
        assert states["connection-supervisor"] == "running"
        assert states["consume-buffer:ORDERS/mem"] == "running"
        assert set(states.values()) == {"running"}
        assert isinstance(progress["rate"], float) and progress["draining"] is False
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit() == 0
    events = proc.events()  # every line is JSON
    names = [e["event"] for e in events]
    assert names[0] == "started" and names[-1] == "stopped"
    assert set(names) == {"started", "progress", "draining", "stopped"}
    assert all(e["pipeline"] == "mem" and e["ts"].endswith("Z") for e in events)
    draining = events[names.index("draining")]
    assert draining["signal"] == "SIGINT"
    final = events[-1]
    assert final["exit_code"] == 0 and final["stats"]["acks"] == 30
    last_progress = [e for e in events if e["event"] == "progress"][-1]
    assert set(last_progress["states"].values()) <= {"stopped", "running"}


async def test_sigint_drains_open_batches(nats_server, natspy, tmp_path: Path) -> None:
    """The batch is open when SIGINT comes (no limit reached): the drain cuts it, the sink
    commits it and every message is acked before the process exits 0."""
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 200)
    out = tmp_path / "out"
    path = write_pipeline(tmp_path, f"OUT = {str(out)!r}\n" + DRAIN)
    async with headrace(
        "run", f"{path}:pipeline", "--nats", nats_server.url, "--interval", "0.1"
    ) as proc:
        await proc.wait_line(_progress_with(**{"in": 200, "ack_pending": 200, "acks": 0}))
        info = await consumer_info(natspy, "drain")
        assert info.num_ack_pending == 200 and info.ack_floor.stream_seq == 0
        assert read_jsonl(out) == []
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit() == 0
    info = await consumer_info(natspy, "drain")
    assert info.num_ack_pending == 0
    assert info.num_pending == 0
    assert info.delivered.stream_seq == info.ack_floor.stream_seq == 200
    lines = read_jsonl(out)
    assert sorted(line["stream_seq"] for line in lines) == list(range(1, 201))
    assert [json.loads(line["value"])["id"] for line in lines] == list(range(200))
    assert _plain_fields(proc.err[-2])["acks"] == "200"  # the last progress line


def _event_time(event: dict[str, Any]) -> float:
    """When a JSON event was written (its ``ts``), as a Unix time."""
    return dt.datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()


@pytest.mark.slow
async def test_second_signal_stops_at_once(nats_server, natspy, tmp_path: Path) -> None:
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 20)
    path = write_pipeline(tmp_path, STUCK)
    async with headrace(
        "run", str(path), "--nats", nats_server.url, "--json-logs", "--interval", "0.1"
    ) as proc:
        await proc.wait_event("progress", lambda e: e["stats"]["ack_pending"] == 20)
        proc.signal(signal.SIGINT)
        index, draining = await proc.wait_event("draining")
        # The drain waits for a write that never ends (drain_timeout is 60 s) ... Within a
        # second of the first, a signal would be the same request: wait for a later report.
        later = _event_time(draining) + SAME_REQUEST_WINDOW
        await proc.wait_event(
            "progress", lambda e: e["draining"] and _event_time(e) > later, start=index
        )
        proc.signal(signal.SIGINT)
        # ... and the second signal ends it at once: 128 + SIGINT.
        assert await proc.wait_exit(timeout=10) == 130
    events = proc.events()
    stopping = [e for e in events if e["event"] == "stopping"]
    assert stopping == [{**stopping[0], "signal": "SIGINT", "hard": True}]
    assert events[-1]["event"] == "stopped" and events[-1]["exit_code"] == 130
    info = await consumer_info(natspy, "stuck")
    assert info.ack_floor.stream_seq == 0  # nothing was committed, nothing acked


async def test_drain_timeout_exits_3(nats_server, natspy, tmp_path: Path) -> None:
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 20)
    path = write_pipeline(tmp_path, STUCK)
    async with headrace(
        "run",
        str(path),
        "--nats",
        nats_server.url,
        "--drain-timeout",
        "0.5",
        "--interval",
        "0.1",
    ) as proc:
        await proc.wait_line(_progress_with(ack_pending=20))
        proc.signal(signal.SIGTERM)
        await proc.wait_line(lambda line: " draining " in line and "signal=SIGTERM" in line)
        assert await proc.wait_exit(timeout=15) == 3
    text = "\n".join(proc.err)
    assert "the drain did not finish within 0.5s: 20 messages taken were not acked" in text
    assert "Traceback" not in text


async def test_metrics_endpoint(nats_server, natspy, tmp_path: Path) -> None:
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 40)
    path = write_pipeline(tmp_path, MEMORY)
    async with headrace(
        "run",
        str(path),
        "--nats",
        nats_server.url,
        "--json-logs",
        "--interval",
        "0.1",
        "--metrics-port",
        "0",
    ) as proc:
        _, metrics = await proc.wait_event("metrics")
        port = metrics["port"]
        assert metrics["url"] == f"http://127.0.0.1:{port}/metrics"
        _, progress = await proc.wait_event("progress", lambda e: e["stats"]["acks"] == 40)
        status, headers, body = await _http_get(port, "/metrics")
        assert status == "HTTP/1.1 200 OK"
        assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert int(headers["content-length"]) == len(body)
        samples = _parse_exposition(body.decode())
        p = 'pipeline="mem"'
        assert samples[f"headrace_messages_total{{{p}}}"] == 40
        assert samples[f"headrace_acks_total{{{p}}}"] == 40
        assert samples[f"headrace_records_committed_total{{{p}}}"] == 40
        assert samples[f"headrace_naks_total{{{p}}}"] == 0
        assert samples[f"headrace_redeliveries_total{{{p}}}"] == 0
        assert samples[f"headrace_redeliveries_held_total{{{p}}}"] == 0
        assert samples[f"headrace_records_skipped_total{{{p}}}"] == 0
        assert samples[f"headrace_lag_messages{{{p}}}"] == 0
        assert samples[f"headrace_ack_pending_messages{{{p}}}"] == 0
        batches = samples[f"headrace_batches_committed_total{{{p}}}"]
        assert batches >= 4
        assert samples[f"headrace_commit_seconds_count{{{p}}}"] == batches
        assert samples[f"headrace_commit_seconds_sum{{{p}}}"] >= 0
        assert samples[f'headrace_actor_state{{{p},actor="sink:out",state="running"}}'] == 1
        assert samples[f'headrace_actor_state{{{p},actor="sink:out",state="failed"}}'] == 0
        for actor in progress["states"]:
            assert samples[f'headrace_actor_state{{{p},actor="{actor}",state="running"}}'] == 1
        assert all(name.startswith("headrace_") for name in samples)
        assert all('pipeline="mem"' in name for name in samples)

        status, _, _ = await _http_get(port, "/other")
        assert status == "HTTP/1.1 404 Not Found"
        status, headers, _ = await _http_get(port, "/metrics", method="POST")
        assert status == "HTTP/1.1 405 Method Not Allowed"
        assert headers["allow"] == "GET, HEAD"
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit() == 0


async def _http_get(port: int, path: str, method: str = "GET") -> tuple[str, dict[str, str], bytes]:
    """A raw HTTP/1.1 request over a trio socket; the server closes after the response."""
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            request = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
            await stream.send_all(request.encode())
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *header_lines = head.decode("ascii").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def _parse_exposition(text: str) -> dict[str, float]:
    """``name{labels}`` -> value; checks each metric has HELP and TYPE before its samples."""
    samples: dict[str, float] = {}
    typed: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("#") or not line:
            continue
        key, value = line.rsplit(" ", 1)
        name = key.split("{", 1)[0]
        assert name in typed or name.rsplit("_", 1)[0] in typed, f"no TYPE for {name}"
        samples[key] = float(value)
    return samples


async def test_sink_override_module_target_and_stdout(nats_server, natspy, tmp_path: Path) -> None:
    """A module target (looked up from the working directory) with its sink replaced by the
    `stdout` plugin: records on stdout, progress and events on stderr."""
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 25)
    write_pipeline(tmp_path, MEMORY, name="mempipe.py")
    async with headrace(
        "run",
        "mempipe:pipeline",
        "--nats",
        nats_server.url,
        "--sink",
        "out=stdout",
        "--durable",
        "renamed",
        "--json-logs",
        cwd=tmp_path,
    ) as proc:
        await proc.wait_line(lambda _line: True, stream="out", start=24)
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit() == 0
    records = [json.loads(line) for line in proc.out]
    assert sorted(r["stream_seq"] for r in records) == list(range(1, 26))
    assert {r["consumer"] for r in records} == {"renamed"}
    assert proc.events()[0]["event"] == "started"


async def test_sink_override_with_options(nats_server, natspy, tmp_path: Path) -> None:
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 15)
    path = write_pipeline(tmp_path, MEMORY)
    out = tmp_path / "files"
    async with headrace(
        "run",
        str(path),
        "--nats",
        nats_server.url,
        "--sink",
        "out=jsonl",
        "--sink-option",
        f"out.directory={out}",
        "--sink-option",
        "out.fsync=false",
        "--interval",
        "0.1",
    ) as proc:
        await proc.wait_line(_progress_with(acks=15))
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit() == 0
    lines = read_jsonl(out)
    assert sorted(line["stream_seq"] for line in lines) == list(range(1, 16))
    assert lines[0]["value"] == {"id": 0}  # decoded by the pipeline's map


async def test_failed_pipeline_exits_1(nats_server, natspy, tmp_path: Path) -> None:
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 3)
    path = write_pipeline(
        tmp_path,
        """\
        def boom(order):
            raise ValueError(f"cannot handle {order}")

        pipeline = Pipeline("fails")
        pipeline.source(JetStreamSource(stream="ORDERS", durable="f")).map(
            json.loads
        ).map(boom, on_error="crash").sink(MemorySink())
        """,
    )
    async with headrace("run", str(path), "--nats", nats_server.url, "--json-logs") as proc:
        assert await proc.wait_exit() == 1
    err = "\n".join(proc.err)
    json_lines = proc.events()  # JSON lines only, the reason included
    [reason] = [e for e in json_lines if e["event"] == "exit_reason"]
    assert reason["message"].startswith("pipeline failed: ValueError: cannot handle"), err
    assert "actor 'map:boom' of pipeline 'fails' failed for good" in reason["message"]
    assert reason["exit_code"] == 1
    assert "Traceback" not in err
    fatal = [e for e in json_lines if e["event"] == "error"]
    assert fatal and fatal[-1]["fatal"] is True
    assert json_lines[-1]["event"] == "stopped" and json_lines[-1]["exit_code"] == 1


async def test_missing_stream_is_a_configuration_error(nats_server, tmp_path: Path) -> None:
    path = write_pipeline(tmp_path, MEMORY)
    result = await run_headrace("run", str(path), "--nats", nats_server.url, "--progress", "none")
    assert result.returncode == 2
    err = result.stderr.decode()
    [message] = [line for line in err.splitlines() if line.startswith("headrace run: ")]
    assert message.startswith("headrace run: StreamNotFound: stream not found"), err
    assert "source 'mem' reads stream 'ORDERS'" in message, message
    assert message.endswith(". Create the stream, or fix the pipeline"), message
    assert "Traceback" not in err


async def test_connection_refused_exits_2(tmp_path: Path) -> None:
    path = write_pipeline(tmp_path, MEMORY)
    url = f"nats://127.0.0.1:{free_port()}"
    result = await run_headrace("run", str(path), "--nats", url, "--connect-timeout", "2")
    assert result.returncode == 2
    err = result.stderr.decode()
    assert f"headrace run: cannot connect to NATS ({url}): " in err, err
    assert "Traceback" not in err


async def test_nats_url_from_the_environment(tmp_path: Path) -> None:
    from tests.cli.cli_support import clean_env

    path = write_pipeline(tmp_path, MEMORY)
    url = f"nats://127.0.0.1:{free_port()}"
    result = await run_headrace("run", str(path), env=clean_env(NATS_URL=url))
    assert result.returncode == 2
    assert f"cannot connect to NATS ({url})" in result.stderr.decode()


async def test_user_password(nats_server_factory, tmp_path: Path) -> None:
    # A password may start with "-"; the "--password=VALUE" form keeps argparse from
    # reading it as an option, which is what the CLI docs tell users to do.
    auth = user_password_auth(password="-leading-dash-secret")
    server = nats_server_factory(auth=auth.config)
    path = write_pipeline(tmp_path, MEMORY)
    wrong = await run_headrace(
        "run", str(path), "--nats", server.url, "--user", auth.user, "--password", "nope"
    )
    assert wrong.returncode == 2
    assert "cannot connect to NATS" in wrong.stderr.decode()
    assert "Authorization Violation" in wrong.stderr.decode()
    # Right credentials: connected; the stream is missing, which is the next thing to fix.
    right = await run_headrace(
        "run", str(path), "--nats", server.url, "--user", auth.user, f"--password={auth.password}"
    )
    assert right.returncode == 2
    assert "cannot connect" not in right.stderr.decode()
    assert " started " in right.stderr.decode()


@pytest.mark.slow
async def test_token_and_tls(nats_server_factory, tls_files, tmp_path: Path) -> None:
    auth = token_auth()
    server = nats_server_factory(auth=auth.config, tls=tls_files)
    path = write_pipeline(tmp_path, MEMORY)
    base = ("run", str(path), "--nats", server.url, f"--token={auth.token}")
    untrusted = await run_headrace(*base, "--tls-ca", str(tls_files.wrong_ca_file))
    assert untrusted.returncode == 2
    assert "cannot connect to NATS" in untrusted.stderr.decode()
    trusted = await run_headrace(*base, "--tls-ca", str(tls_files.ca_file))
    assert " started " in trusted.stderr.decode(), trusted.stderr.decode()
    assert trusted.returncode == 2  # the stream is missing


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{dir}/missing.py"], "missing.py: no such file"),
        (["{path}:nothing"], "has no attribute 'nothing'"),
        (["{path}:broken"], "invalid pipeline: pipeline 'broken' has no sink"),
        (["{path}:pipeline", "--sink", "out=nosuch"], "no sink named 'nosuch'"),
        (["{path}:pipeline", "--sink", "lake=jsonl"], "has no sink named 'lake'"),
        (["{path}:pipeline", "--password", "x"], "--password needs --user"),
        (["{path}:pipeline", "--creds", "{dir}/no.creds"], "no.creds'?: no such file"),
        (["{path}:pipeline", "--tls-ca", "{dir}/no.pem"], "does not exist"),
        (["{path}:pipeline", "--interval", "0"], "--interval must be positive"),
    ],
)
async def test_usage_errors_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    path = write_pipeline(
        tmp_path,
        MEMORY + 'broken = Pipeline("broken")\nbroken.source(JetStreamSource(stream="A"))\n',
    )
    argv = [a.format(dir=tmp_path, path=path) for a in args]
    result = await run_headrace("run", *argv, "--nats", f"nats://127.0.0.1:{free_port()}")
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.startswith("headrace run: ") and re.search(message, err), err
    assert err.count("\n") == 1 and "Traceback" not in err


async def test_metrics_port_in_use(tmp_path: Path) -> None:
    path = write_pipeline(tmp_path, MEMORY)
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = await run_headrace("run", str(path), "--metrics-port", str(port))
    assert result.returncode == 2
    assert f"headrace run: --metrics-port {port}: " in result.stderr.decode()


async def test_live_view_on_a_terminal(nats_server, natspy, tmp_path: Path) -> None:
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 30)
    path = write_pipeline(tmp_path, MEMORY)
    async with headrace(
        "run", str(path), "--nats", nats_server.url, "--interval", "0.1", stderr_terminal=True
    ) as proc:
        await proc.wait_line(lambda line: line.startswith("  acks") and " 30 " in line)
        # Redrawn in place: back to the block's first line, clear, draw again.
        index, _ = await proc.wait_line(lambda line: "\x1b[J" in line)
        assert re.search(
            r"\x1b\[\d+F\x1b\[Jheadrace run mem +up \d+:\d\d:\d\d +running", proc.err[index]
        )
        await proc.wait_line(lambda line: re.fullmatch(r" +sink:out +running", line), start=index)
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit() == 0
    text = "\n".join(proc.err)
    assert re.search(r"  in +30 msg +[\d,.]+ msg/s +redelivered 0", text)
    assert re.search(r"  lag +0 pending +ack pending 0", text)
    assert " draining mem signal=SIGINT" in text
    assert " stopped mem exit_code=0" in text
    assert all(len(line) <= 100 for line in proc.err if not re.search(r" (started|stopped) ", line))


@pytest.mark.slow
async def test_sink_failures_are_error_events(nats_server, natspy, tmp_path: Path) -> None:
    """A failed write is reported and survived: the batch is written again (no nak, no
    redelivery: a sink that fails is backpressure, not bad data) and committed."""
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 10)
    path = write_pipeline(
        tmp_path,
        """\
        pipeline = Pipeline("flaky", nak_delay=0.05)
        pipeline.source(JetStreamSource(stream="ORDERS", durable="flaky")).sink(
            MemorySink(fail_times=1), name="out", batch=BatchPolicy(max_messages=10, max_age=0.1)
        )
        """,
    )
    async with headrace(
        "run", str(path), "--nats", nats_server.url, "--json-logs", "--interval", "0.1"
    ) as proc:
        _, error = await proc.wait_event("error")
        assert error["fatal"] is False and error["stage"] == "out"
        assert error["error"].startswith("RuntimeError: MemorySink: injected failure #1")
        _, progress = await proc.wait_event("progress", lambda e: e["stats"]["acks"] == 10)
        stats = progress["stats"]
        assert stats["naks"] == 0 and stats["redeliveries"] == 0
        assert stats["batches_failed"] == 1 and stats["errors"] == 1
        assert stats["sink_retries"] == 1 and stats["retrying"] == 0
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit() == 0
    assert [e for e in proc.events() if e["event"] == "error"] == [error]  # reported once


async def test_deliver_new_starts_a_new_durable_at_new_messages(
    nats_server, natspy, tmp_path: Path
) -> None:
    """Issue 23: after `headrace consumer rm`, a durable made again read the whole stream,
    with no way to start it at what comes next. `--deliver new` starts a durable the run
    creates there; one that exists goes on from where it is, and says so."""
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 30)
    path = write_pipeline(tmp_path, MEMORY)
    args = ("run", str(path), "--nats", nats_server.url, "--json-logs", "--until-caught-up")
    done = await run_headrace(*args, "--deliver", "new")
    assert done.returncode == 0, done.stderr.decode()
    [stopped] = [e for e in map(json.loads, done.stderr.decode().splitlines())
                 if e["event"] == "stopped"]  # fmt: skip
    assert stopped["stats"]["messages_in"] == 0  # the 30 stored before were not read
    info = await consumer_info(natspy, "mem")
    assert info.config.deliver_policy == "new" and info.num_pending == 0

    await publish(natspy, 5)
    done = await run_headrace(*args, "--deliver", "new")
    assert done.returncode == 0, done.stderr.decode()
    events = [json.loads(line) for line in done.stderr.decode().splitlines()]
    assert [e["stats"]["records_out"] for e in events if e["event"] == "stopped"] == [5]
    [said] = [e for e in events if "exists and goes on from where it is" in e.get("message", "")]
    assert "headrace consumer rm ORDERS mem" in said["message"]


async def test_deliver_is_refused_beside_a_deliver_policy_of_the_pipeline(
    nats_server, tmp_path: Path
) -> None:
    path = write_pipeline(
        tmp_path,
        'pipeline = Pipeline("own")\n'
        'pipeline.source(JetStreamSource(stream="ORDERS", durable="own", '
        "config=ConsumerConfig(deliver_policy='all'))).sink(MemorySink())\n",
    )
    done = await run_headrace("run", str(path), "--nats", nats_server.url, "--deliver", "new")
    assert done.returncode == 2
    assert "sets deliver_policy=all in its ConsumerConfig" in done.stderr.decode()
