"""Generic trio helpers that several layers need: an event hub, "either", a body's error.

They know nothing of NATS, actors or pipelines, so they sit at the bottom of the layers (see
docs/architecture.md section 2) where the connection, the actors, JetStream and the pipeline
runtime can all use them, instead of each writing its own.

- :class:`EventHub` and :class:`EventWatcher`: fan events out to any number of watchers without
  ever blocking the one who emits them. A watcher that does not keep up loses events (its
  ``dropped`` counter says how many) rather than slowing the emitter down: the connection's
  reader emits, and must never wait on a slow watcher.
- :func:`either`: wait until the first of two events is set.
- :class:`BodyError`: the exception of an ``async with`` body, kept out of the nursery the body
  ran next to, and raised again once the nursery has ended. An exception that passes through a
  nursery comes out wrapped in an ``ExceptionGroup`` (trio's strict groups); a context manager
  that runs tasks beside its body wants the body's own error to come out as raised, while the
  failures of its tasks still propagate as trio reports them.
"""

from __future__ import annotations

import math
from types import TracebackType
from typing import Generic, TypeVar

import trio

E = TypeVar("E")


class EventWatcher(Generic[E]):
    """A watcher's side of the hub: iterate it, close it when done."""

    def __init__(self, hub: EventHub[E], buffer: int | float) -> None:
        self._hub = hub
        send, self._receive = trio.open_memory_channel[E](buffer)
        self._send = send
        self.dropped = 0

    async def receive(self) -> E:
        return await self._receive.receive()

    def __aiter__(self) -> EventWatcher[E]:
        return self

    async def __anext__(self) -> E:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._hub._watchers.discard(self)
        self._send.close()
        self._receive.close()

    def __enter__(self) -> EventWatcher[E]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventHub(Generic[E]):
    """Fan events out to watchers without ever blocking the one who emits them."""

    def __init__(self) -> None:
        self._watchers: set[EventWatcher[E]] = set()
        self._closed = False

    def watch(self, buffer: int | float = 256) -> EventWatcher[E]:
        """A new watcher; on a closed hub one whose iteration ends at once."""
        if buffer < 1 and buffer != math.inf:
            raise ValueError(f"buffer must be at least 1, not {buffer}")
        watcher = EventWatcher(self, buffer)
        if self._closed:
            watcher._send.close()
        else:
            self._watchers.add(watcher)
        return watcher

    def emit(self, event: E) -> None:
        for watcher in list(self._watchers):
            try:
                watcher._send.send_nowait(event)
            except trio.WouldBlock:
                watcher.dropped += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._watchers.discard(watcher)

    def close(self) -> None:
        """End every watcher's iteration (after the events already queued)."""
        self._closed = True
        for watcher in list(self._watchers):
            watcher._send.close()
        self._watchers.clear()


async def either(first: trio.Event, second: trio.Event) -> None:
    """Return once either event is set."""
    async with trio.open_nursery() as nursery:

        async def wait(event: trio.Event) -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait, first)
        nursery.start_soon(wait, second)


class BodyError:
    """Keeps the exception of an ``async with`` body out of a nursery, to raise it after.

    The idiom, in an ``@asynccontextmanager`` that runs tasks beside its body::

        body = BodyError()
        async with trio.open_nursery() as nursery:
            ...  # start the tasks
            with body:
                yield resource  # the body's exception is kept here, not raised
            ...  # clean-up, which may also run after a failed body
        body.reraise()  # the body's own exception, as raised

    Anything (``Cancelled`` and ``KeyboardInterrupt`` too) is kept, exactly as a bare
    ``except BaseException`` would. Work between the body and the nursery's end (a drain, a
    close) runs whether the body failed or not; a failure of the nursery itself propagates
    instead of the body's error, as trio reports it.
    """

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def __enter__(self) -> BodyError:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is None:
            return False
        self.error = exc
        return True

    def reraise(self) -> None:
        """Raise the kept exception, if there is one (and forget it: no reference cycle)."""
        error, self.error = self.error, None
        if error is not None:
            try:
                raise error
            finally:
                error = None


__all__ = ["BodyError", "EventHub", "EventWatcher", "either"]
