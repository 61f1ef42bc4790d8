"""A Spark Connect server for the tests: a real one from the jars PySpark ships
(``SparkConnectServer`` started with PySpark's own ``spark-submit``) on a free loopback port.
tests/spark/conftest.py makes it the module-scoped fixture ``connect_url``."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyspark
import trio

from tests.spark.spark_procs import child_env

SPARK_HOME = Path(pyspark.__file__).resolve().parent
CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = 60) -> str:
    text = path.read_text("utf-8", "replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


async def wait_listening(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Until the server accepts connections on ``port`` (polled: a server starting has no
    event to wait for), or fail early if it exited."""
    try:
        with trio.fail_after(120):
            while True:
                if proc.poll() is not None:
                    raise AssertionError(
                        f"the Connect server exited with {proc.returncode}\n{log_tail(log)}"
                    )
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                except OSError:
                    await trio.sleep(0.2)
                else:
                    await stream.aclose()
                    return
    except trio.TooSlowError:
        raise AssertionError(f"no Connect server on port {port}\n{log_tail(log)}") from None


@contextmanager
def connect_server(where: Path) -> Iterator[str]:
    """A Spark Connect server (local[2]) on a free loopback port, working in ``where``; its
    ``sc://`` URL."""
    port = free_port()
    log = where / "server.log"
    env = child_env()
    env["SPARK_HOME"] = str(SPARK_HOME)
    argv = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        "--class",
        CONNECT_SERVER,
        "--master",
        "local[2]",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.session.timeZone=UTC",
        "--conf",
        f"spark.sql.warehouse.dir={(where / 'warehouse').as_uri()}",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=where, env=env
        )
    try:
        trio.run(wait_listening, proc, port, log)
        yield f"sc://127.0.0.1:{port}"
    finally:
        proc.terminate()  # spark-submit execs the JVM: a graceful shutdown
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
