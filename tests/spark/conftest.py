"""One SparkSession for the whole test session (starting a JVM costs seconds). Every test here
is marked ``spark``; the root conftest groups them onto one xdist worker so that they share this
session. The helpers that read what a Spark sink wrote are in ``spark_support``."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] session with the sink's embedded defaults (quiet, UTC, no UI)."""
    from headrace_spark.session import start_session

    session = start_session("local[2]", app_name="headrace-tests")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server for the module (connect_server.py)."""
    from tests.spark.connect_server import connect_server

    with connect_server(tmp_path_factory.mktemp("connect-server")) as url:
        yield url
