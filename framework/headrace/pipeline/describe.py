"""A pipeline as a Mermaid flowchart, with the actors it runs as.

Each source is drawn with the JetStream actors behind it (the connection supervisor, the
consume buffer or the push subscription's heartbeat monitor, flow-control responder and gap
detector, the consumer lifecycle); each sink as its batcher and writer; and the ack tracker that
every sink reports its commits to. Given the states of a running pipeline, every actor shows its
state (running, restarting, draining, stopped, failed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headrace.pipeline.nodes import Node, PipelineGraph


def _label(text: str) -> str:
    return text.replace('"', "'")


def _internal_actors(node: Node) -> list[str]:
    """The JetStream actors a source runs, by their actor names (or a placeholder for the
    consumer name of an ephemeral consumer, known only once created)."""
    spec = node.source
    assert spec is not None
    consumer = spec.durable or "<ephemeral>"
    key = f"{spec.stream}/{consumer}"
    if spec.pull:
        return [f"consume-buffer:{key}", f"consumer-lifecycle:{key}"]
    names = [f"heartbeat-monitor:{consumer}", f"flow-control-responder:{consumer}"]
    names += [f"gap-detector:{consumer}", f"consumer-lifecycle:{key}"]
    return names


def mermaid(
    pipeline: PipelineGraph,
    states: dict[str, str],
    internal_actors: dict[str, list[str]] | None = None,
) -> str:
    """``internal_actors``: the real names of each source's JetStream actors, from a running
    pipeline (an ephemeral consumer's name is known only once created); otherwise they are
    derived from the source's configuration."""
    ids: dict[str, str] = {}

    def node_id(name: str) -> str:
        if name not in ids:
            ids[name] = f"n{len(ids)}"
        return ids[name]

    def box(name: str, shape: str = "rect") -> str:
        state = states.get(name)
        text = _label(name + (f" ({state})" if state else ""))
        left, right = {"rect": ("[", "]"), "round": ("(", ")"), "db": ("[(", ")]")}[shape]
        return f'{node_id(name)}{left}"{text}"{right}'

    lines = ["flowchart LR", f"  %% pipeline {pipeline.name}"]
    conn = "connection-supervisor"
    lines.append(f"  {box(conn, 'round')}")
    for node in pipeline.sources:
        spec = node.source
        assert spec is not None
        source_actor = f"source:{node.name}"
        known = (internal_actors or {}).get(node.name)
        internal = known if known else _internal_actors(node)
        lines.append(
            f'  subgraph {node_id("sg:" + node.name)}["source {_label(node.name)}: '
            f'{_label(spec.describe())}"]'
        )
        lines.append(f"    {box(source_actor)}")
        lines.extend(f"    {box(actor)}" for actor in internal)
        lines.append("  end")
        lines.append(f"  {node_id(conn)} --- {node_id('sg:' + node.name)}")
    for node in pipeline.nodes:
        if node.kind in ("map", "filter", "flat_map", "merge", "stateful", "lookup"):
            lines.append(f"  {box(f'{node.kind}:{node.name}')}")
        elif node.kind == "sink":
            lines.append(f"  {box(f'batcher:{node.name}')}")
            lines.append(f"  {box(f'sink:{node.name}', 'db')}")
    tracker = "ack-tracker"
    lines.append(f"  {box(tracker, 'round')}")

    def entry(node: Node) -> str:
        if node.kind == "source":
            return node_id(f"source:{node.name}")
        if node.kind == "sink":
            return node_id(f"batcher:{node.name}")
        return node_id(f"{node.kind}:{node.name}")

    for node in pipeline.nodes:
        if node.kind == "sink":
            lines.append(f"  {node_id(f'batcher:{node.name}')} --> {node_id(f'sink:{node.name}')}")
            lines.append(f"  {node_id(f'sink:{node.name}')} -. commits .-> {node_id(tracker)}")
            continue
        lines.extend(f"  {entry(node)} --> {entry(d)}" for d in node.downstream)
        if node.kind == "stateful" and node.state is not None:
            # Where its state lives: snapshots in the pipeline's state bucket (KV).
            store = f"state:{pipeline.state_bucket}/{node.name} ({node.state.describe()})"
            lines.append(f"  {box(store, 'db')}")
            lines.append(f"  {entry(node)} -. snapshots .-> {node_id(store)}")
        if node.kind == "lookup" and node.lookup_spec is not None:
            bucket = f"kv:{node.lookup_spec.bucket}"
            lines.append(f"  {box(bucket, 'db')}")
            lines.append(f"  {node_id(bucket)} -. lookups .-> {entry(node)}")
    lines.append(f"  {node_id(tracker)} -. acks .-> {node_id(conn)}")
    return "\n".join(lines) + "\n"
