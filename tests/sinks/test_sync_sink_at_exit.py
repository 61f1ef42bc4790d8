"""A run that ends while a sync sink's call is still in C++ code ends with its own exit code.

Issue 23: a pipeline that failed at start while a DuckDB sink's ``open()`` ran aborted the
process (``terminate called ... FATAL: exception not rethrown``, exit 134, 5 of 5): the
interpreter's finalization stopped the abandoned call's thread inside DuckDB, whose C++ code
catches the unwinding and does not rethrow it. Here DuckDB runs for real: ``open()`` runs a
query whose Python function runs on (taking the GIL now and then, as DuckDB's interrupt checks
do), so the call is deterministically inside DuckDB when the run ends (another sink's
``open()`` fails once the query has begun).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

pytest.importorskip("duckdb")

HEADRACE = str(Path(sys.executable).parent / "headrace")

PIPELINE = """\
import os
import threading
import time

import duckdb
import trio
from headrace.pipeline import JetStreamSource, Pipeline

#: Set by the query's function: the sink's open() is inside DuckDB from here on.
in_duckdb = threading.Event()


def pause(seconds: float) -> float:
    # Short sleeps: the thread takes the GIL back every millisecond, as DuckDB's own checks
    # for interrupts do; a thread taking it during finalization is where the abort came from.
    in_duckdb.set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.001)
    return seconds


class DuckSink:
    def open(self) -> None:
        self.con = duckdb.connect()
        self.con.create_function("pause", pause, [float], float)
        self.con.execute("select pause(?)", [float(os.environ["PAUSE"])]).fetchall()

    def write_batch(self, batch) -> None:
        pass

    def close(self) -> None:
        self.con.close()


class FailingSink:
    async def open(self) -> None:
        await trio.to_thread.run_sync(in_duckdb.wait)
        raise RuntimeError("this sink cannot open")

    async def write_batch(self, batch) -> None:
        pass


pipeline = Pipeline("duck")
source = pipeline.source(JetStreamSource(stream="S", durable="d"), name="s")
source.sink(DuckSink(), name="duck")
source.sink(FailingSink(), name="failing")
"""

APP = """\
import sys

import trio
from headrace import connect
import headrace.pipeline.sink_thread
from pipe import pipeline

headrace.pipeline.sink_thread.EXIT_GRACE = float(sys.argv[2])


async def main() -> None:
    async with connect(sys.argv[1]) as nc:
        await pipeline.run(nc)


try:
    trio.run(main)
except BaseException as exc:
    print("run failed:", type(exc).__name__, flush=True)
    sys.exit(3)
"""


@pytest.fixture
async def stream(nats_server: Any, natspy: Any) -> None:
    await natspy.connect(nats_server.url)
    await natspy.call(natspy.nc.jetstream().add_stream, name="S", subjects=["s.>"])


async def run(argv: list[str], cwd: Path, pause: float) -> subprocess.CompletedProcess[bytes]:
    (cwd / "pipe.py").write_text(PIPELINE)
    with trio.fail_after(60):
        return await trio.run_process(
            argv,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=cwd,
            env={**os.environ, "PAUSE": str(pause), "PYTHONPATH": str(cwd)},
        )


def not_aborted(done: subprocess.CompletedProcess[bytes]) -> str:
    err = done.stderr.decode()
    assert "terminate called" not in err and "FATAL" not in err, err
    return err


async def test_headrace_run_ends_with_its_code_while_open_is_in_duckdb(
    stream: None, nats_server: Any, tmp_path: Path
) -> None:
    done = await run(
        [HEADRACE, "run", "pipe.py", "--nats", nats_server.url], tmp_path, pause=3600.0
    )
    err = not_aborted(done)
    assert "this sink cannot open" in err, err
    # The code the run announced is the one the shell sees.
    [stopped] = [line for line in err.splitlines() if " stopped " in line]
    assert stopped.endswith(f"exit_code={done.returncode}") and done.returncode == 1, err


@pytest.mark.slow
async def test_an_application_waits_for_the_call_then_exits_with_its_own_code(
    stream: None, nats_server: Any, tmp_path: Path
) -> None:
    (tmp_path / "app.py").write_text(APP)
    done = await run([sys.executable, "app.py", nats_server.url, "30"], tmp_path, pause=1.0)
    not_aborted(done)
    assert done.stdout.decode() == "run failed: RuntimeError\n"
    assert done.returncode == 3


@pytest.mark.slow
async def test_an_application_ends_unfinalized_after_the_grace(
    stream: None, nats_server: Any, tmp_path: Path
) -> None:
    (tmp_path / "app.py").write_text(APP)
    done = await run([sys.executable, "app.py", nats_server.url, "0.5"], tmp_path, pause=3600.0)
    err = not_aborted(done)
    assert "open() of sink 'duck' still running 0.5 s after exit began" in err, err
    assert done.returncode == 1
