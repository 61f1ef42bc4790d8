"""Finding sink plugins by name.

A sink plugin is an entry point in the group ``headrace.sinks``: its name is the sink's name,
its object a class or factory called with the sink's options. headrace registers its built-ins
(``jsonl``, ``memory``, ``stdout``) the same way, in its own ``pyproject.toml``::

    [project.entry-points."headrace.sinks"]
    jsonl = "headrace.sinks.jsonl:JsonlSink"
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from headrace.sinks.errors import SinkLoadError, UnknownSink

GROUP = "headrace.sinks"


def available_sinks() -> dict[str, importlib.metadata.EntryPoint]:
    """The installed sink plugins by name, sorted by name.

    Two distributions registering one name: the first found wins, as ``importlib.metadata``
    orders them.
    """
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=GROUP):
        found.setdefault(ep.name, ep)
    return dict(sorted(found.items()))


def load_sink(name: str, **options: Any) -> object:
    """Import the sink plugin ``name`` and call it with ``options``; return the sink.

    Raises :class:`UnknownSink` (listing the available names) when no plugin has that name, and
    :class:`SinkLoadError` (naming the plugin, the original error as ``__cause__``) when its
    module fails to import, its object is not callable, or calling it with ``options`` fails.
    """
    sinks = available_sinks()
    ep = sinks.get(name)
    if ep is None:
        raise UnknownSink(name, sinks)
    try:
        factory = ep.load()
    except Exception as exc:
        raise SinkLoadError(
            name, ep.value, f"failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(factory):
        raise SinkLoadError(name, ep.value, f"is not a class or factory: {factory!r}")
    try:
        return factory(**options)
    except Exception as exc:
        shown = ", ".join(f"{k}={v!r}" for k, v in options.items()) or "no options"
        raise SinkLoadError(
            name, ep.value, f"could not be created with {shown}: {type(exc).__name__}: {exc}"
        ) from exc
