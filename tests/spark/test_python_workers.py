"""Spark's Python workers (a ``transform``'s UDFs) and their failures.

- An embedded session runs its workers on the sink's own interpreter, not on whatever
  ``python3`` is first on PATH: tested in a child process (a fresh session) whose PATH starts
  with a ``python3`` that cannot run anything, and no PYSPARK_PYTHON.
- A UDF that raises is reported in its own words (``ValueError: bad thing``), not as Spark's "An
  exception was thrown from the Python worker:", and as the records' fault (``transient`` False);
  a worker that cannot start is the environment's fault (``transient`` None), and says which
  interpreter it ran.
- In a pipeline, a UDF failing on one record sets that message aside at once (split, never
  waited for as an outage); the rest of the batch is committed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from headrace.pipeline import BatchPolicy
from headrace.pipeline.ack_tracker import PoisonTerminated
from headrace_spark import SparkPythonError, SparkSink
from headrace_spark.session import embedded_conf

from tests.pipeline.pipe_support import (
    FAST,
    add_stream,
    connect,
    fast_pipeline,
    publish,
    source,
    wait_consumer,
)
from tests.spark.spark_procs import child_env, run_child
from tests.spark.spark_support import all_acked

FAKE_PYTHON = """#!/bin/sh
echo "this python3 is not a Python" >&2
exit 3
"""


def path_with_fake_python(bin_dir: Path) -> tuple[dict[str, str], Path]:
    """A child's environment with no PYSPARK_PYTHON and a broken ``python3`` first on PATH."""
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = child_env()
    env.pop("PYSPARK_PYTHON", None)
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env, fake


@pytest.mark.spark
@pytest.mark.slow
async def test_embedded_sessions_run_udfs_on_this_python_and_report_their_errors(
    tmp_path: Path,
) -> None:
    env, fake = path_with_fake_python(tmp_path / "bin")
    child = await run_child(
        "python_child.py", str(tmp_path / "out"), cwd=tmp_path, env=env, timeout=240
    )
    writes = {e["name"]: e for e in child.events("write")}
    # The UDF ran: the write committed, every row through it.
    adds = writes["adds"]
    assert adds.get("rows") == [[1, 2], [2, 3], [3, 4], [4, 5]], child.transcript()
    (session,) = child.events("session")
    assert session["path_python3"] == str(fake)  # what PySpark would have run
    python = session["executable"]
    assert session["python_exec"] == python
    assert session["python"] == session["driver_python"] == python

    # A UDF raising: its own error in the sink's, and the records' fault.
    raises = writes["raises"]
    assert raises["error"] == "SparkPythonError", child.transcript()
    assert raises["python_error"] == "ValueError: bad thing"
    assert "bad thing" in raises["message"]
    assert "An exception was thrown" not in raises["message"]
    assert raises["message"].startswith("Spark could not write batch ORDERS-1-4 to parquet")
    assert raises["transient"] is False

    # Workers that cannot start (what the PATH's python3 gave before): not the records' fault,
    # and the error says what the worker said and which interpreter it was.
    broken = writes["no-python"]
    assert broken["error"] == "SparkPythonError", child.transcript()
    assert "this python3 is not a Python" in broken["message"]
    assert str(fake) in broken["message"]
    assert broken["transient"] is None


def test_embedded_settings_name_this_python_unless_the_environment_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    conf = embedded_conf()
    assert conf["spark.pyspark.python"] == sys.executable
    assert conf["spark.pyspark.driver.python"] == sys.executable
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/py/bin/python")
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", "/opt/py/bin/python")
    conf = embedded_conf()
    assert "spark.pyspark.python" not in conf  # PySpark takes the variable
    assert "spark.pyspark.driver.python" not in conf


def raising_at(bad: int) -> Any:
    """A transform adding ``plus`` (stream_seq + 1) through a Python UDF that raises
    ValueError("bad thing") for the row of stream sequence ``bad``."""

    def transform(df: Any) -> Any:
        from pyspark.sql import functions as F

        def plus(seq):  # no hints: with them pyspark takes it for a pandas UDF
            if seq == bad:
                raise ValueError("bad thing")
            return seq + 1

        return df.withColumn("plus", F.udf(plus, "long")("stream_seq"))

    return transform


@pytest.mark.spark
@pytest.mark.slow
async def test_a_udf_failing_on_one_record_sets_its_message_aside_at_once(
    spark: Any, nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    n, bad = 8, 5
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    await publish(natspy, n)
    out = tmp_path / "out"
    sink = SparkSink(out, spark=spark, transform=raising_at(bad))
    pipe = fast_pipeline("udf", max_deliveries=2)
    pipe.source(source()).sink(sink, name="lake", batch=BatchPolicy(max_messages=n, max_age=0.2))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await wait_consumer(natspy, all_acked(n), timeout=120)
        stats = run.stats
        assert stats.acks == n - 1
        assert stats.terms == 1  # failed alone on both its deliveries (max_deliveries=2)
        # Bad records, said so: split at once, never paused for as an outage would be.
        assert stats.sink_retries == 0
        failures = [e.error for e in run.errors if isinstance(e.error, SparkPythonError)]
        assert failures, [e.error for e in run.errors]
        assert all(f.transient is False for f in failures)
        assert all(f.python_error == "ValueError: bad thing" for f in failures)
        assert any(isinstance(e.error, PoisonTerminated) for e in run.errors)
    rows = spark.read.parquet(str(out)).select("stream_seq", "plus").collect()
    assert sorted((r["stream_seq"], r["plus"]) for r in rows) == [
        (s, s + 1) for s in range(1, n + 1) if s != bad
    ]
