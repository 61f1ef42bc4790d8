"""The Spark sink on a Spark standalone cluster (``master="spark://host:port"``): a real master
and one worker (1 core, 1 GiB) from the jars PySpark ships (``bin/spark-class``), and the sink in
a process of its own (standalone_child.py), since PySpark allows one SparkContext per process
and the test process has its ``local[2]`` one.

The sink's batches become Spark jobs whose tasks run in the worker's executor (a JVM the worker
launches under its work directory), not in the driver: the test checks the output, the sink's
counters, and that the application registered with the master and its tasks ran in that
executor. The executor needs no Python worker (the sink makes its DataFrames from Arrow, and
has no UDF); PYSPARK_PYTHON is this interpreter all the same (spark_procs.child_env).
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import attrs
import pyarrow.parquet as pq
import pyspark
import pytest
import trio

from tests.spark.spark_procs import child_env, run_child
from tests.spark.spark_support import data_files

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).resolve().parent
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
APP_NAME = "headrace-standalone-child"  # standalone_child.py's


@attrs.frozen
class Cluster:
    url: str
    master_log: Path
    worker_log: Path
    work_dir: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_text(path: Path) -> str:
    return path.read_text("utf-8", "replace") if path.exists() else ""


def log_tail(path: Path, lines: int = 60) -> str:
    return f"--- {path.name} ---\n" + "\n".join(log_text(path).splitlines()[-lines:])


async def wait_logged(
    proc: subprocess.Popen[bytes], log: Path, line: str, timeout: float = 60
) -> None:
    """Until ``log`` holds ``line`` (polled: a daemon's log file has no event to wait on), or
    fail early if the process exited."""
    try:
        with trio.fail_after(timeout):
            while line not in log_text(log):
                if proc.poll() is not None:
                    raise AssertionError(
                        f"{log.stem} exited with {proc.returncode} before logging {line!r}\n"
                        + log_tail(log)
                    )
                await trio.sleep(0.1)
    except trio.TooSlowError:
        raise AssertionError(f"{log.stem} did not log {line!r}\n" + log_tail(log)) from None


def start(
    cls: str, args: list[str], log: Path, cwd: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), cls, *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    # spark-class execs the JVM: a graceful shutdown (a worker stops its executors first)
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A standalone master on a free loopback port and one registered worker, for the module."""
    where = tmp_path_factory.mktemp("standalone")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    work_dir = where / "work"
    work_dir.mkdir()
    env = child_env()
    env["SPARK_HOME"] = str(SPARK_HOME)
    # No REST submission server (port 6066 by default): nothing here submits through it.
    env["SPARK_MASTER_OPTS"] = "-Dspark.master.rest.enabled=false"
    master_log, worker_log = where / "master.log", where / "worker.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        master = start(
            MASTER,
            ["--host", "127.0.0.1", "--port", str(port), "--webui-port", "0"],
            master_log,
            where,
            env,
        )
        procs.append(master)
        # The worker only after the master listens: its first registration retry is seconds away.
        trio.run(wait_logged, master, master_log, f"Starting Spark master at {url}")
        worker = start(
            WORKER,
            [
                url,
                *("--host", "127.0.0.1", "--cores", "1", "--memory", "1g"),
                *("--webui-port", "0", "--work-dir", str(work_dir)),
            ],
            worker_log,
            where,
            env,
        )
        procs.append(worker)
        trio.run(wait_logged, worker, worker_log, f"Successfully registered with master {url}")
        yield Cluster(url, master_log, worker_log, work_dir)
    finally:
        for proc in reversed(procs):  # the worker (and its executors) first
            stop(proc)


async def test_sink_writes_through_a_standalone_cluster(cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = await run_child("standalone_child.py", cluster.url, str(out), cwd=tmp_path)
    (result,) = done.events("done")
    transcript = done.transcript()
    logs = "\n".join([transcript, log_tail(cluster.master_log), log_tail(cluster.worker_log)])

    # The sink's own session ran on the cluster's master, and stopped on close (stop_session).
    assert result["master"] == cluster.url, logs
    assert result["app_name"] == APP_NAME
    assert result["stopped"] is True
    app_id = result["app_id"]
    assert app_id.startswith("app-"), logs  # a standalone application (local ones: local-...)
    assert result["sink"] == {
        "batches_committed": 2,
        "rows_written": 8,
        "duplicates_skipped": 2,
    }, logs
    assert result["rows_read"] == 8, logs

    # The master registered the application and launched its executor on our worker, in whose
    # work directory the executor ran the tasks: the two writes and the read back.
    master_log = log_text(cluster.master_log)
    assert f"Registering app {APP_NAME}" in master_log, logs
    assert f"Registered app {APP_NAME} with ID {app_id}" in master_log, logs
    assert f"Launching executor {app_id}/0 on worker" in master_log, logs
    (executor_dir,) = (cluster.work_dir / app_id).iterdir()
    executor_log = (executor_dir / "stderr").read_text("utf-8", "replace")
    finished = executor_log.count("INFO Executor: Finished task")
    assert finished >= 3, executor_log[-5000:]

    # Each record once: 1-5 from the first batch, 6-8 from the second (delivered twice), the
    # redelivered 4 and 5 skipped.
    assert len(data_files(out)) == 2, data_files(out)
    rows = sorted(pq.read_table(out).to_pylist(), key=lambda r: r["stream_seq"])
    assert [r["stream_seq"] for r in rows] == list(range(1, 9)), rows
    for r in rows:
        n = r["stream_seq"]
        assert r["stream"] == "ORDERS" and r["subject"] == "orders.new"
        assert r["data"] == f'{{"n": {n}}}'.encode()
        assert r["num_delivered"] == (1 if n <= 5 else 2)
