"""How ``headrace run`` ends: its exit codes, and the two ways of saying so.

Shared by ``run.py`` (one process) and ``workers.py`` (the supervisor of ``--workers N``). A
module of its own so that the supervisor does not import ``run.py``, which starts it: that was
an import cycle (issue 12).
"""

from __future__ import annotations

import os
import sys

from headrace.cli import jsonlogs

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DRAIN_INCOMPLETE = 3
EXIT_POISON_TERMINATED = 4
#: ``--until-caught-up --timeout``: not caught up in time (drained and stopped).
EXIT_TIMED_OUT = 5

#: After a second signal, how long the hard stop may take before the process just exits.
HARD_STOP_GRACE = 2.0


def fail(message: str, code: int = EXIT_USAGE) -> int:
    """Say why the run ends (``headrace run: ...``; an ``exit_reason`` event with
    ``--json-logs``) and return ``code``."""
    jsonlogs.say("headrace run", message, exit_code=code)
    return code


def exit_now(code: int) -> None:
    """Flush what was printed and end the process at once, without unwinding."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError):
            pass  # RuntimeError: a signal handler interrupted a write to the same stream
    os._exit(code)
