"""The actors a pipeline graph runs as: source, operator, batcher, sink writer.

They pass lists of records (one per source batch, not one per record) through bounded inboxes,
so a slow stage holds up the ones before it down to the source, whose consume then stops asking
the server for more. :data:`END` follows the last batch of a stage that has finished (a drained
source, and then each stage after it), so a drain completes in order: what was taken is
processed, committed and acked before the pipeline stops.

The stages do not know the run that wires them (``PipelineRun``, runtime.py, which imports this
module): a source and a sink stage are given a host that does what :class:`SourceHost` and
:class:`SinkHost` say, and every stage reports the facts of its records to the ack tracker.
"""

from __future__ import annotations

import datetime as dt
import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, cast

import attrs
import trio

from headrace.actors.actor import Actor
from headrace.commits.errors import OutputConflict
from headrace.errors import RequestTimeout, SubscriptionClosedError
from headrace.jetstream.errors import ConsumerNotFound, JetStreamError, JetStreamUnavailable
from headrace.jetstream.reset import supports_reset
from headrace.jetstream.transient import is_transient, retry_transient
from headrace.pipeline.ack_tracker import DEFAULT_ACK_WAIT
from headrace.pipeline.batch import Batch
from headrace.pipeline.message_source import MessageSource
from headrace.pipeline.record import Record
from headrace.pipeline.sink import RecordsRejected, SinkContext, SinkError
from headrace.pipeline.sink_retry import BatchCommitter
from headrace.pipeline.sink_runner import SinkRunner

if TYPE_CHECKING:
    from headrace.jetstream.consumer_config import ConsumerConfig, ConsumerInfo
    from headrace.jetstream.context import JetStream
    from headrace.pipeline.ack_tracker import AckTracker
    from headrace.pipeline.nodes import Node
    from headrace.pipeline.source import JetStreamSource
    from headrace.pipeline.stats import PipelineStats

INBOX_BATCHES = 8
#: How long a source retries binding its consumer through transient failures (seconds).
BIND_DEADLINE = 60.0
#: A sink with nothing to write for this long (seconds) is given a turn at its upkeep.
MAINTAIN_IDLE = 1.0
#: How long after the ack wait of messages a dead worker held a stateful pipeline's source
#: still waits before its first pull (the server's check of expired acks runs on a timer).
REDELIVERY_MARGIN = 1.0
#: What nats-server allows in flight on a consumer created without ``max_ack_pending``.
DEFAULT_MAX_ACK_PENDING = 1000

log = logging.getLogger("headrace.pipeline")


class SourceHost(Protocol):
    """What a source stage needs of its run: the JetStream context to consume through, the
    tracker to ask for room and report to, how many messages it may hold, and to be told once
    its consumer is bound (the run checks the batches against it and gives the tracker the
    source's ``keep_alive``)."""

    @property
    def js(self) -> JetStream: ...

    @property
    def tracker(self) -> AckTracker: ...

    def max_in_flight(self, source: Node) -> int: ...

    def bound(self, source: SourceStage, info: ConsumerInfo) -> None: ...

    def replays_in_order(self, source: Node) -> bool: ...

    async def sinks_opened(self) -> None: ...

    def check_consumer(self, source: Node, info: ConsumerInfo) -> None: ...


class SinkHost(Protocol):
    """What a sink stage needs of its run: its sink's :class:`SinkContext`, the stats it
    counts batches in, where a failure it survives is reported (``PipelineRun.errors``), and
    whom to tell of each committed batch besides the tracker (``on_commit``: the test harness's
    record of what each sink committed; None in production)."""

    @property
    def stats(self) -> PipelineStats: ...

    @property
    def on_commit(self) -> Callable[[str, list[Record]], None] | None: ...

    def sink_context(self, sink: Node) -> SinkContext: ...

    def report_error(self, stage: str, error: BaseException) -> None: ...

    def sink_opened(self) -> None: ...


class _End:
    def __repr__(self) -> str:
        return "END"


END = _End()
Item = list[Record] | _End


class Stage(Actor[Item]):
    """An actor with downstream stages; it fans its output out to all of them."""

    def __init__(self, name: str, node: Node, tracker: AckTracker) -> None:
        super().__init__(name, inbox_size=INBOX_BATCHES)
        self.node = node
        #: Told the facts of each delivery's life (taken, copied, dropped, committed, failed);
        #: it alone does the arithmetic on them (record.py).
        self.tracker = tracker
        self.downstream: list[Stage] = []
        self._ends = 0

    async def forward(self, records: list[Record]) -> None:
        k = len(self.downstream)
        if k > 1:
            self.tracker.forked(records, k)
        for stage in self.downstream:
            await stage.send(records)

    async def forward_end(self) -> None:
        for stage in self.downstream:
            await stage.send(END)

    def ended(self) -> bool:
        """Count an END; True once every upstream has ended."""
        self._ends += 1
        return self._ends >= max(len(self.node.upstream), 1)

    async def next_batch(self) -> list[Record] | None:
        """The next batch of the inbox; None once every upstream has ended (the END has been
        passed on by then)."""
        inbox = self.inbox
        while True:
            item = await inbox.receive()
            if not isinstance(item, _End):
                return item
            if self.ended():
                await self.forward_end()
                return None


class SourceStage(Stage):
    """Consumes a JetStream consumer and admits its messages as records."""

    def __init__(self, node: Node, run: SourceHost) -> None:
        super().__init__(f"source:{node.name}", node, run.tracker)
        self.run_ = run
        self.subscription: Any = None
        #: What the stage takes messages from (a pull consumer's consume buffer, or the push
        #: subscription itself), once bound: the one thing it speaks to.
        self.messages: MessageSource | None = None
        #: The name of the bound consumer (a durable's, or the server's for an ephemeral one).
        self.consumer_name: str | None = None
        self._drain_requested = trio.Event()
        #: Set once the consumer is bound and its JetStream actors run.
        self.bound = trio.Event()

    @property
    def internal_actors(self) -> list[Actor[Any]]:
        """The JetStream actors behind this source (consume buffer, lifecycle, ASM)."""
        found: list[Actor[Any]] = []
        if self.subscription is not None:
            found.extend(self.subscription.actors)
        # A pull source's consume buffer is an actor of its own (the in-memory one of
        # headrace.testing stands in for one: a name and a state); a push subscription is the
        # subscription itself, whose actors are listed above.
        buffer = cast("Actor[Any] | None", self.messages)
        if buffer is not None and buffer is not self.subscription and buffer not in found:
            found.append(buffer)
        return found

    async def run(self) -> None:
        spec = self.node.source
        assert spec is not None
        try:
            await self._bind_and_consume(spec)
        except JetStreamError as exc:
            # "stream not found" alone does not say which of the pipeline's sources failed.
            kind = "pull" if spec.pull else "push"
            exc.add_note(
                f"headrace: source {self.node.name!r} reads stream {spec.stream!r} through "
                f"{kind} consumer {spec.durable or '(ephemeral)'!r}"
            )
            raise

    async def _bind_and_consume(self, spec: JetStreamSource) -> None:
        """Consume; a transient failure before the consumer is bound (a worker starting while
        a node of the cluster fails over: no answer, no leader yet) is retried for up to
        ``BIND_DEADLINE`` seconds rather than failing the pipeline. Once bound, the JetStream
        layer rides out reconnects itself; what reaches here then is a real failure."""
        give_up = trio.current_time() + BIND_DEADLINE
        pause = 0.1
        while True:
            try:
                await self._consume(spec)
                return
            except Exception as exc:
                # (Not "nobody answers the JetStream API": more likely a server without
                # JetStream, a configuration error to report at once, than a failover.)
                if (
                    self.bound.is_set()
                    or not is_transient(exc)
                    or isinstance(exc, JetStreamUnavailable)
                ):
                    raise
                if trio.current_time() > give_up:
                    raise
            await trio.sleep(pause)
            pause = min(2 * pause, 2.0)

    async def _consume(self, spec: JetStreamSource) -> None:
        js: JetStream = self.run_.js
        tracker = self.run_.tracker
        config = await self._with_room(spec, spec.consumer_config())
        subject = spec.filter_subjects[0] if len(spec.filter_subjects) == 1 else None
        if spec.pull:
            async with js.pull_subscribe(
                subject,
                stream=spec.stream,
                durable=spec.durable,
                config=config,
                delete_policy=spec.delete_policy,
            ) as sub:
                self.subscription = sub
                info = sub.consumer.cached_info
                self.consumer_name = info.name  # known to the sinks while they open
                self.run_.check_consumer(self.node, info)  # before the first pull
                if self.run_.replays_in_order(self.node):
                    await self._replay_in_order(sub.consumer.cached_info)
                await self._wait_for_sinks()
                async with sub.consume(spec.consume_options()) as buffer:
                    self.messages = buffer
                    self.run_.bound(self, sub.consumer.cached_info)
                    await self._pump(buffer, tracker)
        else:
            await self._wait_for_sinks()  # a push consumer delivers from its subscribe on
            async with js.subscribe(
                subject,
                stream=spec.stream,
                durable=spec.durable,
                config=config,
                delete_policy=spec.delete_policy,
            ) as sub:
                self.subscription = self.messages = sub
                self.run_.bound(self, sub.info)
                await self._pump(sub, tracker)
        await self.forward_end()

    async def _with_room(self, spec: JetStreamSource, config: ConsumerConfig) -> ConsumerConfig:
        """``config`` as a consumer this source creates gets it: with the source's ``start``,
        and a ``max_ack_pending`` its batches fit in when the configuration leaves that to
        the server (whose default, 1,000, refused spark.md's batches of 50,000 after the
        consumer was made, issue 23): as many as the source may hold in flight. A durable
        that exists is bound as it is (a different value would be refused as a mismatch); its
        batches are checked before the first pull."""
        if config.max_ack_pending is not None and spec.start is None:
            return config
        if spec.durable is not None:
            try:
                await self.run_.js.consumer_info(spec.stream, spec.durable)
                if spec.start is not None:
                    log.warning(
                        "source %s: durable %r exists and goes on from where it is (start=%s "
                        "is for a consumer the run creates; headrace consumer rm %s %s to "
                        "start over)",
                        self.node.name,
                        spec.durable,
                        spec.start,
                        spec.stream,
                        spec.durable,
                    )
                return config
            except ConsumerNotFound:
                pass
            except Exception:  # a probe: the subscribe says what is wrong, in its own words
                return config
        if spec.start is not None:
            # Only a consumer made now starts there (see JetStreamSource.start).
            config = attrs.evolve(config, deliver_policy=spec.start)
        if config.max_ack_pending is not None:
            return config
        room = max(DEFAULT_MAX_ACK_PENDING, self.run_.max_in_flight(self.node))
        if room != DEFAULT_MAX_ACK_PENDING:
            log.info(
                "source %s: creating its consumer with max_ack_pending %d, what it may hold in "
                "flight (the server's default, %d, is below its batches)",
                self.node.name,
                room,
                DEFAULT_MAX_ACK_PENDING,
            )
        return attrs.evolve(config, max_ack_pending=room)

    async def _wait_for_sinks(self) -> None:
        """Take nothing before every sink is open: what a source takes is held (kept alive
        with ``+WPI``) until a sink commits it, so pulling while a sink opens (a Spark
        session's JVM: a minute) held a restarted worker's 639 messages, 355 of them
        redeliveries, away from the live workers that could have written them (issue 23).
        A drain asked meanwhile ends the wait (there is then nothing to take)."""
        async with trio.open_nursery() as nursery:

            async def first(wait: Callable[[], Awaitable[Any]]) -> None:
                await wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(first, self.run_.sinks_opened)
            nursery.start_soon(first, self._drain_requested.wait)

    async def _replay_in_order(self, info: ConsumerInfo) -> None:
        """Before the first pull of a source feeding a stateful operator: if the consumer has
        messages delivered and not acked (a worker before this one died holding them, or
        still holds them: a partition's owner whose lease ran out while it was slow), have
        them come back before anything newer. Otherwise this worker takes newer messages
        first, moves the watermark ahead of the ones it gets back, and those are late (2,503
        records dead-lettered with a lateness of 600 s after one kill, in
        tests/state/test_stateful_faults.py).

        Two steps. First wait until their ack wait has passed since the consumer's last
        delivery (:meth:`_wait_for_redeliveries`): a previous owner that is alive has that
        long to find out it lost the partition and stop pulling; pulling beside it would split
        the stream between two owners, and the records of the one fenced come back late
        (with only the second step, 6 of 9 runs of
        test_three_workers_one_killed_every_window_once_and_exact lost records under load).
        Then reset the consumer to its ack floor (nats-server 2.14+, ``reset_consumer``): the
        server delivers the stream from there in order. Waiting alone is not enough: the
        server queues expired messages on a timer that puts its check off while acks come in,
        and one redelivery behind 3,600 newer messages was late in
        test_headrace_run_workers_share_the_partitions_one_killed. Messages above the floor
        that were acked come again, and the state skips them by their sequence."""
        if not info.num_ack_pending:
            return
        await self._wait_for_redeliveries(info)
        if self._drain_requested.is_set():
            return
        server = self.run_.js.nc.server_info
        if not supports_reset(server.version if server is not None else ""):
            return
        try:
            reset = await retry_transient(
                lambda: self.run_.js.reset_consumer(info.stream_name, info.name)
            )
        except (RequestTimeout, JetStreamError) as exc:
            log.warning(
                "source %s: consumer %s could not be reset to its ack floor (%s); its "
                "redeliveries may come after newer messages",
                self.node.name,
                info.name,
                exc,
            )
        else:
            log.info(
                "source %s: consumer %s starts again from its ack floor, %d (stateful "
                "pipelines replay in stream order)",
                self.node.name,
                info.name,
                reset.reset_seq,
            )

    async def _wait_for_redeliveries(self, info: ConsumerInfo) -> None:
        """The first step of :meth:`_replay_in_order`: wait until the ack wait of the pending
        messages has passed since the consumer's last delivery (every message pending was
        delivered at or before it), plus a margin; a drain asked meanwhile ends it."""
        ack_wait = info.config.ack_wait or DEFAULT_ACK_WAIT
        last = info.delivered.last_active
        waited = 0.0 if last is None else (dt.datetime.now(dt.UTC) - last).total_seconds()
        wait = max(0.0, ack_wait - max(waited, 0.0)) + REDELIVERY_MARGIN
        log.info(
            "source %s: %d messages of consumer %s are held by a worker that is gone; waiting "
            "%.1fs for them to come back first (stateful pipelines replay in stream order)",
            self.node.name,
            info.num_ack_pending,
            info.name,
            wait,
        )
        with trio.move_on_after(wait):
            await self._drain_requested.wait()

    async def _pump(self, messages: MessageSource, tracker: AckTracker) -> None:
        name = self.node.name
        limit = self.run_.max_in_flight(self.node)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._drain_when_asked, messages)
            while True:
                room = await tracker.wait_room(name, limit)
                try:
                    batch = await messages.next_batch(room)
                except SubscriptionClosedError:
                    break  # drained: everything taken has been passed on
                await self.forward(tracker.admit(batch, name, messages.taken_since))
            if not self._drain_requested.is_set():
                nursery.cancel_scope.cancel()
            # else: let the drain finish (a push subscription's drain waits for its acks,
            # which the stages downstream are about to produce)

    @trio.lowlevel.enable_ki_protection  # a Ctrl-C goes to the app (shutdown.py)
    async def _drain_when_asked(self, messages: MessageSource) -> None:
        await self._drain_requested.wait()
        await messages.drain()

    def request_drain(self) -> None:
        self._drain_requested.set()


def _exclusive(node: Node) -> bool:
    """Whether the records reaching ``node`` are held by no other stage: no stage between
    where they were made (a source, a map, a flat_map) and ``node`` sends them on to more than
    one stage (a fan-out passes the same record objects to every branch)."""
    for up in node.upstream:
        if len(up.downstream) != 1:
            return False
        if up.kind in ("filter", "merge") and not _exclusive(up):
            return False
    return True


class OperatorStage(Stage):
    """map, filter, flat_map, or merge (which passes batches through)."""

    def __init__(self, node: Node, tracker: AckTracker) -> None:
        super().__init__(f"{node.kind}:{node.name}", node, tracker)
        fn = node.fn
        # A coroutine function, or an object whose __call__ is one (which iscoroutinefunction
        # does not see through).
        self._async = fn is not None and (
            inspect.iscoroutinefunction(fn)
            or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004
        )
        self._limiter = trio.CapacityLimiter(max(node.concurrency, 1))
        #: A map whose records no other stage holds changes their value in place instead of
        #: making a new record per message (one object less on the data path). Not when the
        #: function gets the record itself: it may keep it.
        self._in_place = node.kind == "map" and not node.record and _exclusive(node)

    async def run(self) -> None:
        while (item := await self.next_batch()) is not None:
            if self.node.kind == "merge":
                await self.forward(item)
                continue
            try:
                out = await self._apply(item)
            except Exception as exc:
                # on_error="crash": the whole batch fails (nak), then the actor fails and its
                # restart policy decides.
                self.tracker.failed(item, exc, self.name, self.node.name)
                raise
            if out:
                await self.forward(out)

    async def _call(self, arg: Any) -> Any:
        fn = self.node.fn
        assert fn is not None
        if self._async:
            return await fn(arg)
        if self.node.concurrency > 1:
            return await trio.to_thread.run_sync(fn, arg, limiter=self._limiter)
        return fn(arg)

    async def _apply(self, batch: list[Record]) -> list[Record]:
        node = self.node
        if node.concurrency == 1:
            results: list[tuple[Record, Any, BaseException | None]] = []
            for record in batch:
                arg = record if node.record else record.value
                try:
                    results.append((record, await self._call(arg), None))
                except Exception as exc:
                    if node.on_error == "crash":
                        raise
                    results.append((record, None, exc))
        else:
            results = await self._apply_concurrently(batch)
        return self._collect(results)

    async def _apply_concurrently(
        self, batch: list[Record]
    ) -> list[tuple[Record, Any, BaseException | None]]:
        node = self.node
        slots: list[tuple[Record, Any, BaseException | None] | None] = [None] * len(batch)
        finished: list[int] = []
        crash: list[BaseException] = []

        async def one(i: int) -> None:
            record = batch[i]
            try:
                value = await self._call(record if node.record else record.value)
                slots[i] = (record, value, None)
            except Exception as exc:
                if node.on_error == "crash":
                    crash.append(exc)
                slots[i] = (record, None, exc)
            finished.append(i)

        async def chain(indices: list[int]) -> None:
            for i in indices:  # one subject's records, in order
                await one(i)

        limiter = trio.CapacityLimiter(node.concurrency)

        @trio.lowlevel.enable_ki_protection  # a Ctrl-C goes to the app (shutdown.py)
        async def limited(fn: Any, *args: Any) -> None:
            async with limiter:
                await fn(*args)

        async with trio.open_nursery() as nursery:
            if node.ordered == "subject":
                groups: dict[str, list[int]] = {}
                for i, record in enumerate(batch):
                    groups.setdefault(record.subject, []).append(i)
                for indices in groups.values():
                    nursery.start_soon(limited, chain, indices)
            else:
                for i in range(len(batch)):
                    nursery.start_soon(limited, one, i)
        if crash:
            raise crash[0]
        order: Iterable[int] = finished if node.ordered == "none" else range(len(batch))
        return [slot for i in order if (slot := slots[i]) is not None]

    def _collect(self, results: list[tuple[Record, Any, BaseException | None]]) -> list[Record]:
        kind = self.node.kind
        out: list[Record] = []
        dropped: list[Record] = []
        for record, value, error in results:
            if error is not None:
                self.tracker.failed([record], error, self.name, self.node.name)
            elif kind == "map":
                if self._in_place:
                    record.value = value
                    out.append(record)
                else:
                    out.append(Record(value, record.delivery))
            elif kind == "filter":
                (out if value else dropped).append(record)
            else:  # flat_map
                values = list(value) if value is not None else []
                if not values:
                    dropped.append(record)
                    continue
                self.tracker.expanded(record, len(values))
                out.extend(Record(v, record.delivery) for v in values)
        if dropped:
            self.tracker.release(dropped)
        return out


class BatcherStage(Stage):
    """Cuts batches for one sink by count, bytes and age, and hands them to its writer."""

    def __init__(self, node: Node, tracker: AckTracker) -> None:
        super().__init__(f"batcher:{node.name}", node, tracker)
        self._records: list[Record] = []
        self._bytes = 0
        self._first_at = math.inf

    async def run(self) -> None:
        policy = self.node.batch
        inbox = self.inbox
        while True:
            deadline = self._first_at + policy.max_age
            item: Item | None = None
            with trio.move_on_at(deadline):
                item = await inbox.receive()
            if item is None:
                await self._cut()
                continue
            if isinstance(item, _End):
                if self.ended():
                    await self._cut()
                    await self.forward_end()
                    return
                continue
            if policy.max_bytes is None:
                await self._add_counted(item, policy.max_messages)
                continue
            last = len(item) - 1
            for i, record in enumerate(item):
                if not self._records:
                    self._first_at = trio.current_time()
                self._records.append(record)
                self._bytes += len(record.data)
                full = len(self._records) >= policy.max_messages or self._bytes >= policy.max_bytes
                # Cut only between messages: the records of one message (a flat_map's) go in
                # one batch, so a sink deduplicating by stream sequence never skips half.
                if full and (i == last or item[i + 1].delivery is not record.delivery):
                    await self._cut()

    async def _add_counted(self, item: list[Record], max_messages: int) -> None:
        """Add ``item`` to the batch, cutting at ``max_messages`` records, whole slices at a
        time (the loop above, without a byte limit, one step per batch instead of per record).
        The same rule: a cut comes only between messages, so it may pass the count to keep a
        message's records together."""
        i, n = 0, len(item)
        while i < n:
            if not self._records:
                self._first_at = trio.current_time()
            j = i + max_messages - len(self._records)  # the first record past full
            if j >= n:
                self._records.extend(item[i:] if i else item)
                if len(self._records) >= max_messages:
                    await self._cut()
                return
            delivery = item[j - 1].delivery
            while j < n and item[j].delivery is delivery:
                j += 1
            self._records.extend(item[i:j])
            i = j
            await self._cut()

    async def _cut(self) -> None:
        if not self._records:
            self._first_at = math.inf
            return
        records, self._records = self._records, []
        self._bytes = 0
        self._first_at = math.inf
        await self.forward(records)


class SinkStage(Stage):
    """Writes batches to a sink and reports what was committed (or failed) to the tracker."""

    def __init__(self, node: Node, tracker: AckTracker, run: SinkHost) -> None:
        super().__init__(f"sink:{node.name}", node, tracker)
        # One batch waits while one is written: the batcher fills the next meanwhile.
        self._send, self.inbox = trio.open_memory_channel[Item](1)
        self.run_ = run
        self.runner = SinkRunner(node.sink_obj, node.name)
        self.committer = BatchCommitter(
            node.retry or node.pipeline.sink_retry,
            self._attempt,
            self._poisoned,
            name=node.name,
            stuck=self._stuck,
        )
        self._failing = False
        self._retries_seen = 0
        self._opened = False

    async def run(self) -> None:
        # The sink's background tasks (SinkContext.nursery) live from its open to its close.
        async with trio.open_nursery() as nursery:
            context = self.run_.sink_context(self.node)
            context.nursery = nursery
            try:
                await self._run(context)
            finally:
                nursery.cancel_scope.cancel()

    async def _run(self, context: SinkContext) -> None:
        await self.runner.bind(context)
        await self.runner.open()
        if not self._opened:  # (once: a restarted stage opens its sink again)
            self._opened = True
            self.run_.sink_opened()
        try:
            while True:
                item: Item | None = None
                with trio.move_on_after(MAINTAIN_IDLE):
                    item = await self.inbox.receive()
                if item is None:
                    # Idle: the sink's own upkeep (a shared output's sweep) gets its turn.
                    await self.runner.maintain()
                    continue
                if isinstance(item, _End):
                    if self.ended():
                        return
                    continue
                await self._write(item)
        finally:
            # Closed however the run ends (a restart opens it again); bounded, so a sink that
            # hangs in close cannot hold the pipeline.
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await self.runner.close()

    async def _write(self, records: list[Record]) -> None:
        """Commit a batch: written again while the sink is down, split to find bad records
        (sink_retry.py). Past the retry deadline everything held is naked and the pipeline
        stops."""
        try:
            # A SinkOutage (past the deadline) stops the pipeline; once its sources have let go
            # of the consumer, the run naks everything held (PipelineRun.lifetime).
            await self.committer.commit(records)
        finally:
            self._note_failing()

    async def _attempt(self, records: list[Record]) -> BaseException | None:
        """One write of ``records``: None when committed (the tracker told), else why not."""
        stats = self.run_.stats
        batch = Batch(records, self.node.name)
        started = trio.current_time()
        try:
            await self.runner.write_batch(batch)
        except OutputConflict:
            # Not this batch's fault, and not transient: writing on would lose or duplicate
            # records. Stop; what is held is redelivered after its ack wait.
            raise
        except RecordsRejected as exc:
            # Committed but for some records: those fail alone (nak, dead letter), the rest is
            # acked as for a whole batch. A message with records on both sides is poison at
            # once: delivered again, the sink would skip it as committed (sinks dedupe by
            # stream sequence) and its rejected records would be acked unwritten; the dead
            # letter keeps them (without one, terminating it is reported).
            rejected = {id(record) for record, _ in exc.rejected}
            if not rejected <= {id(record) for record in records}:
                wrong = SinkError(f"sink {self.node.name!r} rejected records not in the batch")
                wrong.transient = False  # type: ignore[attr-defined]  # its batch: split it
                return self._attempt_failed(wrong, records)
            kept = {id(r.delivery) for r in records if id(r) not in rejected}
            for record, error in exc.rejected:
                self.tracker.failed(
                    [record],
                    error,
                    self.name,
                    self.node.name,
                    poison=id(record.delivery) in kept,
                )
            self.run_.report_error(self.node.name, exc)
            records = [r for r in records if id(r) not in rejected]
        except Exception as exc:
            return self._attempt_failed(exc, records)
        elapsed = trio.current_time() - started
        stats.batches_committed += 1
        stats.commit_seconds_last = elapsed
        stats.commit_seconds_total += elapsed
        stats.commit_last_sink = self.node.name
        self.tracker.committed(records, skipped=min(max(batch.skipped, 0), len(records)))
        on_commit = self.run_.on_commit
        if on_commit is not None:
            on_commit(self.node.name, records)
        self._note_failing()
        return None

    def _attempt_failed(self, exc: BaseException, records: list[Record]) -> BaseException:
        self.run_.stats.batches_failed += 1
        self.run_.stats.failure(self.name, self.node.name, exc, records)
        self.run_.report_error(self.node.name, exc)
        self._note_failing(failing=True)
        return exc

    def _stuck(self, records: list[Record], reason: BaseException) -> None:
        """A batch is taken for an outage after every part of it failed: said as a failure
        of its own (``headrace run`` makes it a ``sink_stuck`` event)."""
        self.run_.stats.failure(self.name, self.node.name, reason, records)

    def _poisoned(self, records: list[Record], exc: BaseException) -> None:
        """A message whose records fail alone, while the sink commits others: it fails like an
        operator's failing record (nak; poison after ``max_deliveries``)."""
        self.tracker.failed(records, exc, self.name, self.node.name)

    def _note_failing(self, *, failing: bool | None = None) -> None:
        """Keep ``stats.retrying`` (sinks in a run of failures) and ``stats.sink_retries``
        current."""
        now_failing = self.committer.failing_since is not None if failing is None else failing
        if now_failing != self._failing:
            self._failing = now_failing
            self.run_.stats.retrying += 1 if now_failing else -1
        self.run_.stats.sink_retries += self.committer.retries - self._retries_seen
        self._retries_seen = self.committer.retries
