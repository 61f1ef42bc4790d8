"""`headrace bench scale`: its options and their misuse, the output check and the ratios on
their own, and one small run end to end (the figures are not asserted: only that every line is
there, verified, with its ratios)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from headrace.cli.main import build_parser
from headrace_bench import scale

from tests.cli.cli_support import HEADRACE


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HEADRACE, "bench", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_bench_scale_parses() -> None:
    args = build_parser().parse_args(
        ["bench", "scale", "--workers", "1,3", "--messages", "3000", "--batch", "500"]
    )
    assert (args.what, args.workers, args.messages, args.batch) == ("scale", (1, 3), 3000, 500)
    assert build_parser().parse_args(["bench", "scale"]).workers is None  # run() defaults


@pytest.mark.parametrize(
    ("text", "counts"), [("1,2,4", (1, 2, 4)), ("2", (2,)), ("4, 1,4", (4, 1)), ("1,", (1,))]
)
def test_worker_counts(text: str, counts: tuple[int, ...]) -> None:
    assert scale.parse_workers(text) == counts


@pytest.mark.parametrize("text", ["", "0", "1,-2", "two", "1;2"])
def test_bad_worker_counts(text: str) -> None:
    with pytest.raises(ValueError, match="--workers"):
        scale.parse_workers(text)


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["scale", "--payload", "64"], "--payload does not apply"),
        (["scale", "--spark-master", "local[1]"], "applies to `bench e2e` only"),
        (["core", "--workers", "2"], "applies to `bench scale` only"),
        (["e2e", "--workers", "2"], "applies to `bench scale` only"),
        (["scale", "--workers", "0"], "at least 1"),
        (["scale", "--workers", "x"], "numbers separated by commas"),
    ],
)
def test_bench_scale_refuses_misuse(argv: list[str], complaint: str) -> None:
    done = _run(*argv)
    assert done.returncode == 2
    assert complaint in done.stderr


def _line(impl: str, workers: int, msg_per_s: int | None) -> dict[str, Any]:
    line: dict[str, Any] = {"bench": "scale", "impl": impl, "workers": workers}
    if msg_per_s is not None:
        line["msg_per_s"] = msg_per_s
    return line


def test_ratios_come_from_the_same_run() -> None:
    lines = [
        _line(scale.SINGLE, 1, 100_000),
        _line(scale.SCALE, 1, 90_000),
        _line(scale.SCALE, 2, 135_000),
        _line(scale.SCALE, 4, None),  # failed its check: no figure, no ratio
    ]
    scale._add_ratios(lines)
    single, one, two, four = lines
    assert "vs_single_writer" not in single and "vs_one_worker" not in single
    assert one["vs_single_writer"] == 0.9 and "vs_one_worker" not in one
    assert (two["vs_single_writer"], two["vs_one_worker"]) == (1.35, 1.5)
    assert "vs_single_writer" not in four and "vs_one_worker" not in four


def test_output_check_finds_missing_and_doubled_rows(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")

    def write(name: str, seqs: list[int]) -> None:
        pq.write_table(pa.table({"stream_seq": pa.array(seqs, pa.int64())}), tmp_path / name)

    write("part-a.parquet", [1, 2, 3])
    write("part-b.parquet", [4, 5])
    (tmp_path / "_headrace").mkdir()
    write("_headrace/ignored.parquet", [1])  # control files are not output
    write(".hidden.parquet", [2])
    assert scale.verify_output(tmp_path, 5)[:3] == (5, 5, [])
    rows, distinct, problems, _ = scale.verify_output(tmp_path, 6)
    assert (rows, distinct) == (5, 5)
    assert any("5 rows, not 6" in p for p in problems)
    write("part-c.parquet", [5])  # a record written twice
    rows, distinct, problems, _ = scale.verify_output(tmp_path, 6)
    assert (rows, distinct) == (6, 5)
    assert any("distinct" in p for p in problems)
    assert any("1..5, not 1..6" in p for p in problems)


@pytest.mark.slow  # a few seconds of timers: the full suite runs it
def test_bench_scale_small_run_verifies_each() -> None:
    pytest.importorskip("pyarrow")
    pytest.importorskip("headrace_spark")
    done = _run(
        "scale", "--messages", "3000", "--batch", "500", "--workers", "1,2", "--json", timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(r["impl"], r["workers"]) for r in lines] == [
        ("headrace-single-writer", 1),
        ("headrace-scale", 1),
        ("headrace-scale", 2),
    ], done.stdout
    for r in lines:
        assert r["bench"] == "scale"
        assert r["verified"] is True, r
        assert r["rows"] == r["distinct_stream_seq"] == r["expected"] == r["msgs"] == 3000
        assert r["msg_per_s"] > 0
        assert r["peak_rss_mb"] > 0
        assert len(r["worker_peak_rss_mb"]) == r["workers"]
        assert sum(r["worker_rows"]) == 3000
        assert r["batches_failed"] == 0
    single, one, two = lines
    assert single["commit_mode"] == "local" and "cas_refused" not in single
    assert "vs_single_writer" not in single
    assert one["commit_mode"] == two["commit_mode"] == "shared"
    assert one["commits"] >= 6 and one["cas_refused"] == 0  # alone, never refused
    assert two["cas_refused"] >= 0 and two["max_refusals"] >= 0
    assert one["vs_single_writer"] > 0 and "vs_one_worker" not in one
    assert two["vs_single_writer"] > 0 and two["vs_one_worker"] > 0
