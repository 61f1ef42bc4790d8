"""The pytest plugin ``headrace.testing.pytest_plugin`` as a user's project loads it: a pytest
process of its own over a test file written here (its own rootdir and ini, so this suite's
conftest is not in play), against real nats-servers the plugin starts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

USER_TESTS = """\
import trio
from headrace.jetstream import JetStream, StreamConfig
from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline
from headrace.sinks import MemorySink
from headrace.testing import LocalServer, run_until_caught_up

PORTS = []


async def test_a_pipeline_caught_up(headrace_connection, nats_server, nats_url):
    assert isinstance(nats_server, LocalServer) and nats_url == nats_server.url
    js = JetStream(headrace_connection)
    await js.add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"]))
    for i in range(20):
        await js.publish("orders.new", b"%d" % i)
    sink = MemorySink()
    pipe = Pipeline("t")
    pipe.source(JetStreamSource(stream="ORDERS", durable="t")).map(int).sink(
        sink, batch=BatchPolicy(max_messages=5, max_age=0.05)
    )
    stats = await run_until_caught_up(pipe, headrace_connection, timeout=20)
    assert sink.values == list(range(20))
    assert stats.acks == 20
    PORTS.append(nats_server.port)


async def test_each_test_has_a_fresh_server(headrace_connection, nats_server):
    js = JetStream(headrace_connection)
    assert await js.stream_names() == []
    PORTS.append(nats_server.port)


def test_the_session_server_is_shared(nats_server_session, request):
    if not hasattr(request.config, "_seen"):
        request.config._seen = nats_server_session
    assert request.config._seen is nats_server_session


def test_the_session_server_again(nats_server_session, request):
    assert request.config._seen is nats_server_session
    assert len(set(PORTS)) == 2  # the function-scoped servers were two


def test_without_fixtures_nothing_starts():
    assert True
"""

OVERRIDE_CONFTEST = """\
import pytest


class Mine:
    url = "nats://override.invalid:4222"


@pytest.fixture
def nats_server():
    return Mine()
"""

OVERRIDDEN = """\
def test_conftest_wins(nats_server, nats_url):
    assert nats_url == "nats://override.invalid:4222"
"""


PLUGIN = "headrace.testing.pytest_plugin"


def _installed() -> bool:
    """Whether the ``pytest11`` entry point is installed: pytest then loads the plugin itself,
    and naming it with ``-p`` as well would register it twice."""
    return any(ep.value == PLUGIN for ep in entry_points(group="pytest11"))


def run_pytest(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (directory / "pytest.ini").write_text("[pytest]\ntrio_mode = true\n")
    load = [] if _installed() else ["-p", PLUGIN]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            *load,
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "--rootdir",
            str(directory),
            "-c",
            str(directory / "pytest.ini"),
            *args,
        ],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_fixtures_run_a_users_pipeline_tests(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    done = run_pytest(tmp_path, "-p", "no:xdist", "test_user.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 passed" in done.stdout


def test_the_first_example_of_docs_testing_md_passes(tmp_path: Path) -> None:
    """The page's "A first test", run as written (so that it cannot rot)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text("utf-8")
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert block.startswith("# test_orders.py")
    (tmp_path / "test_orders.py").write_text(block)
    done = run_pytest(tmp_path, "-p", "no:xdist", "test_orders.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_a_conftest_fixture_of_the_same_name_wins(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(OVERRIDE_CONFTEST)
    (tmp_path / "test_over.py").write_text(textwrap.dedent(OVERRIDDEN))
    done = run_pytest(tmp_path, "-p", "no:xdist", "test_over.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
