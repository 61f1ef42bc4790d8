"""JsonlSink: file per batch, durable writes, line format, and no duplicates across
redeliveries, differently cut batches and restarts."""

from __future__ import annotations

import base64
import itertools
import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from headrace.pipeline import SinkError, SinkNotOpen, SinkRunner
from headrace.pipeline.record import Record
from headrace.protocol.headers import Headers
from headrace.sinks import (
    CorruptOutput,
    JsonlSink,
    OutputInUse,
    UnserialisableValue,
    decode_value,
)
from headrace.sinks.jsonl import SeqSet
from hypothesis import given
from hypothesis import strategies as st

from tests.sinks.sink_support import batch, committed_keys, read_output, rec, seqs


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "out"


@pytest.fixture
def sink(out: Path) -> Iterator[JsonlSink]:
    s = JsonlSink(out)
    s.open()
    yield s
    s.close()


def keys(*numbers: int, stream: str = "ORDERS") -> list[tuple[str, int]]:
    return [(stream, n) for n in numbers]


# -- files and format ------------------------------------------------------------------------


def test_one_file_per_batch_named_by_its_key(sink: JsonlSink, out: Path) -> None:
    sink.write_batch(seqs(1, 2, 3))
    sink.write_batch(batch(rec(5, stream="B"), rec(1, stream="A"), rec(2, stream="A")))
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "A-1-2+B-5-5.jsonl",
        "ORDERS-1-3.jsonl",
    ]
    assert [(x["stream"], x["stream_seq"]) for x in read_output(out)["A-1-2+B-5-5.jsonl"]] == [
        ("A", 1),
        ("A", 2),
        ("B", 5),
    ]
    assert sink.files_written == 2


def test_empty_batch_writes_nothing(sink: JsonlSink, out: Path) -> None:
    sink.write_batch(batch())
    assert read_output(out) == {}


def test_line_format(sink: JsonlSink, out: Path) -> None:
    headers = Headers([("Trace", "a"), ("Trace", "b"), ("Nats-Msg-Id", "m1")])
    sink.write_batch(batch(rec(42, {"id": 7, "tags": ["x"]}, headers=headers, delivered=3)))
    raw = (out / "ORDERS-42-42.jsonl").read_bytes()
    assert raw == (
        b'{"stream":"ORDERS","stream_seq":42,"subject":"orders.new","consumer":"c",'
        b'"num_delivered":3,"timestamp":"2023-11-14T22:13:20.123456789Z",'
        b'"headers":{"Trace":["a","b"],"Nats-Msg-Id":["m1"]},"value":{"id":7,"tags":["x"]}}\n'
    )


@pytest.mark.parametrize(
    ("value", "stored", "encoding"),
    [
        ({"a": {"b": [1, 2.5, None, True]}}, {"a": {"b": [1, 2.5, None, True]}}, None),
        ("naïve ☃", "naïve ☃", None),
        (17, 17, None),
        (None, None, None),
        (b'{"raw": "json"}', '{"raw": "json"}', None),
        ("caf\u00e9".encode(), "café", None),
        (b"\xff\xfe\x00binary", base64.b64encode(b"\xff\xfe\x00binary").decode(), "base64"),
        (bytearray(b"\x80"), "gA==", "base64"),
        (memoryview(b"mv"), "mv", None),
    ],
)
def test_values(sink: JsonlSink, out: Path, value: Any, stored: Any, encoding: str | None) -> None:
    sink.write_batch(batch(rec(1, value)))
    line = read_output(out)["ORDERS-1-1.jsonl"][0]
    assert line["value"] == stored
    assert line.get("value_encoding") == encoding
    if encoding == "base64":
        assert decode_value(line) == bytes(value)


def test_lone_surrogate_is_escaped(sink: JsonlSink, out: Path) -> None:
    sink.write_batch(batch(rec(1, "bad \udcff here")))
    raw = (out / "ORDERS-1-1.jsonl").read_bytes()
    assert b"\\udcff" in raw
    assert json.loads(raw)["value"] == "bad \udcff here"


@pytest.mark.parametrize("value", [{1, 2}, float("nan"), {"when": object()}])
def test_unserialisable_value_fails_the_batch(sink: JsonlSink, out: Path, value: Any) -> None:
    with pytest.raises(UnserialisableValue, match=r"ORDERS#2") as info:
        sink.write_batch(batch(rec(1), rec(2, value)))
    assert isinstance(info.value, TypeError)
    assert read_output(out) == {}
    assert [p.name for p in out.iterdir()] == [".headrace-jsonl.lock"]
    sink.write_batch(seqs(1, 2))  # nothing counted as committed
    assert committed_keys(out) == keys(1, 2)


# -- durability ------------------------------------------------------------------------------


def test_durable_before_write_batch_returns(
    sink: JsonlSink, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, Any]] = []
    real_fsync, real_replace = os.fsync, os.replace
    final = out / "ORDERS-1-2.jsonl"

    def fsync(fd: int) -> None:
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        events.append(("fsync-dir" if is_dir else "fsync-file", final.exists()))
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        temp = Path(src)
        assert temp.parent == out and temp.name.startswith(".") and temp.read_bytes()
        events.append(("replace", Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    sink.write_batch(seqs(1, 2))
    assert events == [
        ("fsync-file", False),
        ("replace", "ORDERS-1-2.jsonl"),
        ("fsync-dir", True),
    ]
    assert sorted(p.name for p in out.iterdir()) == [".headrace-jsonl.lock", final.name]


def test_without_fsync(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", calls.append)
    sink = JsonlSink(out, fsync=False)
    sink.open()
    sink.write_batch(seqs(1, 2))
    sink.close()
    assert calls == []
    assert committed_keys(out) == keys(1, 2)


def test_failed_write_leaves_no_temp_file(
    sink: JsonlSink, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space"):
        sink.write_batch(seqs(1, 2))
    monkeypatch.undo()
    assert [p.name for p in out.iterdir()] == [".headrace-jsonl.lock"]
    sink.write_batch(seqs(1, 2))  # not counted as committed: written now
    assert committed_keys(out) == keys(1, 2)


def test_failed_directory_fsync_stops_the_sink_until_reopened(
    sink: JsonlSink, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output"):
        sink.write_batch(seqs(1, 2))
    with pytest.raises(SinkError, match="earlier fsync of the directory failed"):
        sink.write_batch(seqs(3))
    monkeypatch.undo()
    sink.close()
    sink.open()
    sink.write_batch(seqs(1, 2, 3))  # 1 and 2 are in the renamed file: not again
    assert committed_keys(out) == keys(1, 2, 3)


async def test_runs_in_a_worker_thread(out: Path) -> None:
    threads: list[int] = []

    class Watched(JsonlSink):
        def write_batch(self, b: Any) -> None:
            threads.append(threading.get_ident())
            super().write_batch(b)

    runner = SinkRunner(Watched(out), "jsonl")
    await runner.open()
    await runner.write_batch(seqs(1, 2))
    await runner.close()
    assert threads and threads[0] != threading.get_ident()
    assert committed_keys(out) == keys(1, 2)


# -- idempotence -----------------------------------------------------------------------------


def test_same_batch_redelivered_overwrites_its_file(sink: JsonlSink, out: Path) -> None:
    sink.write_batch(seqs(1, 2, 3))
    sink.write_batch(seqs(1, 2, 3, delivered=2))
    output = read_output(out)
    assert list(output) == ["ORDERS-1-3.jsonl"]
    assert [line["num_delivered"] for line in output["ORDERS-1-3.jsonl"]] == [2, 2, 2]
    assert sink.duplicates_skipped == 0 and sink.files_written == 2


def test_redelivery_cut_differently_skips_duplicates(sink: JsonlSink, out: Path) -> None:
    sink.write_batch(seqs(1, 2, 3))
    sink.write_batch(seqs(2, 3, 4, 5, delivered=2))
    assert sink.duplicates_skipped == 2
    sink.write_batch(seqs(*range(1, 11), delivered=3))
    assert sink.duplicates_skipped == 7
    assert committed_keys(out) == keys(*range(1, 11))
    assert {name: [x["stream_seq"] for x in lines] for name, lines in read_output(out).items()} == {
        "ORDERS-1-3.jsonl": [1, 2, 3],
        "ORDERS-2-5.jsonl": [4, 5],
        "ORDERS-1-10.jsonl": [6, 7, 8, 9, 10],
    }


def test_two_deliveries_of_a_message_in_one_batch_are_written_once(
    sink: JsonlSink, out: Path
) -> None:
    # Issue 23: a stall past ack_wait mid-batch let the redelivery of 2 join the batch that
    # held its first delivery; both lines were written.
    sink.write_batch(batch(rec(1), rec(2), rec(3), rec(2, delivered=2), rec(4)))
    [lines] = read_output(out).values()
    written = [(x["stream_seq"], x["num_delivered"]) for x in lines]
    assert written == [(1, 1), (2, 1), (3, 1), (4, 1)]
    assert sink.duplicates_skipped == 1


def test_batch_of_committed_records_writes_nothing(sink: JsonlSink, out: Path) -> None:
    sink.write_batch(seqs(1, 2))
    sink.write_batch(seqs(3, 4))
    sink.write_batch(seqs(2, 3, delivered=2))
    assert sorted(read_output(out)) == ["ORDERS-1-2.jsonl", "ORDERS-3-4.jsonl"]
    assert sink.duplicates_skipped == 2 and sink.files_written == 2


def test_sequence_inside_a_files_range_but_not_in_it_is_written(sink: JsonlSink, out: Path) -> None:
    sink.write_batch(seqs(1, 2, 4, 5))  # 3 failed in an operator
    sink.write_batch(seqs(3, 6, delivered=2))  # 3 redelivered with 6
    assert committed_keys(out) == keys(1, 2, 3, 4, 5, 6)
    assert [x["stream_seq"] for x in read_output(out)["ORDERS-3-6.jsonl"]] == [3, 6]


def test_rewrite_leaves_out_records_committed_elsewhere(sink: JsonlSink, out: Path) -> None:
    sink.write_batch(seqs(1, 2, 4, 5))  # ORDERS-1-5, without 3
    sink.write_batch(seqs(3))  # ORDERS-3-3
    sink.write_batch(seqs(1, 2, 3, 4, 5, delivered=2))  # same key as the first: a rewrite
    output = read_output(out)
    assert [x["stream_seq"] for x in output["ORDERS-1-5.jsonl"]] == [1, 2, 4, 5]
    assert [x["num_delivered"] for x in output["ORDERS-1-5.jsonl"]] == [2, 2, 2, 2]
    assert committed_keys(out) == keys(1, 2, 3, 4, 5)


def test_rewrite_keeps_records_the_new_batch_lacks(sink: JsonlSink, out: Path) -> None:
    sink.write_batch(seqs(1, 2, 3, 4, 5))
    sink.write_batch(seqs(1, 5, delivered=2))  # 2..4 filtered or failed this time
    lines = read_output(out)["ORDERS-1-5.jsonl"]
    assert [(x["stream_seq"], x["num_delivered"]) for x in lines] == [
        (1, 2),
        (2, 1),
        (3, 1),
        (4, 1),
        (5, 2),
    ]


def test_streams_are_kept_apart(sink: JsonlSink, out: Path) -> None:
    sink.write_batch(seqs(1, 2, stream="A"))
    sink.write_batch(batch(rec(1, stream="B"), rec(2, stream="A"), rec(2, stream="B")))
    assert committed_keys(out) == [("A", 1), ("A", 2), ("B", 1), ("B", 2)]
    assert [(x["stream"], x["stream_seq"]) for x in read_output(out)["A-2-2+B-1-2.jsonl"]] == [
        ("B", 1),
        ("B", 2),
    ]


def test_records_of_one_message_are_written_together(sink: JsonlSink, out: Path) -> None:
    # A flat_map gave two records of message 2 (one delivery): both go in, once.
    a = rec(2, "a")
    again = rec(2, "a", delivered=2)
    sink.write_batch(batch(rec(1), a, Record("b", a.delivery), rec(3)))
    sink.write_batch(batch(again, Record("b", again.delivery), rec(4)))
    assert committed_keys(out) == keys(1, 2, 2, 3, 4)
    assert sink.duplicates_skipped == 2
    values = [x["value"] for x in read_output(out)["ORDERS-1-3.jsonl"]]
    assert values == [{"n": 1}, "a", "b", {"n": 3}]


# -- open: stale files, restarts, locking -----------------------------------------------------


def test_open_removes_stale_temp_files_only(out: Path) -> None:
    out.mkdir()
    stale = out / ".headrace-ORDERS-1-3.jsonl.0badf00d.tmp"
    stale.write_bytes(b'{"stream":"ORDERS","stream_seq":1')
    other = out / "notes.txt"
    other.write_text("keep me")
    sink = JsonlSink(out)
    sink.open()
    assert not stale.exists() and other.exists()
    sink.write_batch(seqs(1, 2, 3))  # the temp file's record did not count as committed
    sink.close()
    assert committed_keys(out) == keys(1, 2, 3)


def test_restart_keeps_the_guarantee(out: Path) -> None:
    first = JsonlSink(out)
    first.open()
    first.write_batch(seqs(1, 2, 4, 5))
    first.write_batch(seqs(6, 7))
    # A crash: the last batch was being written when the process died.
    (out / ".headrace-ORDERS-8-9.jsonl.12345678.tmp").write_bytes(b"partial")
    first.close()  # (the process's death would release the lock the same way)

    second = JsonlSink(out)
    second.open()
    assert not (out / ".headrace-ORDERS-8-9.jsonl.12345678.tmp").exists()
    second.write_batch(seqs(3, 4, 5, 6, 7, 8, delivered=2))  # redelivered, cut differently
    second.write_batch(seqs(8, 9, delivered=2))
    second.close()
    assert committed_keys(out) == keys(*range(1, 10))
    assert [x["stream_seq"] for x in read_output(out)["ORDERS-3-8.jsonl"]] == [3, 8]
    assert [x["stream_seq"] for x in read_output(out)["ORDERS-8-9.jsonl"]] == [9]


def test_restart_after_the_process_died(out: Path) -> None:
    # A real crash: the process dies holding the lock, its last batch half written.
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from headrace.sinks import JsonlSink
        from tests.sinks.sink_support import seqs
        sink = JsonlSink({str(out)!r})
        sink.open()
        sink.write_batch(seqs(1, 2, 3))
        os.replace = lambda src, dst: os._exit(3)  # dies between the fsync and the rename
        sink.write_batch(seqs(4, 5))
        """
    )
    died = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert died.returncode == 3, died.stderr.decode()
    assert len(list(out.glob(".headrace-*.tmp"))) == 1

    sink = JsonlSink(out)
    sink.open()
    assert list(out.glob(".headrace-*.tmp")) == []
    sink.write_batch(seqs(2, 3, 4, 5, delivered=2))
    sink.close()
    assert committed_keys(out) == keys(1, 2, 3, 4, 5)


def test_directory_is_created(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "a" / "b")
    sink.open()
    sink.write_batch(seqs(1))
    sink.close()
    assert committed_keys(tmp_path / "a" / "b") == keys(1)


def test_one_sink_per_directory(sink: JsonlSink, out: Path) -> None:
    other = JsonlSink(out)
    with pytest.raises(OutputInUse, match="in use by another JsonlSink"):
        other.open()
    sink.close()
    other.open()
    other.close()


def test_write_needs_open(out: Path) -> None:
    sink = JsonlSink(out)
    with pytest.raises(SinkNotOpen):
        sink.write_batch(seqs(1))
    sink.open()
    sink.close()
    with pytest.raises(SinkNotOpen):
        sink.write_batch(seqs(1))


def test_open_twice_reopens(sink: JsonlSink, out: Path) -> None:
    sink.write_batch(seqs(1))
    sink.open()
    sink.write_batch(seqs(1, 2))
    assert committed_keys(out) == keys(1, 2)


@pytest.mark.parametrize(
    ("content", "line", "reason"),
    [
        (b'{"stream":"ORDERS","stream_seq":1}\n{"stream":"ORD', 2, "incomplete line"),
        (b"not json\n", 1, "not JSON"),
        (b'{"stream":"ORDERS"}\n', 1, "no 'stream' string"),
        (b"[1, 2]\n", 1, "no 'stream' string"),
        (b'{"stream":"ORDERS","stream_seq":true}\n', 1, "no 'stream' string"),
    ],
)
def test_unreadable_output_stops_open(out: Path, content: bytes, line: int, reason: str) -> None:
    out.mkdir()
    (out / "ORDERS-1-2.jsonl").write_bytes(content)
    sink = JsonlSink(out)
    with pytest.raises(CorruptOutput, match=reason) as info:
        sink.open()
    assert info.value.line == line and info.value.path.endswith("ORDERS-1-2.jsonl")
    other = JsonlSink(out)  # the lock was released: once repaired, the output opens
    (out / "ORDERS-1-2.jsonl").unlink()
    other.open()
    other.close()


def test_batch_key_that_cannot_name_a_file(sink: JsonlSink) -> None:
    with pytest.raises(SinkError, match="cannot name a file"):
        sink.write_batch(batch(rec(1, stream="a/b")))


# -- the committed set ------------------------------------------------------------------------


@given(st.lists(st.integers(min_value=0, max_value=60)))
def test_seqset_is_a_set(numbers: list[int]) -> None:
    s = SeqSet()
    for n in numbers:
        s.add(n)
    expected = set(numbers)
    assert len(s) == len(expected)
    assert all((n in s) == (n in expected) for n in range(-1, 62))
    intervals = s.intervals
    assert all(a <= b for a, b in intervals)
    assert all(b + 1 < c for (_, b), (c, _) in itertools.pairwise(intervals))


def test_seqset_contiguous_run_is_one_interval() -> None:
    s = SeqSet()
    for n in [5, 3, 4, 1, 2, *range(6, 10_000)]:
        s.add(n)
    assert s.intervals == [(1, 9_999)]
    assert "5" not in s
