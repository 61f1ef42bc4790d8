"""examples/checkpointed_orders.py runs as documented: order 3 parked, the others billed, then
order 3 resumed after the skip."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

EXAMPLE = Path(__file__).parents[2] / "examples" / "checkpointed_orders.py"


@pytest.mark.slow  # a few seconds of timers: the full suite runs it
async def test_the_example_runs() -> None:
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, str(EXAMPLE)], capture_stdout=True, capture_stderr=True, check=False
        )
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    billed = [line.split()[-1] for line in out.splitlines() if line.startswith("  billed ")]
    assert "orders.3.paid" not in billed
    assert billed[-1] == "orders.3.shipped"  # after the skip
    for order in (1, 2, 4, 5):
        mine = [s for s in billed if s.startswith(f"orders.{order}.")]
        assert mine == [f"orders.{order}.{e}" for e in ("created", "paid", "shipped")]
    assert "billing/ledger/orders.3  failed" in out and "card declined" in out


@pytest.mark.slow  # a few seconds of timers: the full suite runs it
async def test_bench_checkpoints_runs_both_and_keeps_order() -> None:
    # A small run of `headrace bench checkpoints --json`: both implementations finish and
    # headrace reports every checkpoint at its version (else it prints an error and exits 1).
    import json

    headrace = str(Path(sys.executable).parent / "headrace")
    with trio.fail_after(120):
        done = await trio.run_process(
            [headrace, "bench", "checkpoints", "--messages", "600", "--json"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    rows = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [r["impl"] for r in rows] == ["headrace-checkpoints", "nats-py-serial"]
    assert all("error" not in r and r["msgs"] == 600 and r["peak_rss_mb"] for r in rows)
    assert rows[0]["ratio_vs_nats-py-serial"] > 0
