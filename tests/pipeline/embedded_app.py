"""A trio application that embeds a pipeline, run as a child process by
``test_embedded_signals.py``: ``python embedded_app.py URL DURABLE MODE``.

It consumes the stream ORDERS (JSON ``{"id": i}``) with the durable pull consumer DURABLE into a
memory sink, as fast as it can, and prints JSON lines on stdout: ``progress`` (messages taken,
acks) every 50 ms, then one ``exit`` line with its final counts and how it ended.

MODE says how it stops:

- ``ki``: as a plain ``trio.run`` application does, by the ``KeyboardInterrupt`` of a SIGINT.
  Its main task sleeps next to the pipeline. When the interrupt comes out, the application says
  where trio raised it (``where``: the innermost frame of headrace's or of this file, then the
  innermost frame), checks that its connection still answers a flush, and exits with 130;
- ``ki-in-reader``: ``ki``, but the SIGINT is raised by the application itself, inside the
  connection's reader task (a subscription handler), once 1000 messages were taken;
- ``ki-in-map``: ``ki``, but the SIGINT is raised inside a map of the pipeline, on the record of
  order 1000;
- ``helper``: through ``headrace.run_until_signal``; the exit status is the outcome's.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any

import trio
from headrace import run_until_signal
from headrace.jetstream import ConsumeOptions
from headrace.nats import Connection, connect
from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline, PipelineRun
from headrace.sinks import MemorySink

INTERRUPT_AT = 1000
runs: list[PipelineRun] = []


def say(event: str, **fields: Any) -> None:
    # One write with its newline: print() writes the text and the newline apart, and an
    # interrupt landing between them (CI saw it) glued the next event onto this line.
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def interrupt_at(value: Any) -> Any:
    """A map: SIGINT, raised here, on order INTERRUPT_AT."""
    order = json.loads(value)
    if order["id"] == INTERRUPT_AT:
        signal.raise_signal(signal.SIGINT)
    return order


def interrupt_now(batch: Any) -> None:
    """A subscription handler: runs in the connection's reader task."""
    signal.raise_signal(signal.SIGINT)


def build(durable: str, mode: str) -> Pipeline:
    pipe = Pipeline("embedded", drain_timeout=30)
    source = JetStreamSource(
        stream="ORDERS", durable=durable, consume=ConsumeOptions(max_messages=1000)
    )
    node = pipe.source(source)
    if mode == "ki-in-map":
        node = node.map(interrupt_at, name="interrupt")
    node.sink(MemorySink(), batch=BatchPolicy(max_messages=200, max_age=0.05))
    return pipe


async def report(run: PipelineRun) -> None:
    while True:
        say("progress", taken=run.stats.messages_in, acks=run.stats.acks)
        await trio.sleep(0.05)


async def interrupt_in_reader(nc: Connection, run: PipelineRun) -> None:
    nc.subscribe_nowait("app.interrupt", handler=interrupt_now)
    while run.stats.messages_in < INTERRUPT_AT:  # noqa: ASYNC110 - stats have no change event
        await trio.sleep(0.01)
    await nc.publish("app.interrupt")


async def app(nc: Connection, pipe: Pipeline, mode: str = "ki") -> None:
    async with trio.open_nursery() as nursery, pipe.running(nc) as run:
        runs.append(run)
        nursery.start_soon(report, run)
        if mode == "ki-in-reader":
            nursery.start_soon(interrupt_in_reader, nc, run)
        await trio.sleep_forever()


async def main(url: str, durable: str, mode: str) -> int:
    pipe = build(durable, mode)
    async with connect(url, name="embedded-app") as nc:
        if mode == "helper":
            outcome = await run_until_signal(app, nc, pipe)
            say_exit(outcome.reason.value)
            return outcome.exit_code
        try:
            await app(nc, pipe, mode)
        except BaseException as exc:
            if not has_interrupt(exc):
                raise
            say_exit("interrupted", exc)
            await nc.flush(timeout=5)  # the connection outlived the interrupt
            say("flushed")
            return 130
    return 0


def has_interrupt(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(KeyboardInterrupt) is not None
    return isinstance(exc, KeyboardInterrupt)


def where(error: BaseException) -> str:
    """Where a KeyboardInterrupt was raised: the innermost frame of headrace or of this file,
    and the innermost frame, as ``module.function``."""
    if isinstance(error, BaseExceptionGroup):
        found = error.subgroup(KeyboardInterrupt)
        while isinstance(found, BaseExceptionGroup):
            found = found.exceptions[0]
        error = found if found is not None else error
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(f"{tb.tb_frame.f_globals.get('__name__')}.{tb.tb_frame.f_code.co_name}")
        tb = tb.tb_next
    ours = [f for f in frames if f.startswith(("headrace", "__main__"))]
    return f"{ours[-1] if ours else '?'} > {frames[-1] if frames else '?'}"


def say_exit(how: str, error: BaseException | None = None) -> None:
    stats = runs[0].stats if runs else None
    say(
        "exit",
        how=how,
        where=where(error) if error is not None else None,
        taken=stats.messages_in if stats else 0,
        acks=stats.acks if stats else 0,
        ack_pending=stats.ack_pending if stats else 0,
    )


if __name__ == "__main__":
    sys.exit(trio.run(main, *sys.argv[1:4]))
