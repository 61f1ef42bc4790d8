"""The stdout of a checkpoint host process, for the tests that run hosts in their own
processes (test_worker_loop.py, test_host_faults.py): kept line by line as it comes."""

from __future__ import annotations

import trio


async def read_lines(proc: trio.Process, into: list[str]) -> None:
    """Append each complete line of ``proc``'s stdout to ``into`` until it closes."""
    assert proc.stdout is not None
    pending = b""
    async for chunk in proc.stdout:
        pending += chunk
        *done, pending = pending.split(b"\n")
        into.extend(line.decode() for line in done)
