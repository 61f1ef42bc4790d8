"""examples/shared_csv_sink.py, the plugin example of docs/sinks.md, runs as documented: two
workers of one pipeline write one directory, the first stopped hard, every order once."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import trio

EXAMPLE = Path(__file__).parents[2] / "examples" / "shared_csv_sink.py"


@pytest.mark.slow  # a few seconds of timers: the full suite runs it
async def test_the_example_runs() -> None:
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, str(EXAMPLE)], capture_stdout=True, capture_stderr=True, check=False
        )
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    assert out.splitlines()[-1] == "every order once", out
    first = re.search(r"worker 1 committed (\d+) batches", out)
    second = re.search(r"worker 2 committed (\d+) batches", out)
    assert first is not None and second is not None, out
    assert int(first.group(1)) >= 1 and int(second.group(1)) >= 1, out
