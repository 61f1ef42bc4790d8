"""The metrics exposition, the HTTP answers and the progress reporters, without processes."""

from __future__ import annotations

import io
import json

import pytest
import trio
from headrace.cli.metrics import Snapshot, answer, render, serve
from headrace.cli.progress import EventsOnly, JsonLines, LiveView, PlainLines, Sample, make_reporter
from headrace.pipeline.stats import PipelineStats


def _snapshot(**kw) -> Snapshot:
    stats = PipelineStats(messages_in=7, acks=5, batches_committed=2, commit_seconds_total=0.5)
    return Snapshot(
        pipeline=kw.pop("pipeline", "p"),
        stats=stats.snapshot(),
        states=kw.pop("states", {"sink:a": "running", "source:s": "restarting"}),
        **kw,
    )


def test_render_exposition() -> None:
    text = render(_snapshot(draining=True, started_at=12.5))
    lines = text.splitlines()
    assert text.endswith("\n")
    assert 'headrace_messages_total{pipeline="p"} 7' in lines
    assert 'headrace_acks_total{pipeline="p"} 5' in lines
    assert 'headrace_commit_seconds_sum{pipeline="p"} 0.5' in lines
    assert 'headrace_commit_seconds_count{pipeline="p"} 2' in lines
    assert "# TYPE headrace_commit_seconds summary" in lines
    assert 'headrace_draining{pipeline="p"} 1' in lines
    assert 'headrace_start_time_seconds{pipeline="p"} 12.5' in lines
    assert 'headrace_actor_state{pipeline="p",actor="source:s",state="restarting"} 1' in lines
    assert 'headrace_actor_state{pipeline="p",actor="source:s",state="running"} 0' in lines
    states = [
        line
        for line in lines
        if line.startswith('headrace_actor_state{pipeline="p",actor="sink:a"')
    ]
    assert len(states) == 6 and sum(line.endswith(" 1") for line in states) == 1
    # Every sample's metric has a HELP and a TYPE line before it, once.
    typed = [line.split()[2] for line in lines if line.startswith("# TYPE ")]
    assert len(typed) == len(set(typed))
    assert len([line for line in lines if line.startswith("# HELP ")]) == len(typed)


def test_render_escapes_label_values() -> None:
    text = render(_snapshot(pipeline='a "b"\\c\nd', states={}))
    assert 'headrace_acks_total{pipeline="a \\"b\\"\\\\c\\nd"} 5' in text.splitlines()


def test_http_answers() -> None:
    ok = answer(b"GET /metrics?x=1 HTTP/1.1\r\nHost: h\r\n\r\n", lambda: "m 1\n")
    assert ok.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Length: 4\r\n" in ok and ok.endswith(b"\r\n\r\nm 1\n")
    head = answer(b"HEAD /metrics HTTP/1.1\r\n\r\n", lambda: "m 1\n")
    assert b"Content-Length: 4\r\n" in head and head.endswith(b"\r\n\r\n")
    assert answer(b"GET / HTTP/1.1\r\n\r\n", str).startswith(b"HTTP/1.1 404 ")
    assert answer(b"DELETE /metrics HTTP/1.1\r\n\r\n", str).startswith(b"HTTP/1.1 405 ")
    assert answer(b"nonsense\r\n\r\n", str).startswith(b"HTTP/1.1 400 ")
    assert answer(None, str).startswith(b"HTTP/1.1 400 ")

    def broken() -> str:
        raise RuntimeError("bug")

    failed = answer(b"GET /metrics HTTP/1.1\r\n\r\n", broken)
    assert failed.startswith(b"HTTP/1.1 500 ") and failed.endswith(b"RuntimeError: bug\n")


async def test_server_survives_bad_clients() -> None:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, 0, _snapshot)
        # A client that sends garbage without a blank line and goes away.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GARBAGE")
        await stream.aclose()
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        data = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):
                data += chunk
        await stream.aclose()
        assert data.startswith(b"HTTP/1.1 200 OK")
        assert b'headrace_messages_total{pipeline="p"} 7' in data
        nursery.cancel_scope.cancel()


def _sample(**kw) -> Sample:
    return Sample(
        pipeline="p",
        uptime=61.0,
        stats=PipelineStats(messages_in=10, acks=9, ack_pending=1).snapshot(),
        states={"sink:a": "running", "source:s": "restarting"},
        rate=2.5,
        out_rate=2.0,
        **kw,
    )


def test_plain_lines() -> None:
    out = io.StringIO()
    reporter = PlainLines(out)
    reporter.progress(_sample())
    reporter.event("error", "p", stage="sink:a", error="RuntimeError: x y", fatal=False)
    progress, error = out.getvalue().splitlines()
    assert " progress pipeline=p in=10 rate=2.5/s " in progress
    assert " ack_pending=1 " in progress and " acks=9 " in progress
    assert progress.endswith(" actors_running=1/2 actors_other=source:s:restarting")
    assert error.endswith(' error pipeline=p stage=sink:a error="RuntimeError: x y" fatal=False')


def test_json_lines() -> None:
    out = io.StringIO()
    reporter = JsonLines(out)
    reporter.progress(_sample(draining=True))
    reporter.event("draining", "p", signal="SIGTERM")
    progress, draining = (json.loads(line) for line in out.getvalue().splitlines())
    assert progress["event"] == "progress" and progress["pipeline"] == "p"
    assert progress["stats"]["acks"] == 9 and progress["rate"] == 2.5
    assert progress["states"] == {"sink:a": "running", "source:s": "restarting"}
    assert progress["draining"] is True
    assert draining == {**draining, "event": "draining", "signal": "SIGTERM"}


def test_live_view_redraws_in_place() -> None:
    out = io.StringIO()
    view = LiveView(out)
    view.progress(_sample())
    first = out.getvalue()
    assert first.startswith("headrace run p   up 0:01:01   running\n")
    assert "\x1b[" not in first
    height = first.count("\n")
    view.event("draining", "p", signal="SIGINT")
    view.progress(_sample(draining=True))
    rest = out.getvalue()[len(first) :]
    assert rest.startswith(f"\x1b[{height}F\x1b[J")  # erase the block, then the event above it
    assert "draining p signal=SIGINT\nheadrace run p" in rest
    assert "   draining\n" in rest


def test_make_reporter() -> None:
    assert isinstance(make_reporter("json", io.StringIO()), JsonLines)
    assert isinstance(make_reporter("auto", io.StringIO()), PlainLines)  # not a terminal
    assert isinstance(make_reporter("live", io.StringIO()), LiveView)
    assert isinstance(make_reporter("none", io.StringIO()), EventsOnly)


# -- typos: no abbreviations, the option meant suggested ----------------------------------------


@pytest.mark.slow
def test_options_are_never_abbreviated_and_a_typo_names_the_option_meant(tmp_path) -> None:
    """`--worker 2` ran as `--workers 2` (argparse's prefix matching); `--until-caughtup` was
    reported with the top-level usage; a target's misspelt attribute had no suggestion."""
    import subprocess
    import sys

    def headrace(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "headrace", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)

    done = headrace("run", "x.py", "--worker", "2")
    assert done.returncode == 2
    assert "headrace run: error: unrecognized arguments: --worker (did you mean --workers?) 2" in (
        done.stderr
    )
    done = headrace("run", "x.py", "--until-caughtup")
    assert done.returncode == 2 and done.stderr.startswith("usage: headrace run ")
    assert "--until-caughtup (did you mean --until-caught-up?)" in done.stderr
    done = headrace("state", "show", "p", "--decodee")
    assert done.returncode == 2 and done.stderr.startswith("usage: headrace state show ")
    assert "(did you mean --decode?)" in done.stderr
    done = headrace("run", "x.py", "--json", "--nats", "nats://127.0.0.1:1")
    assert done.returncode == 2 and "--json (did you mean --json-logs?)" in done.stderr
    (tmp_path / "target.py").write_text("make_pipeline = None\n")
    done = headrace("run", "target.py:make_pipline")
    assert done.returncode == 2
    assert "has no attribute 'make_pipline' (did you mean 'make_pipeline'?)" in done.stderr
