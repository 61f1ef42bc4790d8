"""``python -m headrace_bench.state_memory``: the memory an open window costs in each backend.

One process per backend (``resource.getrusage`` peak RSS is per process): a window operator
(tumbling, one hour, ``count()``) takes N records of N distinct keys, so N windows are open at
once, and nothing fires. The line reports the process's peak RSS before and after, and for the
disk backend the size of its SQLite file. No server: what is measured is the operator's state
alone, which `bench windows` cannot show apart (its peak is at the end, when every window has
fired into results the sink keeps for checking, the same in both backends).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time


def _peak_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _child(backend: str, n: int) -> dict[str, object]:
    from headrace.state import DiskWindowOperator, StateFile, TumblingWindow, WindowOperator, count

    before = _peak_mb()
    file = None
    if backend == "disk":
        file = StateFile(directory=tempfile.gettempdir())
        op: WindowOperator = DiskWindowOperator(TumblingWindow(3600), count(), 30, file=file)
    else:
        op = WindowOperator(TumblingWindow(3600), count(), 30)
    base = 1_700_000_000_000_000
    started = time.perf_counter()
    for i in range(n):
        op.add(f"u{i}", base + i, None)
        if file is not None and i % 1000 == 999:
            file.commit()
    seconds = time.perf_counter() - started
    result = {
        "backend": backend,
        "windows": op.open_windows,
        "peak_rss_mb_before": before,
        "peak_rss_mb": _peak_mb(),
        "records_per_s": round(n / seconds),
        "file_mb": round(file.size() / 1e6, 1) if file is not None else 0,
    }
    if file is not None:
        file.close()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m headrace_bench.state_memory")
    parser.add_argument("--windows", type=int, default=1_000_000)
    parser.add_argument("--child", choices=["memory", "disk"])
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.windows)))
        return
    for backend in ("memory", "disk"):
        cmd = [sys.executable, "-m", "headrace_bench.state_memory", "--child", backend]
        done = subprocess.run(
            [*cmd, "--windows", str(args.windows)], capture_output=True, text=True, check=True
        )
        print(done.stdout.strip())


if __name__ == "__main__":
    main()
