"""`headrace bench` wiring: the subcommands and their options exist, misuse is refused before
anything starts (no servers, no Spark)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from headrace.cli.main import build_parser
from headrace_bench import e2e

from tests.cli.cli_support import HEADRACE


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HEADRACE, "bench", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_bench_e2e_help() -> None:
    done = _run("e2e", "--help")
    assert done.returncode == 0, done.stderr
    for option in ("e2e", "--messages", "--batch", "--json", "--spark-master"):
        assert option in done.stdout


def test_bench_e2e_parses() -> None:
    args = build_parser().parse_args(
        ["bench", "e2e", "--messages", "5000", "--batch", "2000", "--spark-master", "local[2]"]
    )
    assert (args.what, args.messages, args.batch, args.spark_master) == (
        "e2e",
        5000,
        2000,
        "local[2]",
    )


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["core", "--batch", "10"], "applies to `bench e2e`, `bench scale` and `bench spark` only"),
        (["e2e", "--partitions", "2"], "--partitions applies to `bench spark` only"),
        (["spark", "--partitions", "0"], "at least 1"),
        (["spark", "--partitions", "x"], "numbers separated by commas"),
        (["pipeline", "--spark-master", "local[1]"], "applies to `bench e2e` only"),
        (["e2e", "--payload", "512"], "--payload does not apply"),
    ],
)
def test_bench_refuses_options_of_other_benchmarks(argv: list[str], complaint: str) -> None:
    done = _run(*argv)
    assert done.returncode == 2
    assert complaint in done.stderr


def test_bench_spark_parses() -> None:
    args = build_parser().parse_args(
        ["bench", "spark", "--messages", "3000", "--partitions", "4,1", "--batch", "1000"]
    )
    assert (args.what, args.messages, args.partitions, args.batch) == ("spark", 3000, (4, 1), 1000)
    args = build_parser().parse_args(["bench", "range-read", "--json"])
    assert (args.what, args.messages, args.json) == ("range-read", None, True)  # 300000 later


def test_missing_pyspark_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(e2e, "_have_module", lambda name: name != "pyspark")
    with pytest.raises(e2e.SparkUnavailable, match=r"pip install 'headrace\[spark\]'"):
        e2e.check_spark()


def test_missing_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(e2e, "_have_module", lambda name: True)
    monkeypatch.setattr(e2e, "_have_java", lambda: False)
    with pytest.raises(e2e.SparkUnavailable, match="Java"):
        e2e.check_spark("local[*]")
    e2e.check_spark("sc://localhost")  # Spark Connect: the JVM is the server's


def test_orders_are_json_of_the_announced_size() -> None:
    import json

    for i in (0, 1, 12_345, 199_999, 10**8):
        subject, body = e2e.order(i)
        assert subject.startswith("orders.")
        assert json.loads(body)["order_id"] == f"o-{i:09d}"
        assert 100 <= len(body) <= 200


def test_the_benchmarks_are_no_part_of_the_headrace_package() -> None:
    """``headrace.benchmarks`` was a deprecated alias of ``headrace_bench``: gone (issue 25)."""
    done = subprocess.run(
        [sys.executable, "-c", "import headrace.benchmarks"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "No module named 'headrace.benchmarks'" in done.stderr


@pytest.mark.slow
def test_bench_pipeline_runs_and_says_where_the_time_went() -> None:
    """A small real run: both implementations verified, with each process's CPU per 100k."""
    done = subprocess.run(
        [HEADRACE, "bench", "pipeline", "--messages", "3000", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert {line["impl"] for line in lines} == {"headrace-pipeline", "nats-py"}, done.stdout
    for line in lines:
        assert "error" not in line, line
        assert line["msgs"] == line["expected"] == 3000
        # nats-server's CPU is read in clock ticks (10 ms): a short run may show none of it
        assert line["client_cpu_s_per_100k"] > 0 and line["server_cpu_s_per_100k"] >= 0, line
