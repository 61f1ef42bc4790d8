"""Records, batches and output readers for the sink tests (no server needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headrace.jetstream.message import JsMsg
from headrace.pipeline.batch import Batch
from headrace.pipeline.record import Delivery, Record
from headrace.protocol.events import Msg
from headrace.protocol.headers import Headers

_DEFAULT: Any = object()
TS = 1_700_000_000_123_456_789  # 2023-11-14T22:13:20.123456789Z


def rec(
    seq: int,
    value: Any = _DEFAULT,
    *,
    stream: str = "ORDERS",
    subject: str = "orders.new",
    delivered: int = 1,
    headers: Headers | None = None,
    ts: int = TS,
) -> Record:
    """A record of message ``stream``#``seq``; its value defaults to ``{"n": seq}``."""
    reply = f"$JS.ACK.{stream}.c.{delivered}.{seq}.{seq}.{ts}.0"
    raw = headers.encode() if headers is not None else None
    data = json.dumps({"n": seq}).encode()
    msg = Msg(subject, 1, reply, data, raw)
    delivery = Delivery(JsMsg(msg, conn=None), 0.0, "src")  # type: ignore[arg-type]
    return Record({"n": seq} if value is _DEFAULT else value, delivery)


def batch(*records: Record) -> Batch:
    return Batch(list(records), sink="test")


def seqs(*numbers: int, stream: str = "ORDERS", delivered: int = 1) -> Batch:
    """A batch of records for ``numbers`` of ``stream``."""
    return batch(*(rec(n, stream=stream, delivered=delivered) for n in numbers))


def read_output(directory: Path) -> dict[str, list[dict[str, Any]]]:
    """The parsed lines of every output file, by file name."""
    return {
        p.name: [json.loads(line) for line in p.read_text("utf-8").splitlines()]
        for p in sorted(directory.glob("*.jsonl"))
    }


def committed_keys(directory: Path) -> list[tuple[str, int]]:
    """(stream, stream_seq) of every line in the output, sorted, duplicates kept."""
    return sorted(
        (line["stream"], line["stream_seq"])
        for lines in read_output(directory).values()
        for line in lines
    )
