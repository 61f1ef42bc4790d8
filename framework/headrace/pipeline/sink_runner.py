"""How the pipeline calls a sink, whether its members are coroutine functions or plain ones.

Coroutine functions are awaited on the event loop. Plain ones run on one
:class:`~headrace.pipeline.sink_thread.SinkThread` per life of the sink, from ``bind``/``open``
to ``close``, one call at a time, so a blocking write never stalls the loop. The contract
itself (the members, what each must do) is :mod:`headrace.pipeline.sink`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from headrace.pipeline.sink import sink_members
from headrace.pipeline.sink_thread import SinkThread

if TYPE_CHECKING:
    from headrace.pipeline.batch import Batch
    from headrace.pipeline.sink import SinkContext


class SinkRunner:
    """Calls a sink's methods: coroutine functions on the loop, plain ones on the sink's thread.

    A sink's life runs from ``bind``/``open`` to ``close``; its sync calls all run on one
    :class:`SinkThread`, started at the first and let go after ``close`` (or after a ``bind``
    or ``open`` that failed: the stage does not close what did not open). A new life (a
    restart opens the sink again) gets a new thread, once the last one is free: a call
    abandoned by a hard stop never overlaps the next one.
    """

    def __init__(self, sink: object, name: str) -> None:
        self.sink = sink
        self.name = name
        #: The members read once (TypeError here for a sink that breaks the contract).
        self.members = sink_members(sink, name)
        #: The thread of the sink's current (or last) life; None before its first sync call.
        self.thread: SinkThread | None = None

    async def _call(self, fn: Callable[..., Any] | None, *args: Any) -> None:
        if fn is None:
            return
        if inspect.iscoroutinefunction(fn):
            await fn(*args)
            return
        thread = self.thread
        if thread is None or thread.stopping:
            if thread is not None:
                # The last life's thread may still be in a call abandoned by a hard stop.
                await thread.ended.wait()
            thread = self.thread = SinkThread(self.name)
        await thread.call(fn, *args)

    async def _start(self, fn: Callable[..., Any] | None, *args: Any) -> None:
        try:
            await self._call(fn, *args)
        except BaseException:
            self._stop_thread()
            raise

    def _stop_thread(self) -> None:
        if self.thread is not None:
            self.thread.stop()

    async def bind(self, context: SinkContext) -> None:
        await self._start(self.members.bind, context)

    async def open(self) -> None:
        await self._start(self.members.open)

    async def maintain(self) -> None:
        await self._call(self.members.maintain)

    async def write_batch(self, batch: Batch) -> None:
        await self._call(self.members.write_batch, batch)

    async def close(self) -> None:
        """Close the sink and let its thread go. When the thread is free (no call abandoned by a
        hard stop still runs in it), this waits for it to stop serving the sink, which is then
        immediate: a sink closed has no thread left."""
        try:
            await self._call(self.members.close)
        finally:
            self._stop_thread()
        thread = self.thread
        if thread is not None and not thread.pending:
            await thread.ended.wait()
