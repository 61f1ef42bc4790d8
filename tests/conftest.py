"""Shared fixtures: real nats-server processes (see ``servers.py``)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any


def _cache_bytecode() -> None:
    """Keep compiled bytecode even where the environment turns it off
    (``PYTHONDONTWRITEBYTECODE=1`` on the CI machine): without it every xdist worker compiles
    and assertion-rewrites every test module again, and every ``headrace`` subprocess a test
    starts compiles the framework (the fast set took 73-77 s instead of 55-60 s). Into the
    usual ``__pycache__`` directories (ignored by git), not a ``PYTHONPYCACHEPREFIX``: with a
    prefix, Python ignores the bytecode pip already wrote for every dependency, and the prefix
    keeps the bytecode of every temporary directory a test ever ran code from."""
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


_cache_bytecode()

import pytest  # noqa: E402 - after the bytecode setting, so that what follows is cached
from hypothesis import settings  # noqa: E402

from tests.natspy_peer import NatsPyPeer  # noqa: E402
from tests.servers import NatsCluster, NatsServer, TLSFiles  # noqa: E402

settings.register_profile("ci", max_examples=2000, deadline=None)
settings.register_profile("dev", max_examples=200, deadline=None)
# The fast set (a plain `pytest`) runs 200 examples per property; `make test`, which CI runs,
# sets HYPOTHESIS_PROFILE=ci for 2000 (and the slow copies run 20000).
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def nats_server_factory() -> Iterator[Callable[..., NatsServer]]:
    """``factory(**NatsServer kwargs) -> started NatsServer``; all are closed at teardown."""
    started: list[NatsServer] = []

    def factory(**kwargs: Any) -> NatsServer:
        server = NatsServer(**kwargs)
        started.append(server)
        return server.start()

    yield factory
    for server in reversed(started):
        server.close()


@pytest.fixture
def nats_server(nats_server_factory: Callable[..., NatsServer]) -> NatsServer:
    """A fresh single node with JetStream (file store in a temp dir)."""
    return nats_server_factory()


@pytest.fixture
def nats_cluster() -> Iterator[NatsCluster]:
    """Three routed nodes (n0, n1, n2) with clustered JetStream and an elected meta leader."""
    cluster = NatsCluster(size=3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def core_server(nats_server_factory: Callable[..., NatsServer]) -> NatsServer:
    """A fresh single node without JetStream: quicker to start, for core NATS tests."""
    return nats_server_factory(jetstream=False)


@pytest.fixture
def natspy() -> Iterator[NatsPyPeer]:
    """nats-py on its own asyncio loop, the independent peer (see ``natspy_peer.py``)."""
    peer = NatsPyPeer()
    try:
        yield peer
    finally:
        peer.close()


@pytest.fixture
def tls_files() -> Iterator[TLSFiles]:
    """CA, server cert (127.0.0.1/localhost), client cert and an unrelated CA, as PEM files."""
    with TLSFiles.create() as files:
        yield files


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Spark tests share one JVM (one SparkSession per test session, tests/spark/conftest.py):
    under xdist they all go to one worker (``--dist loadgroup``). Those marked
    ``spark_children`` run Spark only in child processes of their own (faults, clusters, the
    benchmarks) and form a second group, one at a time beside the first: two JVM-heavy chains
    at most, where one chain of both was the whole suite's last quarter of an hour. The other
    tests spread as usual.
    ``tryfirst``: xdist's worker reads the group marks in its own hook of this name, which
    pluggy would otherwise call before this one (the marks came too late, and the Spark tests
    were spread over every worker, a JVM each)."""
    for item in items:
        if item.get_closest_marker("spark") is not None:
            apart = item.get_closest_marker("spark_children") is not None
            group = "spark-children" if apart else "spark"
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Every test that failed and was run again (``--reruns``, as ``make test`` and CI do) under
    one heading, whatever its second run gave: a flake is investigated like a failure."""
    reruns = terminalreporter.stats.get("rerun", [])
    if not reruns:
        return
    terminalreporter.section("FLAKES")
    for report in reruns:
        terminalreporter.line(f"{report.nodeid}: failed, run again")
        # What failed, enough to investigate without the run: the crash and the error lines
        # (a trio test's failure is an exception group, whose last line is only its border).
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:
            terminalreporter.line(f"    at {crash.path}:{crash.lineno}: {crash.message[:300]}")
        for line in _error_lines(str(report.longrepr or ""))[-25:]:
            terminalreporter.line(f"    {line[:300]}")


def _error_lines(text: str) -> list[str]:
    """The lines of a failure's report that say what went wrong: pytest's ``E`` lines, the
    exceptions inside an exception group's ``|`` frames, and where in the tests it was."""
    found = []
    for raw in text.splitlines():
        line = raw.lstrip(" |+-")
        if (
            line.startswith("E ")
            or re.match(r"[\w.]*(Error|Exception|Timeout|TooSlow\w*|Failed)\b.*", line)
            or re.match(r"tests/\S+\.py:\d+", line)
            or re.match(r'File ".*/tests/\S+", line \d+', line)
        ) and line not in found[-1:]:
            found.append(line)
    return found
