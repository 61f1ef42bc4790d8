"""Batches: what a sink writes at once, and the policy that cuts them.

A :class:`Batch` holds records in arrival order and knows the stream sequence ranges it covers,
from which it derives a stable ``key``: a redelivered batch with the same range gets the same
key, so a sink can overwrite instead of duplicating.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from headrace._validators import positive_or_none
from headrace.pipeline.record import Record


@attrs.frozen(slots=True, kw_only=True)
class BatchPolicy:
    """When a sink's batch is cut: ``max_messages`` records, ``max_bytes`` bytes of payload, or
    ``max_age`` seconds after its first record, whichever comes first."""

    max_messages: int = attrs.field(default=1000, validator=attrs.validators.ge(1))
    max_bytes: int | None = attrs.field(default=None, validator=positive_or_none)
    max_age: float = attrs.field(default=1.0, validator=attrs.validators.gt(0))


def _stream_sequences(records: list[Record]) -> dict[str, list[int]]:
    """The stream sequences of ``records``, by stream, in record order.

    Every batch's ranges come from this (sinks ask for them on every commit): one pass gathers
    the messages' metadata, and a batch from one stream (the usual case) needs no grouping.
    """
    metas = [record.delivery.msg.metadata for record in records]
    streams = {meta.stream for meta in metas}
    if len(streams) == 1:
        return {streams.pop(): [meta.stream_seq for meta in metas]}
    by_stream: dict[str, list[int]] = {}
    for meta in metas:
        by_stream.setdefault(meta.stream, []).append(meta.stream_seq)
    return by_stream


class Batch:
    """Records for one ``write_batch`` call.

    ``skipped``: set by a sink that left records out as already committed (a redelivery of
    messages it wrote before: after a crash, a stall past ``ack_wait``, a nak): the pipeline
    counts them as ``records_skipped``, not as ``records_out``.
    """

    __slots__ = ("_ranges", "records", "sink", "skipped")

    def __init__(self, records: list[Record], sink: str = "") -> None:
        self.records = records
        self.sink = sink
        self.skipped = 0
        self._ranges: list[tuple[str, int, int]] | None = None

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __repr__(self) -> str:
        return f"<Batch {self.key} {len(self.records)} records>"

    @property
    def ranges(self) -> list[tuple[str, int, int]]:
        """(stream, first_seq, last_seq) per stream, sorted by stream name."""
        if self._ranges is None:
            self._ranges = [
                (stream, min(seqs), max(seqs))
                for stream, seqs in sorted(_stream_sequences(self.records).items())
            ]
        return self._ranges

    @property
    def key(self) -> str:
        """A stable name for the batch from its ranges: ``ORDERS-1-100`` (``+`` between
        streams)."""
        return "+".join(f"{s}-{first}-{last}" for s, first, last in self.ranges) or "empty"

    def to_arrow(self) -> Any:
        """The batch as a ``pyarrow.Table`` (needs pyarrow): the metadata columns, the original
        payload as ``data`` and ``value`` when the values are bytes or str."""
        try:
            import pyarrow as pa
        except ImportError as exc:  # pragma: no cover - depends on the extras installed
            raise RuntimeError(
                "Batch.to_arrow needs pyarrow (pip install 'headrace[spark]')"
            ) from exc
        metas = [r.delivery.msg.metadata for r in self.records]
        columns: dict[str, Any] = {
            "subject": pa.array([r.subject for r in self.records], pa.string()),
            "data": pa.array([r.data for r in self.records], pa.binary()),
            "stream": pa.array([m.stream for m in metas], pa.string()),
            "stream_seq": pa.array([m.stream_seq for m in metas], pa.uint64()),
            "consumer_seq": pa.array([m.consumer_seq for m in metas], pa.uint64()),
            "num_delivered": pa.array([m.num_delivered for m in metas], pa.uint32()),
            "timestamp": pa.array([m.timestamp_ns for m in metas], pa.timestamp("ns", "UTC")),
        }
        values = [r.value for r in self.records]
        if all(isinstance(v, bytes) for v in values):
            columns["value"] = pa.array(values, pa.binary())
        elif all(isinstance(v, str) for v in values):
            columns["value"] = pa.array(values, pa.string())
        return pa.table(columns)
