"""JetStream messages and their acknowledgements (ADR-15 "Ack Handling").

An ack is a publish to the message's ``$JS.ACK`` reply subject with the ack type as payload:
``+ACK``, ``-NAK`` (optionally ``{"delay": ns}``), ``+TERM`` (optionally a reason) are terminal;
``+WPI`` (work in progress) is not. Rules:

- once a terminal ack was published, every later ack call is ignored;
- with ack policy ``none``, every ack call is ignored;
- an error is raised only when publishing the ack fails (a closed connection, say).

Acks go out through the connection's write buffer without a checkpoint per message
(``publish_nowait``), so acking a batch costs one socket write, not one per message.
``ack_sync`` (the "double ack") waits for the server to confirm it recorded the ack.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, cast

import trio

from headrace.jetstream.ack_reply import AckMetadata, parse_ack_reply
from headrace.jetstream.errors import NotAJetStreamMessage
from headrace.protocol.events import Msg
from headrace.protocol.headers import Headers

if TYPE_CHECKING:
    from headrace.nats.connection import Connection

ACK = b"+ACK"
NAK = b"-NAK"
TERM = b"+TERM"
WPI = b"+WPI"


def _utf8_len(text: str) -> int:
    # isascii() is a flag check in CPython, so the common case costs no encoding.
    return len(text) if text.isascii() else len(text.encode())


def wire_size(msg: Msg) -> int:
    """A message's size as the server counts it for ``max_bytes`` (ADR-37): subject, reply,
    header block and payload, in bytes (the server's consumer.go sums exactly these)."""
    raw = msg.raw_headers
    reply = msg.reply
    return (
        _utf8_len(msg.subject)
        + (_utf8_len(reply) if reply else 0)
        + (len(raw) if raw is not None else 0)
        + len(msg.data)
    )


def ack_all(messages: list[JsMsg]) -> int:
    """Acknowledge every message of ``messages`` not acked yet, in one write; return how many
    acks were queued.

    The batch form of :meth:`JsMsg.ack`: the acks are encoded with one join and queued with one
    call, a fraction of the per-message cost. The same rules apply: acked messages and those of
    an ack-policy-none consumer are skipped; nothing is marked acked unless queuing succeeded.
    """
    if len(set(messages)) == len(messages):  # the usual case, checked at C speed
        pending = [m for m in messages if not (m._acked or m._ack_none)]
    else:
        pending = []
        seen: set[JsMsg] = set()
        for m in messages:
            if m._acked or m._ack_none or m in seen:
                continue  # acked, not to be acked, or listed twice: one ack each, no more
            seen.add(m)
            pending.append(m)
    if not pending:
        return 0
    replies = [m.msg.reply for m in pending]
    if None in replies:
        m = pending[replies.index(None)]
        raise NotAJetStreamMessage(f"{m!r} cannot be acknowledged: it has no reply")
    subjects = cast("list[str]", replies)  # None was ruled out just above
    encoded = ("PUB " + " 4\r\n+ACK\r\nPUB ".join(subjects) + " 4\r\n+ACK\r\n").encode()
    conn = pending[0]._conn
    if any(m._conn is not conn for m in pending):
        for m in pending:  # messages of several connections: each to its own
            m.ack_nowait()
        return len(pending)
    conn.write_nowait(encoded, len(pending), 4 * len(pending))  # 4: len(b"+ACK")
    # Each message's tracker told once per run of messages sharing it (usually all of them).
    tracker: OutstandingAcks | None = None
    run = 0
    for m in pending:
        m._acked = True
        if m._tracker is not tracker:
            if tracker is not None:
                tracker.acked(run)
            tracker, run = m._tracker, 0
        run += 1
    if tracker is not None:
        tracker.acked(run)
    return len(pending)


class OutstandingAcks:
    """Counts messages handed to the user and not yet terminally acked, so that a drain can
    wait for them (up to its deadline) before deleting the consumer."""

    __slots__ = ("_lot", "count")

    def __init__(self) -> None:
        self.count = 0
        self._lot = trio.lowlevel.ParkingLot()

    def delivered(self, n: int) -> None:
        self.count += n

    def acked(self, n: int = 1) -> None:
        self.count -= n
        if self.count <= 0 and self._lot:
            self._lot.unpark_all()

    async def wait_all_acked(self) -> None:
        while self.count > 0:
            await self._lot.park()


class JsMsg:
    """A message delivered by a JetStream consumer, with its acknowledgement methods."""

    __slots__ = ("_ack_none", "_acked", "_conn", "_meta", "_tracker", "msg")

    def __init__(
        self,
        msg: Msg,
        conn: Connection,
        ack_none: bool = False,
        tracker: OutstandingAcks | None = None,
    ) -> None:
        self.msg = msg
        self._conn = conn
        self._ack_none = ack_none
        self._acked = False
        self._meta: AckMetadata | None = None
        self._tracker = tracker

    def __repr__(self) -> str:
        return f"JsMsg(subject={self.msg.subject!r}, reply={self.msg.reply!r})"

    # -- the message --------------------------------------------------------------------------

    @property
    def subject(self) -> str:
        return self.msg.subject

    @property
    def data(self) -> bytes:
        return self.msg.data

    @property
    def headers(self) -> Headers | None:
        return self.msg.headers

    @property
    def reply(self) -> str | None:
        return self.msg.reply

    @property
    def size(self) -> int:
        """Bytes as the server counts them for ``max_bytes`` (ADR-37): subject, reply,
        headers and payload."""
        return wire_size(self.msg)

    @property
    def metadata(self) -> AckMetadata:
        """Stream, consumer, sequences, delivery count (parsed on first access)."""
        meta = self._meta
        if meta is None:
            if self.msg.reply is None:
                raise NotAJetStreamMessage(f"{self!r} has no $JS.ACK reply subject")
            meta = self._meta = parse_ack_reply(self.msg.reply)
        return meta

    @property
    def is_acked(self) -> bool:
        """Whether a terminal ack was published for this message."""
        return self._acked

    # -- acknowledging ------------------------------------------------------------------------

    def _publish(self, payload: bytes, terminal: bool) -> bool:
        if self._ack_none or self._acked:
            return False
        reply = self.msg.reply
        if reply is None:
            raise NotAJetStreamMessage(f"{self!r} cannot be acknowledged: it has no reply")
        self._conn.publish_nowait(reply, payload)  # raises if it cannot be queued
        if terminal:
            self._acked = True
            if self._tracker is not None:
                self._tracker.acked()
        return True

    def ack_nowait(self) -> bool:
        """Queue ``+ACK`` now; ``False`` when ignored (already acked, or ack policy none)."""
        return self._publish(ACK, True)

    def nak_nowait(self, delay: float | None = None) -> bool:
        """Queue ``-NAK`` (with a redelivery delay) now; ``False`` when ignored."""
        payload = NAK
        if delay is not None:
            if delay < 0:
                raise ValueError(f"nak delay must not be negative, not {delay}")
            payload = NAK + b" " + json.dumps({"delay": round(delay * 1e9)}).encode()
        return self._publish(payload, True)

    def term_nowait(self, reason: str | None = None) -> bool:
        """Queue ``+TERM`` now; ``False`` when ignored."""
        return self._publish(TERM if not reason else TERM + b" " + reason.encode(), True)

    def in_progress_nowait(self) -> bool:
        """Queue ``+WPI`` now (not terminal); ``False`` when ignored."""
        return self._publish(WPI, False)

    async def ack(self) -> None:
        """Acknowledge: processed, do not redeliver."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self._publish(ACK, True)

    async def nak(self, delay: float | None = None) -> None:
        """Negative acknowledgement: redeliver, after ``delay`` seconds if given."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self.nak_nowait(delay)

    async def term(self, reason: str | None = None) -> None:
        """Terminate: never redeliver this message (the server emits an advisory)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self.term_nowait(reason)

    async def in_progress(self) -> None:
        """Work in progress: restart the ack wait timer (not terminal, may repeat)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self.in_progress_nowait()

    async def ack_sync(self, timeout: float | None = None) -> None:
        """Acknowledge and wait until the server confirms it recorded the ack.

        Raises :class:`~headrace.errors.RequestTimeout` when no confirmation comes in time;
        the message then counts as not acked, and may be acked again.
        """
        if self._ack_none or self._acked:
            await trio.lowlevel.checkpoint()
            return
        reply = self.msg.reply
        if reply is None:
            raise NotAJetStreamMessage(f"{self!r} cannot be acknowledged: it has no reply")
        await self._conn.request(reply, ACK, timeout=timeout)
        if self._acked:
            return  # acked another way while we waited: counted once already
        self._acked = True
        if self._tracker is not None:
            self._tracker.acked()
