"""Consumer reset (nats-server 2.14+): start a consumer over from a stream sequence.

``$JS.API.CONSUMER.RESET.<stream>.<consumer>`` with an empty body moves the consumer back to
its ack floor; with ``{"seq": n}`` to sequence ``n`` (any sequence for ``DeliverAll``, none
below the configured start for ``DeliverByStartSequence`` and ``DeliverByStartTime``, and no
other for the other deliver policies: :class:`~headrace.jetstream.errors.InvalidConsumerReset`).

What a reset does (nats-server's ``resetStartingSeq``): the consumer forgets every delivery it
was waiting on an ack for, and its queue of redeliveries; its next delivery is the first
message at or after the sequence, then the stream in order, each counted as a first delivery
(``num_delivered`` 1, delivery sequences from 1 again). The answer is the consumer's info
after the reset and ``reset_seq``, the sequence it starts from.

That is what a stateful pipeline needs after a worker died holding messages: waiting for the
server to redeliver them lets newer messages through first whenever its timer has not yet
queued every expired one (acks flowing make it put that check off), and a record that comes
back behind the watermark is late. A reset replays them in stream order, at once.
"""

from __future__ import annotations

import re
from typing import Final

import attrs

from headrace.jetstream.consumer_config import ConsumerInfo

#: The first nats-server release with the reset call.
RESET_SINCE: Final = (2, 14)


def supports_reset(version: str) -> bool:
    """Whether a server of ``version`` (its INFO's, ``2.15.1``) has the reset call; an empty
    or unreadable version is taken to have it (the call then says)."""
    parts = re.match(r"^v?(\d+)\.(\d+)", version)
    if parts is None:
        return True
    return (int(parts.group(1)), int(parts.group(2))) >= RESET_SINCE


def reset_api(stream: str, consumer: str) -> str:
    """The API subject that resets a consumer, without the JetStream API prefix."""
    return f"CONSUMER.RESET.{stream}.{consumer}"


def reset_body(seq: int | None) -> dict[str, int] | None:
    """The request body: none for the ack floor, else the sequence (at least 1)."""
    if seq is None:
        return None
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ValueError(f"a consumer resets to a stream sequence of at least 1, not {seq!r}")
    return {"seq": seq}


@attrs.frozen(slots=True)
class ConsumerReset:
    """A reset's answer: the sequence the consumer starts from and its info afterwards."""

    reset_seq: int
    info: ConsumerInfo
