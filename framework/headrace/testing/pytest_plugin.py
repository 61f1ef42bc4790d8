"""The headrace pytest plugin: fixtures for testing pipelines against a real server.

Registered under the ``pytest11`` entry point, so installing headrace makes it available; it
defines fixtures and no hooks, so nothing happens (no server starts) unless a test asks for
one of them. Without the entry point (a checkout), load it with
``-p headrace.testing.pytest_plugin`` or ``pytest_plugins = ["headrace.testing.pytest_plugin"]``
in the root ``conftest.py``.

- ``nats_server``: a private nats-server with JetStream (:class:`LocalServer`), started for
  the test and stopped after it, its streams in a temporary directory: each test starts
  empty.
- ``nats_server_session``: one such server for the whole session, quicker when many tests
  need one; they share its streams, so give each test its own stream names.
- ``nats_url``: the URL of ``nats_server``.
- ``headrace_connection``: a :class:`~headrace.nats.Connection` to ``nats_server``, for
  trio tests (pytest-trio), closed after the test.

A fixture of the same name in a ``conftest.py`` overrides the plugin's, as pytest's rule is
(headrace's own suite does so: its ``nats_server`` is the richer launcher of
``tests/servers.py``); ``nats_url`` and ``headrace_connection`` then use the override, which
needs only a ``url`` attribute.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from headrace.localserver import LocalServer
from headrace.nats.connection import Connection, connect


@pytest.fixture
def nats_server() -> Iterator[LocalServer]:
    """A private nats-server with JetStream for this test (started empty, stopped after)."""
    with LocalServer() as server:
        yield server


@pytest.fixture(scope="session")
def nats_server_session() -> Iterator[LocalServer]:
    """One private nats-server with JetStream for the whole test session (shared streams)."""
    with LocalServer() as server:
        yield server


@pytest.fixture
def nats_url(nats_server: Any) -> str:
    """``nats_server``'s URL (``nats://127.0.0.1:PORT``)."""
    return str(nats_server.url)


@pytest.fixture
async def headrace_connection(nats_url: str) -> AsyncIterator[Connection]:
    """A headrace connection to ``nats_server`` for a trio test, closed after it."""
    async with connect(nats_url) as nc:
        yield nc
