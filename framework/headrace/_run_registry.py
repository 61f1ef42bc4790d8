"""Which pipeline runs a hard stop of :func:`headrace.run_until_signal` stops.

Every new ``PipelineRun`` registers itself here; ``run_until_signal`` (``headrace.shutdown``)
opens the registry for the code it runs. It is a module of its own, below both, because the
shutdown helper runs pipelines (it sits above ``pipeline/``) while each run must find the
helper's registry: kept in ``shutdown.py``, it made the import cycle
``pipeline.graph -> pipeline.runtime -> shutdown -> pipeline.graph``.

Level 0, it imports nothing of ``pipeline/``, not even for types: a run is what
:class:`TrackedRun` says, what a hard stop needs of it.
"""

from __future__ import annotations

import contextvars
import weakref
from typing import Any, Protocol


class TrackedRun(Protocol):
    """What a hard stop needs of a pipeline run (``PipelineRun``): to stop it now, and to learn
    afterwards whether its drain timed out."""

    @property
    def drain_timed_out(self) -> bool: ...

    def stop(self) -> None: ...


#: The runs started inside the current ``run_until_signal`` (``None`` outside of one). The set
#: is the opener's, typed there (``shutdown.py`` keeps ``PipelineRun``s); here, runs are only
#: added to it, as :class:`TrackedRun`.
RUNS: contextvars.ContextVar[weakref.WeakSet[Any] | None] = contextvars.ContextVar(
    "headrace_shutdown_runs", default=None
)


def track_run(run: TrackedRun) -> None:
    """Called by every new :class:`~headrace.pipeline.runtime.PipelineRun`: inside
    :func:`~headrace.shutdown.run_until_signal` (in its task or tasks started from it), the run
    is one of those a hard stop stops."""
    runs = RUNS.get()
    if runs is not None:
        runs.add(run)
