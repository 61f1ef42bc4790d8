"""`headrace bench e2e` end to end, small: every implementation (headrace with either writer,
the naive loop) writes every message once and says so (the figures are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.spark_children]

HEADRACE = str(Path(sys.executable).parent / "headrace")


def test_bench_e2e_small_run_verifies_each() -> None:
    done = subprocess.run(
        [HEADRACE, "bench", "e2e", "--messages", "2000", "--batch", "1000", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    by_impl = {line["impl"]: line for line in lines}
    assert set(by_impl) == {"headrace-e2e", "headrace-e2e-arrow", "naive"}, done.stdout
    for impl, line in by_impl.items():
        assert line["verified"] is True, (impl, line)
        assert line["rows"] == line["distinct_stream_seq"] == line["expected"] == 2000
        assert line["msg_per_s"] > 0
        assert line["peak_rss_mb"] > 0
        # where the time went, process by process (the Python process always uses some)
        assert line["python_cpu_s_per_100k"] > 0, line
        assert {"jvm_cpu_s_per_100k", "server_cpu_s_per_100k"} <= set(line), line
    assert by_impl["headrace-e2e"]["ratio_vs_naive"] > 0
    assert by_impl["headrace-e2e-arrow"]["ratio_vs_naive"] > 0


def test_bench_spark_small_run_reads_every_message_once() -> None:
    """`headrace bench spark`: the jetstream source (a streaming query per --partitions value),
    the batch read (the source's default partitions and 2), the pipeline into SparkSink and the
    naive loop each write every message once, with CPU per process, peak RSS and the ratios."""
    done = subprocess.run(
        [HEADRACE, "bench", "spark", "--messages", "2000", "--partitions", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "MISMATCH" not in done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    by_line = {(line["impl"], line["partitions"]): line for line in lines}
    assert set(by_line) == {
        ("headrace-spark-source", 2),
        ("headrace-spark-batch-read", None),
        ("headrace-spark-batch-read", 2),
        ("headrace-sparksink", None),
        ("naive", None),
    }, done.stdout
    for key, line in by_line.items():
        assert line["verified"] is True, (key, line)
        assert line["rows"] == line["distinct_seq"] == line["expected"] == 2000, (key, line)
        assert line["msg_per_s"] > 0 and line["peak_rss_mb"] > 0, (key, line)
        assert line["jvm_peak_rss_mb"] > 0 and line["tree_peak_mb"] > 0, (key, line)
        # CPU on the clock, process by process (the driver and its JVM always use some)
        assert line["python_cpu_s_per_100k"] > 0 and line["jvm_cpu_s_per_100k"] > 0, line
        assert line["workers_cpu_s_per_100k"] >= 0 and line["server_cpu_s_per_100k"] >= 0, line
    for partitions in (2,):
        source = by_line[("headrace-spark-source", partitions)]
        assert source["input_rows"] == 2000 and source["micro_batches"] == 1, source
        assert source["planned_partitions"] == partitions
        # the source's reads run in Spark's Python workers
        assert source["workers_cpu_s_per_100k"] > 0, source
    assert by_line[("headrace-spark-batch-read", 2)]["planned_partitions"] == 2
    assert by_line[("headrace-spark-batch-read", None)]["planned_partitions"] >= 1
    for key, line in by_line.items():
        if key[0] in ("headrace-spark-source", "headrace-spark-batch-read"):
            assert line["ratio_vs_sparksink"] > 0 and line["ratio_vs_naive"] > 0, line
    assert by_line[("headrace-sparksink", None)]["ratio_vs_naive"] > 0
