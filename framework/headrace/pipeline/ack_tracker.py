"""The ack tracker actor: the I/O of a pipeline's delivery guarantees.

A JetStream message is acked only after every record derived from it was committed by every
sink it went to. The other actors report, synchronously and per batch (trio runs one task at a
time, so there is no race): records admitted at the source, dropped by a filter, committed by a
sink, or failed. The bookkeeping on the :class:`Delivery` objects is the ack ledger's
(``ack_ledger.py``, :class:`AckLedger`, no I/O: the rules for acks, naks, poison messages and
+WPI are written down there); the tracker drives it, h11-style: it tells the ledger what a
stage reported, with the time, and does what the ledger answers: the acks of a committed batch
in one write (``ack_all``), the naks with their delays, the +WPI. It also wakes the sources
waiting for room (``wait_room``) and those waiting for the consumer's state to move
(``changed``).

Poison messages: the tracker publishes each to the dead-letter subject (which a stream must
store: checked at start) and terminates it (+TERM) only after the stream's PubAck, so a poison
message is never just dropped; if the copy cannot be stored, it is naked again instead.
Without a dead letter it is terminated and reported (:class:`PoisonTerminated`). Poison
handling runs apart from the +WPI scan, one message at a time, shielded, so a stop never cuts
it in half.

Slow commits: the tracker's own task scans at a quarter of the shortest ack_wait, sends the
+WPI the ledger finds due, and asks each pull source's consume buffer to do so for messages
still waiting there (through the ``keep_alive`` callable the source gave).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio

from headrace.actors.actor import Actor
from headrace.errors import HeadraceError, MaxPayloadExceeded, NatsError
from headrace.jetstream.errors import JetStreamError, StreamLookupError
from headrace.jetstream.message import JsMsg, ack_all
from headrace.jetstream.transient import retry_transient
from headrace.pipeline.ack_ledger import AckLedger, Poison
from headrace.pipeline.errors import PipelineError
from headrace.pipeline.record import Delivery, Record
from headrace.pipeline.stats import PipelineStats

if TYPE_CHECKING:
    from headrace.jetstream.context import JetStream
    from headrace.pipeline.nodes import PipelineGraph

#: The ack wait assumed for a source whose consumer has not told its own (the server's
#: default).
DEFAULT_ACK_WAIT = 30.0
#: How long one poison message's dead-letter publish and +TERM may take, shielded from a stop.
POISON_TIMEOUT = 10.0


class PoisonTerminated(HeadraceError):
    """A poison message was terminated without a dead-letter copy (the pipeline has no
    ``dead_letter``): its data is only in the stream now."""


@attrs.frozen(slots=True)
class _Wake:
    """Poison jobs wait in the ledger: the tracker's task is to take them."""


_WAKE = _Wake()

#: The tracker's inbox holds one wake-up at most. What it wakes for is kept elsewhere: the
#: poison jobs, in the ledger (a failure is reported synchronously, by ``failed``, which cannot
#: wait for room, and a poison job dropped for want of room would be neither dead-lettered nor
#: naked). So a wake-up that finds the inbox full is not needed: the one already there makes
#: the task take every poison job then waiting. An unbounded inbox of jobs is what this
#: replaces. (A source's new ack_wait goes to the +WPI scan directly.)
INBOX_SIZE = 1

#: A source's way to send +WPI for the messages waiting in its consume buffer that arrived
#: before a moment (``trio.current_time()`` units); returns how many it sent.
KeepAlive = Callable[[float], int]


class AckTracker(Actor[_Wake]):
    """The driver of a run's :class:`AckLedger` (:attr:`ledger`), which owns every delivery's
    state (see the module docs).

    Stages report facts to it, synchronously and one way (``admit``, ``forked``, ``expanded``,
    ``release``, ``committed``, ``failed``); it acks a message once all its records are
    committed, naks it with a growing delay when one failed, and dead-letters or terminates it
    after ``max_deliveries``. Its task keeps slow messages alive with +WPI and runs the poison
    handling, shielded. A plugin author never calls it: a sink only returns or raises.
    """

    def __init__(self, pipeline: PipelineGraph, js: JetStream, stats: PipelineStats) -> None:
        super().__init__("ack-tracker", inbox_size=INBOX_SIZE)
        self.pipeline = pipeline
        self.js = js
        self.stats = stats
        #: The bookkeeping, without I/O: what to ack, nak, terminate, keep alive.
        self.ledger = AckLedger(stats, pipeline, default_ack_wait=DEFAULT_ACK_WAIT)
        # The sources waiting for their in-flight count to fall (wait_room).
        self._room = trio.lowlevel.ParkingLot()
        #: How each pull source keeps alive the messages still waiting in its consume buffer
        #: (``keep_alive(older_than) -> +WPI sent``), called by the same scan: the one narrow
        #: way the tracker reaches back to a source, instead of holding its buffer.
        self.keep_alives: dict[str, KeepAlive] = {}
        self._rescan = trio.Event()
        #: Told of failures worth a line in the run's errors (``PipelineRun.report_error``).
        self.report: Callable[[str, BaseException], None] = lambda _stage, _error: None
        self._changed = trio.Event()

    @property
    def ack_wait(self) -> dict[str, float]:
        """ack_wait of each source's consumer (seconds), learned when it binds."""
        return self.ledger.ack_wait

    @property
    def in_flight(self) -> dict[str, int]:
        """Messages each source has in the pipeline (taken, not yet acked, naked or
        terminated)."""
        return self.ledger.in_flight

    def changed(self) -> trio.Event:
        """An event set at the next ack, nak or +TERM the tracker sends: the moments the
        consumer's state on the server can move (``PipelineRun.wait_caught_up`` asks the
        server then). Take it before looking, so that no change is missed in between."""
        return self._changed

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _moved(self) -> None:
        """Messages left the pipeline (acked, naked, made poison): the consumer's state may
        move, and the sources waiting for room may take more."""
        self._touch()
        if self._room:
            self._room.unpark_all()

    def learn_ack_wait(
        self, source: str, ack_wait: float, keep_alive: KeepAlive | None = None
    ) -> None:
        """A source bound its consumer: scan for +WPI at a quarter of its ack_wait;
        ``keep_alive``: how to keep alive what waits in its consume buffer (pull sources)."""
        self.ledger.learn_ack_wait(source, ack_wait)
        if keep_alive is not None:
            self.keep_alives[source] = keep_alive
        # Straight to the scan, not through the inbox: behind a queue of poison jobs, the
        # first +WPI of a source with a shorter ack_wait would come late.
        self._rescan.set()

    # -- reports from the other actors (synchronous) ------------------------------------------

    def admit(self, msgs: list[JsMsg], source: str, since: float | None = None) -> list[Record]:
        """Messages taken from a source become deliveries and records. ``since``: when their
        ack_wait started (they may have waited in a consume buffer), if not now.

        A redelivery of a message the pipeline still holds is not taken again
        (``AckLedger._held_again``)."""
        return self.ledger.admit(msgs, source, trio.current_time(), since)

    def forked(self, records: list[Record], copies: int) -> None:
        """Each of ``records`` goes on as ``copies`` records (a fan-out to several stages):
        its message waits for every copy."""
        self.ledger.forked(records, copies)

    def expanded(self, record: Record, count: int) -> None:
        """``record`` became ``count`` records (a flat_map; at least one: none is a drop)."""
        self.ledger.expanded(record, count)

    def release(self, records: list[Record]) -> None:
        """Records that end without a sink (a filter dropped them, a flat_map made none):
        their messages are acked once nothing else is outstanding."""
        self._acked(self.ledger.release(records))

    def committed(self, records: list[Record], skipped: int = 0) -> None:
        """A sink committed these records, ``skipped`` of them by finding them committed
        already (``Batch.skipped``)."""
        self._acked(self.ledger.committed(records, skipped))

    def _acked(self, ready: list[JsMsg]) -> None:
        if self.ledger.settled_results:
            self._tell_owners()
        if ready:
            ack_all(ready)
            self._moved()

    def _tell_owners(self) -> None:
        """Tell stateful operators that results of theirs settled (committed, or failed and
        made poison): each forgets them at its next snapshot."""
        for delivery, committed in self.ledger.take_settled_results():
            delivery.owner.result_settled(delivery.result_seq, committed=committed)

    def failed(
        self,
        records: list[Record],
        error: BaseException,
        actor: str | None = None,
        node: str | None = None,
        *,
        poison: bool = False,
    ) -> None:
        """Processing these records failed in ``actor`` (of node ``node``): nak their messages
        (or, past ``max_deliveries``, treat them as poison). ``poison``: they are poison now,
        whatever their delivery count (a delivery would not bring them back: see
        ``SinkStage._attempt``)."""
        self.stats.failure(actor or self.name, node or actor or self.name, error, records)
        outcome = self.ledger.failed(records, error, poison=poison)
        if self.ledger.settled_results:
            self._tell_owners()
        for msg, delay in outcome.naks:
            msg.nak_nowait(delay)
        if outcome.poison:
            # The job waits in the ledger; a full inbox holds a wake-up that will take it.
            self.tell(_WAKE)
        self._moved()

    def abandon_all(self) -> int:
        """Nak, without a delay, every message held (the pipeline is giving up: a sink outage
        past its deadline): they are delivered again, here or to another worker, and none is
        terminated. How many."""
        naked = self.ledger.abandon_all()
        for msg in naked:
            msg.nak_nowait()
        self._moved()
        return len(naked)

    async def wait_room(self, source: str, limit: int) -> int:
        """Wait while ``source`` has ``limit`` or more messages in the pipeline (the bound on
        memory, whatever the stages' inboxes could hold); how many it may take now."""
        in_flight = self.ledger.in_flight
        while in_flight.get(source, 0) >= limit:
            await self._room.park()
        return limit - in_flight.get(source, 0)

    # -- the actor's task: poison messages and +WPI ---------------------------------------------

    async def run(self) -> None:
        await self._check_dead_letter()
        # Poison jobs are handled one after another, each whole (its dead-letter publish and
        # its +TERM); the +WPI scan runs beside them on its own deadline, so neither cuts the
        # other short (a dead-letter publish cancelled by the scan's timer was stored and never
        # terminated, and the rest of its batch neither terminated nor naked).
        ledger = self.ledger
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._scan_loop)
            while True:
                await self.inbox.receive()  # poison came (see INBOX_SIZE)
                while (job := ledger.take_poison()) is not None:
                    await self._poison(job)
                    # Each job is shielded whole; between two, a stop takes effect (the jobs
                    # left in the ledger are delivered again after their ack wait).
                    await trio.lowlevel.checkpoint()

    @trio.lowlevel.enable_ki_protection  # a Ctrl-C goes to the app (shutdown.py)
    async def _scan_loop(self) -> None:
        ledger = self.ledger
        next_scan = trio.current_time() + ledger.scan_interval()
        while True:
            with trio.move_on_at(next_scan):
                await self._rescan.wait()
                self._rescan = trio.Event()
                next_scan = min(next_scan, trio.current_time() + ledger.scan_interval())
                continue
            now = trio.current_time()
            self._send_in_progress(now, now - next_scan)
            next_scan = trio.current_time() + ledger.scan_interval()

    async def _check_dead_letter(self) -> None:
        """A dead letter must be kept: a stream must store the subject (checked once, when the
        pipeline starts), so that a poison message is terminated only once its copy is."""
        subject = self.pipeline.dead_letter
        if subject is None:
            return
        try:
            await retry_transient(lambda: self.js.find_stream(subject))
        except StreamLookupError:
            raise PipelineError(
                f"pipeline {self.pipeline.name!r}: no stream stores its dead_letter subject "
                f"{subject!r}, so a poison message's copy would be kept nowhere. Create a stream "
                "capturing it (e.g. headrace stream add DLQ --subjects "
                f"'{subject}'), or leave dead_letter unset"
            ) from None

    def _send_in_progress(self, now: float, late: float) -> None:
        due = self.ledger.scan(now, late)
        for source, keep_alive in self.keep_alives.items():
            before = due.buffered_before.get(source)
            if before is not None:
                self.stats.in_progress += keep_alive(before)
        for msg in due.msgs:
            msg.in_progress_nowait()

    async def _poison(self, job: Poison) -> None:
        dead_letter = self.pipeline.dead_letter
        reason = f"{type(job.error).__name__}: {job.error}"[:500]
        for delivery in job.deliveries:
            # Each message whole: its copy stored, then its +TERM, not cut apart by a stop.
            try:
                with trio.CancelScope(shield=True), trio.move_on_after(POISON_TIMEOUT):
                    await self._one_poison(delivery, dead_letter, reason)
            finally:
                self.ledger.poison_settled(delivery)
                self._touch()  # terminated, or naked again: either way the consumer moved

    async def _one_poison(self, delivery: Delivery, dead_letter: str | None, reason: str) -> None:
        msg = delivery.msg
        if dead_letter is not None and self.ledger.copied_already(msg):
            # Copied already; this is a delivery that came again before the +TERM landed.
            msg.term_nowait(f"poison message in pipeline {self.pipeline.name}: {reason}"[:200])
            self.stats.terms += 1
            return
        if dead_letter is not None:
            try:
                await self._dead_letter(dead_letter, msg, reason)
            except (JetStreamError, NatsError) as exc:
                # Not kept anywhere: terminating it now would lose it. Redeliver later.
                self.stats.failure(self.name, self.name, exc, msg=msg)
                msg.nak_nowait(self.pipeline.nak_delay_max)
                self.stats.naks += 1
                return
            self.ledger.dead_lettered(msg)
        else:
            # Terminated with no copy anywhere but the stream: said loudly, counted, and
            # `headrace run` exits non-zero at the end unless the pipeline allows it.
            self.stats.terminated_unkept += 1
            self.report(
                self.name,
                PoisonTerminated(
                    f"poison message {msg.metadata.stream} #{msg.metadata.stream_seq} "
                    f"terminated without a dead letter: {reason}"
                ),
            )
        msg.term_nowait(f"poison message in pipeline {self.pipeline.name}: {reason}"[:200])
        self.stats.terms += 1

    async def _dead_letter(self, subject: str, msg: JsMsg, reason: str) -> None:
        meta = msg.metadata
        headers = {
            "Headrace-Pipeline": self.pipeline.name,
            "Headrace-Error": reason.replace("\r", " ").replace("\n", " "),
            "Headrace-Subject": msg.subject,
            "Headrace-Stream": meta.stream,
            "Headrace-Stream-Seq": str(meta.stream_seq),
            "Headrace-Delivered": str(meta.num_delivered),
        }
        if msg.headers is not None:
            for name, value in msg.headers.multi_items():
                if name.startswith("Nats-"):
                    continue  # the server's own (de-duplication, expectations): not to replay
                headers.setdefault(name, value)
        try:
            await self.js.publish(subject, msg.data, headers=headers)
        except MaxPayloadExceeded:
            # The copy does not fit (the message was just under max_payload, and the headers
            # above made it larger): a reference, without the body, rather than nothing. The
            # body stays in the stream at the sequence the headers name.
            headers["Headrace-Body"] = (
                f"omitted: {len(msg.data)} bytes, over the server's max_payload with these "
                "headers; the message is in its stream at Headrace-Stream-Seq"
            )
            await self.js.publish(subject, b"", headers=headers)
