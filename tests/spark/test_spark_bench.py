"""`headrace bench e2e` end to end, small: every implementation (headrace with either writer,
the naive loop) writes every message once and says so (the figures are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

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
