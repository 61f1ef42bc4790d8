"""Loading a stream fast: many publishes in flight, every one confirmed by the stream.

``JetStream.publish`` waits for each PubAck, one round trip a message. Loading a stream
(benchmarks, the demo, backfills) wants the messages out back to back instead, with their
PubAcks collected on one inbox and at most ``window`` of them outstanding, so memory and the
server's pending queue stay bounded. Refusals (an error PubAck, a status such as 503) are
counted, not raised mid-way: the caller compares what the stream holds with what it sent.

A ``ttl`` (ADR-43) applies to every message of the load, as the ``Nats-TTL`` header; it is
checked once before the first message goes out, since a bad one would have every message
refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

import attrs
import trio

from headrace.jetstream.msg_ttl import NATS_TTL, MessageTTL, ttl_header
from headrace.nats.connection import Connection

#: PubAcks awaited at once by default.
DEFAULT_WINDOW = 2000
#: How long a PubAck may take before the load is given up.
ACK_TIMEOUT = 30.0


@attrs.frozen(slots=True)
class BulkPublishResult:
    """How a bulk publish went: messages sent, refused by the stream, payload bytes, seconds."""

    sent: int
    refused: int
    payload_bytes: int
    seconds: float

    @property
    def msg_per_s(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0


async def publish_acked(
    nc: Connection,
    messages: Iterable[tuple[str, bytes, Mapping[str, str] | None]],
    *,
    window: int = DEFAULT_WINDOW,
    ttl: MessageTTL | None = None,
) -> BulkPublishResult:
    """Publish ``(subject, data, headers)`` messages with at most ``window`` PubAcks pending;
    returns once every one was answered (``trio.TooSlowError`` if one takes over 30 s).

    ``ttl`` gives every message that per-message TTL (seconds, a timedelta, a duration
    string or ``"never"``; :class:`~headrace.jetstream.errors.InvalidMessageTTL` before
    anything is sent if it is not one). A stream without ``allow_msg_ttl`` refuses them all,
    counted in ``refused``."""
    if window < 1:
        raise ValueError(f"window must be at least 1, not {window}")
    ttl_value = None if ttl is None else ttl_header(ttl)
    inbox = nc.new_inbox()
    acks = await nc.subscribe(inbox)
    sent = answered = refused = payload = 0
    started = time.perf_counter()
    try:

        async def collect() -> None:
            nonlocal answered, refused
            with trio.fail_after(ACK_TIMEOUT):
                batch = await acks.next_batch()
            answered += len(batch)
            refused += sum(1 for m in batch if m.status is not None or b'"error"' in m.data)

        for subject, data, headers in messages:
            if ttl_value is not None:
                headers = {**(headers or {}), NATS_TTL: ttl_value}
            await nc.publish(subject, data, reply=inbox, headers=headers)
            sent += 1
            payload += len(data)
            while sent - answered > window:
                await collect()
        while answered < sent:
            await collect()
    finally:
        await acks.unsubscribe()
    return BulkPublishResult(sent, refused, payload, time.perf_counter() - started)
