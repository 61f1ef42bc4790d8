"""The example pipelines (examples/orders_pipeline.py, examples/embedded_pipeline.py) do what
their docs say, tested with headrace.testing.run_pipeline: each test body once in memory and
once against a real nats-server."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from headrace.sinks import JsonlSink, MemorySink
from headrace.testing import TestMessage, run_pipeline

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=[False, True], ids=["memory", "real"])
def mode(request: pytest.FixtureRequest) -> dict[str, Any]:
    if not request.param:
        return {}
    return {"server_url": request.getfixturevalue("nats_server").url}


def order_messages(*payloads: object) -> list[TestMessage]:
    return [TestMessage("orders.eu", p if isinstance(p, str) else json.dumps(p)) for p in payloads]


def lines(directory: Path) -> list[Any]:
    found: list[Any] = []
    for path in sorted(directory.glob("*.jsonl")):
        found.extend(json.loads(line) for line in path.read_text().splitlines())
    return found


def orders_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("ORDERS_OUT", str(tmp_path))
    return example("orders_pipeline").make_pipeline()


async def test_orders_example_writes_orders_and_drops_the_rest(
    mode: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe = orders_pipeline(tmp_path, monkeypatch)
    # The example's sink shares its commits through the JetStream API when a pipeline binds
    # it ("auto"); the same sink with local commits runs without a server as well.
    lake = JsonlSink(tmp_path, commits="local", fsync=False)
    fed = order_messages({"id": 1, "qty": 2}, {"note": "no id"}, {"id": 3, "qty": 1})
    async with run_pipeline(pipe, fed, sinks={"lake": lake}, **mode) as run:
        await run.settled()
    assert run.values("lake") == [{"id": 1, "qty": 2}, {"id": 3, "qty": 1}]
    # On disk, once each, with where each came from.
    assert [(line["stream_seq"], line["value"]) for line in lines(tmp_path)] == [
        (1, {"id": 1, "qty": 2}),
        (3, {"id": 3, "qty": 1}),
    ]
    assert sorted(a.stream_seq for a in run.acked) == [1, 2, 3]  # the dropped one too
    assert run.naked == [] and run.dead_lettered == []
    assert pipe.node("lake").sink_obj is not lake  # the pipeline's own sink is back


@pytest.mark.slow  # the example's own nak delays: two redeliveries take 3 s
async def test_orders_example_dead_letters_what_it_cannot_decode(
    mode: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe = orders_pipeline(tmp_path, monkeypatch)
    fed = order_messages({"id": 1, "qty": 2}, "{not json")
    async with run_pipeline(pipe, fed, sinks={"lake": MemorySink()}, **mode) as run:
        await run.settled(timeout=20)  # the example's nak delays: 1 s, then 2 s
        assert run.values("lake") == [{"id": 1, "qty": 2}]
        # max_deliveries=3: naked twice (1 s, then 2 s), then copied to dead.orders and
        # terminated.
        assert [(n.stream_seq, n.num_delivered, n.delay) for n in run.naked] == [
            (2, 1, 1.0),
            (2, 2, 2.0),
        ]
        assert [(t.stream_seq, t.num_delivered) for t in run.terminated] == [(2, 3)]
        [dead] = run.dead_lettered
        assert (dead.subject, dead.data) == ("dead.orders", b"{not json")
        assert dead.headers["Headrace-Pipeline"] == "orders-to-lake"


async def test_embedded_example_fans_out_and_acks_after_both_sinks(
    mode: dict[str, Any], tmp_path: Path
) -> None:
    counter = MemorySink()
    pipe = example("embedded_pipeline").build(str(tmp_path), counter)
    fed = order_messages(*({"id": i, "qty": i} for i in range(8)))
    large = MemorySink()
    async with run_pipeline(pipe, fed, sinks={"large-orders": large}, **mode) as run:
        await run.settled()
        assert [o["id"] for o in run.values("large-orders")] == [5, 6, 7]
        assert [o["id"] for o in run.values("count")] == list(range(8))
        assert counter.records == run.committed["count"]
        # A message is acked once, after every sink it reached committed it.
        assert sorted(a.stream_seq for a in run.acked) == list(range(1, 9))
