"""The pipeline test harness (headrace.testing.run_pipeline): each test body runs twice, once
server-less (in memory) and once against a real nats-server (``real``), and must see the same
commits, acks, naks, terms and dead letters in both.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing
from headrace.pipeline import (
    Batch,
    BatchPolicy,
    JetStreamSource,
    Pipeline,
    Record,
    RecordsRejected,
    SinkRetry,
)
from headrace.sinks import MemorySink
from headrace.testing import HarnessError, NotInMemory, TestMessage, run_pipeline

FAST_RETRY = SinkRetry(backoff=0.01, backoff_max=0.05)
#: Batches cut 50 ms after their first record instead of the default second: every test waits
#: for a whole pipeline to settle, in both modes.
QUICK = BatchPolicy(max_age=0.05)


@pytest.fixture(params=[False, True], ids=["memory", "real"])
def mode(request: pytest.FixtureRequest) -> dict[str, Any]:
    """``run_pipeline`` keyword arguments: none (in memory), or a real server's URL."""
    if not request.param:
        return {}
    return {"server_url": request.getfixturevalue("nats_server").url}


def orders(*items: dict[str, Any] | str) -> list[TestMessage]:
    return [
        TestMessage(
            "orders.eu",
            item if isinstance(item, str) else json.dumps(item),
            headers={"Order-Index": str(i)},
        )
        for i, item in enumerate(items)
    ]


def source() -> JetStreamSource:
    return JetStreamSource(stream="ORDERS", durable="test", filter_subjects="orders.>")


async def test_map_filter_sink_commits_each_record_once_and_acks_it(
    mode: dict[str, Any],
) -> None:
    pipe = Pipeline("map-filter", nak_delay=0.05)
    lake = MemorySink()
    (
        pipe.source(source(), name="orders")
        .map(json.loads)
        .filter(lambda o: o["qty"] > 1)
        .sink(lake, name="lake", batch=QUICK)
    )
    fed = orders({"id": 1, "qty": 2}, {"id": 2, "qty": 1}, {"id": 3, "qty": 5})
    async with run_pipeline(pipe, fed, **mode) as run:
        await run.settled()
        committed = run.values("lake")
        assert committed == [{"id": 1, "qty": 2}, {"id": 3, "qty": 5}]
        # Every message is acked once (the filtered one too: it ends without a sink).
        assert sorted(a.stream_seq for a in run.acked) == [1, 2, 3]
        assert [a.num_delivered for a in run.acked] == [1, 1, 1]
        assert run.naked == [] and run.terminated == [] and run.dead_lettered == []
        # The records carry the message's metadata, as from a server.
        first = run.committed["lake"][0]
        assert (first.stream, first.stream_seq, first.subject) == ("ORDERS", 1, "orders.eu")
        assert first.headers is not None and first.headers["Order-Index"] == "0"
        assert {a.data for a in run.acked} == {m.data for m in fed}
    assert run.values("lake") == committed  # nothing more after the drain
    assert lake.records == run.committed["lake"]


class BadOrder(ValueError):
    transient = False  # bad data: the sink stage splits the batch at once


class PickySink:
    """Refuses orders without a quantity (bad data), commits the rest."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    async def write_batch(self, batch: Batch) -> None:
        await trio.lowlevel.checkpoint()
        for record in batch.records:
            if "qty" not in record.value:
                raise BadOrder(f"order {record.value['id']} has no quantity")
        self.records.extend(batch.records)


def picky_pipeline(dead_letter: str | None) -> Pipeline:
    pipe = Pipeline(
        "picky",
        dead_letter=dead_letter,
        max_deliveries=1,
        allow_termination=dead_letter is None,
        sink_retry=FAST_RETRY,
    )
    pipe.source(source(), name="orders").map(json.loads).sink(
        PickySink(), name="picky", batch=QUICK
    )
    return pipe


async def test_a_record_the_sink_refuses_is_dead_lettered_and_the_rest_committed(
    mode: dict[str, Any],
) -> None:
    pipe = picky_pipeline("dead.orders")
    fed = orders({"id": 1, "qty": 1}, {"id": 2}, {"id": 3, "qty": 3})
    async with run_pipeline(pipe, fed, **mode) as run:
        await run.settled()
        assert [o["id"] for o in run.values("picky")] == [1, 3]
        assert [a.stream_seq for a in run.acked] == [1, 3]
        assert [(t.stream_seq, t.message) for t in run.terminated] == [(2, fed[1])]
        assert run.naked == []
        [dead] = run.dead_lettered
        assert (dead.subject, dead.data) == ("dead.orders", fed[1].data)
        assert dead.headers["Headrace-Stream-Seq"] == "2"
        assert dead.headers["Order-Index"] == "1"  # the message's own headers are kept
        assert "BadOrder" in dead.headers["Headrace-Error"]


async def test_without_a_dead_letter_the_refused_record_is_terminated(
    mode: dict[str, Any],
) -> None:
    pipe = picky_pipeline(None)
    fed = orders({"id": 1, "qty": 1}, {"id": 2})
    async with run_pipeline(pipe, fed, **mode) as run:
        await run.settled()
        assert [o["id"] for o in run.values("picky")] == [1]
        assert [t.stream_seq for t in run.terminated] == [2]
        assert run.terminated[0].reason is not None and "BadOrder" in run.terminated[0].reason
        assert run.dead_lettered == []
        assert run.stats.terminated_unkept == 1


class Outage(ConnectionError):
    transient = True  # the sink is down: never split, only retried


async def test_a_transient_sink_failure_is_retried_in_place(mode: dict[str, Any]) -> None:
    pipe = Pipeline("outage", sink_retry=FAST_RETRY)
    sink = MemorySink(fail_times=3, fail_with=Outage)
    pipe.source(source(), name="orders").sink(sink, name="lake", batch=QUICK)
    fed = orders({"id": 1}, {"id": 2})
    async with run_pipeline(pipe, fed, **mode) as run:
        await run.settled()
        assert sink.failures == 3
        assert sorted(r.stream_seq for r in run.committed["lake"]) == [1, 2]
        assert sorted(a.stream_seq for a in run.acked) == [1, 2]
        # Held and retried: never naked, so never redelivered.
        assert run.naked == []
        assert {a.num_delivered for a in run.acked} == {1}


async def test_a_naked_message_is_redelivered_and_then_committed(mode: dict[str, Any]) -> None:
    pipe = Pipeline("flaky", nak_delay=0.05, max_deliveries=3)

    def first_time_fails(record: Record) -> Any:
        value = json.loads(record.value)
        if value["id"] == 2 and record.num_delivered == 1:
            raise RuntimeError("not this time")
        return value

    lake = MemorySink()
    pipe.source(source(), name="orders").map(first_time_fails, record=True).sink(lake, batch=QUICK)
    fed = orders({"id": 1}, {"id": 2})
    async with run_pipeline(pipe, fed, **mode) as run:
        await run.settled()
        [nak] = run.naked
        assert (nak.stream_seq, nak.num_delivered, nak.message) == (2, 1, fed[1])
        assert nak.delay == pytest.approx(0.05)  # the pipeline's first nak delay
        assert sorted((a.stream_seq, a.num_delivered) for a in run.acked) == [(1, 1), (2, 2)]
        [again] = [r for r in run.committed["memorysink"] if r.stream_seq == 2]
        assert again.num_delivered == 2
        assert run.stats.redeliveries == 1


async def test_a_poison_message_is_dead_lettered_after_max_deliveries(
    mode: dict[str, Any],
) -> None:
    pipe = Pipeline("poison", dead_letter="dead.orders", nak_delay=0.02, max_deliveries=3)
    pipe.source(source(), name="orders").map(json.loads).sink(
        MemorySink(), name="lake", batch=QUICK
    )
    fed = orders({"id": 1}, "not json")
    async with run_pipeline(pipe, fed, **mode) as run:
        await run.settled()
        assert [(n.stream_seq, n.num_delivered) for n in run.naked] == [(2, 1), (2, 2)]
        assert [(t.stream_seq, t.num_delivered) for t in run.terminated] == [(2, 3)]
        [dead] = run.dead_lettered
        assert dead.headers["Headrace-Delivered"] == "3"
        assert run.values("lake") == [{"id": 1}]


async def test_messages_fed_while_running_are_settled_too(mode: dict[str, Any]) -> None:
    pipe = Pipeline("feed")
    pipe.source(source(), name="orders").sink(MemorySink(), name="lake", batch=QUICK)
    async with run_pipeline(pipe, orders({"id": 1}), **mode) as run:
        await run.settled()
        seqs = await run.feed(TestMessage("orders.us", b"2"), TestMessage("orders.eu", b"3"))
        assert seqs == [2, 3]
        await run.settled()
        assert sorted(a.stream_seq for a in run.acked) == [1, 2, 3]
        assert [r.subject for r in run.committed["lake"]][1:] == ["orders.us", "orders.eu"]


async def test_settled_names_what_is_still_open(mode: dict[str, Any]) -> None:
    gate = trio.Event()

    class Stuck:
        async def write_batch(self, batch: Batch) -> None:
            await gate.wait()

    pipe = Pipeline("stuck", drain_timeout=5)
    pipe.source(source(), name="orders").sink(Stuck(), name="stuck", batch=QUICK)
    async with run_pipeline(pipe, orders({"id": 1}), **mode) as run:
        with pytest.raises(trio.TooSlowError) as caught:
            await run.settled(timeout=0.3)
        assert "ORDERS#1" in str(caught.value.__notes__)
        gate.set()
        await run.settled()


async def test_a_message_no_stream_stores_is_a_clear_error() -> None:
    pipe = Pipeline("two")
    a = pipe.source(JetStreamSource(stream="A", filter_subjects="a.>"), name="a")
    b = pipe.source(JetStreamSource(stream="B"), name="b")
    pipe.merge(a, b).sink(MemorySink(), name="out", batch=QUICK)
    with pytest.raises(HarnessError, match=r"which stream stores a message on 'a\.x'"):
        async with run_pipeline(pipe, [TestMessage("a.x", b"1")]):
            pass  # pragma: no cover
    # Named, it goes where it is told.
    async with run_pipeline(pipe, [TestMessage("a.x", b"1", stream="B")]) as run:
        await run.settled()
        assert [(a.stream, a.stream_seq) for a in run.acked] == [("B", 1)]


async def test_a_sink_using_the_jetstream_api_is_told_to_use_a_server() -> None:
    class Needy:
        async def bind(self, context: Any) -> None:
            await context.js.stream_info("ORDERS")

        async def write_batch(self, batch: Batch) -> None:
            raise AssertionError("not reached")

    pipe = Pipeline("needy")
    pipe.source(source(), name="orders").sink(Needy(), name="needy", batch=QUICK)
    with pytest.raises(NotInMemory, match=r"'stream_info'.*real=True"):
        async with run_pipeline(pipe, orders({"id": 1})):
            await trio.sleep_forever()


async def test_in_memory_the_nak_backoff_runs_on_the_autojump_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """No I/O in memory: trio's autojump clock passes the pipeline's own delays at once, and
    they are the pipeline's (1 s doubling), then the poison message's +TERM."""
    pipe = Pipeline("backoff", max_deliveries=5, allow_termination=True)
    pipe.source(source(), name="orders").map(json.loads).sink(
        MemorySink(), name="lake", batch=QUICK
    )
    async with run_pipeline(pipe, orders("not json")) as run:
        started = trio.current_time()
        await run.settled(timeout=60)
        assert [n.delay for n in run.naked] == [1.0, 2.0, 4.0, 8.0]
        assert [t.num_delivered for t in run.terminated] == [5]
        assert trio.current_time() - started >= 15.0  # virtual seconds


async def test_real_without_a_url_runs_a_local_server_of_its_own() -> None:
    pipe = Pipeline("local")
    pipe.source(source(), name="orders").sink(MemorySink(), name="lake", batch=QUICK)
    async with run_pipeline(pipe, orders({"id": 1}), real=True) as run:
        await run.settled()
        url = run.run.nc.connected_server
        assert url is not None and url.host == "127.0.0.1"
    assert run.real and [a.stream_seq for a in run.acked] == [1]


class RejectingSink:
    """Commits a batch but the records without a quantity, which it rejects by name."""

    async def write_batch(self, batch: Batch) -> None:
        await trio.lowlevel.checkpoint()
        bad = [(r, ValueError("no quantity")) for r in batch.records if "qty" not in r.value]
        if bad:
            raise RecordsRejected(bad)


async def test_records_a_sink_rejects_are_not_counted_as_committed(mode: dict[str, Any]) -> None:
    pipe = Pipeline("rejecting", dead_letter="dead.orders", max_deliveries=2, nak_delay=0.02)
    pipe.source(source(), name="orders").map(json.loads).sink(
        RejectingSink(), name="out", batch=QUICK
    )
    fed = orders({"id": 1, "qty": 1}, {"id": 2}, {"id": 3, "qty": 3})
    async with run_pipeline(pipe, fed, **mode) as run:
        await run.settled()
        # The rejected record fails alone: naked, delivered again, rejected again, then
        # dead-lettered; it is never among what the sink committed.
        assert sorted(o["id"] for o in run.values("out")) == [1, 3]
        assert [(n.stream_seq, n.num_delivered) for n in run.naked] == [(2, 1)]
        assert [(t.stream_seq, t.num_delivered) for t in run.terminated] == [(2, 2)]
        assert [d.data for d in run.dead_lettered] == [fed[1].data]


@pytest.mark.parametrize(
    "spec",
    [
        JetStreamSource(stream="ORDERS", filter_subjects="orders.>", pull=False),
        JetStreamSource(stream="ORDERS", filter_subjects="orders.>"),
    ],
    ids=["push-durable-less", "pull-ephemeral"],
)
async def test_push_and_ephemeral_sources(mode: dict[str, Any], spec: JetStreamSource) -> None:
    pipe = Pipeline("kinds", nak_delay=0.02)

    def once_failing(record: Record) -> bytes:
        if record.num_delivered == 1 and record.stream_seq == 1:
            raise RuntimeError("first delivery")
        return record.value  # type: ignore[no-any-return]

    pipe.source(spec, name="orders").map(once_failing, record=True).sink(
        MemorySink(), name="out", batch=QUICK
    )
    async with run_pipeline(pipe, orders({"id": 1}, {"id": 2}), **mode) as run:
        await run.settled()
        [source_stage] = run.run.sources
        consumer = source_stage.consumer_name
        assert consumer is not None
        assert {a.consumer for a in run.events} == {consumer}
        assert sorted((a.stream_seq, a.num_delivered) for a in run.acked) == [(1, 2), (2, 1)]
        assert sorted(r.stream_seq for r in run.committed["out"]) == [1, 2]
