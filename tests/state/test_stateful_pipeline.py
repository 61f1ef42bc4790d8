"""Stateful operators in a running pipeline, on a real nats-server: windows and keyed state
checked against counts computed independently from what was published, across restarts,
with late records in the dead letter and the snapshot in KV.

Events are JSON ``{"user": u, "ts": seconds, "n": i}`` on ``clicks.<u>``; a last event far in
the future (user ``"end"``) moves the watermark past every real window, so all of them close.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from typing import Any

import pytest
import trio
from headrace.jetstream import ConsumerConfig, JetStream, StreamConfig, publish_acked
from headrace.jetstream.kv import KeyValueConfig, create_key_value, key_value
from headrace.nats import connect
from headrace.pipeline import (
    BatchPolicy,
    JetStreamSource,
    Pipeline,
    PipelineError,
    SinkRetry,
    run_until_caught_up,
)
from headrace.sinks import MemorySink
from headrace.state import (
    Joined,
    SessionWindow,
    SlidingWindow,
    TumblingWindow,
    WindowResult,
    count,
    to_micros,
)
from headrace.state.disk import is_file_snapshot
from headrace.state.errors import StateConsumerChanged, StateFenced, StateStreamRecreated
from headrace.state.snapshots import SnapshotStore

BASE = 1_700_000_000.0  # event time of event 0 (seconds)
END_TS = BASE + 100_000.0


def events(n: int, *, users: int = 20, seed: int = 1, jitter: float = 2.0) -> list[dict[str, Any]]:
    """``n`` events 10 ms apart, each moved up to ``jitter`` seconds either way: out of order."""
    rng = random.Random(seed)
    return [
        {
            "user": f"u{rng.randrange(users)}",
            "ts": BASE + i * 0.01 + rng.uniform(-jitter, jitter),
            "n": i,
        }
        for i in range(n)
    ]


def tumbling_counts(evs: list[dict[str, Any]], size: float) -> Counter[tuple[str, float]]:
    """Per (user, window start) counts, computed without headrace."""
    out: Counter[tuple[str, float]] = Counter()
    for e in evs:
        start = (e["ts"] // size) * size
        out[(e["user"], start)] += 1
    return out


async def load(url: str, evs: list[dict[str, Any]], *, stream: str = "CLICKS") -> None:
    async with connect(url) as nc:
        js = JetStream(nc)
        try:
            await js.add_stream(StreamConfig(name=stream, subjects=["clicks.>"]))
        except Exception:
            pass  # made by an earlier call of the test
        messages = ((f"clicks.{e['user']}", json.dumps(e).encode(), None) for e in evs)
        await publish_acked(nc, messages)


def results_of(sink: MemorySink) -> list[WindowResult]:
    return [r.value for r in sink.records if isinstance(r.value, WindowResult)]


def windowed(name: str = "clicks", **kw: Any) -> tuple[Pipeline, MemorySink]:
    sink = MemorySink()
    pipe = Pipeline(name, drain_timeout=10.0, dead_letter=kw.pop("dead_letter", None))
    (
        pipe.source(JetStreamSource(stream="CLICKS", durable=name))
        .map(json.loads)
        .key_by(lambda e: e["user"])
        .window(
            kw.pop("assigner", TumblingWindow(60)),
            kw.pop("aggregate", count()),
            event_time=lambda e: e["ts"],
            lateness=kw.pop("lateness", 5.0),
            snapshot_interval=kw.pop("snapshot_interval", 0.2),
            **kw,
        )
        .sink(sink)
    )
    return pipe, sink


def as_counts(results: list[WindowResult]) -> Counter[tuple[str, float]]:
    out: Counter[tuple[str, float]] = Counter()
    for r in results:
        if r.key != "end":
            out[(r.key, r.start.timestamp())] += r.value
    return out


BACKENDS = pytest.mark.parametrize("backend", ["memory", "disk"])


@pytest.mark.slow
@BACKENDS
async def test_tumbling_counts_equal_the_counts_computed_from_the_events(nats_server, backend):
    evs = events(20_000)
    await load(nats_server.url, [*evs, {"user": "end", "ts": END_TS, "n": -1}])
    pipe, sink = windowed(backend=backend)
    async with connect(nats_server.url) as nc:
        with trio.fail_after(60):
            stats = await run_until_caught_up(pipe, nc)
    results = results_of(sink)
    keys = [(r.key, r.start) for r in results]
    assert len(keys) == len(set(keys)), "a window emitted twice"
    assert as_counts(results) == tumbling_counts(evs, 60)
    assert stats.acks == len(evs) + 1


@pytest.mark.parametrize(
    ("before", "after"),
    [("memory", "memory"), ("disk", "disk"), ("memory", "disk"), ("disk", "memory")],
)
async def test_a_restarted_pipeline_goes_on_from_its_snapshot(nats_server, before, after):
    """Half the events, drain; the other half, a new run of the same pipeline: every window
    once, with the count of both halves (the open windows came back from KV), whichever
    backend saved the snapshot and whichever restores it."""
    evs = events(6_000, seed=2)
    first, second = evs[:3_000], evs[3_000:]
    await load(nats_server.url, first)
    pipe, sink1 = windowed("restart", backend=before)
    async with connect(nats_server.url) as nc:
        with trio.fail_after(60):
            await run_until_caught_up(pipe, nc)
    await load(nats_server.url, [*second, {"user": "end", "ts": END_TS, "n": -1}])
    pipe, sink2 = windowed("restart", backend=after)
    async with connect(nats_server.url) as nc:
        with trio.fail_after(60):
            await run_until_caught_up(pipe, nc)
        store = await SnapshotStore.open(JetStream(nc), "restart", "window")
        payload = await store.load()
        assert payload is not None and store.epoch >= 2
        assert is_file_snapshot(payload) == (after == "disk")
    results = results_of(sink1) + results_of(sink2)
    keys = [(r.key, r.start) for r in results]
    assert len(keys) == len(set(keys))
    assert as_counts(results) == tumbling_counts(evs, 60)


async def test_late_records_reach_the_dead_letter_with_the_reason(nats_server):
    """Three records from before the watermark (an hour behind with a lateness of 5 s): each
    in the dead letter with the reason, none counted, the rest exact."""
    evs = events(2_000, seed=3, jitter=0.0)
    late = [{"user": "u1", "ts": BASE - 3600.0 + k, "n": 10_000 + k} for k in range(3)]
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="DEAD", subjects=["dead.>"]))
    await load(nats_server.url, [*evs[:1000], *late, *evs[1000:], {"user": "end", "ts": END_TS}])
    pipe, sink = windowed("lateness", dead_letter="dead.clicks")
    async with connect(nats_server.url) as nc:
        with trio.fail_after(60):
            stats = await run_until_caught_up(pipe, nc)
        js = JetStream(nc)
        info = await js.stream_info("DEAD")
        assert info.state.messages == 3
        copies = [await js.get_msg("DEAD", seq) for seq in range(1, 4)]
    assert stats.dead_lettered == 3
    for copy in copies:
        assert copy.headers is not None
        assert "late record" in (copy.headers.get("Headrace-Error") or "")
        assert json.loads(copy.data)["n"] >= 10_000
    assert as_counts(results_of(sink)) == tumbling_counts(evs, 60)


def sessions_brute_force(evs: list[dict[str, Any]], gap: float) -> Counter[tuple[str, int]]:
    """Per (user, session start in microseconds): sort each user's times, split at gaps."""
    by_user: dict[str, list[int]] = {}
    for e in evs:
        by_user.setdefault(e["user"], []).append(to_micros(e["ts"]))
    out: Counter[tuple[str, int]] = Counter()
    for user, times in by_user.items():
        times.sort()
        start, n = times[0], 1
        for prev, t in itertools.pairwise(times):
            if t - prev >= gap * 1_000_000:
                out[(user, start)] += n
                start, n = t, 0
            n += 1
        out[(user, start)] += n
    return out


@BACKENDS
async def test_session_windows_match_a_brute_force_computation(nats_server, backend):
    rng = random.Random(5)
    evs = []
    t = BASE
    for i in range(3_000):  # bursts with pauses: sessions of many lengths
        t += rng.choice([0.1, 0.2, 0.5, 3.0, 12.0])
        evs.append({"user": f"u{rng.randrange(5)}", "ts": t, "n": i})
    await load(nats_server.url, [*evs, {"user": "end", "ts": END_TS}])
    pipe, sink = windowed("sessions", assigner=SessionWindow(10.0), lateness=0.0, backend=backend)
    async with connect(nats_server.url) as nc:
        with trio.fail_after(60):
            await run_until_caught_up(pipe, nc)
    found: Counter[tuple[str, int]] = Counter()
    for r in results_of(sink):
        if r.key != "end":
            found[(r.key, r.start_us)] += r.value
    assert found == sessions_brute_force(evs, 10.0)


async def test_sliding_windows_count_each_record_in_every_window_it_falls_in(nats_server):
    evs = events(3_000, seed=7)
    await load(nats_server.url, [*evs, {"user": "end", "ts": END_TS}])
    pipe, sink = windowed("sliding", assigner=SlidingWindow(60, 20))
    async with connect(nats_server.url) as nc:
        with trio.fail_after(60):
            await run_until_caught_up(pipe, nc)
    expected: Counter[tuple[str, float]] = Counter()
    for e in evs:
        last = (e["ts"] // 20) * 20
        for start in (last, last - 20, last - 40):
            expected[(e["user"], start)] += 1
    assert as_counts(results_of(sink)) == expected


@pytest.mark.parametrize(
    ("before", "after"), [("memory", "memory"), ("disk", "disk"), ("disk", "memory")]
)
async def test_fold_keeps_a_running_total_per_key_across_a_restart(nats_server, before, after):
    evs = events(2_000, seed=11)
    backends = iter([before, after])

    def build() -> tuple[Pipeline, MemorySink]:
        sink = MemorySink()
        pipe = Pipeline("totals", drain_timeout=10.0)
        (
            pipe.source(JetStreamSource(stream="CLICKS", durable="totals"))
            .map(json.loads)
            .key_by(lambda e: e["user"])
            .fold(
                lambda: 0,
                lambda total, e: total + 1,
                snapshot_interval=0.2,
                backend=next(backends),
            )
            .sink(sink)
        )
        return pipe, sink

    await load(nats_server.url, evs[:1000])
    pipe, sink1 = build()
    async with connect(nats_server.url) as nc:
        with trio.fail_after(60):
            await run_until_caught_up(pipe, nc)
    await load(nats_server.url, evs[1000:])
    pipe, sink2 = build()
    async with connect(nats_server.url) as nc:
        with trio.fail_after(60):
            await run_until_caught_up(pipe, nc)
    outputs = [r.value for r in sink1.records + sink2.records]
    assert len(outputs) == len(evs)
    last: dict[str, int] = {}
    for user, total in outputs:
        assert total == last.get(user, 0) + 1  # each running total once, in order
        last[user] = total
    assert last == dict(Counter(e["user"] for e in evs))


async def test_a_second_process_on_the_same_state_is_fenced(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        a = await SnapshotStore.open(js, "fence", "op")
        b = await SnapshotStore.open(js, "fence", "op")
        assert await a.load() is None and await b.load() is None
        await a.save(b"one", "lineage")
        with pytest.raises(StateFenced):
            await b.save(b"two", "lineage")
        assert await b.load() == b"one"
        await b.save(b"three" * 300_000, "lineage")  # over one chunk
        assert await a.load() == b"three" * 300_000
        kv = await key_value(js, "headrace_state")
        assert len(await kv.keys("fence.op.>")) == 1 + 3  # the head and the last epoch's
        assert await SnapshotStore(kv, "fence", "op").reset()
        assert await kv.keys("fence.op.>") == []


def join_brute_force(
    orders: list[dict[str, Any]], payments: list[dict[str, Any]], size: float
) -> Counter[tuple[str, float, int, int]]:
    """Every (user, window start, order n, payment n) pair in the same 60 s window."""
    out: Counter[tuple[str, float, int, int]] = Counter()
    for o in orders:
        for p in payments:
            if o["user"] == p["user"] and o["ts"] // size == p["ts"] // size:
                out[(o["user"], (o["ts"] // size) * size, o["n"], p["n"])] += 1
    return out


async def test_a_windowed_join_pairs_what_a_brute_force_pairs(nats_server):
    """Orders and payments from two streams, joined per user in one-minute windows: the
    pairs equal those of a nested loop over both lists (inner join)."""
    rng = random.Random(13)
    orders = [
        {"user": f"u{rng.randrange(8)}", "ts": BASE + rng.uniform(0, 600), "n": i}
        for i in range(400)
    ]
    payments = [
        {"user": f"u{rng.randrange(8)}", "ts": BASE + rng.uniform(0, 600), "n": i}
        for i in range(300)
    ]
    orders.sort(key=lambda e: e["ts"])
    payments.sort(key=lambda e: e["ts"])
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"]))
        await js.add_stream(StreamConfig(name="PAYMENTS", subjects=["payments.>"]))
        # A far-future record closes every window; on each side, since the join's watermark is
        # the least of the two sides' (a side read ahead makes nothing of the other's late).
        end = {"user": "end", "ts": END_TS, "n": -1}
        await publish_acked(
            nc, ((f"orders.{o['user']}", json.dumps(o).encode(), None) for o in [*orders, end])
        )
        await publish_acked(
            nc, ((f"payments.{p['user']}", json.dumps(p).encode(), None) for p in payments)
        )
        await publish_acked(nc, [("payments.end", json.dumps(end).encode(), None)])
    sink = MemorySink()
    pipe = Pipeline("joins", drain_timeout=10.0)
    left = pipe.source(JetStreamSource(stream="ORDERS", durable="j")).map(json.loads)
    right = pipe.source(JetStreamSource(stream="PAYMENTS", durable="j")).map(json.loads)
    (
        left.key_by(lambda o: o["user"])
        .join(
            right.key_by(lambda p: p["user"]),
            TumblingWindow(60),
            event_time=lambda e: e["ts"],
            lateness=0.0,  # the events of each side are in order
            snapshot_interval=0.2,
        )
        .sink(sink)
    )
    async with connect(nats_server.url) as nc:
        with trio.fail_after(60):
            stats = await run_until_caught_up(pipe, nc)
    assert stats.terms == 0  # nothing late
    found: Counter[tuple[str, float, int, int]] = Counter()
    for record in sink.records:
        j = record.value
        assert isinstance(j, Joined)
        found[(j.key, j.start.timestamp(), j.left["n"], j.right["n"])] += 1
    assert found == join_brute_force(orders, payments, 60.0)
    assert found  # the data does pair


@pytest.mark.slow
async def test_a_lookup_enriches_each_record_from_kv_and_drops_or_keeps_the_missing(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        kv = await create_key_value(js, KeyValueConfig(bucket="plans"))
        for k in range(5):
            await kv.put(f"u{k}", json.dumps({"plan": "gold" if k % 2 else "free"}).encode())
    evs = events(500, users=8, seed=17)  # u5..u7 have no plan
    await load(nats_server.url, evs)

    def build(missing: str) -> tuple[Pipeline, MemorySink]:
        sink = MemorySink()
        pipe = Pipeline(f"enrich-{missing}", drain_timeout=10.0)
        (
            pipe.source(JetStreamSource(stream="CLICKS", durable=f"enrich-{missing}"))
            .map(json.loads)
            .lookup(
                "plans",
                key=lambda e: e["user"],
                into=lambda e, plan: {**e, "plan": plan and plan["plan"]},
                decode=json.loads,
                missing=missing,  # type: ignore[arg-type]
            )
            .sink(sink)
        )
        return pipe, sink

    for missing in ("keep", "drop"):
        pipe, sink = build(missing)
        async with connect(nats_server.url) as nc:
            with trio.fail_after(60):
                stats = await run_until_caught_up(pipe, nc)
        got = {r.value["n"]: r.value["plan"] for r in sink.records}
        want = {
            e["n"]: ("gold" if int(e["user"][1:]) % 2 else "free")
            if int(e["user"][1:]) < 5
            else None
            for e in evs
            if missing == "keep" or int(e["user"][1:]) < 5
        }
        assert got == want
        assert stats.acks == len(evs)


async def test_the_in_memory_harness_refuses_a_stateful_pipeline_in_words():
    from headrace.pipeline import PipelineError
    from headrace.testing import TestMessage, run_pipeline

    pipe, _ = windowed("memory")
    with pytest.raises(PipelineError, match="real=True"):
        async with run_pipeline(pipe, [TestMessage("clicks.u1", b"{}")], real=False):
            pass


async def test_a_stream_created_again_under_its_state_is_refused_in_words(nats_server):
    """The state's sequences name the old stream's messages: on the new stream they would
    skip new messages as taken. The run fails with StateStreamRecreated instead."""
    await load(nats_server.url, events(100, seed=19))
    pipe, _ = windowed("recreated")
    async with connect(nats_server.url) as nc:
        with trio.fail_after(60):
            await run_until_caught_up(pipe, nc)
        js = JetStream(nc)
        await js.delete_stream("CLICKS")
    await load(nats_server.url, events(100, seed=20))
    pipe, _ = windowed("recreated")
    async with connect(nats_server.url) as nc:
        with trio.fail_after(60), pytest.raises(StateStreamRecreated, match="created again"):
            await run_until_caught_up(pipe, nc)


class DownSink(MemorySink):
    """A sink that is down (ConnectionError) until ``up`` is set; counts its failed writes
    (``failed_often`` is set at the ``often``-th)."""

    def __init__(self, often: int = 1) -> None:
        super().__init__()
        self.up = trio.Event()
        self.failures = 0
        self.failed = trio.Event()
        self.often = often
        self.failed_often = trio.Event()

    async def write_batch(self, batch: Any) -> None:
        if not self.up.is_set():
            self.failures += 1
            self.failed.set()
            if self.failures >= self.often:
                self.failed_often.set()
            raise ConnectionError("the lake is down")
        await super().write_batch(batch)


@pytest.mark.slow
@BACKENDS
async def test_an_operator_waits_for_its_sinks_instead_of_piling_up_results(nats_server, backend):
    """Windows of one second close ~20 at a time while the sink is down: once 100 results
    wait for it (``max_pending_results``), the operator takes no more records, so the stream
    keeps them (the consumer has messages not even delivered), instead of the process holding
    every result. Once the sink is back, every window once, exact."""
    evs = events(6_000, seed=31)
    await load(nats_server.url, [*evs, {"user": "end", "ts": END_TS, "n": -1}])
    sink = DownSink(often=6)
    pipe = Pipeline(
        "pressure", drain_timeout=10.0, sink_retry=SinkRetry(backoff=0.2, backoff_max=0.2)
    )
    (
        pipe.source(JetStreamSource(stream="CLICKS", durable="pressure"))
        .map(json.loads)
        .key_by(lambda e: e["user"])
        .window(TumblingWindow(1), count(), event_time=lambda e: e["ts"], lateness=5.0,
                snapshot_interval=0.2, max_pending_results=100, backend=backend)
        .sink(sink, batch=BatchPolicy(max_messages=50))  # below the limit: no batch waits
    )  # fmt: skip
    async with connect(nats_server.url) as nc, pipe.running(nc) as run:
        stage: Any = run.stages["stateful:window"]
        with trio.fail_after(30):
            await sink.failed_often.wait()  # > 1 s of outage: 6,000 events take 0.3 s
            info = await JetStream(nc).consumer_info("CLICKS", "pressure")
            assert stage.stats.backpressured and stage.stats.backpressure_waits >= 1
            assert stage.stats.results_pending <= 100 + 200  # + what one batch closed
            assert info.num_pending > 0, "the operator read the whole stream anyway"
            sink.up.set()
            await run.wait_caught_up()
            await sink.wait_for(len(tumbling_counts(evs, 1)))
    assert not stage.stats.backpressured
    results = results_of(sink)
    assert len({(r.key, r.start) for r in results}) == len(results)
    assert as_counts(results) == tumbling_counts(evs, 1)


@pytest.mark.slow
async def test_window_results_wait_out_a_sink_outage_longer_than_the_ack_wait(nats_server):
    """The sink fails every write for 3 s, past the consumer's 1 s ack wait, while windows
    close: the results are retried in place and kept in the snapshots meanwhile, the inputs
    acked by the snapshots. Then every window once, exact; nothing naked, terminated or
    dead-lettered."""
    evs = events(6_000, seed=29)
    await load(nats_server.url, [*evs, {"user": "end", "ts": END_TS, "n": -1}])
    sink = DownSink()
    pipe = Pipeline("outage", drain_timeout=10.0, sink_retry=SinkRetry(backoff=0.2))
    (
        pipe.source(
            JetStreamSource(stream="CLICKS", durable="outage", config=ConsumerConfig(ack_wait=1.0))
        )
        .map(json.loads)
        .key_by(lambda e: e["user"])
        .window(TumblingWindow(60), count(), event_time=lambda e: e["ts"], lateness=5.0,
                snapshot_interval=0.2)
        .sink(sink)
    )  # fmt: skip
    async with connect(nats_server.url) as nc, pipe.running(nc) as run:
        with trio.fail_after(30):
            await sink.failed.wait()
            with trio.move_on_after(3.0):  # the outage's length: the fault, not a condition
                await trio.sleep_forever()
            sink.up.set()
            await run.wait_caught_up()
            await sink.wait_for(len(tumbling_counts(evs, 60)))
    stats = run.stats
    assert sink.failures >= 3
    assert stats.naks == 0 and stats.terms == 0 and stats.dead_lettered == 0
    results = results_of(sink)
    assert len({(r.key, r.start) for r in results}) == len(results)
    assert as_counts(results) == tumbling_counts(evs, 60)


def test_a_sink_batch_above_max_pending_results_is_refused_in_words():
    pipe, _ = windowed("refused", max_pending_results=100)
    with pytest.raises(PipelineError, match=r"batches 1000 messages, more than the max_pending"):
        pipe.validate()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"backend": "ssd"}, "backend must be 'memory' or 'disk'"),
        ({"state_dir": "/tmp"}, "state_dir is where backend='disk'"),
        ({"backend": "disk", "state_dir": "/no/such/dir"}, "is not a directory"),
        ({"backend": "disk", "cache_bytes": 1000}, "at least 1 MiB"),
        ({"max_pending_results": 0}, "positive int"),
    ],
)
def test_storage_options_are_checked_in_words(options: dict[str, Any], words: str):
    with pytest.raises(PipelineError, match=words):
        windowed("checked", **options)


def test_a_stateful_operator_on_an_ephemeral_consumer_is_refused_in_words():
    pipe = Pipeline("ephemeral")
    (
        pipe.source(JetStreamSource(stream="CLICKS"))
        .key_by(lambda e: e)
        .fold(lambda: 0, lambda n, _: n + 1)
        .sink(MemorySink())
    )
    with pytest.raises(PipelineError, match="an ephemeral consumer: its state outlives the run"):
        pipe.validate()


@pytest.mark.slow
async def test_a_state_read_through_another_durable_is_refused_in_words(nats_server):
    """A durable renamed under the same pipeline and operator would deliver again everything
    the state counted (its ack floor is not the state's): the run stops with
    StateConsumerChanged, and a reset lets the new consumer start afresh."""
    evs = events(500, seed=37)
    await load(nats_server.url, evs)

    def build(durable: str) -> Pipeline:
        pipe = Pipeline("renamed", drain_timeout=10.0)
        (
            # The refused run took messages: a short ack wait gets them back soon.
            pipe.source(
                JetStreamSource(
                    stream="CLICKS", durable=durable, config=ConsumerConfig(ack_wait=1.0)
                )
            )
            .map(json.loads)
            .key_by(lambda e: e["user"])
            .fold(lambda: 0, lambda n, _: n + 1, snapshot_interval=0.2)
            .sink(MemorySink())
        )
        return pipe

    async with connect(nats_server.url) as nc:
        with trio.fail_after(60):
            await run_until_caught_up(build("first"), nc)
            with pytest.raises(StateConsumerChanged, match="consumer first of stream 'CLICKS'"):
                await run_until_caught_up(build("second"), nc)
            store = await SnapshotStore.open(JetStream(nc), "renamed", "fold")
            assert await store.reset()
            stats = await run_until_caught_up(build("second"), nc)
    assert stats.acks == len(evs)


@pytest.mark.slow  # 60,000 events, two runs: some seconds
async def test_a_disk_operator_goes_on_from_a_snapshot_of_many_chunks(nats_server):
    """60,000 users in hour-long windows: some 38,000 windows open at once, a state file of
    megabytes whose snapshot spans several KV chunks, streamed out and back in."""
    evs = events(60_000, users=60_000, seed=41)
    first, second = evs[:30_000], evs[30_000:]
    await load(nats_server.url, first)
    kw: dict[str, Any] = {"assigner": TumblingWindow(3600), "backend": "disk"}
    pipe, sink1 = windowed("chunks", **kw)
    async with connect(nats_server.url) as nc:
        with trio.fail_after(60):
            await run_until_caught_up(pipe, nc)
        store = await SnapshotStore.open(JetStream(nc), "chunks", "window")
        payload = await store.load()
        assert store.head is not None and store.head.chunks >= 2 and payload is not None
        assert is_file_snapshot(payload)
    await load(nats_server.url, [*second, {"user": "end", "ts": END_TS, "n": -1}])
    pipe, sink2 = windowed("chunks", **kw)
    async with connect(nats_server.url) as nc:
        with trio.fail_after(60):
            await run_until_caught_up(pipe, nc)
    results = results_of(sink1) + results_of(sink2)
    assert len({(r.key, r.start) for r in results}) == len(results)
    assert as_counts(results) == tumbling_counts(evs, 3600)
