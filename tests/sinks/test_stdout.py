"""StdoutSink: one JSON line per record, flushed."""

from __future__ import annotations

import io
import json

import pytest
from headrace.pipeline import SinkRunner
from headrace.sinks import StdoutSink, record_to_line

from tests.sinks.sink_support import batch, rec


class Recorder(io.StringIO):
    flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


async def test_prints_one_line_per_record_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    records = [rec(1), rec(2, "plain text"), rec(3, b"\xff\x00")]
    runner = SinkRunner(StdoutSink(), "stdout")
    await runner.open()
    await runner.write_batch(batch(*records))
    await runner.close()
    out = capsys.readouterr().out
    assert out == "".join(record_to_line(r) for r in records)
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["value"] for line in lines] == [{"n": 1}, "plain text", "/wA="]
    assert lines[2]["value_encoding"] == "base64"
    assert lines[0]["timestamp"] == "2023-11-14T22:13:20.123456789Z"


def test_writes_to_a_given_stream_and_flushes() -> None:
    out = Recorder()
    sink = StdoutSink(stream=out)
    sink.write_batch(batch(rec(7, [1, 2])))
    sink.write_batch(batch())
    assert out.flushes == 2
    (line,) = out.getvalue().splitlines()
    assert json.loads(line) == {
        "stream": "ORDERS",
        "stream_seq": 7,
        "subject": "orders.new",
        "consumer": "c",
        "num_delivered": 1,
        "timestamp": "2023-11-14T22:13:20.123456789Z",
        "headers": {},
        "value": [1, 2],
    }
