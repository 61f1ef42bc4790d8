"""``StdoutSink``: one JSON line per record on standard output (or another text stream)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from headrace.pipeline.sink import Sink
from headrace.sinks.lines import record_to_line

if TYPE_CHECKING:
    from headrace.pipeline.batch import Batch


class StdoutSink(Sink):
    """Prints each record as a line of JSON (the format of :mod:`headrace.sinks.lines`) and
    flushes before ``write_batch`` returns.

    ``stream``: where to print; ``None`` (the default) is whatever ``sys.stdout`` is at the
    time of the write. A sync sink: the pipeline runs it in a worker thread. "Durable" here
    means handed to the operating system: the records are acked once flushed.
    """

    def __init__(self, *, stream: TextIO | None = None) -> None:
        self.stream = stream

    def __repr__(self) -> str:
        return f"StdoutSink(stream={self.stream!r})"

    def write_batch(self, batch: Batch) -> None:
        out = self.stream if self.stream is not None else sys.stdout
        out.write("".join(record_to_line(record) for record in batch.records))
        out.flush()
