"""Helpers for the CLI tests: `headrace` subprocesses whose output is read line by line, pipeline
files written to a temporary directory, and nats-py set-up and inspection.

Waiting is on events: a new line from the process, the process's exit, nats-py answers. A test
waits for a line with a predicate and a time limit; on timeout the error shows what the process
printed.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from tests.procs import LineProcess

HEADRACE = str(Path(sys.executable).parent / "headrace")

#: Imports the pipeline files of the tests start with.
PIPELINE_HEADER = """\
import json
import trio
from headrace.jetstream.consumer_config import ConsumerConfig
from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline
from headrace.sinks import JsonlSink, MemorySink
"""


def write_pipeline(directory: Path, body: str, name: str = "pipe.py") -> Path:
    """A pipeline module ``name`` in ``directory``: the common imports, then ``body``."""
    path = directory / name
    path.write_text(PIPELINE_HEADER + "\n" + textwrap.dedent(body), "utf-8")
    return path


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NATS_URL"}
    env.update(extra)
    return env


class HeadraceProcess(LineProcess):
    """A running ``headrace`` command; its stdout and stderr collected as lines. Its events are
    its JSON log lines (``--json-logs``), every stderr line."""

    events_on = "err"
    strict_events = True

    def __init__(self, proc: trio.Process, args: list[str]) -> None:
        super().__init__(proc, f"$ headrace {' '.join(args)}")
        self.args = args

    async def wait_line(
        self,
        predicate: Callable[[str], bool],
        *,
        stream: str = "err",
        start: int = 0,
        timeout: float = 20,
    ) -> tuple[int, str]:
        """The first line (index, text) from ``start`` on that satisfies ``predicate``."""
        lines = self.err if stream == "err" else self.out
        checked = start
        try:
            with trio.fail_after(timeout):
                while True:
                    while checked < len(lines):
                        if predicate(lines[checked]):
                            return checked, lines[checked]
                        checked += 1
                    if self.eof:
                        raise AssertionError(
                            "headrace ended without the expected line\n" + self.transcript()
                        )
                    await self._changed.wait()
        except trio.TooSlowError:
            raise AssertionError(
                f"no expected line within {timeout}s\n" + self.transcript()
            ) from None

    async def wait_event(
        self,
        event: str,
        predicate: Callable[[dict[str, Any]], bool] = lambda _e: True,
        *,
        start: int = 0,
        timeout: float = 20,
    ) -> tuple[int, dict[str, Any]]:
        """The first JSON event named ``event`` (from line ``start`` on) that ``predicate``
        accepts."""

        def match(line: str) -> bool:
            try:
                obj = json.loads(line)
            except ValueError:
                raise AssertionError(f"not a JSON line: {line!r}") from None
            return bool(obj.get("event") == event and predicate(obj))

        index, line = await self.wait_line(match, start=start, timeout=timeout)
        return index, json.loads(line)

    async def wait_exit(self, timeout: float = 30) -> int:
        return await self._wait_exit(timeout, "headrace did not exit")


@asynccontextmanager
async def headrace(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    stderr_terminal: bool = False,
    sigint_ignored: bool = False,
) -> AsyncIterator[HeadraceProcess]:
    """Start ``headrace *args``; it is killed at the end of the block if still running.

    ``stderr_terminal``: its stderr is a pseudo-terminal (100 columns) instead of a pipe.
    ``sigint_ignored``: started as a shell starts a script's background job, SIGINT ignored
    (``trap '' INT``, then ``exec``: the disposition is inherited).
    """
    argv = [HEADRACE, *args]
    if sigint_ignored:
        argv = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]
    master = slave = -1
    if stderr_terminal:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 100, 0, 0))
    async with trio.open_nursery() as nursery:
        try:
            proc = await trio.lowlevel.open_process(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=slave if stderr_terminal else subprocess.PIPE,
                cwd=cwd,
                env=env or clean_env(),
            )
        finally:
            if stderr_terminal:
                os.close(slave)  # the child has its copy; EOF (EIO) once it exits
        hp = HeadraceProcess(proc, list(args))
        nursery.start_soon(hp._read, proc.stdout, hp.out)
        if stderr_terminal:
            nursery.start_soon(hp._read, _TerminalStream(master), hp.err)
        else:
            nursery.start_soon(hp._read, proc.stderr, hp.err)
        try:
            yield hp
        finally:
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()


class _TerminalStream:
    """The master side of a pty, read like a pipe: EIO (the other side closed) is EOF."""

    def __init__(self, fd: int) -> None:
        self._stream = trio.lowlevel.FdStream(fd)

    async def receive_some(self, max_bytes: int) -> bytes:
        try:
            data = await self._stream.receive_some(max_bytes)
        except (OSError, trio.BrokenResourceError):
            data = b""
        if not data:
            await self._stream.aclose()
        return data.replace(b"\r\n", b"\n")


async def run_headrace(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[bytes]:
    """Run ``headrace *args`` to the end and return its output (not checked)."""
    with trio.fail_after(timeout):
        return await trio.run_process(
            [HEADRACE, *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=cwd,
            env=env or clean_env(),
        )


# -- nats-py: the independent peer ------------------------------------------------------------


async def create_stream(natspy: Any, url: str, name: str = "ORDERS") -> None:
    if natspy.nc is None:
        await natspy.connect(url)
    js = natspy.nc.jetstream()
    await natspy.call(js.add_stream, name=name, subjects=[f"{name.lower()}.>"])


async def publish(
    natspy: Any, count: int, *, stream: str = "ORDERS", start: int = 0, chunk: int = 500
) -> None:
    """Publish ``count`` JSON orders ``{"id": i}`` to the stream, confirmed by their PubAcks."""
    js = natspy.nc.jetstream()
    subject = f"{stream.lower()}.new"

    async def go() -> None:
        for base in range(start, start + count, chunk):
            end = min(base + chunk, start + count)
            await asyncio.gather(
                *(js.publish(subject, json.dumps({"id": i}).encode()) for i in range(base, end))
            )

    await natspy.call(go)


async def consumer_info(natspy: Any, durable: str, stream: str = "ORDERS") -> Any:
    return await natspy.call(natspy.nc.jetstream().consumer_info, stream, durable)


def read_jsonl(directory: Path) -> list[dict[str, Any]]:
    """Every line of every ``*.jsonl`` file in ``directory``, parsed."""
    return [
        json.loads(line)
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text("utf-8").splitlines()
    ]


# -- several workers (`headrace run --workers N`) ---------------------------------------------


class ProcessWatch:
    """A process that is not our child (a worker of a `headrace run --workers`), to wait for
    its end: a pidfd, opened while the process runs so that a later reuse of its pid cannot
    fool the wait; it becomes readable when the process exits, reaped or not."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd = os.pidfd_open(pid)

    async def wait_gone(self, timeout: float = 10) -> None:
        try:
            with trio.fail_after(timeout):
                await trio.lowlevel.wait_readable(self.fd)
        except trio.TooSlowError:
            raise AssertionError(f"process {self.pid} still runs after {timeout}s") from None

    def close(self) -> None:
        os.close(self.fd)


async def metrics_samples(port: int) -> dict[str, float]:
    """``GET /metrics`` from 127.0.0.1:``port``: ``name{labels}`` -> value (status 200 checked)."""
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK"), head
    samples: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    return samples
