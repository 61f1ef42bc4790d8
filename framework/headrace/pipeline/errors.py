"""The pipeline's own error base, in a module of its own.

It sits below everything else in ``pipeline/`` so that the ack tracker and the publish guard can
raise pipeline errors without importing the graph (``graph.py`` runs pipelines, so it imports
the runtime, which imports them: an import cycle). ``headrace.pipeline.graph.PipelineError`` is
the same class.
"""

from __future__ import annotations

from headrace.errors import HeadraceError


class PipelineError(HeadraceError, ValueError):
    """A pipeline graph that cannot run; the message names the node."""


class PipelineEnded(HeadraceError):
    """The run finished (drained, stopped or failed) before a call on its sources could reach
    them: a :meth:`PipelineRun.pause` or ``resume`` of a run that is over."""
