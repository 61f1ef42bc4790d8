"""``MemorySink``: batches kept in memory, for tests and for embedding a pipeline.

It can fail on purpose (``fail_times`` writes, or :meth:`MemorySink.fail_next`) and be slow on
purpose (``delay`` seconds per write), and a test can wait for records with
:meth:`MemorySink.wait_for` instead of polling.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import trio

from headrace.pipeline.sink import Sink

if TYPE_CHECKING:
    from headrace.pipeline.batch import Batch
    from headrace.pipeline.record import Record

FailWith = type[BaseException] | BaseException


class MemorySink(Sink):
    """Keeps every batch written (``batches``) and their records (``records``), in order.

    ``fail_times``: the next that many ``write_batch`` calls raise ``fail_with`` (an exception
    class, instantiated with a message, or an instance) and keep nothing. ``delay``: each write
    takes that many seconds (``trio.sleep``) before it keeps (or fails) its batch.
    """

    def __init__(
        self,
        *,
        fail_times: int = 0,
        fail_with: FailWith = RuntimeError,
        delay: float = 0.0,
    ) -> None:
        if fail_times < 0:
            raise ValueError(f"fail_times must not be negative, not {fail_times}")
        if not delay >= 0:
            raise ValueError(f"delay must not be negative, not {delay!r}")
        self.batches: list[Batch] = []
        self.records: list[Record] = []
        self.fail_times = fail_times
        self.fail_with: FailWith = fail_with
        self.delay = delay
        #: Calls so far: ``open()``, ``close()``, ``write_batch()`` (failed ones included), and
        #: the failures raised.
        self.opens = 0
        self.closes = 0
        self.writes = 0
        self.failures = 0
        self._waiters: list[tuple[int, trio.Event]] = []

    def __repr__(self) -> str:
        return f"<MemorySink {len(self.batches)} batches, {len(self.records)} records>"

    # -- the sink contract --------------------------------------------------------------------

    async def open(self) -> None:
        self.opens += 1
        await trio.lowlevel.checkpoint()

    async def write_batch(self, batch: Batch) -> None:
        self.writes += 1
        if self.delay > 0:
            await trio.sleep(self.delay)
        else:
            await trio.lowlevel.checkpoint()
        if self.fail_times > 0:
            self.fail_times -= 1
            self.failures += 1
            exc = self.fail_with
            if isinstance(exc, type):
                exc = exc(f"MemorySink: injected failure #{self.failures} ({batch!r})")
            raise exc
        self.batches.append(batch)
        self.records.extend(batch.records)
        self._wake()

    async def close(self) -> None:
        self.closes += 1
        await trio.lowlevel.checkpoint()

    # -- for tests ----------------------------------------------------------------------------

    def fail_next(self, n: int = 1, fail_with: FailWith | None = None) -> None:
        """Make the next ``n`` writes fail (with ``fail_with`` if given)."""
        if n < 0:
            raise ValueError(f"n must not be negative, not {n}")
        self.fail_times = n
        if fail_with is not None:
            self.fail_with = fail_with

    @property
    def values(self) -> list[Any]:
        """The values of ``records``."""
        return [r.value for r in self.records]

    @property
    def keys(self) -> list[tuple[str, int]]:
        """(stream, stream_seq) of each record, in order (duplicates show here)."""
        return [(r.stream, r.stream_seq) for r in self.records]

    def clear(self) -> None:
        """Forget the batches and records kept so far."""
        self.batches.clear()
        self.records.clear()

    async def wait_for(self, n_records: int, timeout: float | None = 10.0) -> None:
        """Wait until the sink holds at least ``n_records`` records.

        Raises :class:`trio.TooSlowError` after ``timeout`` seconds (``None``: no limit).
        Woken by the writes themselves, it does not poll.
        """
        if len(self.records) >= n_records:
            await trio.lowlevel.checkpoint()
            return
        event = trio.Event()
        waiter = (n_records, event)
        self._waiters.append(waiter)
        try:
            with trio.move_on_after(math.inf if timeout is None else timeout):
                await event.wait()
                return
        finally:
            if not event.is_set():
                self._waiters.remove(waiter)
        raise trio.TooSlowError(
            f"{self!r}: waited {timeout}s for {n_records} records, it holds {len(self.records)}"
        )

    def _wake(self) -> None:
        held = len(self.records)
        if not self._waiters:
            return
        still = []
        for n, event in self._waiters:
            if held >= n:
                event.set()
            else:
                still.append((n, event))
        self._waiters = still
