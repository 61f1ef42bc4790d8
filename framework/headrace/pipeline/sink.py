"""The sink contract, and how the pipeline calls a sink whether it is async or not.

A sink has three methods, each either a coroutine function or a plain one:

- ``open()`` before the first batch;
- ``write_batch(batch)``, which returns only once the batch is durable: the records are acked
  after it returns, never before;
- ``close()`` after the last batch (also after a failure).

Async sinks run on the event loop. Sync sinks run in a worker thread, one call at a time per
sink, so a blocking write never stalls the loop. ``name`` (optional) names the sink in graphs,
progress and metrics.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol, runtime_checkable

import trio

from headrace.pipeline.batch import Batch


@runtime_checkable
class Sink(Protocol):
    def write_batch(self, batch: Batch) -> Any: ...


class SinkRunner:
    """Calls a sink's methods on the loop or in a worker thread, as each one is defined."""

    def __init__(self, sink: Any, name: str) -> None:
        if not callable(getattr(sink, "write_batch", None)):
            raise TypeError(f"sink {name!r} ({sink!r}) has no write_batch(batch) method")
        self.sink = sink
        self.name = name
        self._limiter = trio.CapacityLimiter(1)

    async def _call(self, method: str, *args: Any) -> None:
        fn = getattr(self.sink, method, None)
        if fn is None:
            return
        if inspect.iscoroutinefunction(fn):
            await fn(*args)
        else:
            # abandon_on_cancel: a hard stop must not wait for a thread stuck in a sink's I/O.
            # The batch is then not committed (so redelivered); the limiter keeps the next call
            # from overlapping the abandoned one.
            await trio.to_thread.run_sync(fn, *args, limiter=self._limiter, abandon_on_cancel=True)

    async def open(self) -> None:
        await self._call("open")

    async def write_batch(self, batch: Batch) -> None:
        await self._call("write_batch", batch)

    async def close(self) -> None:
        await self._call("close")
