"""How a sink stage gets a batch committed when writes fail: an outage is backpressure, a bad
record is poison, and the two are told apart by splitting the batch.

A sink's write can fail for two kinds of reasons, and treating them alike loses data:

- **the sink is down** (a lost connection, a full disk, Spark restarting, the commit state
  unreachable): every record would fail, for a while. The batch is written again, after a pause
  that doubles up to ``backoff_max``, as long as it takes (or until ``deadline``). Meanwhile
  nothing is naked: the messages stay held, kept from redelivery by ``+WPI`` (the ack tracker),
  and the source takes no more (its ``max_in_flight`` is reached), so the outage holds the
  stream back instead of burning its messages' delivery counts;
- **some records are bad** (a value the sink can never write): the batch would fail on every
  delivery, and failing it whole would dead-letter its good records too. After ``split_after``
  failures the batch is split in two (between messages) and each half written alone. A half
  that commits proves the sink works: the other half holds the bad records, and is split again,
  down to single messages; a message that fails alone ``poison_after`` times while others
  commit is failed on its own (naked, and dead-lettered after ``max_deliveries`` like an
  operator's failing record). When both halves fail, the sink is down after all: pause and
  write the whole again.

A sink may say which kind an error is with an attribute ``transient`` on the exception: ``True``
(the sink is down: never split, only wait), ``False`` (bad records: split at once, and a single
message failing so is poison at once); without it the batch is written again first, then
split. Without it, a batch whose every record fails cannot be told from an outage (every half
fails): it is retried as one, until the deadline if there is one.

``deadline`` (default: none) bounds how long a sink may fail without one write succeeding: past
it the pipeline stops with :class:`SinkOutage`, and everything it holds is naked, never
terminated.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import attrs
import trio

from headrace._validators import positive, positive_or_none
from headrace.errors import HeadraceError
from headrace.pipeline.record import Record


@attrs.frozen(slots=True, kw_only=True)
class SinkRetry:
    """How a sink stage retries a batch whose write failed (see the module docs)."""

    #: The first pause after a failure (seconds), doubled after each, up to ``backoff_max``.
    backoff: float = attrs.field(default=0.5, validator=positive)
    backoff_max: float = attrs.field(default=30.0, validator=positive)
    #: Seconds a sink may fail without one write succeeding before the pipeline stops
    #: (:class:`SinkOutage`, everything held naked); None: for as long as it takes.
    deadline: float | None = attrs.field(default=None, validator=positive_or_none)
    #: Failures of a batch before it is split to find bad records.
    split_after: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    #: Failures of a message alone, while others commit, before it is poison.
    poison_after: int = attrs.field(default=3, validator=attrs.validators.ge(1))

    def pause(self, failures: int) -> float:
        return float(min(self.backoff * 2 ** min(failures - 1, 30), self.backoff_max))


class SinkOutage(HeadraceError):
    """A sink failed for longer than its ``SinkRetry.deadline`` without one write succeeding;
    the pipeline stops (everything it held is naked, to be delivered again). ``__cause__`` is
    the last failure."""

    #: A restart would meet the same outage: the pipeline stops (actors/supervision.py).
    restartable = False


#: Messages remembered as bad by one sink stage (their (stream, sequence)).
REMEMBERED = 10_000

#: Writes ``records`` as one batch; returns None when they are committed (or set aside by the
#: sink as rejected), else the failure.
Attempt = Callable[[list[Record]], Awaitable[BaseException | None]]


def by_message(records: list[Record]) -> list[list[Record]]:
    """The records grouped by the message they come from, in order of first appearance: a
    batch is only ever split between messages (their records commit together)."""
    groups: dict[int, list[Record]] = {}
    for record in records:
        groups.setdefault(id(record.delivery), []).append(record)
    return list(groups.values())


def _bad_data(error: BaseException | None) -> bool:
    """The sink says the records are bad (``transient = False``)."""
    return getattr(error, "transient", None) is False


def _key(message: list[Record]) -> tuple[str, int]:
    meta = message[0].delivery.msg.metadata
    return meta.stream, meta.stream_seq


def _halves(messages: list[list[Record]]) -> tuple[list[Record], list[Record]]:
    middle = len(messages) // 2
    return (
        [r for group in messages[:middle] for r in group],
        [r for group in messages[middle:] for r in group],
    )


class BatchCommitter:
    """Commits the batches of one sink stage despite failures (see the module docs).

    ``attempt`` writes and reports; ``poisoned`` fails one message's records on their own (the
    ack tracker's nak, then dead letter); ``name`` names the sink in :class:`SinkOutage`.
    """

    def __init__(
        self,
        retry: SinkRetry,
        attempt: Attempt,
        poisoned: Callable[[list[Record], BaseException], None],
        *,
        name: str,
    ) -> None:
        self.retry = retry
        self._attempt = attempt
        self._poisoned = poisoned
        self.name = name
        #: When the current run of failures began (no write has succeeded since); None when
        #: the last write succeeded.
        self.failing_since: float | None = None
        #: Failed writes retried, and messages set aside as poison, since the stage began.
        self.retries = 0
        self.isolated = 0
        #: Messages found bad (failed alone while others committed), oldest first.
        self._bad: dict[tuple[str, int], None] = {}

    async def commit(self, records: list[Record]) -> None:
        """Until every record of ``records`` is committed or failed alone as poison; raises
        :class:`SinkOutage` past the deadline. A message this sink found bad before (it failed
        alone while others committed) is written alone, after the rest: when it comes back
        (redelivered after its nak) it fails alone again and is poison at once, instead of
        holding its new batch up, or, alone in a batch, passing for an outage."""
        # (Only when some message was found bad: grouping a batch by message and reading each
        # one's metadata cost a third of the pipeline's time per message when done always.)
        known = [m for m in by_message(records) if _key(m) in self._bad] if self._bad else []
        if known:
            suspects = {id(r) for m in known for r in m}
            rest = [r for r in records if id(r) not in suspects]
            if rest:
                await self._commit(rest)
            for message in known:
                error = await self._write(message)
                if error is None:
                    self._bad.pop(_key(message), None)
                else:
                    self._poison(message, error)
            return
        await self._commit(records)

    async def _commit(self, records: list[Record]) -> None:
        failures = 0
        while True:
            error = await self._write(records)
            if error is None:
                return
            failures += 1
            if getattr(error, "transient", None) is False and len(by_message(records)) == 1:
                # The sink says the records are bad, and they are one message's.
                self._poison(records, error)
                return
            if self._splittable(records, error, failures) and await self._bisect(records):
                return
            await self._pause(failures, error)

    async def _write(self, records: list[Record]) -> BaseException | None:
        error = await self._attempt(records)
        if error is None:
            self.failing_since = None
        elif self.failing_since is None:
            self.failing_since = trio.current_time()
        return error

    def _splittable(self, records: list[Record], error: BaseException, failures: int) -> bool:
        kind = getattr(error, "transient", None)
        if kind is True or len(by_message(records)) < 2:
            return False
        return kind is False or failures >= self.retry.split_after

    async def _bisect(self, records: list[Record]) -> bool:
        """Write each half of ``records`` alone; find the bad records in a half that fails
        while the other commits. False when both fail at once: the sink is down."""
        left, right = _halves(by_message(records))
        left_error = await self._write(left)
        right_error = await self._write(right)
        both_failed = left_error is not None and right_error is not None
        if both_failed and not (_bad_data(left_error) and _bad_data(right_error)):
            return False  # the sink is down, or says nothing: not bad records
        # (Both failing as bad data: the sink says both halves hold bad records.)
        for half, error in ((left, left_error), (right, right_error)):
            if error is not None:
                await self._isolate(half, error)
        return True

    async def _isolate(self, records: list[Record], error: BaseException) -> None:
        """``records`` failed while records beside them committed: split down to the
        messages that fail alone, and fail those."""
        messages = by_message(records)
        if len(messages) > 1:
            if not await self._bisect(records):
                # Both halves failed: everything here is bad, or the sink went down meanwhile.
                # Back to the general case (pause, write again, split again).
                await self._commit(records)
            return
        alone = 1
        while True:
            if getattr(error, "transient", None) is not True and (
                alone >= self.retry.poison_after or getattr(error, "transient", None) is False
            ):
                self._poison(records, error)
                return
            await self._pause(alone, error)
            retried = await self._write(records)
            if retried is None:
                return
            error = retried
            alone += 1

    def _poison(self, message: list[Record], error: BaseException) -> None:
        """Fail one message's records on their own, and remember it as bad (while it may
        come back: until it commits, or until many others were found bad since)."""
        self.isolated += 1
        self.failing_since = None  # the sink works: others beside this message committed
        key = _key(message)
        self._bad.pop(key, None)
        self._bad[key] = None
        while len(self._bad) > REMEMBERED:
            del self._bad[next(iter(self._bad))]
        self._poisoned(message, error)

    async def _pause(self, failures: int, error: BaseException) -> None:
        """Wait before writing again; :class:`SinkOutage` once the sink has failed for longer
        than the deadline."""
        self.retries += 1
        since = self.failing_since if self.failing_since is not None else trio.current_time()
        deadline = self.retry.deadline
        waited = trio.current_time() - since
        if deadline is not None and waited >= deadline:
            raise SinkOutage(
                f"sink {self.name!r} failed for {waited:.0f}s without one write succeeding "
                f"(the deadline is {deadline:g}s); last: {type(error).__name__}: {error}"
            ) from error
        pause = self.retry.pause(failures)
        if deadline is not None:
            pause = min(pause, max(0.0, since + deadline - trio.current_time()))
        await trio.sleep(pause if math.isfinite(pause) else self.retry.backoff_max)
