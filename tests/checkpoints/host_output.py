"""The stdout of a checkpoint host process, for the tests that run hosts in their own
processes (test_worker_loop.py, test_host_faults.py): kept line by line as it comes."""

from __future__ import annotations

from collections.abc import Callable

import trio


async def read_lines(
    proc: trio.Process, into: list[str], on_lines: Callable[[], None] | None = None
) -> None:
    """Append each complete line of ``proc``'s stdout to ``into`` until it closes; call
    ``on_lines`` after each batch of them (for a test to wait on)."""
    assert proc.stdout is not None
    pending = b""
    async for chunk in proc.stdout:
        pending += chunk
        *done, pending = pending.split(b"\n")
        into.extend(line.decode() for line in done)
        if done and on_lines is not None:
            on_lines()
