"""The global stream consumer: reads the stream once per subscription group and turns messages
into work, raising each affected checkpoint's version (Beckett's model).

It reads with a durable pull consumer (``checkpoints_<group>``), so its ack floor is the
group's global checkpoint: a batch is acked only after every checkpoint it touches was written,
and a crash in between re-reads the batch, which raises the same versions again (harmless:
versions only go up, and only events past the stored version are counted, so none twice). The
count is how workers find events that left the stream before they were handled, anywhere in an
entity's backlog (checkpoint.py). One write per checkpoint per batch, each a compare-and-set
(store.py), so it never undoes a worker's position or reservation; the batch's checkpoints
are read in one batched Direct Get and written a few at a time (``write_concurrency``).

A batch held by a host that dies is redelivered to another host after the consumer's ack wait
(:data:`DEFAULT_ACK_WAIT`, 5 s rather than the server's 30 s: it bounds how long a killed host
delays those events). A batch taking longer to write than a third of it is kept with
in-progress acks, so a short ack wait never redelivers a batch still being written; one held
at a graceful stop (cancellation) or a failed write is nakked at once for another host.

At start it refuses a stream that drops events before they are handled (stream_check.py).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import attrs
import trio

from headrace._validators import at_least_one
from headrace.checkpoints.checkpoint import Checkpoint
from headrace.checkpoints.store import CheckpointStore
from headrace.checkpoints.stream_check import check_stream
from headrace.checkpoints.subscription import SubscriptionGroup, events_by_checkpoint
from headrace.jetstream import AckPolicy, ConsumerConfig, JetStream, PullConsumer
from headrace.jetstream.message import JsMsg, ack_all

#: The global consumer's ack wait, seconds: a killed host's batch reaches another host this
#: long after it was delivered (plus one ``max_wait``). Long enough for a pull and a network
#: hiccup (a slow batch is kept by in-progress acks), short next to the server's 30 s.
DEFAULT_ACK_WAIT = 5.0
#: Checkpoint writes of one batch in flight at once, by default. Few: a host runs its workers
#: beside its global consumer, and a batch of new entities written 32 at a time kept the
#: event loop from them (bench checkpoints --entities 10000: 32 -> 2,550-2,637 events/s,
#: 8 -> 2,806, 4 -> 2,903-3,061, 2 -> 2,618-2,649, 1 -> 2,095-2,200). Four writes in flight
#: at a 1 ms round trip are still 4,000 checkpoints a second per host, and the hosts of a
#: group share the global consumer's batches.
DEFAULT_WRITE_CONCURRENCY = 4


def durable_name(group: str) -> str:
    return f"checkpoints_{group}"


def _positive(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be a positive number of seconds, not {value}")


@attrs.define(slots=True)
class GlobalConsumer:
    """Reads ``stream`` for ``group`` into ``store``; :meth:`run` until cancelled."""

    js: JetStream
    stream: str
    group: SubscriptionGroup
    store: CheckpointStore
    batch: int = 1000
    #: How long one pull on a quiet stream waits for a message; one that comes is taken at
    #: once (with whatever else the stream has), so this bounds no event's delay.
    max_wait: float = 0.5
    #: The durable consumer's ack wait (set on it at start): how long a batch held by a killed
    #: host waits before another host gets it.
    ack_wait: float = attrs.field(default=DEFAULT_ACK_WAIT, validator=_positive)
    #: Checkpoint writes of one batch in flight at once (each is a compare-and-set on its own
    #: key, so their order does not matter).
    write_concurrency: int = attrs.field(default=DEFAULT_WRITE_CONCURRENCY, validator=at_least_one)
    #: Messages read, and checkpoint writes made, since start.
    messages: int = 0
    writes: int = 0
    #: What keeps it from reading right now (a server restarting, no stream leader), or None;
    #: and how many such failures since start.
    outage: str | None = None
    outages: int = 0

    async def ensure_consumer(self) -> None:
        """Check the stream (:class:`~.stream_check.UnsafeStream` if refused), then create
        the group's durable consumer or update its ack wait."""
        await check_stream(self.js, self.stream)
        await self.js.create_or_update_consumer(
            self.stream,
            ConsumerConfig(
                durable_name=durable_name(self.group.name),
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=self.ack_wait,
            ),
        )

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read until cancelled. The start must work (a refusal is raised); after it, a
        failure (a server restarting, no stream leader, a write timing out) is said
        (:attr:`outage`, a warning) and reading starts again after a pause: the batch in hand
        was not acked, so it comes again and raises the same versions again."""
        await self.ensure_consumer()
        consumer = await self.js.pull_consumer(self.stream, durable_name(self.group.name))
        task_status.started()
        pause = 0.1
        while True:
            try:
                await self._read(consumer)
            except Exception as exc:
                self._outage(exc)
            await trio.sleep(pause)
            pause = min(2 * pause, 2.0)

    async def _read(self, consumer: PullConsumer) -> None:
        while True:
            msgs = await self._next_batch(consumer)
            if self.outage is not None:
                warnings.warn(
                    f"global consumer of {self.group.name!r}: reads again",
                    RuntimeWarning,
                    stacklevel=1,
                )
                self.outage = None
            if msgs:
                try:
                    await self.apply(msgs)
                except BaseException:
                    await self._hand_over(msgs)
                    raise

    async def _next_batch(self, consumer: PullConsumer) -> list[JsMsg]:
        """What the stream has for the group now, up to ``batch``; on a quiet stream, waits
        up to ``max_wait`` for the first message and returns as soon as it comes (a fetch
        of a whole batch would hold a lone new event until the wait ends)."""
        msgs = await consumer.fetch(self.batch, no_wait=True)
        if msgs:
            return msgs
        msgs = await consumer.fetch(1, expires=self.max_wait)
        if msgs and self.batch > 1:
            msgs += await consumer.fetch(self.batch - 1, no_wait=True)
        return msgs

    def _outage(self, exc: Exception) -> None:
        text = f"{type(exc).__name__}: {exc}"
        if self.outage is None:
            warnings.warn(
                f"global consumer of {self.group.name!r}: {text} (trying again)",
                RuntimeWarning,
                stacklevel=1,
            )
        self.outage = text
        self.outages += 1

    async def _hand_over(self, msgs: list[JsMsg]) -> None:
        """Nak a batch this host will not finish (stopped, or a write failed), so that another
        host gets it now rather than after the ack wait; acked ones are left alone."""
        for msg in msgs:
            msg.nak_nowait()
        with trio.move_on_after(2, shield=True):
            try:
                await self.js.nc.flush()
            except Exception:  # connection gone: the ack wait hands the batch over
                pass

    async def apply(self, msgs: list[JsMsg]) -> None:
        """Raise the versions a batch implies, then ack it (in-progress acks meanwhile)."""
        error: Exception | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._keep_in_progress, msgs)
            try:
                await self._write(msgs)
            except Exception as exc:  # raised as is, not wrapped in an exception group
                error = exc
            finally:
                nursery.cancel_scope.cancel()
        if error is not None:
            raise error
        ack_all(msgs)

    async def _keep_in_progress(self, msgs: list[JsMsg]) -> None:
        """Every third of the ack wait: the batch is still being written, do not redeliver."""
        while True:
            await trio.sleep(self.ack_wait / 3)
            for msg in msgs:
                msg.in_progress_nowait()

    async def _write(self, msgs: list[JsMsg]) -> None:
        """One write per checkpoint the batch touches. They are read together first (one
        batched Direct Get per 1024), then written ``write_concurrency`` at a time: each
        is a compare-and-set on its own key, so their order does not matter, and a batch of
        new entities costs a create each rather than a read and a write in turn."""
        header = self.group.type_header
        seen = events_by_checkpoint(
            self.group,
            (
                (m.subject, m.headers.get(header) if m.headers else None, m.metadata.stream_seq)
                for m in msgs
            ),
        )
        stored = await self.store.get_many(list(seen))
        todo = iter(seen.items())
        errors: list[Exception] = []

        async def writer() -> None:
            for cid, seqs in todo:  # shared: each writer takes the next checkpoint
                if errors:
                    return
                current = stored.get(cid)
                try:
                    await self.store.change(
                        cid,
                        _raise_to(seqs),
                        create=True,
                        current=current,
                        missing=current is None,
                    )
                except Exception as exc:  # raised as is after the others, not in a group
                    errors.append(exc)

        async with trio.open_nursery() as nursery:
            for _ in range(min(self.write_concurrency, len(seen))):
                nursery.start_soon(writer)
        if errors:
            raise errors[0]
        self.writes += len(seen)
        self.messages += len(msgs)


def _raise_to(seqs: list[int]) -> Callable[[Checkpoint], Checkpoint]:
    return lambda cp: cp.counted(seqs)
