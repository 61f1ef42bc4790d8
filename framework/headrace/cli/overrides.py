"""Command-line overrides of a loaded pipeline: its sinks, durable names and drain timeout.

- ``--sink NAME=PLUGIN`` replaces the sink of the sink node ``NAME`` with the registered sink
  plugin ``PLUGIN`` (``headrace.sinks`` entry points: ``jsonl``, ``memory``, ``stdout``, ...),
  created with the options given by ``--sink-option NAME.key=value`` (values are read as JSON
  when they parse as JSON, ``10``, ``true``, ``null``, ``"x"``, and as plain strings otherwise).
- ``--durable [SOURCE=]DURABLE`` sets the durable consumer name of a source (``SOURCE`` may be
  left out when the pipeline has one source).
- ``--drain-timeout SECONDS`` sets the pipeline's ``drain_timeout``.
- ``--deliver all|new|last|last_per_subject`` sets where the durable consumers the run creates
  start (their deliver policy). It is a start for new consumers only: a durable that exists
  goes on from where it is, whatever policy it was made with (the server allows no change
  of it), and a source whose configuration names a deliver policy of its own is refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs

from headrace.errors import HeadraceError
from headrace.jetstream.consumer_config import DeliverPolicy
from headrace.pipeline.graph import Pipeline
from headrace.sinks.registry import load_sink


class OverrideError(HeadraceError):
    """An override that does not fit the pipeline or cannot be read."""


#: The ``--deliver`` policies: those that need no start sequence or time.
DELIVER_CHOICES = ("all", "new", "last", "last_per_subject")


@attrs.define(kw_only=True)
class Overrides:
    sinks: dict[str, str] = attrs.field(factory=dict)
    sink_options: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    durables: dict[str | None, str] = attrs.field(factory=dict)
    drain_timeout: float | None = None
    deliver: DeliverPolicy | None = None

    @classmethod
    def parse(
        cls,
        *,
        sinks: Sequence[str] = (),
        sink_options: Sequence[str] = (),
        durables: Sequence[str] = (),
        drain_timeout: float | None = None,
        deliver: str | None = None,
    ) -> Overrides:
        if deliver is not None and deliver not in DELIVER_CHOICES:
            raise OverrideError(f"--deliver {deliver!r}: one of {', '.join(DELIVER_CHOICES)}")
        self = cls(
            drain_timeout=drain_timeout,
            deliver=DeliverPolicy(deliver) if deliver is not None else None,
        )
        for item in sinks:
            name, sep, plugin = item.partition("=")
            if not sep or not name or not plugin:
                raise OverrideError(f"--sink {item!r}: expected NAME=PLUGIN (e.g. lake=jsonl)")
            self.sinks[name] = plugin
        for item in sink_options:
            left, sep, raw = item.partition("=")
            name, dot, key = left.rpartition(".")
            if not sep or not dot or not name or not key.isidentifier():
                raise OverrideError(
                    f"--sink-option {item!r}: expected NAME.key=value (e.g. lake.directory=out)"
                )
            self.sink_options.setdefault(name, {})[key] = parse_value(raw)
        for item in durables:
            source, sep, durable = item.rpartition("=")
            if not durable:
                raise OverrideError(f"--durable {item!r}: expected [SOURCE=]DURABLE")
            self.durables[source if sep else None] = durable
        if drain_timeout is not None and not drain_timeout > 0:
            raise OverrideError(f"--drain-timeout must be positive, not {drain_timeout}")
        return self

    def apply(self, pipe: Pipeline) -> None:
        """Change ``pipe`` in place; raises :class:`OverrideError` or the sink registry's
        errors (:class:`~headrace.sinks.UnknownSink`, :class:`~headrace.sinks.SinkLoadError`).
        """
        sink_names = [n.name for n in pipe.sinks]
        for name in self.sink_options:
            if name not in self.sinks:
                raise OverrideError(
                    f"--sink-option for {name!r}, but no --sink {name}=PLUGIN replaces that sink"
                )
        for name, plugin in self.sinks.items():
            if name not in sink_names:
                raise OverrideError(
                    f"--sink {name}={plugin}: pipeline {pipe.name!r} has no sink named {name!r} "
                    f"(its sinks: {', '.join(sink_names) or 'none'})"
                )
            node = pipe.node(name)
            node.sink_obj = load_sink(plugin, **self.sink_options.get(name, {}))
        sources = pipe.sources
        for source_name, durable in self.durables.items():
            if source_name is None:
                if len(sources) != 1:
                    names = ", ".join(n.name for n in sources) or "none"
                    raise OverrideError(
                        f"--durable {durable}: pipeline {pipe.name!r} has {len(sources)} sources "
                        f"({names}); say which, as SOURCE={durable}"
                    )
                node = sources[0]
            else:
                found = [n for n in sources if n.name == source_name]
                if not found:
                    names = ", ".join(n.name for n in sources) or "none"
                    raise OverrideError(
                        f"--durable {source_name}={durable}: pipeline {pipe.name!r} has no "
                        f"source named {source_name!r} (its sources: {names})"
                    )
                node = found[0]
            assert node.source is not None
            try:
                node.source = attrs.evolve(node.source, durable=durable)
            except ValueError as exc:
                raise OverrideError(f"--durable {durable}: {exc}") from None
        if self.drain_timeout is not None:
            pipe.drain_timeout = self.drain_timeout
        if self.deliver is not None:
            for node in sources:
                spec = node.source
                assert spec is not None
                own = spec.config.deliver_policy
                if own is not None and own is not self.deliver:
                    raise OverrideError(
                        f"--deliver {self.deliver}: source {node.name!r} of pipeline "
                        f"{pipe.name!r} sets deliver_policy={own} in its ConsumerConfig; "
                        "change it there, or leave --deliver off"
                    )
                node.source = attrs.evolve(spec, start=self.deliver)


def parse_value(raw: str) -> Any:
    """A ``--sink-option`` value: JSON if it parses as JSON, else the string itself."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw
