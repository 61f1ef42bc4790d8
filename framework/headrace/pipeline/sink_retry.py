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
  failures the batch is split (between messages) and each part written alone: in halves, and
  each time it fails again in twice as many parts (quarters, eighths, ... up to
  :data:`MAX_SPLIT_LEVEL`). A part that commits proves the sink works: every part that failed
  holds bad records, and is split on down to single messages; a message that fails alone
  ``poison_after`` times is failed on its own (naked, and dead-lettered after
  ``max_deliveries`` like an operator's failing record). When every part fails, the sink is
  taken for down: pause, write the whole again, and say so (``stuck``: a ``sink_stuck`` event
  in ``headrace run``).

A sink may say which kind an error is with an attribute ``transient`` on the exception: ``True``
(the sink is down: never split, only wait), ``False`` (bad records: split at once, and a single
message failing so is poison at once); without it the batch is written again first, then
split. Without it, a batch whose every record fails cannot be told from an outage (every part
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
from headrace.pipeline.sink import failure_kind


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


class SinkStuck(HeadraceError):
    """Not raised: the reason of a ``sink_stuck`` event. A batch keeps failing and every part
    of it failed too, so the sink is taken for down and the batch is written again after a
    pause, for as long as that lasts; the text says what was tried and what to do if the sink
    is in fact up (its failures are bad records it does not mark as such)."""


#: Messages remembered as bad by one sink stage (their (stream, sequence)).
REMEMBERED = 10_000
#: The finest split of a failing batch: ``2 ** 5``, 32 parts (each round of splitting, while
#: every part fails, doubles the parts up to that).
MAX_SPLIT_LEVEL = 5

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
    return failure_kind(error) is False


def _key(message: list[Record]) -> tuple[str, int]:
    meta = message[0].delivery.msg.metadata
    return meta.stream, meta.stream_seq


def _two(messages: list[list[Record]]) -> list[list[list[Record]]]:
    """A part of messages in two halves; a single message stays whole."""
    if len(messages) < 2:
        return [messages]
    middle = len(messages) // 2
    return [messages[:middle], messages[middle:]]


def _chunks(messages: list[list[Record]], count: int) -> list[list[list[Record]]]:
    """``messages`` in ``count`` contiguous parts of sizes that differ by one at most, the
    larger ones last (as :func:`_two` halves them; fewer parts when there are fewer
    messages)."""
    count = max(1, min(count, len(messages)))
    size, extra = divmod(len(messages), count)
    parts, at = [], 0
    for i in range(count):
        end = at + size + (1 if i >= count - extra else 0)
        parts.append(messages[at:end])
        at = end
    return parts


def _flat(messages: list[list[Record]]) -> list[Record]:
    return [record for message in messages for record in message]


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
        stuck: Callable[[list[Record], SinkStuck], None] | None = None,
    ) -> None:
        self.retry = retry
        self._attempt = attempt
        self._poisoned = poisoned
        self._stuck = stuck
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
        failures = rounds = 0
        while True:
            error = await self._write(records)
            if error is None:
                return
            failures += 1
            if failure_kind(error) is False and len(by_message(records)) == 1:
                # The sink says the records are bad, and they are one message's.
                self._poison(records, error)
                return
            split = self._splittable(records, error, failures)
            if split:
                rounds += 1
                if await self._bisect(records, rounds):
                    return
            if split or failures > self.retry.split_after:
                self._say_stuck(records, error, failures, rounds if split else 0)
            await self._pause(failures, error)

    async def _write(self, records: list[Record]) -> BaseException | None:
        error = await self._attempt(records)
        if error is None:
            self.failing_since = None
        elif self.failing_since is None:
            self.failing_since = trio.current_time()
        return error

    def _splittable(self, records: list[Record], error: BaseException, failures: int) -> bool:
        kind = failure_kind(error)
        if kind is True or len(by_message(records)) < 2:
            return False
        return kind is False or failures >= self.retry.split_after

    async def _bisect(self, records: list[Record], level: int = 1) -> bool:
        """Find the bad records of ``records`` by writing parts of it alone: ``2 ** level``
        parts (between messages; the caller raises ``level`` each time the batch fails again,
        up to :data:`MAX_SPLIT_LEVEL`). A part that commits proves the sink works (so does a
        sink that says every failure is bad data): every part that failed then holds bad
        records, and is split down to single messages, each failed alone
        (:meth:`_narrow`). When every part fails, the sink is taken for down (False), and
        the next round splits finer. An outage fails every part; bad records spread through
        a batch fail some parts only (16 bad records among 262 messages failed both halves,
        and the batch was retried whole, every 30 s, for ever, when halves were the only
        split). Finer each round, not at once: during an outage each round costs ``2 **
        level`` writes, and a slow-failing sink (Spark, about a second a write) would
        otherwise spend a minute a round on it."""
        messages = by_message(records)
        parts = _chunks(messages, 2 ** min(level, MAX_SPLIT_LEVEL))
        failed: list[tuple[list[list[Record]], BaseException]] = []
        works = False
        for part in parts:
            error = await self._write(_flat(part))
            if error is None:
                works = True
            else:
                failed.append((part, error))
        if not failed:
            return True
        if not works and not all(_bad_data(error) for _, error in failed):
            return False
        await self._narrow(failed)
        return True

    async def _narrow(self, failed: list[tuple[list[list[Record]], BaseException]]) -> None:
        """The sink works: split each part that failed in halves, and the halves that fail
        again, down to the messages that fail alone (:meth:`_isolate`)."""
        pending = failed
        while pending:
            again: list[tuple[list[list[Record]], BaseException]] = []
            for part, error in pending:
                if len(part) == 1:
                    await self._isolate(part[0], error)
                    continue
                for half in _two(part):
                    retried = await self._write(_flat(half))
                    if retried is not None:
                        again.append((half, retried))
            pending = again

    async def _isolate(self, message: list[Record], error: BaseException) -> None:
        """One message's records failed alone while records beside them committed: written
        again alone up to ``poison_after`` times (a moment's failure is not bad data), then
        failed on their own as poison. An error the sink marks ``transient`` is waited out."""
        alone = 1
        while True:
            kind = failure_kind(error)
            if kind is not True and (alone >= self.retry.poison_after or kind is False):
                self._poison(message, error)
                return
            await self._pause(alone, error)
            retried = await self._write(message)
            if retried is None:
                return
            error = retried
            alone += 1

    def _say_stuck(
        self, records: list[Record], error: BaseException, failures: int, level: int
    ) -> None:
        """Tell (``stuck``) that the batch is taken for an outage: what was tried (``level``:
        the split of this round, 0 for none), what comes next, what to do if the sink is up."""
        if self._stuck is None:
            return
        messages = len(by_message(records))
        if messages < 2:
            tried = "it is one message, which cannot be split"
        elif level:
            parts = min(2 ** min(level, MAX_SPLIT_LEVEL), messages)  # as _bisect split it
            tried = (
                f"written in {parts} parts of about {max(1, messages // parts)} messages, every "
                "part failed (each round splits finer, up to "
                f"{2**MAX_SPLIT_LEVEL} parts)"
            )
        else:
            tried = "not split: the sink marks its error transient (down)"
        pause = self.retry.pause(failures)
        self._stuck(
            records,
            SinkStuck(
                f"sink {self.name!r}: a batch of {messages} messages failed {failures} times "
                f"({type(error).__name__}: {error}); {tried}. Taken for an outage: written "
                f"again in {pause:g}s, for as long as it fails. If the sink is up, these "
                "failures are records it cannot write: raise the error with "
                "transient=False for such records (they are split out and dead-lettered), "
                "transient=True for an outage (docs/sinks.md, 'When writes fail')"
            ),
        )

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
