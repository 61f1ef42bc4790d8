"""`headrace bench windows`: its options and their misuse, the clicks and the check of the
windows on their own, and one small run end to end (the figures are not asserted: only that
both lines are there, verified, with their figures and the ratio)."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from datetime import UTC, datetime

import pytest
from headrace.cli.main import build_parser
from headrace.state import to_micros
from headrace_bench import windows

from tests.cli.cli_support import HEADRACE


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HEADRACE, "bench", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_bench_windows_parses() -> None:
    args = build_parser().parse_args(["bench", "windows", "--messages", "5000", "--json"])
    assert (args.what, args.messages, args.json) == ("windows", 5000, True)
    assert build_parser().parse_args(["bench", "windows"]).messages is None  # 1000000 later


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["windows", "--payload", "64"], "--payload does not apply"),
        (["windows", "--batch", "10"], "applies to `bench e2e`, `bench scale` and `bench spark`"),
        (["windows", "--workers", "2"], "applies to `bench scale` only"),
    ],
)
def test_bench_windows_refuses_misuse(argv: list[str], complaint: str) -> None:
    done = _run(*argv)
    assert done.returncode == 2
    assert complaint in done.stderr


def test_clicks_are_the_same_each_time_and_read_back_to_the_microsecond() -> None:
    first = list(windows.clicks(2000))
    assert first == list(windows.clicks(2000))
    assert len({user for user, _, _ in first}) > 500  # among 1000 users
    for user, t_us, page in first:
        assert abs(t_us - windows.BASE_US) <= 2000 * windows.SPACING_US + windows.JITTER_US
        click = json.loads(windows.click_json(user, t_us, page))
        assert (click["user"], click["page"]) == (user, page)
        # both implementations' readings of ts: headrace's and Bytewax's (a datetime)
        assert to_micros(click["ts"]) == t_us
        assert to_micros(datetime.fromtimestamp(click["ts"], tz=UTC)) == t_us
    assert windows.sentinel_us(2000) > max(t for _, t, _ in first) + 86_400_000_000 - 1
    assert windows.window_start_s(windows.BASE_US + 59_999_999) == 1_700_000_000 - 20 + 60


def test_compare_names_each_difference() -> None:
    expected = Counter({("u1", 60): 2, ("u2", 120): 1, ("u3", 0): 4})
    same = windows.compare(expected, [("u3", 0, 4), ("u1", 60, 2), ("u2", 120, 1)])
    assert same["problems"] == [] and same["windows"] == same["expected_windows"] == 3
    assert same["counted"] == same["events"] == 7
    off = windows.compare(expected, [("u1", 60, 2), ("u1", 60, 2), ("u3", 0, 3), ("u9", 0, 1)])
    assert (off["missing"], off["extra"], off["duplicates"], off["wrong_counts"]) == (1, 1, 1, 2)
    assert off["counted"] == 8
    text = "; ".join(off["problems"])
    for words in ("missing", "not expected", "more than once", "miscounted", "8 events"):
        assert words in text


def test_a_line_whose_windows_differ_fails_and_says_how() -> None:
    """No figures on a failed line, but the difference is in it (and the sentinel's window,
    which only one implementation emits, is never counted)."""
    expected = Counter({("u1", 60): 2, ("u2", 60): 1})

    def raw() -> dict[str, object]:
        return {"impl": "bytewax", "msgs": 4, "seconds": 2.0, "python_cpu_s": 1.0, "problems": []}

    emitted = [["u1", 60, 2], ["u2", 60, 1], [windows.SENTINEL, 86_400, 1]]
    good = windows._finish(raw(), 3, expected, {"windows": emitted, "late": 0})
    assert good["verified"] is True and good["msg_per_s"] == 2 and good["windows"] == 2
    assert good["python_cpu_s_per_100k"] == 25_000.0
    bad = windows._finish(raw(), 3, expected, {"windows": emitted[1:], "late": 2})
    assert bad["verified"] is False
    assert "msg_per_s" not in bad and "seconds" not in bad and "python_cpu_s" not in bad
    assert (bad["missing"], bad["counted"], bad["events"], bad["late"]) == (1, 1, 3, 2)
    assert "1 windows missing" in bad["error"] and "2 events judged late" in bad["error"]


@pytest.mark.slow  # two processes over a loaded stream: some seconds
def test_bench_windows_small_run_verifies_every_line() -> None:
    pytest.importorskip("bytewax")
    done = _run("windows", "--messages", "20000", "--json", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "MISMATCH" not in done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    by_impl = {line["impl"]: line for line in lines}
    assert set(by_impl) == {"headrace-windows", "headrace-windows-disk", "bytewax"}, done.stdout
    for impl, line in by_impl.items():
        assert line["bench"] == "windows"
        assert line["verified"] is True, (impl, line)
        assert line["msgs"] == line["expected"] == 20_001, (impl, line)
        assert line["counted"] == line["events"] == 20_000, (impl, line)
        assert line["windows"] == line["expected_windows"] >= 1000, (impl, line)
        assert line["missing"] == line["extra"] == line["duplicates"] == line["late"] == 0
        assert line["msg_per_s"] > 0 and line["peak_rss_mb"] > 0, (impl, line)
        assert line["python_cpu_s_per_100k"] > 0 and line["server_cpu_s_per_100k"] >= 0, line
    for impl, backend in (("headrace-windows", "memory"), ("headrace-windows-disk", "disk")):
        ours = by_impl[impl]
        assert ours["snapshots"] >= 1 and 0 <= ours["snapshot_share"] < 1, ours
        assert ours["ratio_vs_bytewax"] > 0 and ours["backend"] == backend
    assert by_impl["headrace-windows"]["state_file_bytes"] == 0
    assert by_impl["headrace-windows-disk"]["state_file_bytes"] > 0
    assert by_impl["bytewax"]["acked"] == "when fetched"
