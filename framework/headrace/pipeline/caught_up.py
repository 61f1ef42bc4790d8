"""Caught up: every message a source's consumer had when we asked is settled on the server.

A run is *caught up* to a moment when, for each source, every message of its stream that the
consumer's filter selects and that was stored at that moment has been acked or terminated
(+TERM, which is how a poison message ends once its dead-letter copy is stored). A message
naked and waiting for its redelivery is not settled, nor is one whose ack wait ran out, nor a
poison message whose dead-letter copy is not stored yet.

Why the server decides, not the ack tracker: the tracker forgets a message once it has naked
it (``stats.ack_pending`` falls to 0 while the message waits for its redelivery), and it never
saw what still waits on the server. The consumer knows both. Its ack floor
(``ack_floor.stream_seq``) is the stream sequence below which nothing it delivered is pending:
the server keeps it at (the lowest pending sequence) - 1, or at the last sequence it looked at
when nothing is pending. A naked message stays pending (counted in ``num_ack_pending``) until
its redelivery is acked, so it holds the floor down; +ACK and +TERM release it.

So the mark of a moment is, per source, the stream sequence of the last message the filter
selects (:func:`catch_up_mark`), and the source is caught up once its consumer's ack floor has
reached it. It is exact both ways: the floor at or past the mark means every selected message
up to the mark is settled (what is below the floor is), and once they all are, the floor is at
least the mark (the lowest pending message, if any, came after it; with none pending, the
consumer has looked at the mark's message, having delivered it). Messages stored after the
mark are not waited for, even if the consumer holds them unsettled (they sit above the
floor). The mark is found from the consumer's info: with ``num_pending == 0`` it is the last
delivered stream sequence; otherwise the last stored message of each filter subject (or of
the stream, without a filter), asked just after: a message stored in between is waited for
too, which can only make the wait a message longer.

When to ask: the server's floor can only move when the run's acks and terms reach it, so the
waiter asks after each change the tracker reports (:meth:`AckTracker.changed`), once the
connection is flushed (a PING answered after the acks were written: they reached the
server). The server applies acks on the consumer's own queue, after the PONG, and a naked
message's redelivery is the server's timer: neither has an event the client can see. So
between changes the waiter asks again on a short backoff (:data:`RECHECK_MIN` doubling up to
:data:`RECHECK_MAX`), reset by each change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from headrace.errors import HeadraceError
from headrace.jetstream.errors import MessageNotFound
from headrace.jetstream.transient import retry_transient

if TYPE_CHECKING:
    from headrace.jetstream.api import JetStreamAPI
    from headrace.jetstream.consumer_config import ConsumerInfo

#: The first pause before asking the server again when nothing changed (seconds).
RECHECK_MIN = 0.01
#: The longest such pause: how late a caught-up run can be noticed, at worst.
RECHECK_MAX = 0.5


class NotCaughtUp(HeadraceError):
    """The run ended (drained, stopped, or failed) before it caught up."""


class CatchUpTimeout(NotCaughtUp, TimeoutError):
    """``run_until_caught_up`` did not catch up within its timeout."""


@attrs.frozen(slots=True)
class SourceMark:
    """One source's mark: its consumer, and the stream sequence its ack floor must reach."""

    source: str
    stream: str
    consumer: str
    seq: int


@attrs.frozen(slots=True)
class CatchUpMark:
    """A moment to catch up to: a :class:`SourceMark` per source
    (:meth:`PipelineRun.catch_up_mark`)."""

    sources: tuple[SourceMark, ...]


async def catch_up_mark(
    js: JetStreamAPI, source: str, stream: str, consumer: str
) -> tuple[SourceMark, ConsumerInfo]:
    """The mark of one source's consumer now (see the module docs), and the info it came
    from."""
    info = await retry_transient(lambda: js.consumer_info(stream, consumer))
    seq = info.delivered.stream_seq
    if info.num_pending > 0:
        config = info.config
        filters = list(config.filter_subjects or ())
        if config.filter_subject:
            filters.append(config.filter_subject)
        if filters:
            for subject in filters:
                try:
                    stored = await js.get_msg(stream, last_by_subject=subject)
                except MessageNotFound:
                    continue
                seq = max(seq, stored.seq)
        else:
            seq = max(seq, (await js.stream_info(stream)).state.last_seq)
    return SourceMark(source, stream, consumer, seq), info


def reached(mark: SourceMark, info: ConsumerInfo) -> bool:
    """Whether the consumer whose info this is has settled everything up to the mark."""
    return info.ack_floor.stream_seq >= mark.seq
