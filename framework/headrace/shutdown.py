"""Stopping on signals: the first SIGINT or SIGTERM drains, a later one stops hard.

``headrace run`` and :func:`run_until_signal` (for trio applications and scripts that run a
pipeline themselves) follow one rule, written once here:

- the first signal asks for a **drain**: sources stop pulling; what was taken is committed,
  acked, and the acks flushed;
- a signal less than :data:`SAME_REQUEST_WINDOW` (1 s) after the request it follows is **the
  same request**. Signals often come twice: GNU ``timeout`` signals the process and then its
  process group, a service manager may signal every process of the group, and a user presses
  Ctrl-C twice in a row when nothing seems to happen at once. Taking the copy for "stop hard"
  threw away a drain that was about to finish;
- a signal later than that asks for a **hard stop**: every pipeline is stopped without waiting
  for its drain; what was not committed is redelivered by the server after its ack wait;
- a signal later again, after the hard stop, is **force**: ``headrace run`` exits at once.

The pieces:

- :class:`StopLadder`: the rule itself, without I/O: a signal and when it came in, the step
  out.
- :class:`SignalCatcher`: the signal handlers. It records every signal with the time its
  handler ran (not when the loop got round to it: a loop held up by a long computation would
  otherwise see two signals seconds apart as one). It is not ``trio.open_signal_receiver``,
  because that one re-raises, when its block ends, every signal it caught and nobody read, with
  the handler that was there before: a duplicated SIGTERM arriving while ``headrace run`` was
  finishing killed the process with status 143 after it had logged ``exit_code=0``. Here a
  signal is never raised again; once the outcome is decided, signals go to a callback
  (:meth:`SignalCatcher.settle`).
- :func:`run_until_signal`: the rule applied to a pipeline or to an async function that runs
  pipelines, with the outcome as a :class:`Shutdown`.

With the handlers in place, SIGINT is no ``KeyboardInterrupt``. An application that takes
Ctrl-C the plain trio way still gets one, but not inside headrace: the connection's tasks, a
pipeline's actors and its own task are protected from it
(:func:`trio.lowlevel.enable_ki_protection`), so trio raises it in the application's main task,
and the pipeline drains as the exception leaves its ``running`` block.
"""

from __future__ import annotations

import enum
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs
import trio

from headrace._run_registry import RUNS

if TYPE_CHECKING:
    from headrace.pipeline.runtime import PipelineRun

#: Seconds after a request during which another signal is the same request.
SAME_REQUEST_WINDOW = 1.0
#: The signals that ask a pipeline to stop.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)

#: Exit statuses, as ``headrace run`` uses them (docs/cli.md).
EXIT_OK = 0
EXIT_DRAIN_INCOMPLETE = 3

T = TypeVar("T")


class Step(enum.Enum):
    """What a signal asks for, by :class:`StopLadder`'s rule."""

    #: The first request: drain.
    DRAIN = "drain"
    #: Within the window of the request before it: the same request again; nothing changes.
    REPEAT = "repeat"
    #: The second request: stop hard.
    HARD = "hard"
    #: A request after the hard stop: stop at once (``headrace run`` exits).
    FORCE = "force"


@attrs.frozen(slots=True)
class Arrival:
    """A signal, and when its handler ran (``time.monotonic()``)."""

    signal: signal.Signals
    at: float


@attrs.frozen(slots=True)
class SignalStep:
    """A signal and what :class:`StopLadder` took it for."""

    signal: signal.Signals
    step: Step
    #: When it came in (``time.monotonic()``).
    at: float
    #: Seconds since the request it repeats or follows; ``None`` for the first.
    since: float | None


class StopLadder:
    """The rule of the module docs: each signal moves one step up (drain, hard, force), unless
    it came less than ``window`` seconds after the step before, which makes it a repeat.

    The window is counted from the last step taken, not from the last signal: signals coming
    every half second still climb, once a second.
    """

    def __init__(self, window: float = SAME_REQUEST_WINDOW) -> None:
        if not window >= 0:
            raise ValueError(f"the window must be 0 or more seconds, not {window!r}")
        self.window = window
        self.steps: list[SignalStep] = []
        self._level = 0
        self._last: float | None = None

    @property
    def level(self) -> Step | None:
        """The highest step taken so far (``None`` before any signal)."""
        return (None, Step.DRAIN, Step.HARD, Step.FORCE)[self._level]

    def feed(self, arrival: Arrival) -> SignalStep:
        since = None if self._last is None else arrival.at - self._last
        if since is not None and since < self.window:
            step = Step.REPEAT
        else:
            self._level = min(self._level + 1, 3)
            self._last = arrival.at
            step = (Step.DRAIN, Step.HARD, Step.FORCE)[self._level - 1]
        taken = SignalStep(arrival.signal, step, arrival.at, since)
        self.steps.append(taken)
        return taken

    def after_stopped(self, stop_now: Callable[[], object]) -> Callable[[Arrival], None]:
        """For :meth:`SignalCatcher.settle` once the outcome was said: the same request again
        is nothing; a new one calls ``stop_now`` (which ends the process with that outcome)."""

        def late(arrival: Arrival) -> None:
            if self.feed(arrival).step is not Step.REPEAT:
                stop_now()

        return late


class SignalCatcher:
    """Handlers for ``signals`` from entering the ``with`` block (or :meth:`install`) to leaving
    it (:meth:`uninstall`), which puts the previous handlers back.

    Every signal is recorded with the time its handler ran and handed, in the trio run, to
    whoever awaits :meth:`receive`. A signal nobody received is left in :attr:`unread`, never
    raised again. After :meth:`settle`, signals go straight to its callback instead.

    Only in the main thread (Python runs signal handlers there). One catcher per signal at a
    time: a second one replaces the first's handlers until it is uninstalled.
    """

    def __init__(self, signals: Iterable[int] = STOP_SIGNALS) -> None:
        self.signals = tuple(dict.fromkeys(signal.Signals(s) for s in signals))
        if not self.signals:
            raise ValueError("no signals to catch")
        #: Every signal caught, in order.
        self.received: list[Arrival] = []
        self._unread: deque[Arrival] = deque()
        self._previous: dict[signal.Signals, Any] = {}
        self._token: trio.lowlevel.TrioToken | None = None
        self._lot = trio.lowlevel.ParkingLot()
        self._late: Callable[[Arrival], object] | None = None

    @property
    def unread(self) -> list[Arrival]:
        """Signals caught and not received yet."""
        return list(self._unread)

    # -- handlers ---------------------------------------------------------------------------

    def install(self) -> SignalCatcher:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("signals can be caught in the main thread only")
        if self._previous:
            raise RuntimeError("this SignalCatcher is installed already")
        try:
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self._handler)
        except BaseException:
            self.uninstall()
            raise
        return self

    def uninstall(self) -> None:
        """Put back the handlers there were before; signals caught and not read stay in
        :attr:`unread`."""
        previous, self._previous = self._previous, {}
        for signum, handler in reversed(previous.items()):
            signal.signal(signum, handler)

    def __enter__(self) -> SignalCatcher:
        return self.install()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstall()

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread between two bytecodes of whatever was running: record, and
        # leave the rest to the trio run (or to the settled callback).
        arrival = Arrival(signal.Signals(signum), time.monotonic())
        self.received.append(arrival)
        late = self._late
        if late is not None:
            late(arrival)
            return
        self._unread.append(arrival)
        token = self._token
        if token is not None:
            try:
                token.run_sync_soon(self._wake, idempotent=True)
            except trio.RunFinishedError:
                pass

    def _wake(self) -> None:
        self._lot.unpark_all()

    # -- reading ----------------------------------------------------------------------------

    async def receive(self) -> Arrival:
        """The next signal caught (signals caught before the first call come first)."""
        self._token = trio.lowlevel.current_trio_token()
        if self._unread:
            await trio.lowlevel.checkpoint()
        while not self._unread:
            await self._lot.park()
        return self._unread.popleft()

    def settle(self, late: Callable[[Arrival], object]) -> None:
        """The outcome is decided: each signal not read yet, and from now on each signal as it
        comes (in the signal handler itself), goes to ``late``."""
        self._late = late
        while self._unread:
            late(self._unread.popleft())


# -- which pipelines a hard stop stops ------------------------------------------------------

# The registry lives in headrace._run_registry (below pipeline/, which registers every run).
_RUNS = RUNS


# -- the helper -----------------------------------------------------------------------------


class StopReason(enum.Enum):
    """How :func:`run_until_signal` ended."""

    #: No signal: the pipeline or the function ended on its own.
    FINISHED = "finished"
    #: A signal; the drain finished: every message taken was committed and acked.
    DRAINED = "drained"
    #: A signal; the drain did not finish in time (``grace``, or a pipeline's
    #: ``drain_timeout``): the rest was stopped hard and is redelivered after its ack wait.
    DRAIN_TIMED_OUT = "drain_timed_out"
    #: A second signal stopped it hard: what was not committed is redelivered.
    STOPPED_HARD = "stopped_hard"


@attrs.frozen(slots=True)
class Shutdown(Generic[T]):
    """What :func:`run_until_signal` returns: why it ended, and the exit status a process
    would use for it (that of ``headrace run``)."""

    reason: StopReason
    #: The signal that asked for the stop: the first one, or for ``STOPPED_HARD`` the one that
    #: stopped it hard; ``None`` for ``FINISHED``.
    signal: signal.Signals | None
    #: Every signal caught, with the step it was taken for (repeats included).
    signals: tuple[SignalStep, ...] = ()
    #: What the function returned (``None`` for a pipeline, or when it was cancelled).
    result: T | None = None

    @property
    def exit_code(self) -> int:
        """0 when finished or drained, 3 when the drain ran out of time, 128 + N when signal
        N stopped it hard."""
        if self.reason is StopReason.STOPPED_HARD:
            assert self.signal is not None
            return 128 + int(self.signal)
        if self.reason is StopReason.DRAIN_TIMED_OUT:
            return EXIT_DRAIN_INCOMPLETE
        return EXIT_OK


class _Stopper:
    """One :func:`run_until_signal`: its cancel scope, the runs it stops, what happened."""

    def __init__(
        self,
        window: float,
        grace: float | None,
        on_signal: Callable[[SignalStep], object] | None,
    ) -> None:
        self.ladder = StopLadder(window)
        self.grace = grace
        self.on_signal = on_signal
        self.scope = trio.CancelScope()
        self.runs: weakref.WeakSet[PipelineRun] = weakref.WeakSet()
        self.drain: SignalStep | None = None
        self.hard: SignalStep | None = None
        self.grace_expired = False

    async def listen(self, catcher: SignalCatcher, nursery: trio.Nursery) -> None:
        while True:
            taken = self.ladder.feed(await catcher.receive())
            if taken.step is Step.DRAIN:
                self.drain = taken
                # Cancelling the body drains every pipeline in it (their `running` blocks
                # are left by cancellation); the app's own tasks stop too.
                self.scope.cancel()
                if self.grace is not None:
                    nursery.start_soon(self._grace_timer, self.grace)
            elif taken.step is not Step.REPEAT:
                if self.hard is None:
                    self.hard = taken
                self._stop_hard()
            if self.on_signal is not None:
                self.on_signal(taken)

    async def _grace_timer(self, grace: float) -> None:
        await trio.sleep(grace)
        self.grace_expired = True
        self._stop_hard()

    def _stop_hard(self) -> None:
        self.scope.cancel()
        for run in list(self.runs):
            run.stop()

    def outcome(self, result: T | None, late: list[Arrival]) -> Shutdown[T]:
        for arrival in late:  # came as it ended: on the record, too late to change anything
            self.ladder.feed(arrival)
        steps = tuple(self.ladder.steps)
        if self.hard is not None:
            return Shutdown(StopReason.STOPPED_HARD, self.hard.signal, steps, result)
        if self.drain is None:
            return Shutdown(StopReason.FINISHED, None, steps, result)
        if self.grace_expired or any(run.drain_timed_out for run in self.runs):
            return Shutdown(StopReason.DRAIN_TIMED_OUT, self.drain.signal, steps, result)
        return Shutdown(StopReason.DRAINED, self.drain.signal, steps, result)


async def run_until_signal(
    target: Any,
    *args: Any,
    signals: Iterable[int] = STOP_SIGNALS,
    grace: float | None = None,
    window: float = SAME_REQUEST_WINDOW,
    on_signal: Callable[[SignalStep], object] | None = None,
) -> Shutdown[Any]:
    """Run a pipeline, or an async function that runs pipelines, until a signal stops it.

    ``await run_until_signal(pipe, nc)`` runs :class:`~headrace.pipeline.graph.Pipeline`
    ``pipe`` on connection ``nc`` (as ``pipe.run(nc)``); ``await run_until_signal(fn, *args)``
    runs ``await fn(*args)``, which may start pipelines and tasks of its own. Then:

    - the first of ``signals`` cancels it: its pipelines drain (sources stop, what was taken is
      committed and acked, the acks flushed), its other tasks are cancelled;
    - a signal less than ``window`` seconds after the one before that counted is the same
      request;
    - a later one stops every pipeline started inside at once (``PipelineRun.stop()``): what was
      not committed is redelivered after its ack wait;
    - ``grace``: seconds the drain may take before it is stopped hard that way (by default each
      pipeline's ``drain_timeout`` applies).

    Returns a :class:`Shutdown`: why it ended and the matching exit status; ``result`` is what
    ``fn`` returned. An error of the pipeline or of ``fn`` is raised as it is. The handlers are
    in place for the whole call, in the main thread only, and the previous ones put back on
    return; a signal that comes while it returns is listed in ``signals``, not raised again.
    ``on_signal`` is called (in the trio run) with each signal and the step it was taken for.
    """
    from headrace.pipeline.graph import Pipeline

    if grace is not None and not grace >= 0:
        raise ValueError(f"grace must be 0 or more seconds, not {grace!r}")
    if isinstance(target, Pipeline):
        if len(args) != 1:
            raise TypeError(
                "run_until_signal(pipeline, nc): a pipeline takes the connection to run on, "
                f"and only that ({len(args)} arguments given)"
            )
        fn: Callable[..., Awaitable[Any]] = target.run
    elif callable(target):
        fn = target
    else:
        raise TypeError(
            f"run_until_signal runs a Pipeline or an async function, not {type(target).__name__}"
        )
    stopper = _Stopper(window, grace, on_signal)
    result: Any = None
    error: BaseException | None = None
    with SignalCatcher(signals) as catcher:
        token = _RUNS.set(stopper.runs)
        try:
            # The body runs in this task, outside the nursery's body as far as exceptions go,
            # so that its error comes out as raised, not wrapped in an ExceptionGroup.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stopper.listen, catcher, nursery)
                try:
                    with stopper.scope:
                        result = await fn(*args)
                except BaseException as exc:
                    error = exc
                nursery.cancel_scope.cancel()
        finally:
            _RUNS.reset(token)
    late = catcher.unread
    if error is not None:
        try:
            raise error
        finally:
            error = None
    return stopper.outcome(result, late)


__all__ = [
    "SAME_REQUEST_WINDOW",
    "STOP_SIGNALS",
    "Arrival",
    "Shutdown",
    "SignalCatcher",
    "SignalStep",
    "Step",
    "StopLadder",
    "StopReason",
    "run_until_signal",
]
