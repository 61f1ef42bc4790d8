"""The pipeline DSL: building graphs, validation errors that name the node, describe().

Most tests need no server (validation runs before anything connects). The last ones run
against a real nats-server: the server-side max_ack_pending check, and that describe() names
the actors a running pipeline really has.
"""

from __future__ import annotations

import re

import pytest
import trio
from headrace.jetstream import ConsumerConfig, DeliverPolicy
from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline, PipelineError
from headrace.sinks import MemorySink

from tests.pipeline.pipe_support import (
    FAST,
    add_stream,
    connect,
    consumer_info,
    fast_pipeline,
    source,
    wait_stats,
)


def ident(x: object) -> object:
    return x


def labels(mermaid: str) -> list[str]:
    """The quoted labels of a Mermaid chart."""
    return re.findall(r'"([^"]*)"', mermaid)


def node_ids(mermaid: str) -> dict[str, str]:
    """Label (without a state suffix) to Mermaid node id."""
    found: dict[str, str] = {}
    for node_id, label in re.findall(r'^\s*(n\d+)[\[\(]+"([^"]*)"', mermaid, re.MULTILINE):
        found[re.sub(r" \((running|starting|stopped|failed|draining|restarting)\)$", "", label)] = (
            node_id
        )
    return found


def subgraphs(mermaid: str) -> dict[str, list[str]]:
    """Subgraph title to the labels of the nodes declared inside it."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in mermaid.splitlines():
        line = line.strip()
        if line.startswith("subgraph"):
            title = labels(line)[0]
            current = found.setdefault(title, [])
        elif line == "end":
            current = None
        elif current is not None:
            current.extend(labels(line))
    return found


# -- building -----------------------------------------------------------------------------------


def test_a_linear_graph() -> None:
    pipe = Pipeline("orders")
    src = pipe.source(source("ORDERS", "lake"))
    m = src.map(ident, name="decode")
    f = m.filter(bool)
    fm = f.flat_map(lambda v: [v, v])
    sink = MemorySink()
    s = fm.sink(sink, batch=BatchPolicy(max_messages=10))
    pipe.validate()
    assert [n.name for n in pipe.nodes] == ["lake", "decode", "bool", "flat_map", "memorysink"]
    assert [n.kind for n in pipe.nodes] == ["source", "map", "filter", "flat_map", "sink"]
    assert m.upstream == [src] and src.downstream == [m]
    assert fm.downstream == [s] and s.upstream == [fm]
    assert s.sink_obj is sink
    assert s.batch.max_messages == 10
    assert pipe.sources == [src] and pipe.sinks == [s]
    assert pipe.node("decode") is m
    with pytest.raises(KeyError):
        pipe.node("nope")
    assert pipe.sources_of(s) == [src]


def test_source_names_default_to_the_durable_or_the_stream() -> None:
    pipe = Pipeline("p")
    assert pipe.source(source("ORDERS", "lake")).name == "lake"
    assert pipe.source(source("ORDERS", None)).name == "orders"
    assert pipe.source(source("ORDERS", None), name="mine").name == "mine"


def test_names_are_made_unique() -> None:
    pipe = Pipeline("p")
    src = pipe.source(source())
    a = src.map(int)
    b = a.map(int)
    c = b.map(int, name="int")
    d = c.map(lambda v: v)
    e = d.map(lambda v: v)
    s1 = e.sink(MemorySink())
    s2 = e.sink(MemorySink())
    assert [a.name, b.name, c.name] == ["int", "int-2", "int-3"]
    assert [d.name, e.name] == ["map", "map-2"]  # lambdas are named after their kind
    assert [s1.name, s2.name] == ["memorysink", "memorysink-2"]
    assert len({n.name for n in pipe.nodes}) == len(pipe.nodes)


def test_merge_and_fan_out() -> None:
    pipe = Pipeline("p")
    a = pipe.source(source("A", "ca"))
    b = pipe.source(source("B", "cb"))
    merged = pipe.merge(a, b)
    s1 = merged.sink(MemorySink(), name="one")
    s2 = merged.map(ident).sink(MemorySink(), name="two")
    pipe.validate()
    assert merged.kind == "merge" and merged.name == "merge"
    assert merged.upstream == [a, b]
    assert a.downstream == [merged] and b.downstream == [merged]
    assert len(merged.downstream) == 2
    assert {n.name for n in pipe.sources_of(s1)} == {"ca", "cb"}
    assert {n.name for n in pipe.sources_of(s2)} == {"ca", "cb"}


def test_merge_errors() -> None:
    pipe = Pipeline("p")
    a = pipe.source(source("A", "ca"))
    with pytest.raises(PipelineError, match="at least two"):
        pipe.merge(a)
    other = Pipeline("q").source(source("B", "cb"))
    with pytest.raises(PipelineError, match="another pipeline"):
        pipe.merge(a, other)
    s = a.sink(MemorySink(), name="out")
    with pytest.raises(PipelineError, match="sink 'out'"):
        pipe.merge(a, s)


def test_nothing_follows_a_sink() -> None:
    pipe = Pipeline("p")
    s = pipe.source(source()).sink(MemorySink(), name="out")
    with pytest.raises(PipelineError, match="sink 'out' has no output"):
        s.map(ident)
    with pytest.raises(PipelineError, match="sink 'out' has no output"):
        s.sink(MemorySink())


def test_pipeline_and_source_arguments() -> None:
    with pytest.raises(PipelineError):
        Pipeline("")
    with pytest.raises(PipelineError, match="max_deliveries"):
        Pipeline("p", max_deliveries=0)
    with pytest.raises(PipelineError, match="JetStreamSource"):
        Pipeline("p").source("S")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="explicit"):
        JetStreamSource(stream="S", config=ConsumerConfig(ack_policy="all"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="deliver_subject"):
        JetStreamSource(stream="S", config=ConsumerConfig(deliver_subject="x"))
    with pytest.raises(ValueError, match="not both"):
        JetStreamSource(stream="S", start="new", config=ConsumerConfig(deliver_policy="all"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a sequence or a time"):
        JetStreamSource(stream="S", start="by_start_sequence")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'soon' is not a valid DeliverPolicy"):
        JetStreamSource(stream="S", start="soon")  # type: ignore[arg-type]
    assert JetStreamSource(stream="S", start="new").start is DeliverPolicy.NEW  # type: ignore[arg-type]


def test_source_consumer_config() -> None:
    one = JetStreamSource(stream="S", filter_subjects="s.a", config=ConsumerConfig(ack_wait=5))
    assert one.consumer_config().filter_subject == "s.a"
    assert one.consumer_config().ack_policy == "explicit"
    assert one.consumer_config().ack_wait == 5
    two = JetStreamSource(stream="S", filter_subjects=["s.a", "s.b"])
    assert two.consumer_config().filter_subjects == ["s.a", "s.b"]
    assert two.describe() == "S/ephemeral (pull)"
    assert JetStreamSource(stream="S", durable="d", pull=False).describe() == "S/d (push)"


# -- validation ---------------------------------------------------------------------------------


def test_no_source() -> None:
    with pytest.raises(PipelineError, match="pipeline 'empty' has no source"):
        Pipeline("empty").validate()


def test_no_sink() -> None:
    pipe = Pipeline("nosink")
    pipe.source(source()).map(ident)
    with pytest.raises(PipelineError, match="pipeline 'nosink' has no sink"):
        pipe.validate()


def test_unconnected_operator_is_named() -> None:
    pipe = Pipeline("p")
    src = pipe.source(source())
    src.sink(MemorySink())
    src.map(ident, name="dangling")
    with pytest.raises(PipelineError, match="map 'dangling' is not connected"):
        pipe.validate()


def test_unconnected_source_is_named() -> None:
    pipe = Pipeline("p")
    pipe.source(source("A", "used")).sink(MemorySink())
    pipe.source(source("B", "unused"))
    with pytest.raises(PipelineError, match="source 'unused' is not connected"):
        pipe.validate()


def test_batch_larger_than_max_ack_pending_in_the_source_config() -> None:
    pipe = Pipeline("p")
    src = pipe.source(source(config=ConsumerConfig(max_ack_pending=50)), name="orders")
    src.sink(MemorySink(), name="lake", batch=BatchPolicy(max_messages=100))
    with pytest.raises(PipelineError) as caught:
        pipe.validate()
    message = str(caught.value)
    assert "sink 'lake'" in message
    assert "source 'orders'" in message
    assert "100" in message and "50" in message


def test_batch_that_fits_max_ack_pending() -> None:
    pipe = Pipeline("p")
    src = pipe.source(source(config=ConsumerConfig(max_ack_pending=100)))
    src.sink(MemorySink(), batch=BatchPolicy(max_messages=100))
    pipe.validate()


def test_batch_check_follows_merges_to_every_source() -> None:
    pipe = Pipeline("p")
    a = pipe.source(source("A", "a"))
    b = pipe.source(source("B", "b", config=ConsumerConfig(max_ack_pending=10)))
    pipe.merge(a, b).map(ident).sink(MemorySink(), name="lake", batch=BatchPolicy(max_messages=20))
    with pytest.raises(PipelineError, match=r"sink 'lake'.*source 'b'"):
        pipe.validate()


@pytest.mark.parametrize("kind", ["map", "filter", "flat_map"])
def test_operator_that_is_not_callable(kind: str) -> None:
    pipe = Pipeline("p")
    node = getattr(pipe.source(source()), kind)("not a function", name="bad")
    node.sink(MemorySink())
    with pytest.raises(PipelineError, match=f"{kind} 'bad': its function is not callable"):
        pipe.validate()


@pytest.mark.parametrize("concurrency", [0, -1])
def test_bad_concurrency(concurrency: int) -> None:
    pipe = Pipeline("p")
    pipe.source(source()).map(ident, name="work", concurrency=concurrency).sink(MemorySink())
    with pytest.raises(PipelineError, match="map 'work': concurrency must be >= 1"):
        pipe.validate()


def test_bad_ordered() -> None:
    pipe = Pipeline("p")
    pipe.source(source()).filter(ident, name="keep", ordered="random").sink(MemorySink())  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match="filter 'keep': ordered must be"):
        pipe.validate()


def test_sink_without_write_batch() -> None:
    pipe = Pipeline("p")
    pipe.source(source()).sink(object(), name="nowhere")
    with pytest.raises(PipelineError, match=r"sink 'nowhere' .*has no write_batch"):
        pipe.validate()


def test_cycle_is_refused() -> None:
    pipe = Pipeline("p")
    src = pipe.source(source())
    a = src.map(ident, name="a")
    b = a.map(ident, name="b")
    b.sink(MemorySink())
    b.downstream.append(a)  # not possible through the DSL; validate still guards it
    a.upstream.append(b)
    with pytest.raises(PipelineError, match=r"cycle through .*a -> b -> a"):
        pipe.validate()


async def test_running_validates_before_connecting() -> None:
    pipe = Pipeline("p")
    pipe.source(source())
    with pytest.raises(PipelineError, match="no sink"):
        async with pipe.running(None):  # type: ignore[arg-type]
            pytest.fail("an invalid pipeline ran")


# -- describe -----------------------------------------------------------------------------------


def test_describe_pull_source() -> None:
    pipe = Pipeline("lake")
    src = pipe.source(source("ORDERS", "lake"))
    src.map(ident, name="decode").sink(MemorySink(), name="files")
    chart = pipe.describe()
    assert chart.startswith("flowchart LR\n")
    assert "%% pipeline lake" in chart
    ids = node_ids(chart)
    assert {
        "connection-supervisor",
        "source:lake",
        "consume-buffer:ORDERS/lake",
        "consumer-lifecycle:ORDERS/lake",
        "map:decode",
        "batcher:files",
        "sink:files",
        "ack-tracker",
    } == set(ids)
    groups = subgraphs(chart)
    assert groups == {
        "source lake: ORDERS/lake (pull)": [
            "source:lake",
            "consume-buffer:ORDERS/lake",
            "consumer-lifecycle:ORDERS/lake",
        ]
    }
    edges = set(re.findall(r"(n\d+) (-->|---|-\. \w+ \.->) (n\d+)", chart))
    assert (ids["source:lake"], "-->", ids["map:decode"]) in edges
    assert (ids["map:decode"], "-->", ids["batcher:files"]) in edges
    assert (ids["batcher:files"], "-->", ids["sink:files"]) in edges
    assert (ids["sink:files"], "-. commits .->", ids["ack-tracker"]) in edges
    assert (ids["ack-tracker"], "-. acks .->", ids["connection-supervisor"]) in edges
    # the sink is drawn as a store
    assert f'{ids["sink:files"]}[("sink:files")]' in chart


def test_describe_push_and_ephemeral_sources() -> None:
    pipe = Pipeline("p")
    push = pipe.source(source("EV", "audit", pull=False))
    eph = pipe.source(source("EV", None), name="eph")
    pipe.merge(push, eph).sink(MemorySink(), name="out")
    chart = pipe.describe()
    groups = subgraphs(chart)
    assert groups["source audit: EV/audit (push)"] == [
        "source:audit",
        "heartbeat-monitor:audit",
        "flow-control-responder:audit",
        "gap-detector:audit",
        "consumer-lifecycle:EV/audit",
    ]
    assert groups["source eph: EV/ephemeral (pull)"] == [
        "source:eph",
        "consume-buffer:EV/<ephemeral>",
        "consumer-lifecycle:EV/<ephemeral>",
    ]
    ids = node_ids(chart)
    assert f"{ids['source:audit']} --> {ids['merge:merge']}" in chart
    assert f"{ids['source:eph']} --> {ids['merge:merge']}" in chart
    assert f"{ids['merge:merge']} --> {ids['batcher:out']}" in chart


def test_describe_fan_out_sinks_as_batcher_and_writer() -> None:
    pipe = Pipeline("p")
    src = pipe.source(source())
    src.sink(MemorySink(), name="a")
    src.sink(MemorySink(), name="b")
    chart = pipe.describe()
    ids = node_ids(chart)
    for name in ("a", "b"):
        assert f"{ids['source:C']} --> {ids['batcher:' + name]}" in chart
        assert f"{ids['batcher:' + name]} --> {ids['sink:' + name]}" in chart
        assert f"{ids['sink:' + name]} -. commits .-> {ids['ack-tracker']}" in chart


def test_describe_with_states_and_quotes() -> None:
    pipe = Pipeline("p")
    pipe.source(source()).map(ident, name='say "hi"').sink(MemorySink(), name="out")
    chart = pipe.describe({"sink:out": "restarting", "ack-tracker": "running"})
    assert '"sink:out (restarting)"' in chart
    assert '"ack-tracker (running)"' in chart
    assert "map:say 'hi'" in chart  # double quotes would break the Mermaid label


async def bound(run) -> None:
    """Until every source has bound its consumer and every actor runs (actor states have no
    change event: polled briefly)."""
    with trio.fail_after(10):
        await run.wait_bound()
    await wait_stats(
        lambda: all(a.state.value == "running" for a in run.actors), what="actors running"
    )


# -- with a server ------------------------------------------------------------------------------


async def test_batch_larger_than_the_servers_max_ack_pending(nats_server, natspy) -> None:
    """The durable exists with max_ack_pending=10, the source config does not say so: the run
    learns it when it binds and fails, naming the sink."""
    await natspy.connect(nats_server.url)
    await add_stream(natspy)

    async def create() -> None:
        from nats.js.api import AckPolicy as PyAck
        from nats.js.api import ConsumerConfig as PyConfig

        await natspy.nc.jetstream().add_consumer(
            "S", PyConfig(durable_name="C", ack_policy=PyAck.EXPLICIT, max_ack_pending=10)
        )

    await natspy.call(create)
    pipe = fast_pipeline()
    pipe.source(source()).sink(MemorySink(), name="lake", batch=BatchPolicy(max_messages=100))
    pipe.validate()  # nothing in the config says so
    async with connect(nats_server.url, **FAST) as nc:
        with trio.fail_after(10), pytest.raises(PipelineError) as caught:
            async with pipe.running(nc):
                await trio.sleep_forever()
    assert "sink 'lake'" in str(caught.value)
    assert "max_ack_pending (10)" in str(caught.value)
    info = await consumer_info(natspy)
    assert info.config.max_ack_pending == 10


async def test_describe_names_the_actors_a_running_pipeline_has(nats_server, natspy) -> None:
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    pipe = fast_pipeline()
    pipe.source(source("S", "C")).map(ident, name="m").sink(MemorySink(), name="out")
    static = set(node_ids(pipe.describe()))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await bound(run)
        states = run.states()
        chart = run.describe()
    assert set(states) == static
    assert all(state == "running" for state in states.values()), states
    drawn = re.findall(r'^\s*n\d+[\[\(]+"([^"]*)"', chart, re.MULTILINE)
    assert sorted(drawn) == sorted(f"{name} (running)" for name in static)


async def test_describe_names_a_push_sources_actors(nats_server, natspy) -> None:
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    pipe = fast_pipeline()
    spec = source("S", "P", pull=False, config=ConsumerConfig(idle_heartbeat=1, flow_control=True))
    pipe.source(spec).sink(MemorySink(), name="out")
    static = set(node_ids(pipe.describe()))
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await bound(run)
        states = run.states()
    assert set(states) == static


async def test_running_describe_keeps_each_sources_actors_apart(nats_server, natspy) -> None:
    await natspy.connect(nats_server.url)
    await add_stream(natspy, "A", ["a.>"])
    await add_stream(natspy, "B", ["b.>"])
    pipe = fast_pipeline()
    a = pipe.source(source("A", "CA"))
    b = pipe.source(source("B", "CB"))
    pipe.merge(a, b).sink(MemorySink(), name="out")
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await bound(run)
        chart = run.describe()
    groups = subgraphs(chart)
    assert sorted(groups["source CA: A/CA (pull)"]) == [
        "consume-buffer:A/CA (running)",
        "consumer-lifecycle:A/CA (running)",
        "source:CA (running)",
    ]
    assert sorted(groups["source CB: B/CB (pull)"]) == [
        "consume-buffer:B/CB (running)",
        "consumer-lifecycle:B/CB (running)",
        "source:CB (running)",
    ]
