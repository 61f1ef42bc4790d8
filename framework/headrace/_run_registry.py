"""Which pipeline runs a hard stop of :func:`headrace.run_until_signal` stops.

Every new ``PipelineRun`` registers itself here; ``run_until_signal`` (``headrace.shutdown``)
opens the registry for the code it runs. It is a module of its own, below both, because the
shutdown helper runs pipelines (it sits above ``pipeline/``) while each run must find the
helper's registry: kept in ``shutdown.py``, it made the import cycle
``pipeline.graph -> pipeline.runtime -> shutdown -> pipeline.graph``.
"""

from __future__ import annotations

import contextvars
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headrace.pipeline.runtime import PipelineRun

#: The runs started inside the current ``run_until_signal`` (``None`` outside of one).
RUNS: contextvars.ContextVar[weakref.WeakSet[PipelineRun] | None] = contextvars.ContextVar(
    "headrace_shutdown_runs", default=None
)


def track_run(run: PipelineRun) -> None:
    """Called by every new :class:`~headrace.pipeline.runtime.PipelineRun`: inside
    :func:`~headrace.shutdown.run_until_signal` (in its task or tasks started from it), the run
    is one of those a hard stop stops."""
    runs = RUNS.get()
    if runs is not None:
        runs.add(run)
