"""A child process whose stdout and stderr the tests read line by line: the base of the CLI tests'
``headrace`` processes (``tests/cli/cli_support.py``), of the Spark tests' child scripts and
workers (``tests/spark/spark_procs.py``, ``tests/spark/workers_support.py``), of the embedded
application (``tests/pipeline/test_embedded_signals.py``) and of the pinned workers
(``tests/jetstream/test_priority_groups.py``).

Its JSON event lines (:meth:`LineProcess.events`) and the transcript shown in a failed assertion
(:meth:`LineProcess.transcript`) are read here, once for all of them.

Waiting is on events: a new line, the process's exit and the end of both pipes. The end of the
pipes matters where the child starts processes of its own that inherit them (a JVM): only then
is everything it started gone too.
"""

from __future__ import annotations

import json
import signal
from typing import Any

import trio


def json_events(lines: list[str], name: str | None = None) -> list[dict[str, Any]]:
    """The lines that are JSON objects (with ``event`` == ``name`` if given); other lines are
    skipped."""
    found = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and (name is None or obj.get("event") == name):
            found.append(obj)
    return found


class LineProcess:
    """A running process; its stdout and stderr collected as lines in ``out`` and ``err``.

    Whoever starts it runs :meth:`_read` once per pipe (in a nursery). ``title`` heads its
    transcript: the command line, or which of several processes it is. A subclass says where
    its events are and how much a transcript shows (the class attributes), and what it waits
    for."""

    #: The pipe whose JSON lines are the process's events: ``"out"`` or ``"err"``.
    events_on = "out"
    #: Whether every line of that pipe must be JSON (``headrace --json-logs``: another line
    #: fails the test), or other lines are skipped (a library printing there must not).
    strict_events = False
    #: How many of the last stderr and stdout lines a transcript shows.
    transcript_lines = (60, 20)
    #: Stderr lines containing this are left out of a transcript (``None``: none).
    transcript_skips: str | None = None

    def __init__(self, proc: trio.Process, title: str) -> None:
        self.proc = proc
        self.title = title
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
        """What the process printed last, for an assertion message."""
        err_lines, out_lines = self.transcript_lines
        skip = self.transcript_skips
        err = [line for line in self.err if skip is None or skip not in line]
        return (
            f"{self.title}\n--- stderr ---\n"
            + "\n".join(err[-err_lines:])
            + "\n--- stdout ---\n"
            + "\n".join(self.out[-out_lines:])
        )

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The JSON event lines of :attr:`events_on` (``event`` == ``name`` if given)."""
        lines = self.err if self.events_on == "err" else self.out
        if not self.strict_events:
            return json_events(lines, name)
        found = []
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                raise AssertionError(f"not a JSON line: {line!r}\n{self.transcript()}") from None
            if name is None or (isinstance(obj, dict) and obj.get("event") == name):
                found.append(obj)
        return found

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
