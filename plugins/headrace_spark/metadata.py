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

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from headrace.jetstream import AckMetadata
from headrace.sinks import SeqSet
from headrace.sinks import once_per_message as shared_once_per_message

if TYPE_CHECKING:
    from headrace.pipeline import Batch, Record

#: Token positions of the v1 reply ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.
#: <consumer seq>.<timestamp>.<pending>``.
_V1_TOKENS = 9
_NUMBERS = {"num_delivered": 4, "stream_seq": 5, "consumer_seq": 6, "timestamp_ns": 7}
_PENDING = 8


class BatchMetadata:
    """The metadata columns of some records (:meth:`column`): ``stream`` (string) and the
    int64 columns ``num_delivered``, ``stream_seq``, ``consumer_seq``, ``timestamp_ns``.

    After the per-message fallback a column becomes an Arrow array only when asked for, so a
    number Spark cannot hold (past int64) fails only a batch that writes its column, as it did
    when each column was made from the messages directly.
    """

    __slots__ = ("_by_stream_cache", "_columns", "_values", "size")

    def __init__(
        self,
        columns: dict[str, pa.Array],
        size: int,
        values: Mapping[str, Sequence[Any]] | None = None,
    ) -> None:
        self._columns = columns
        self._values = values or {}
        self.size = size
        self._by_stream_cache: list[tuple[str, SeqSet]] | None = None

    @classmethod
    def of(cls, records: Sequence[Record]) -> BatchMetadata:
        msgs = [r.delivery.msg for r in records]
        columns = _bulk(msgs) if msgs else None
        if columns is not None:
            return cls(columns, len(msgs))
        metas = [m.metadata for m in msgs]  # raises NotAJetStreamMessage / InvalidAckReply
        values = dict(zip(AckMetadata._fields, zip(*metas, strict=True), strict=False))
        return cls({}, len(msgs), values)

    def column(self, name: str) -> pa.Array:
        """The column ``name`` (``stream`` or one of the numbers)."""
        column = self._columns.get(name)
        if column is None:
            kind = pa.string() if name == "stream" else pa.int64()
            column = self._columns[name] = pa.array(self._values.get(name, ()), kind)
        return column

    def ranges(self) -> list[tuple[str, int, int]]:
        """(stream, first, last) per stream, sorted by stream, like ``Batch.ranges``."""
        return [(s, seqs.intervals[0][0], seqs.intervals[-1][1]) for s, seqs in self._by_stream()]

    def sequences(self) -> dict[str, SeqSet]:
        """Each stream's sequences, for the commit ledger."""
        return dict(self._by_stream())

    def _by_stream(self) -> list[tuple[str, SeqSet]]:
        """Computed once: the sink asks for the ranges (the ledger check) and then for the
        sequences (the commit entry) of the same records."""
        if self._by_stream_cache is None:
            out: list[tuple[str, SeqSet]] = []
            if self.size:
                streams, seqs = self.column("stream"), self.column("stream_seq")
                names = pc.unique(streams).to_pylist()
                for name in sorted(names):
                    mine = seqs if len(names) == 1 else seqs.filter(pc.equal(streams, name))
                    out.append((name, _seq_set(mine)))
            self._by_stream_cache = out
        return self._by_stream_cache


def once_per_message(batch: Batch) -> tuple[list[Record], BatchMetadata, int, bool]:
    """The batch's records without those of a second delivery of a message it already holds
    (headrace.sinks.once_per_message, counted in bulk from the metadata), their
    metadata, how many were left out, and whether the batch holds redeliveries."""
    records = batch.records
    meta = BatchMetadata.of(records)
    if not records:
        return records, meta, 0, False
    redelivered = bool(pc.max(meta.column("num_delivered")).as_py() > 1)
    kept, dropped = shared_once_per_message(records, meta.sequences())
    if not dropped:
        return records, meta, 0, redelivered
    return kept, BatchMetadata.of(kept), dropped, redelivered


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
    if not pc.all(pc.ascii_is_decimal(token(_PENDING))).as_py():
        return None  # not written, but a reply the per-message parse refuses is refused here
    columns: dict[str, pa.Array] = {"stream": token(2)}
    for name, i in _NUMBERS.items():
        digits = token(i)
        if not pc.all(pc.ascii_is_decimal(digits)).as_py():
            return None  # an empty or non-digit number: the per-message parse says which
        try:
            columns[name] = pc.cast(digits, pa.int64())
        except pa.ArrowInvalid:
            return None  # past int64: the per-message path keeps it until a column needs it
    return columns
