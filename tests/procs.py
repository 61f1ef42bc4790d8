"""A child process whose stdout and stderr the tests read line by line: the base of the CLI tests'
``headrace`` processes (``tests/cli/cli_support.py``) and of the Spark tests' child scripts
(``tests/spark/spark_procs.py``).

Waiting is on events: a new line, the process's exit and the end of both pipes. The end of the
pipes matters where the child starts processes of its own that inherit them (a JVM): only then
is everything it started gone too.
"""

from __future__ import annotations

import signal
from typing import Any

import trio


class LineProcess:
    """A running process; its stdout and stderr collected as lines in ``out`` and ``err``.

    Whoever starts it runs :meth:`_read` once per pipe (in a nursery). A subclass says how it is
    shown in a failed assertion (:meth:`transcript`) and what it waits for."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        self._changed = trio.Event()
        self._eof = 0

    async def _read(self, stream: Any, lines: list[str]) -> None:
        """Append the lines of ``stream`` (anything with ``receive_some``) to ``lines`` until it
        ends; a last line without a newline counts too."""
        pending = b""
        while True:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            pending += chunk
            *complete, pending = pending.split(b"\n")
            if complete:
                lines.extend(line.decode("utf-8", "replace") for line in complete)
                self._wake()
        if pending:
            lines.append(pending.decode("utf-8", "replace"))
        self._eof += 1
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    @property
    def eof(self) -> bool:
        """Both pipes ended."""
        return self._eof >= 2

    async def wait_eof(self) -> None:
        """Until both pipes ended (no time limit: the caller sets one)."""
        while not self.eof:
            await self._changed.wait()

    def transcript(self) -> str:
        """What the process printed, for an assertion message."""
        raise NotImplementedError

    def signal(self, sig: signal.Signals = signal.SIGINT) -> None:
        self.proc.send_signal(sig)

    async def _wait_exit(self, timeout: float, too_slow: str) -> int:
        """The exit code, once the process exited and both pipes ended; after ``timeout``
        seconds an AssertionError saying ``too_slow`` and showing the transcript."""
        try:
            with trio.fail_after(timeout):
                code = await self.proc.wait()
                await self.wait_eof()
        except trio.TooSlowError:
            raise AssertionError(f"{too_slow} within {timeout}s\n" + self.transcript()) from None
        return code
