"""``ack_all``'s bookkeeping, which its batch form must keep exactly as one ``ack()`` per
message would: each message's own tracker told once per message, nothing marked acked when
one of them cannot be acked. A recording stand-in for the connection (the wire format is
checked against a real server by the consume and pipeline tests)."""

from __future__ import annotations

from typing import Any

import pytest
from headrace.jetstream.errors import NotAJetStreamMessage
from headrace.jetstream.message import JsMsg, OutstandingAcks, ack_all
from headrace.protocol.events import Msg


class _Conn:
    def __init__(self) -> None:
        self.writes: list[tuple[bytes, int]] = []

    def write_nowait(self, encoded: bytes, messages: int, payload_bytes: int = 0) -> None:
        self.writes.append((encoded, messages))


def _msg(conn: Any, seq: int, tracker: OutstandingAcks | None, reply: bool = True) -> JsMsg:
    subject = f"$JS.ACK.S.C.1.{seq}.{seq}.0.0" if reply else None
    return JsMsg(Msg("s.x", 1, subject, b""), conn, False, tracker)


def test_interleaved_trackers_are_each_told_their_own_count() -> None:
    one, two = OutstandingAcks(), OutstandingAcks()
    one.delivered(4)
    two.delivered(3)
    conn: Any = _Conn()
    owners = [one, one, two, two, None, one, two]  # runs of one tracker, and interleaved
    batch = [_msg(conn, seq, owner) for seq, owner in enumerate(owners, 1)]
    assert ack_all(batch) == 7
    assert (one.count, two.count) == (1, 0)
    assert all(m._acked for m in batch)
    (encoded, count), *_ = conn.writes
    assert count == 7 and encoded.count(b"+ACK") == 7
    assert ack_all(batch) == 0  # acked already: nothing more, no count goes below
    assert (one.count, two.count) == (1, 0)


def test_a_message_without_reply_fails_the_batch_before_anything_is_acked() -> None:
    tracker = OutstandingAcks()
    tracker.delivered(2)
    conn: Any = _Conn()
    batch = [_msg(conn, 1, tracker), _msg(conn, 2, tracker, reply=False)]
    with pytest.raises(NotAJetStreamMessage):
        ack_all(batch)
    assert conn.writes == [] and tracker.count == 2
    assert not any(m._acked for m in batch)
