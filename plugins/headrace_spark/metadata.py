"""A batch's delivery metadata as Arrow columns, parsed from the ``$JS.ACK`` replies in bulk.

Every row the sink writes carries its message's stream, sequences, delivery count and
timestamp, and the commit ledger needs each stream's sequences. Parsing each reply subject in
Python (``JsMsg.metadata``) costs about 1.7 us a message, the largest single cost left on the
end-to-end path after the protocol parser. Here the replies of a whole batch go to Arrow as one
string column and are split and converted in C.

Only the v1 form (9 tokens, the form servers send without a domain) is taken this way, and only
when every token checks out: ``$JS.ACK`` prefix, non-empty names, ASCII digits for the numbers.
Anything else (v2 replies, a malformed reply, a message without one) falls back to each
message's own parse, which accepts v2 and raises the precise error for the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from headrace.jetstream.ack_reply import AckMetadata
from headrace.sinks.output import SeqSet

if TYPE_CHECKING:
    from headrace.pipeline.record import Record

#: Token positions of the v1 reply ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.
#: <consumer seq>.<timestamp>.<pending>``.
_V1_TOKENS = 9
_NUMBERS = {"num_delivered": 4, "stream_seq": 5, "consumer_seq": 6, "timestamp_ns": 7}


class BatchMetadata:
    """The metadata columns of some records: ``stream`` (string) and the int64 columns
    ``num_delivered``, ``stream_seq``, ``consumer_seq``, ``timestamp_ns``."""

    __slots__ = ("columns", "size")

    def __init__(self, columns: dict[str, pa.Array], size: int) -> None:
        self.columns = columns
        self.size = size

    @classmethod
    def of(cls, records: Sequence[Record]) -> BatchMetadata:
        msgs = [r.delivery.msg for r in records]
        columns = _bulk(msgs) if msgs else None
        if columns is None:
            columns = _one_by_one(msgs)
        return cls(columns, len(msgs))

    def ranges(self) -> list[tuple[str, int, int]]:
        """(stream, first, last) per stream, sorted by stream, like ``Batch.ranges``."""
        return [(s, seqs.intervals[0][0], seqs.intervals[-1][1]) for s, seqs in self._by_stream()]

    def sequences(self) -> dict[str, SeqSet]:
        """Each stream's sequences, for the commit ledger."""
        return dict(self._by_stream())

    def _by_stream(self) -> list[tuple[str, SeqSet]]:
        if not self.size:
            return []
        streams, seqs = self.columns["stream"], self.columns["stream_seq"]
        names = pc.unique(streams).to_pylist()
        out: list[tuple[str, SeqSet]] = []
        for name in sorted(names):
            mine = seqs if len(names) == 1 else seqs.filter(pc.equal(streams, name))
            out.append((name, _seq_set(mine)))
        return out


def _seq_set(seqs: pa.Array) -> SeqSet:
    """A SeqSet of an int64 column: one interval without a Python loop when the sequences run
    without gaps or repeats (a batch's usual shape)."""
    bounds = pc.min_max(seqs)
    first, last = bounds["min"].as_py(), bounds["max"].as_py()
    n = len(seqs)
    if last - first == n - 1 and pc.count_distinct(seqs).as_py() == n:
        return SeqSet([(first, last)])
    return SeqSet.of(seqs.to_pylist())


def _bulk(msgs: list[Any]) -> dict[str, pa.Array] | None:
    replies = pa.array([m.msg.reply for m in msgs], pa.string())
    if replies.null_count:
        return None
    tokens = pc.split_pattern(replies, ".")
    lengths = pc.min_max(pc.list_value_length(tokens))
    if lengths["min"].as_py() != _V1_TOKENS or lengths["max"].as_py() != _V1_TOKENS:
        return None

    def token(i: int) -> pa.Array:
        return pc.list_element(tokens, i)

    if not (
        pc.all(pc.equal(token(0), "$JS")).as_py()
        and pc.all(pc.equal(token(1), "ACK")).as_py()
        and pc.min(pc.utf8_length(token(2))).as_py() > 0
        and pc.min(pc.utf8_length(token(3))).as_py() > 0
    ):
        return None
    columns: dict[str, pa.Array] = {"stream": token(2)}
    for name, i in _NUMBERS.items():
        digits = token(i)
        if not pc.all(pc.ascii_is_decimal(digits)).as_py():
            return None  # an empty or non-digit number: the per-message parse says which
        try:
            columns[name] = pc.cast(digits, pa.int64())
        except pa.ArrowInvalid:
            return None  # out of int64's range: Python's int takes it, Spark will not
    return columns


def _one_by_one(msgs: list[Any]) -> dict[str, pa.Array]:
    metas = [m.metadata for m in msgs]  # raises NotAJetStreamMessage / InvalidAckReply
    fields = dict(zip(AckMetadata._fields, zip(*metas, strict=True), strict=False))
    columns = {"stream": pa.array(fields.get("stream", ()), pa.string())}
    for name in _NUMBERS:
        columns[name] = pa.array(fields.get(name, ()), pa.int64())
    return columns
