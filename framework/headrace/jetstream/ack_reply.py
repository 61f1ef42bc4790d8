"""``$JS.ACK`` reply subjects: the delivery metadata every JetStream message carries (ADR-15).

v1, 9 tokens::

    $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<timestamp>.<pending>

v2, 11 or more tokens (more may be appended later; they are ignored), with two inserted::

    $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>...<pending>

A domain of ``_`` means "no domain" and is exposed as ``None``. Anything else (another prefix,
10 tokens, fewer than 9, a non-numeric number) is an :class:`InvalidAckReply`.
"""

from __future__ import annotations

import datetime as dt
from typing import NamedTuple

from headrace.jetstream.errors import InvalidAckReply


class AckMetadata(NamedTuple):
    """Where a delivered message sits in its stream and consumer.

    A named tuple rather than an attrs class: every delivered message gets one, and a frozen
    attrs instance costs three times as much to make (0.8 against 0.3 us here), which showed
    in the end-to-end profile. It is immutable and compares by value all the same.
    """

    stream: str
    consumer: str
    num_delivered: int
    stream_seq: int
    consumer_seq: int
    #: Nanoseconds since the epoch when the message was stored.
    timestamp_ns: int
    num_pending: int
    domain: str | None = None
    account_hash: str | None = None

    @property
    def timestamp(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.timestamp_ns / 1e9, dt.UTC)


def _number(token: str, what: str, reply: str) -> int:
    if not token.isdigit() or not token.isascii():
        raise InvalidAckReply(f"{what} {token!r} is not a number in ack reply {reply!r}")
    return int(token)


def parse_ack_reply(reply: str) -> AckMetadata:
    """The metadata of ``reply``; :class:`InvalidAckReply` if it is not a ``$JS.ACK`` subject."""
    tokens = reply.split(".")
    n = len(tokens)
    if n == 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        # The common v1 form, unpacked at once: every delivered message pays for this parse.
        _, _, stream, consumer, delivered, sseq, cseq, ts, pending = tokens
        digits = delivered + sseq + cseq + ts + pending
        if stream and consumer and digits.isdigit() and digits.isascii() and all(tokens[4:]):
            return AckMetadata(
                stream, consumer, int(delivered), int(sseq), int(cseq), int(ts), int(pending)
            )
    if n < 2 or tokens[0] != "$JS" or tokens[1] != "ACK":
        raise InvalidAckReply(f"not a JetStream ack reply (no $JS.ACK prefix): {reply!r}")
    if n == 9:
        domain = account = None
        rest = tokens[2:9]
    elif n >= 11:
        domain = None if tokens[2] == "_" else tokens[2]
        account = tokens[3]
        rest = tokens[4:11]
    else:
        raise InvalidAckReply(
            f"an ack reply has 9 tokens (v1) or 11 or more (v2), not {n}: {reply!r}"
        )
    stream, consumer, delivered, sseq, cseq, ts, pending = rest
    if not stream or not consumer:
        raise InvalidAckReply(f"empty stream or consumer name in ack reply {reply!r}")
    digits = delivered + sseq + cseq + ts + pending
    if digits.isdigit() and digits.isascii() and all(rest[2:]):
        # Every message pays for this parse: one check of the five numbers together, and the
        # per-token checks below only to say which one is wrong.
        return AckMetadata(
            stream,
            consumer,
            int(delivered),
            int(sseq),
            int(cseq),
            int(ts),
            int(pending),
            domain,
            account,
        )
    return AckMetadata(
        stream=stream,
        consumer=consumer,
        num_delivered=_number(delivered, "delivery count", reply),
        stream_seq=_number(sseq, "stream sequence", reply),
        consumer_seq=_number(cseq, "consumer sequence", reply),
        timestamp_ns=_number(ts, "timestamp", reply),
        num_pending=_number(pending, "pending count", reply),
        domain=domain,
        account_hash=account,
    )
