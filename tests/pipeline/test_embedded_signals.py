"""Signals to a trio application that embeds a pipeline.

In child processes (``embedded_app.py``), against a real nats-server: a SIGINT at a random
moment of a fast consumption, as a plain application gets it (``KeyboardInterrupt``) and through
``run_until_signal``; and interrupts raised on purpose inside the connection's reader and inside
a map. In every case the application ends within a few seconds, the interrupt reaches the
application's own code, and every message it says it took was committed and acked: the server's
ack floor is the count the application reports.

In this process: ``run_until_signal`` on a pipeline and on an application function, with the
signals raised by the test (``signal.raise_signal``) while the helper's handlers are in place.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace import Shutdown, StopReason, run_until_signal
from headrace.pipeline import BatchPolicy, Pipeline, PipelineRun
from headrace.shutdown import Step
from headrace.sinks import MemorySink

from tests.pipeline.pipe_support import (
    GatedSink,
    add_stream,
    connect,
    consumer_info,
    fast_pipeline,
    publish,
    source,
    wait_consumer,
)
from tests.procs import LineProcess

APP = Path(__file__).resolve().parent / "embedded_app.py"

#: Enough for several seconds of consumption: the signal comes while it runs at full speed.
MESSAGES = 60_000


# -- the application in a child process ------------------------------------------------------


class App(LineProcess):
    """``embedded_app.py`` running; its stdout lines are JSON events."""

    transcript_lines = (60, 10)

    def __init__(self, proc: trio.Process, argv: list[str]) -> None:
        super().__init__(proc, f"$ {' '.join(argv)}")
        self.argv = argv

    async def wait_event(
        self, name: str, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20
    ) -> dict[str, Any]:
        try:
            with trio.fail_after(timeout):
                while True:
                    for event in self.events(name):
                        if predicate(event):
                            return event
                    if self.eof:
                        raise AssertionError(f"ended without {name!r}\n" + self.transcript())
                    await self._changed.wait()
        except trio.TooSlowError:
            raise AssertionError(f"no {name!r} within {timeout}s\n" + self.transcript()) from None

    async def wait_exit(self, timeout: float) -> int:
        return await self._wait_exit(timeout, "the application did not exit")


@asynccontextmanager
async def embedded_app(url: str, durable: str, mode: str) -> AsyncIterator[App]:
    """Run ``embedded_app.py URL DURABLE MODE``; killed at the end of the block if still
    running."""
    argv = [sys.executable, str(APP), url, durable, mode]
    async with trio.open_nursery() as nursery:
        proc = await trio.lowlevel.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        app = App(proc, argv)
        nursery.start_soon(app._read, proc.stdout, app.out)
        nursery.start_soon(app._read, proc.stderr, app.err)
        try:
            yield app
        finally:
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()


@pytest.fixture
async def orders(nats_server: Any, natspy: Any) -> Any:
    """The stream ORDERS with MESSAGES orders ``{"id": i}`` (published without waiting for
    each PubAck, then counted in the stream)."""
    await natspy.connect(nats_server.url)
    await add_stream(natspy, "ORDERS", ["orders.>"])

    async def go() -> None:
        nc = natspy.nc
        for i in range(MESSAGES):
            await nc.publish("orders.new", b'{"id": %d}' % i)
        await nc.flush()
        js = nc.jetstream()
        # The stream stores what it was sent; that has no event to wait for.
        while (await js.stream_info("ORDERS")).state.messages < MESSAGES:  # noqa: ASYNC110
            await asyncio.sleep(0.02)

    await natspy.call(go)
    return natspy


async def interrupted(
    natspy: Any, url: str, durable: str, mode: str, moment: float | None = None
) -> tuple[int, float, dict[str, Any], Any]:
    """Run the application; SIGINT it ``moment`` seconds after consumption started (``None``:
    it interrupts itself). The exit status, the seconds from the signal to the exit, the
    application's ``exit`` event, and the consumer once the server applied the acks it
    reports."""
    async with embedded_app(url, durable, mode) as app:
        if moment is not None:
            await app.wait_event("progress", lambda e: e["taken"] > 0)
            await trio.sleep(moment)  # not a wait for a condition: the moment, at random
            app.signal(signal.SIGINT)
        sent = trio.current_time()
        code = await app.wait_exit(timeout=15)
        took = trio.current_time() - sent
    exits = app.events("exit")
    assert len(exits) == 1, app.transcript()
    end = exits[0]
    # The server applies acks from its own queue: wait until it shows the reported count.
    info = await wait_consumer(
        natspy,
        lambda i: i.ack_floor.stream_seq >= end["acks"],
        stream="ORDERS",
        durable=durable,
    )
    return code, took, end, info


def check_drained(code: int, took: float, end: dict[str, Any], info: Any, expected: int) -> None:
    """Exited promptly with ``expected``; everything taken was committed and acked, and the
    server's ack floor is what the application counted."""
    assert code == expected, end
    assert took < 5, (took, end)
    assert end["taken"] > 0 and end["acks"] == end["taken"] and end["ack_pending"] == 0, end
    assert info.ack_floor.stream_seq == end["acks"], (end, info)


@pytest.mark.slow
async def test_sigint_at_random_moments_reaches_the_app_and_drains(
    nats_server: Any, orders: Any
) -> None:
    """A plain trio application: trio raises the interrupt wherever the main thread is. It used
    to land in the connection's writer or reader (the connection died under the drain, which
    waited out its 30 s with the acks unsent), or in a stage of the pipeline (which stopped
    without a drain, or failed with the ClosedResourceError of the next stage). Now it lands
    in the application's code every time: its main task, or a task of its own (its progress
    reporter, CI saw once), never in headrace's."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for attempt in range(12):
        code, took, end, info = await interrupted(
            orders, nats_server.url, f"ki{attempt}", "ki", rng.uniform(0, 0.3)
        )
        context = f"attempt {attempt}, seed {seed}: {end}"
        assert end["where"].startswith("__main__."), context
        check_drained(code, took, end, info, 130)


@pytest.mark.slow
async def test_sigint_at_random_moments_through_run_until_signal(
    nats_server: Any, orders: Any
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for attempt in range(10):
        code, took, end, info = await interrupted(
            orders, nats_server.url, f"helper{attempt}", "helper", rng.uniform(0, 0.3)
        )
        assert end["how"] == "drained", f"attempt {attempt}, seed {seed}: {end}"
        check_drained(code, took, end, info, 0)


async def test_an_interrupt_in_the_reader_goes_to_the_app(nats_server: Any, orders: Any) -> None:
    """Raised inside the connection's reader task (a subscription handler runs there), the
    interrupt is held for the application's main task: the connection lives on, the drain sends
    its acks, and a flush after the interrupt is answered."""
    code, took, end, info = await interrupted(orders, nats_server.url, "reader", "ki-in-reader")
    assert end["where"].startswith("__main__.app >"), end
    check_drained(code, took, end, info, 130)


async def test_an_interrupt_in_a_map_goes_to_the_app(nats_server: Any, orders: Any) -> None:
    """Raised inside a map (a stage's task), the interrupt is held for the application's main
    task: the pipeline drains instead of losing a stage."""
    code, took, end, info = await interrupted(orders, nats_server.url, "map", "ki-in-map")
    assert end["where"].startswith("__main__.app >"), end
    check_drained(code, took, end, info, 130)
    assert end["taken"] > 1000  # the map raised it on order 1000, and that one was acked too


# -- run_until_signal in this process --------------------------------------------------------


@pytest.fixture
async def peer(nats_server: Any, natspy: Any) -> Any:
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    return natspy


def gated_pipeline(sink: Any, **kwargs: Any) -> Pipeline:
    """One source, one sink whose batch only a drain cuts."""
    pipe = fast_pipeline(**kwargs)
    pipe.source(source()).sink(sink, batch=BatchPolicy(max_messages=1000, max_age=3600))
    return pipe


async def delivered(peer: Any, count: int) -> None:
    """Until the server delivered ``count`` messages to the pipeline's consumer: a drain
    takes them all (it processes what the server already sent)."""
    await wait_consumer(peer, lambda i: i.num_ack_pending == count)


class Steps:
    """``on_signal`` for run_until_signal: the steps, and a wait for the n-th."""

    def __init__(self) -> None:
        self.taken: list[Any] = []
        self._changed = trio.Event()

    def __call__(self, step: Any) -> None:
        self.taken.append(step)
        self._changed.set()
        self._changed = trio.Event()

    async def wait(self, count: int) -> None:
        with trio.fail_after(10):
            while len(self.taken) < count:
                await self._changed.wait()


async def test_the_first_signal_drains_a_pipeline(nats_server: Any, peer: Any) -> None:
    await publish(peer, 30)
    sink = MemorySink()
    pipe = gated_pipeline(sink)
    steps = Steps()
    async with connect(nats_server.url) as nc, trio.open_nursery() as nursery:

        async def stop() -> None:
            await delivered(peer, 30)
            signal.raise_signal(signal.SIGTERM)

        nursery.start_soon(stop)
        with trio.fail_after(20):
            outcome = await run_until_signal(pipe, nc, on_signal=steps)
    assert outcome.reason is StopReason.DRAINED and outcome.exit_code == 0
    assert outcome.signal is signal.SIGTERM
    assert [s.step for s in outcome.signals] == [Step.DRAIN]
    assert steps.taken == list(outcome.signals)
    assert len(sink.records) == 30
    info = await wait_consumer(peer, lambda i: i.ack_floor.stream_seq == 30)
    assert info.num_ack_pending == 0
    # The handlers it put in place are gone again.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


async def test_a_signal_within_the_window_is_the_same_request(nats_server: Any, peer: Any) -> None:
    """More signals right after the first (as from GNU timeout, or an impatient Ctrl-C): one
    drain, not a hard stop."""
    await publish(peer, 20)
    sink = GatedSink()
    pipe = gated_pipeline(sink)
    steps = Steps()
    async with connect(nats_server.url) as nc, trio.open_nursery() as nursery:

        async def signals() -> None:
            await delivered(peer, 20)
            signal.raise_signal(signal.SIGTERM)
            await sink.entered.wait()  # the drain cut the batch; its write waits at the gate
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGINT)
            await steps.wait(3)
            sink.gate.set()

        nursery.start_soon(signals)
        with trio.fail_after(20):
            outcome = await run_until_signal(pipe, nc, on_signal=steps)
    assert [s.step for s in outcome.signals] == [Step.DRAIN, Step.REPEAT, Step.REPEAT]
    assert outcome.reason is StopReason.DRAINED and outcome.exit_code == 0
    assert len(sink.records) == 20
    await wait_consumer(peer, lambda i: i.ack_floor.stream_seq == 20 and i.num_ack_pending == 0)


async def test_a_later_signal_stops_the_functions_pipelines_hard(
    nats_server: Any, peer: Any
) -> None:
    """The second signal, past the window (0 here), stops the pipelines the function started:
    what was taken is not acked; the server keeps it for a redelivery."""
    await publish(peer, 20)
    sink = GatedSink()  # never opened: the drain cannot finish
    pipe = gated_pipeline(sink, drain_timeout=60)
    runs: list[PipelineRun] = []

    async def application(nc: Any) -> str:
        async with pipe.running(nc) as run:
            runs.append(run)
            await trio.sleep_forever()
        return "not reached"

    async with connect(nats_server.url) as nc, trio.open_nursery() as nursery:

        async def signals() -> None:
            await delivered(peer, 20)
            signal.raise_signal(signal.SIGINT)
            await sink.entered.wait()
            signal.raise_signal(signal.SIGTERM)

        nursery.start_soon(signals)
        with trio.fail_after(20):
            outcome = await run_until_signal(application, nc, window=0)
    assert outcome.reason is StopReason.STOPPED_HARD
    assert outcome.signal is signal.SIGTERM and outcome.exit_code == 128 + signal.SIGTERM
    assert [s.step for s in outcome.signals] == [Step.DRAIN, Step.HARD]
    assert outcome.result is None
    assert runs[0].stopped_hard and not sink.records
    info = await consumer_info(peer)
    assert info.ack_floor.stream_seq == 0 and info.num_ack_pending == 20


async def test_grace_bounds_the_drain(nats_server: Any, peer: Any) -> None:
    await publish(peer, 5)
    sink = GatedSink()
    pipe = gated_pipeline(sink, drain_timeout=60)
    async with connect(nats_server.url) as nc, trio.open_nursery() as nursery:

        async def stop() -> None:
            await delivered(peer, 5)
            signal.raise_signal(signal.SIGINT)

        nursery.start_soon(stop)
        with trio.fail_after(20):
            outcome = await run_until_signal(pipe, nc, grace=0.2)
    assert outcome.reason is StopReason.DRAIN_TIMED_OUT and outcome.exit_code == 3
    assert outcome.signal is signal.SIGINT
    assert sink.entered.is_set() and not sink.records


async def test_what_the_function_returns_and_raises() -> None:
    async def answer(x: int) -> int:
        await trio.lowlevel.checkpoint()
        return x * 2

    outcome: Shutdown[Any] = await run_until_signal(answer, 21)
    assert outcome == Shutdown(StopReason.FINISHED, None, (), 42)
    assert outcome.exit_code == 0

    class Oops(Exception):
        pass

    async def fails() -> None:
        await trio.lowlevel.checkpoint()
        raise Oops("as raised")

    with pytest.raises(Oops, match="as raised"):  # itself, not in an ExceptionGroup
        await run_until_signal(fails)
    with pytest.raises(TypeError, match="takes the connection"):
        await run_until_signal(Pipeline("p"))
    with pytest.raises(TypeError, match="not int"):
        await run_until_signal(3)
    with pytest.raises(ValueError, match="grace"):
        await run_until_signal(answer, 1, grace=-1)
