"""Offsets and partitions of the ``jetstream`` source: what Spark checkpoints, and how a range
of a stream is cut into tasks.

A JetStream stream is an append-only log whose messages are numbered by the stream sequence,
so the source's offset is one number, the last sequence a micro-batch includes, together with
the stream it counts in: the stream's name and its identity (its creation time). A stream
deleted and created again under the same name numbers from 1 again; the identity is how a
restarted query notices that its checkpoint belongs to another stream.

A micro-batch reads the sequences after its start offset up to its end offset. The range is
cut into :class:`SequenceRange` partitions of about equal numbers of sequences, each read by
one Spark task. With subject filters a range holds fewer messages than sequences; the cut is
still by sequence, which is all the driver knows without reading.
"""

from __future__ import annotations

import math
from typing import Any

from pyspark.sql.datasource import InputPartition

from headrace_spark.errors import JetStreamFormatError

#: The offset's version: a reader refuses offsets of a version it does not know.
OFFSET_VERSION = 1


class StreamOffset:
    """The last stream sequence a batch includes (0: none yet), in stream ``stream`` created at
    ``created`` (ISO 8601, as :class:`headrace.commits.StreamIdentity` writes it).

    ``parts``: in a batch's end offset, how many partitions its range is cut into, fixed when
    the batch is planned. A batch run again after a restart is cut the same way, so its rows
    come in the same partitions and order (the jetstream sink's message ids name them), even
    when the stream's average message size, which ``partitionBytes`` divides, changed since.
    Absent from offsets written before it (those are planned as they were)."""

    __slots__ = ("created", "parts", "seq", "stream")

    def __init__(self, stream: str, created: str, seq: int, parts: int | None = None) -> None:
        self.stream = stream
        self.created = created
        self.seq = seq
        self.parts = parts

    def to_dict(self) -> dict[str, Any]:
        value: dict[str, Any] = {
            "v": OFFSET_VERSION,
            "stream": self.stream,
            "created": self.created,
            "seq": self.seq,
        }
        if self.parts is not None:
            value["parts"] = self.parts
        return value

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> StreamOffset:
        try:
            version = value.get("v", OFFSET_VERSION)
            if version != OFFSET_VERSION:
                raise JetStreamFormatError(
                    f"a jetstream offset of version {version} (this headrace_spark reads "
                    f"version {OFFSET_VERSION}): {value!r}"
                )
            parts = value.get("parts")
            return cls(
                str(value["stream"]),
                str(value["created"]),
                int(value["seq"]),
                None if parts is None else int(parts),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise JetStreamFormatError(f"not a jetstream offset: {value!r}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StreamOffset) and (
            (self.stream, self.created, self.seq) == (other.stream, other.created, other.seq)
        )

    def __hash__(self) -> int:
        return hash((self.stream, self.created, self.seq))

    def __repr__(self) -> str:
        return f"StreamOffset({self.stream!r}, {self.created!r}, {self.seq})"


class SequenceRange(InputPartition):
    """Sequences ``first`` to ``last`` (both included) of stream ``stream`` created at
    ``created``: one Spark task's share of a batch. Picklable, as Spark requires."""

    def __init__(self, index: int, stream: str, created: str, first: int, last: int) -> None:
        super().__init__(index)
        self.index = index
        self.stream = stream
        self.created = created
        self.first = first
        self.last = last

    def __repr__(self) -> str:
        return f"SequenceRange({self.index}, {self.stream!r}, {self.first}-{self.last})"


def split_range(first: int, last: int, parts: int) -> list[tuple[int, int]]:
    """``first``..``last`` (inclusive) in ``parts`` consecutive ranges of about equal size, none
    empty (fewer ranges than ``parts`` when there are fewer sequences)."""
    count = last - first + 1
    if count <= 0:
        return []
    parts = max(1, min(parts, count))
    size, extra = divmod(count, parts)
    ranges = []
    start = first
    for i in range(parts):
        end = start + size - 1 + (1 if i < extra else 0)
        ranges.append((start, end))
        start = end + 1
    return ranges


def partition_count(
    sequences: int, avg_message_bytes: float, *, num_partitions: int | None, partition_bytes: int
) -> int:
    """How many tasks read ``sequences`` messages: ``numPartitions`` if set, else one task per
    ``partitionBytes`` of the stream's average message size (at least one)."""
    if num_partitions is not None:
        return num_partitions
    estimate = sequences * max(avg_message_bytes, 1.0)
    return max(1, math.ceil(estimate / partition_bytes))


def plan(
    stream: str,
    created: str,
    start: int,
    end: int,
    *,
    avg_message_bytes: float,
    num_partitions: int | None,
    partition_bytes: int,
) -> list[SequenceRange]:
    """The partitions reading sequences ``start + 1`` to ``end``."""
    first, last = start + 1, end
    count = partition_count(
        last - first + 1,
        avg_message_bytes,
        num_partitions=num_partitions,
        partition_bytes=partition_bytes,
    )
    return [
        SequenceRange(i, stream, created, a, b)
        for i, (a, b) in enumerate(split_range(first, last, count))
    ]
