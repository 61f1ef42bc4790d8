"""`headrace bench publish`: its options and their misuse, and one tiny run end to end (the
figures are not asserted: only that every implementation has its line, checked against what
the stream holds, and that headrace's line has its ratios)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from headrace.cli.main import build_parser

from tests.cli.cli_support import HEADRACE


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HEADRACE, "bench", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_bench_publish_parses() -> None:
    args = build_parser().parse_args(
        ["bench", "publish", "--messages", "3000", "--max-pending", "500", "--json"]
    )
    assert (args.what, args.messages, args.max_pending, args.json) == ("publish", 3000, 500, True)


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["consume", "--max-pending", "10"], "--max-pending applies to `bench publish` only"),
        (["core", "--anchors"], "--anchors applies to `bench consume` and `bench publish` only"),
    ],
)
def test_bench_publish_options_elsewhere_are_refused(argv: list[str], complaint: str) -> None:
    done = _run(*argv)
    assert done.returncode == 2
    assert complaint in done.stderr


@pytest.mark.slow  # every peer, end to end
def test_bench_publish_json_runs() -> None:
    """A tiny run: a line per implementation, each checked against the stream (no ``error``),
    or skipped with its reason (the peers need libnats-dev, node and npm's nats)."""
    done = _run("publish", "--json", "--messages", "1500", "--max-pending", "200")
    assert done.returncode == 0, done.stderr[-2000:]
    lines: list[dict[str, Any]] = [json.loads(line) for line in done.stdout.splitlines()]
    by_impl = {line["impl"]: line for line in lines}
    assert set(by_impl) == {"headrace-async", "headrace-sync", "nats-py", "libnats", "nats.js"}
    for impl in ("headrace-async", "headrace-sync", "nats-py"):
        line = by_impl[impl]
        assert "error" not in line, line
        assert line["msgs"] == line["expected"] == 1500 and line["msg_per_s"] > 0
        assert line["peak_rss_mb"] > 0 and line["payload"] == 128
    for peer in ("libnats", "nats.js"):
        assert "msg_per_s" in by_impl[peer] or by_impl[peer]["skipped"], by_impl[peer]
        assert "error" not in by_impl[peer], by_impl[peer]
    ours = by_impl["headrace-async"]
    assert ours["peak_pending"] <= 200 and ours["window"] == 200
    assert {"ratio_vs_nats-py", "ratio_vs_headrace-sync"} <= set(ours)
