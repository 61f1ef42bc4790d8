"""Python child processes for the Spark tests that need a process of their own: a crash
(SIGKILL), or a session restart (an embedded Derby metastore is one JVM's at a time).

A child prints JSON lines on stdout (its events and counters); its stderr is kept for the
assertion messages. Waiting is on events: a new line, the process's exit and the end of both
pipes. The end of the pipes matters: the JVM PySpark starts inherits them, so it also says that
the child's JVM is gone (and with it the metastore's lock and the output's files in use).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from tests.procs import LineProcess

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def child_env() -> dict[str, str]:
    """The environment of a child: ours (JAVA_HOME, PATH), the test helpers importable, the
    Python workers on this interpreter, Spark bound to the loopback address, and a JVM tuned
    to start fast (C1 only, the serial collector: about half the start-up of a short-lived
    Spark driver on two cores)."""
    env = dict(os.environ)
    # The repository root, for `tests.sinks.sink_support` and the like; never tests/ itself,
    # where tests/nats would hide nats-py.
    paths = [str(TESTS.parent)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYTHONUNBUFFERED"] = "1"
    java = env.get("JAVA_TOOL_OPTIONS", "")
    env["JAVA_TOOL_OPTIONS"] = f"{java} {FAST_JVM}".strip()
    return env


class Child(LineProcess):
    """A running child script; its stdout and stderr collected as lines."""

    transcript_lines = (80, 30)

    def __init__(self, proc: trio.Process, argv: list[str]) -> None:
        super().__init__(proc, f"$ {' '.join(argv)}")
        self.argv = argv

    async def wait_event(
        self,
        name: str,
        predicate: Callable[[dict[str, Any]], bool] = lambda _e: True,
        timeout: float = 60,
    ) -> dict[str, Any]:
        try:
            with trio.fail_after(timeout):
                while True:
                    for event in self.events(name):
                        if predicate(event):
                            return event
                    if self.eof:
                        raise AssertionError(
                            f"the child ended without event {name!r}\n" + self.transcript()
                        )
                    await self._changed.wait()
        except trio.TooSlowError:
            raise AssertionError(
                f"no event {name!r} within {timeout}s\n" + self.transcript()
            ) from None

    async def wait_exit(self, timeout: float = 60) -> int:
        """The exit code, once the child exited and its JVM closed the pipes too."""
        return await self._wait_exit(timeout, "the child did not end")


@asynccontextmanager
async def child(
    script: str, *args: str, cwd: Path, env: Mapping[str, str] | None = None
) -> AsyncIterator[Child]:
    """Run ``tests/spark/<script> *args`` (in ``env``, default :func:`child_env`); killed at
    the end of the block if still running."""
    argv = [sys.executable, str(HERE / script), *args]
    async with trio.open_nursery() as nursery:
        proc = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=dict(env) if env is not None else child_env(),
        )
        running = Child(proc, argv)
        nursery.start_soon(running._read, proc.stdout, running.out)
        nursery.start_soon(running._read, proc.stderr, running.err)
        try:
            yield running
        finally:
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()
                # The JVM notices that its parent is gone (its stdin closes) and exits, which
                # ends the pipes: the readers finish, boundedly.
                with trio.move_on_after(30):
                    await running.wait_eof()
                nursery.cancel_scope.cancel()


async def run_child(
    script: str,
    *args: str,
    cwd: Path,
    timeout: float = 90,
    env: Mapping[str, str] | None = None,
) -> Child:
    """Run a child to its end (and its JVM's); its exit code must be 0."""
    async with child(script, *args, cwd=cwd, env=env) as running:
        code = await running.wait_exit(timeout)
        assert code == 0, f"the child exited with {code}\n" + running.transcript()
    return running
