"""``headrace demo`` end to end, as the README's first command runs it: its own nats-server,
its own Spark session, parquet partitioned by day, read back and checked."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import trio

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HEADRACE = str(Path(sys.executable).parent / "headrace")


async def _demo(out: Path, *extra: str) -> tuple[int, str, str]:
    with trio.fail_after(300):
        result = await trio.run_process(
            [HEADRACE, "demo", "--out", str(out), *extra],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


def _summary(stdout: str) -> dict[str, str]:
    fields = {}
    for line in stdout.splitlines():
        key, _, value = line.partition(" ")
        if key in {"published", "rows", "distinct", "missing", "duplicates"}:
            fields[key] = value.strip().split(" ")[0].replace(",", "")
    return fields


async def test_demo_runs_and_checks_its_output(tmp_path: Path) -> None:
    out = tmp_path / "headrace-demo"
    code, stdout, stderr = await _demo(out, "--messages", "3000", "--batch", "1000")
    assert code == 0, stdout + stderr
    assert _summary(stdout) == {
        "published": "3000",
        "rows": "3000",
        "distinct": "3000",
        "missing": "0",
        "duplicates": "0",
    }
    assert "OK: every order exactly once" in stdout
    # The JVM wrote once before the pipeline ran (somewhere else: the checks below see only
    # the pipeline's files), and that is said next to the figure it changes.
    assert re.search(r"Spark session on local\[\*\] in [\d.]+ s, warmed up in [\d.]+ s\n", stdout)
    assert re.search(r"Spark session start [\d.]+ s and warm-up [\d.]+ s not included", stdout)
    days = sorted(p.name for p in out.glob("day=*"))
    assert days == [f"day=2026-11-0{d}" for d in range(1, 8)]
    # The files are plain parquet: any reader sees the orders and their stream positions.
    table = pq.read_table(out, columns=["order_id", "nats_stream_seq", "nats_subject"])
    assert sorted(table.column("order_id").to_pylist()) == list(range(1, 3001))
    assert sorted(table.column("nats_stream_seq").to_pylist()) == list(range(1, 3001))
    assert set(table.column("nats_subject").to_pylist()) == {
        f"headrace.demo.orders.{r}" for r in ("eu", "us", "uk")
    }
    # The demo's pipeline shares its output the way several workers would: a manifest naming
    # the commit state (in the demo's own server, gone now), no local ledger, nothing staged.
    manifest = json.loads((out / "_headrace" / "output.json").read_bytes())
    # (the sink node is "spark-2": the source, named after its durable, took "spark")
    assert manifest["owner"] == "demo/spark-2" and manifest["bucket"] == "headrace_commits"
    assert not (out / "_headrace" / "ledger").exists()
    assert list((out / "_headrace" / "staging").iterdir()) == []

    # A second run replaces the first one's output (its own), and checks again; this time
    # Arrow's writer writes the files (--writer arrow), Spark still reads them back.
    code, stdout, stderr = await _demo(out, "--messages", "500", "--writer", "arrow")
    assert code == 0, stdout + stderr
    assert _summary(stdout)["rows"] == "500"
    assert "warm" not in stdout  # Arrow writes the files: nothing to warm up
    assert "OK: every order exactly once" in stdout
    assert sorted(pq.read_table(out, columns=["order_id"]).column(0).to_pylist()) == list(
        range(1, 501)
    )
