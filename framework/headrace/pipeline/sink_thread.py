"""One thread for a sync sink's whole life.

A sync sink's methods must all run on one thread. Many database drivers tie what they make to
the thread that made it: a ``sqlite3`` connection opened in ``open()`` refuses to be used from
any other thread (``check_same_thread``), and a driver that is not thread-safe at all is safe
only when one thread does everything. ``trio.to_thread.run_sync`` gives no such promise: each
call takes whichever thread of trio's cache is idle, so ``open()`` and ``write_batch()`` ran on
different threads, and every batch of such a sink failed and went, after its retries, to the
dead letter.

A :class:`SinkThread` holds one thread from ``bind``/``open`` to ``close`` and runs the sink's
calls on it, one at a time and in order, from a queue. The thread is taken from trio's cache
with one long ``trio.to_thread.run_sync`` call (hosted by a system task), not made with
``threading.Thread``: trio knows its own worker threads only, and a sync sink is told to reach
the loop with ``trio.from_thread.run(...)`` (docs/sinks.md; ``JsonlSink`` does), which fails in
any other thread. Results come back through the run's ``TrioToken`` and a ``trio.Event``.

Cancellation: a caller cancelled while waiting (a hard stop) gets ``Cancelled`` at once. A call
it had queued that has not started yet is never run; one that is running is abandoned, as
``trio.to_thread.run_sync(..., abandon_on_cancel=True)`` would: it runs on and its result is
dropped, and the thread runs nothing else until it returns. :meth:`stop` (after ``close``)
queues the end: the thread finishes what it runs, skips abandoned calls and goes back to trio's
cache (where it exits after 10 s idle). If the run ends first, the thread stops at the same
point; a call stuck for good keeps its (daemon) thread until the process exits.

The end of the process: an abandoned call may still run when the interpreter finalizes, and
finalization ends a daemon thread where it stands. In C++ code that catches every exception
(DuckDB's ``connect`` or ``execute``) this is ``terminate called ... FATAL: exception not
rethrown`` and an abort, exit 134, instead of the exit code the run decided (issue 23: a run
that failed at start while a DuckDB sink's ``open()`` ran, 5 of 5 times). So the module knows
which sink calls are running (:func:`calls_running`); ``headrace run`` ends without finalizing
when one is (:func:`headrace.cli.exits.exit_now`, after its last line), and in an embedding
application an exit handler waits up to :data:`EXIT_GRACE` seconds for them, then ends the
same way (exit status 1) rather than abort.
"""

from __future__ import annotations

import atexit
import contextvars
import os
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import trio

#: The name each sink's thread carries while it serves the sink (``<prefix><sink name>``).
THREAD_NAME_PREFIX = "headrace sink "

#: How long an application's exit waits for sink calls that still run (see the module docs).
EXIT_GRACE = 30.0

#: Every sink thread not yet back in trio's cache; guarded by :data:`_calls_changed`.
_serving: weakref.WeakSet[SinkThread] = weakref.WeakSet()
#: Notified (by the threads) each time a sink call starts or ends.
_calls_changed = threading.Condition()


def calls_running() -> list[str]:
    """The sink calls running now, abandoned ones included (``open() of sink 'duck'``)."""
    with _calls_changed:
        return sorted(
            f"{running}() of sink {thread.name!r}"
            for thread in _serving
            if (running := thread.running) is not None
        )


def wait_for_calls(timeout: float) -> list[str]:
    """Wait up to ``timeout`` seconds for no sink call to run; return those still running."""
    deadline = time.monotonic() + timeout
    with _calls_changed:
        while running := calls_running():
            left = deadline - time.monotonic()
            if left <= 0:
                return running
            _calls_changed.wait(left)
    return []


@atexit.register
def _at_exit() -> None:
    """An application's exit: do not let finalization stop a thread in a sink call."""
    if not calls_running():
        return
    running = wait_for_calls(EXIT_GRACE)
    if running:
        print(
            f"headrace: {', '.join(running)} still running {EXIT_GRACE:g} s after exit began; "
            "ending the process without finalizing it (a thread stopped in a C extension's "
            "call could abort it)",
            file=sys.stderr,
        )
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(1)


class _Call:
    """One call of a sink method, handed from the loop to the thread and back."""

    __slots__ = ("abandoned", "args", "context", "done", "error", "fn", "value")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        # The caller's context variables, as trio.to_thread gives them to a thread.
        self.context = contextvars.copy_context()
        self.done = trio.Event()
        #: Set (from the loop) when the caller gave up waiting: not started, it is skipped.
        self.abandoned = False
        self.value: Any = None
        self.error: BaseException | None = None


class SinkThread:
    """A thread that runs one sink's sync calls, in order, until :meth:`stop`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._token = trio.lowlevel.current_trio_token()
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        #: Set once stop() was called: no more calls are taken.
        self.stopping = False
        #: Set once the thread serves the sink no more (it is back in trio's cache), or the
        #: run is ending.
        self.ended = trio.Event()
        #: The thread's id, once it has started.
        self.ident: int | None = None
        #: Calls queued and not finished (abandoned ones included): the thread is free at 0.
        self.pending = 0
        #: The name of the method the thread runs now (set by the thread), or None.
        self.running: str | None = None
        trio.lowlevel.spawn_system_task(self._host, name=f"<sink thread {name}>")

    def __repr__(self) -> str:
        state = "ended" if self.ended.is_set() else "stopping" if self.stopping else "serving"
        return f"<SinkThread {self.name!r} {state}>"

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the thread, after the calls queued before it; see the module docs
        for cancellation."""
        if self.stopping:
            raise RuntimeError(f"{self!r} takes no more calls")
        await trio.lowlevel.checkpoint_if_cancelled()
        call = _Call(fn, args)
        self.pending += 1
        self._calls.put(call)
        try:
            await call.done.wait()
        except BaseException:
            call.abandoned = True
            raise
        error, call.error = call.error, None
        if error is not None:
            try:
                raise error
            finally:
                del error  # (no frame <-> traceback cycle left to the garbage collector)
        return call.value

    def stop(self) -> None:
        """Let the thread go once it has run the calls queued (idempotent)."""
        if not self.stopping:
            self.stopping = True
            self._calls.put(None)

    async def _host(self) -> None:
        try:
            await trio.to_thread.run_sync(
                self._serve,
                thread_name=THREAD_NAME_PREFIX + self.name,
                # At the end of the run, not wait for a call that may never return.
                abandon_on_cancel=True,
                # Its own: holding a thread for a sink's life takes nothing from the default
                # limiter that the application's to_thread calls share.
                limiter=trio.CapacityLimiter(1),
            )
        finally:
            # The run is ending (or the thread is done): let a thread still in a call stop
            # after it.
            self._calls.put(None)
            self.ended.set()

    def _running(self, method: str | None) -> None:
        with _calls_changed:
            self.running = method
            if method is None:
                _calls_changed.notify_all()
            else:
                _serving.add(self)

    def _serve(self) -> None:
        """The thread's loop."""
        self.ident = threading.get_ident()
        calls = self._calls
        while True:
            call = calls.get()
            if call is None:
                return
            # (One abandoned before it began is skipped: as if never asked.)
            if not call.abandoned:
                self._running(getattr(call.fn, "__name__", "call"))
                try:
                    call.value = call.context.run(call.fn, *call.args)
                except BaseException as exc:
                    call.error = exc
                finally:
                    self._running(None)
            try:
                self._token.run_sync_soon(self._finished, call)
            except trio.RunFinishedError:
                return
            del call

    def _finished(self, call: _Call) -> None:
        """In the loop: a call is over."""
        self.pending -= 1
        call.done.set()
