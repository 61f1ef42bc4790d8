"""Helpers for the pipeline tests: streams and messages through nats-py (the independent peer),
consumer state as nats-py reads it, and a connection to the server for the pipeline itself.

Server-side consumer state has no event to wait for, so :func:`wait_consumer` polls it briefly
under a ``trio.fail_after`` bound; everything else waits on events (``MemorySink.wait_for``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio
from headrace.jetstream.message import JsMsg
from headrace.nats import connect
from headrace.pipeline import Batch, Delivery, JetStreamSource, Pipeline, Record
from headrace.protocol.events import Msg
from headrace.sinks import MemorySink

from tests.natspy_peer import consumer_info, wait_consumer
from tests.waiting import FAST

__all__ = [
    "FAST",
    "GatedSink",
    "add_stream",
    "connect",
    "consumer_info",
    "fake_record",
    "fast_pipeline",
    "publish",
    "source",
    "wait_consumer",
    "wait_stats",
]


async def add_stream(natspy: Any, name: str = "S", subjects: list[str] | None = None) -> None:
    """Create a file stream through nats-py."""

    async def go() -> None:
        await natspy.nc.jetstream().add_stream(name=name, subjects=subjects or ["s.>"])

    await natspy.call(go)


async def publish(
    natspy: Any,
    n: int,
    subject: str | Callable[[int], str] = "s.x",
    *,
    start: int = 0,
    data: Callable[[int], bytes] | None = None,
    headers: Callable[[int], dict[str, str] | None] | None = None,
) -> list[int]:
    """Publish ``n`` messages through nats-py (data: the index); their stream sequences."""

    async def go() -> list[int]:
        js = natspy.nc.jetstream()
        seqs = []
        for i in range(start, start + n):
            subj = subject(i) if callable(subject) else subject
            payload = data(i) if data is not None else b"%d" % i
            hdrs = headers(i) if headers is not None else None
            ack = await js.publish(subj, payload, headers=hdrs)
            seqs.append(ack.seq)
        return seqs

    return await natspy.call(go)


async def wait_stats(
    predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Wait for a condition on pipeline stats. Polls (stats have no change event) under a
    ``trio.fail_after`` bound."""
    try:
        with trio.fail_after(timeout):
            while not predicate():  # noqa: ASYNC110 - stats have no change event
                await trio.sleep(0.01)
    except trio.TooSlowError:
        raise AssertionError(f"timed out waiting for {what}") from None


def source(stream: str = "S", durable: str | None = "C", **kw: Any) -> JetStreamSource:
    return JetStreamSource(stream=stream, durable=durable, **kw)


def fast_pipeline(name: str = "p", **kw: Any) -> Pipeline:
    """A pipeline with short nak delays and drain timeout, for tests."""
    kw.setdefault("nak_delay", 0.05)
    kw.setdefault("nak_delay_max", 0.2)
    kw.setdefault("drain_timeout", 5.0)
    return Pipeline(name, **kw)


class GatedSink(MemorySink):
    """A MemorySink whose writes wait for ``gate`` (a test opens it when it has looked at the
    state in between); ``entered`` is set when a write is waiting at the gate."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.gate = trio.Event()
        self.entered = trio.Event()

    async def write_batch(self, batch: Batch) -> None:
        self.entered.set()
        await self.gate.wait()
        await super().write_batch(batch)


def fake_record(stream: str, seq: int, value: Any = None, *, subject: str = "s.x") -> Record:
    """A record of a made-up delivery of ``stream``#``seq`` (no server, no connection)."""
    reply = f"$JS.ACK.{stream}.C.1.{seq}.{seq}.1700000000000000000.0"
    msg = JsMsg(Msg(subject, 1, reply, b"%d" % seq, None), conn=None)  # type: ignore[arg-type]
    return Record(seq if value is None else value, Delivery(msg, 0.0, "src"))
