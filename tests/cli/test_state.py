"""``headrace state show|reset`` and the stateful operators' figures in ``headrace run``'s
metrics and progress.

Against a real nats-server: a windowed pipeline runs (in this process, or as ``headrace run``)
over events whose windows are computed here without headrace; what ``state show --decode`` and
the metrics say is checked against that. Without a server: the decoding, the words, the
confirmation, the metrics exposition and the progress lines of given figures.

Events are JSON ``{"user": u, "ts": seconds, "n": i}`` on ``clicks.<u>``; no event moves the
watermark past the last windows, so some stay open.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import pickle
import random
import signal
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from headrace.cli.metrics import Snapshot, render
from headrace.cli.progress import LiveView, PlainLines, Sample
from headrace.cli.state import StateCommandError, confirm, decode, describe
from headrace.cli.workers import Worker, combine_stats
from headrace.jetstream import JetStream, StreamConfig, publish_acked
from headrace.jetstream.kv import key_value
from headrace.nats import connect
from headrace.pipeline import JetStreamSource, Pipeline, run_until_caught_up
from headrace.pipeline.stats import STATEFUL, PipelineStats, state_figures
from headrace.sinks import MemorySink
from headrace.state import TumblingWindow, WindowOperator, WindowResult, count, to_micros
from headrace.state.snapshots import SnapshotStore

from tests.cli.cli_support import headrace, metrics_samples, run_headrace, write_pipeline

BASE = 1_700_000_000.0
SIZE = 60.0
LATENESS = 5.0


def events(n: int, *, seed: int, start: float = BASE, users: int = 7) -> list[dict[str, Any]]:
    """``n`` events 0.5 s apart from ``start``, each moved up to a second either way."""
    rng = random.Random(seed)
    return [
        {"user": f"u{rng.randrange(users)}", "ts": start + i * 0.5 + rng.uniform(-1, 1), "n": i}
        for i in range(n)
    ]


def windows_of(evs: list[dict[str, Any]]) -> Counter[tuple[str, float]]:
    """Per (user, window start): the count, computed without headrace."""
    return Counter((e["user"], (e["ts"] // SIZE) * SIZE) for e in evs)


async def load(url: str, evs: list[dict[str, Any]]) -> None:
    async with connect(url) as nc:
        js = JetStream(nc)
        try:
            await js.add_stream(StreamConfig(name="CLICKS", subjects=["clicks.>"]))
        except Exception:
            pass  # made by an earlier call
        await publish_acked(
            nc, ((f"clicks.{e['user']}", json.dumps(e).encode(), None) for e in evs)
        )


def windowed(
    name: str, dead_letter: str | None = None, backend: str = "memory"
) -> tuple[Pipeline, MemorySink]:
    sink = MemorySink()
    pipe = Pipeline(name, drain_timeout=10.0, dead_letter=dead_letter)
    (
        pipe.source(JetStreamSource(stream="CLICKS", durable=name))
        .map(json.loads)
        .key_by(lambda e: e["user"])
        .window(
            TumblingWindow(SIZE),
            count(),
            event_time=lambda e: e["ts"],
            lateness=LATENESS,
            snapshot_interval=0.2,
            backend=backend,  # type: ignore[arg-type]
        )
        .sink(sink)
    )
    return pipe, sink


async def run_pipeline(
    url: str, name: str, dead_letter: str | None = None, backend: str = "memory"
) -> list[WindowResult]:
    pipe, sink = windowed(name, dead_letter, backend)
    async with connect(url) as nc:
        with trio.fail_after(60):
            await run_until_caught_up(pipe, nc)
    return [r.value for r in sink.records if isinstance(r.value, WindowResult)]


def still_open(evs: list[dict[str, Any]], results: list[WindowResult]) -> tuple[int, int]:
    """(open windows, keys with one) left: the windows of the events less those emitted."""
    emitted = {(r.key, r.start.timestamp()) for r in results}
    left = set(windows_of(evs)) - emitted
    assert emitted <= set(windows_of(evs))
    return len(left), len({user for user, _ in left})


async def state(url: str, *args: str) -> Any:
    return await run_headrace("state", *args, "--nats", url)


def json_lines(done: Any) -> list[dict[str, Any]]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


# -- against a real server --------------------------------------------------------------------


@pytest.mark.slow
async def test_show_decodes_the_snapshot_of_an_operator_on_disk(nats_server: Any) -> None:
    url = nats_server.url
    evs = events(1_500, seed=3)
    await load(url, evs)
    results = await run_pipeline(url, "ondisk", backend="disk")
    open_windows, keys = still_open(evs, results)
    assert open_windows > 0
    [shown] = json_lines(await state(url, "show", "ondisk", "window", "--json", "--decode"))
    got = shown["state"]
    assert got["backend"] == "disk" and got["kind"] == "window"
    assert (got["open_windows"], got["keys"]) == (open_windows, keys)
    assert got["next_result"] == len(results) + 1
    assert got["assigner"] == {"type": "tumbling", "size": SIZE, "slide": SIZE, "align": 0.0}
    assert sum(t["sequences"] for t in got["taken"].values()) >= 1
    done = await state(url, "show", "ondisk", "window", "--decode")
    assert done.returncode == 0, done.stderr
    assert "tumbling windows of 1m, lateness 5s, kept on disk" in done.stdout.decode()


@pytest.mark.slow
async def test_show_before_and_after_a_windowed_run(nats_server: Any) -> None:
    url = nats_server.url
    done = await state(url, "show", "clicks")
    assert done.returncode == 2
    assert b"headrace state show: there is no state bucket 'headrace_state'" in done.stderr

    evs = events(1_500, seed=1)
    late = [{"user": "u1", "ts": BASE - 3600.0 + k, "n": 10_000 + k} for k in range(3)]
    async with connect(url) as nc:
        await JetStream(nc).add_stream(StreamConfig(name="DEAD", subjects=["dead.>"]))
    await load(url, [*evs[:700], *late, *evs[700:]])
    before = dt.datetime.now(dt.UTC)
    results = await run_pipeline(url, "clicks", dead_letter="dead.clicks")
    open_windows, keys = still_open(evs, results)
    assert open_windows > 0 and results

    # The head only: no --decode, nothing unpickled.
    [head] = json_lines(await state(url, "show", "clicks", "--json"))
    assert head["pipeline"] == "clicks" and head["operator"] == "window"
    assert head["bucket"] == "headrace_state" and head["key"] == "clicks.window.head"
    # A small snapshot travels in its head (snapshots.INLINE): no chunk.
    assert head["epoch"] >= 1 and head["chunks"] == 0 and head["size"] > 0
    assert head["format"] == 1 and len(head["digest"]) == 64 and head["revision"] >= 1
    saved = dt.datetime.fromisoformat(head["saved"].replace("Z", "+00:00"))
    lineage = dt.datetime.fromisoformat(head["lineage"].replace("Z", "+00:00"))
    assert before <= lineage <= saved <= dt.datetime.now(dt.UTC)
    assert "state" not in head

    # Decoded: the open windows are those the events make less those the pipeline emitted.
    [shown] = json_lines(await state(url, "show", "clicks", "window", "--json", "--decode"))
    assert {k: v for k, v in shown.items() if k != "state"} == head
    got = shown["state"]
    assert got["kind"] == "window"
    assert got["open_windows"] == open_windows
    assert got["keys"] == keys
    assert got["next_result"] == len(results) + 1
    assert 0 <= got["results_pending"] <= len(results)
    assert got["late"] == 3
    assert got["assigner"] == {"type": "tumbling", "size": SIZE, "slide": SIZE, "align": 0.0}
    assert got["lateness"] == LATENESS
    newest = max(e["ts"] for e in evs)
    assert got["max_event_time"] == _iso(newest)
    mark = dt.datetime.fromisoformat(got["watermark"].replace("Z", "+00:00")).timestamp()
    assert abs(newest - LATENESS - mark) < 1e-5
    assert set(got["taken"]) <= {"CLICKS"}
    for t in got["taken"].values():
        assert 0 < t["sequences"] <= len(evs) + len(late) and t["intervals"] >= 1

    # In words.
    done = await state(url, "show", "clicks")
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    assert "clicks/window   bucket 'headrace_state', key clicks.window.head" in text
    assert f"epoch {head['epoch']}" in text and f"lineage   {head['lineage']}" in text
    assert "--decode" in text
    done = await state(url, "show", "clicks", "--decode")
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    assert "tumbling windows of 1m, lateness 5s" in text
    assert f"windows   {open_windows:,} open, of {keys} keys" in text
    assert "late      3 records" in text

    # What is not there is named, with what is.
    done = await state(url, "show", "clicks", "nope")
    assert done.returncode == 2
    assert b"pipeline 'clicks' has no state of operator 'nope'" in done.stderr
    assert b"(its stateful operators with state: window)" in done.stderr
    done = await state(url, "show", "other")
    assert done.returncode == 2
    assert b"holds no state of pipeline 'other' (it holds state of: clicks;" in done.stderr
    done = await state(url, "show", "clicks", "--bucket", "elsewhere")
    assert done.returncode == 2 and b"no state bucket 'elsewhere'" in done.stderr


def _iso(seconds: float) -> str:
    us = to_micros(seconds)
    moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=us)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


@pytest.mark.slow
async def test_reset_removes_the_state_and_the_next_run_starts_afresh(nats_server: Any) -> None:
    url = nats_server.url
    first = events(600, seed=2)
    await load(url, first)
    await run_pipeline(url, "again")
    [old] = json_lines(await state(url, "show", "again", "--json"))

    # Not on a terminal and no --yes: refused, nothing removed.
    done = await state(url, "reset", "again", "window")
    assert done.returncode == 2
    assert b"confirm with --yes (standard input is not a terminal" in done.stderr
    assert json_lines(await state(url, "show", "again", "--json")) == [old]

    for args, message in [
        (("again", "nope"), b"pipeline 'again' has no state of operator 'nope'"),
        (("other", "window"), b"holds no state of pipeline 'other'"),
    ]:
        done = await state(url, "reset", *args, "--yes")
        assert done.returncode == 2 and message in done.stderr, done.stderr

    done = await state(url, "reset", "again", "window", "--yes")
    assert done.returncode == 0, done.stderr
    assert b"reset the state of again/window" in done.stdout
    async with connect(url) as nc:
        kv = await key_value(JetStream(nc), "headrace_state")
        assert await kv.keys("again.window.>") == []
    done = await state(url, "show", "again")
    assert done.returncode == 2 and b"holds no state of pipeline 'again'" in done.stderr

    # The next run starts afresh: a new lineage, and only the new events in its windows.
    second = events(400, seed=3, start=BASE + 86_400.0)
    await load(url, second)
    results = await run_pipeline(url, "again")
    [new] = json_lines(await state(url, "show", "again", "--json", "--decode"))
    assert new["lineage"] > old["lineage"]
    open_windows, keys = still_open(second, results)
    assert new["state"]["open_windows"] == open_windows and new["state"]["keys"] == keys
    assert all(r.start.timestamp() >= BASE + 86_000 for r in results)


async def test_the_metrics_and_progress_of_a_windowed_run(nats_server: Any, tmp_path: Path) -> None:
    url = nats_server.url
    evs = events(800, seed=4)
    await load(url, evs)
    path = write_pipeline(
        tmp_path,
        """\
        from headrace.state import TumblingWindow, count
        pipeline = Pipeline("live")
        (
            pipeline.source(JetStreamSource(stream="CLICKS", durable="live"))
            .map(json.loads)
            .key_by(lambda e: e["user"])
            .window(TumblingWindow(60), count(), event_time=lambda e: e["ts"], lateness=5,
                    snapshot_interval=0.2, name="per-minute")
            .sink(MemorySink(), name="out", batch=BatchPolicy(max_messages=50, max_age=0.1))
        )
        """,
    )
    args = ["run", str(path), "--nats", url, "--json-logs", "--interval", "0.1"]
    async with headrace(*args, "--metrics-port", "0") as proc:
        _, metrics = await proc.wait_event("metrics")

        def settled(e: dict[str, Any]) -> bool:
            op = e["stats"].get(STATEFUL, {}).get("per-minute", {})
            done = e["stats"]["acks"] == len(evs)
            return done and op.get("held") == 0 and op.get("snapshots", 0) > 0

        _, progress = await proc.wait_event("progress", settled)
        figures = progress["stats"][STATEFUL]["per-minute"]
        samples = await metrics_samples(metrics["port"])
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit() == 0

    assert figures["kind"] == "window" and figures["late"] == 0
    assert figures["open_windows"] > 0 and 0 < figures["keys"] <= 7
    assert figures["watermark_lag"] == pytest.approx(5.0, abs=1e-5)
    assert figures["event_time_lag"] > 365 * 86400  # the events are from 2023
    labels = 'pipeline="live",operator="per-minute"'

    def sample(name: str) -> float:
        return samples[f"{name}{{{labels}}}"]

    assert sample("headrace_state_open_windows") == figures["open_windows"]
    assert sample("headrace_state_keys") == figures["keys"]
    assert sample("headrace_state_watermark_lag_seconds") == pytest.approx(5.0, abs=1e-5)
    assert sample("headrace_state_event_time_lag_seconds") > 365 * 86400
    assert sample("headrace_state_late_records_total") == 0
    assert sample("headrace_state_held_messages") == 0
    assert sample("headrace_state_results_pending") >= 0
    snapshots = sample("headrace_state_snapshots_total")
    assert snapshots >= figures["snapshots"] >= 1
    assert sample("headrace_state_snapshot_seconds_count") == snapshots
    assert 0 < sample("headrace_state_snapshot_seconds_sum") < snapshots * 5
    assert sample("headrace_state_snapshot_bytes") > 0


# -- without a server -------------------------------------------------------------------------


def _operator() -> WindowOperator:
    """Windows of a and b; the watermark (130 - 5 s past BASE) closed the first ones."""
    op = WindowOperator(TumblingWindow(60), count(), dt.timedelta(seconds=5))
    for i, (user, t) in enumerate([("a", 0.0), ("b", 10.0), ("a", 70.0), ("a", 130.0)]):
        assert op.add(user, to_micros(BASE + t), i)
    op.fire()
    return op


def _payload(**changes: Any) -> bytes:
    state = {
        "format": 1,
        "kind": "window",
        "next_seq": 4,
        "pending": [(3, ("result", 0))],
        "taken": {"CLICKS": [(1, 10), (12, 12)]},
        "windows": _operator().snapshot(),
        "keyed": None,
        "late": 2,
        **changes,
    }
    return zlib.compress(pickle.dumps(state))


def test_decode_counts_what_a_snapshot_holds() -> None:
    got = decode(_payload())
    op = _operator()
    assert got["kind"] == "window"
    assert got["open_windows"] == op.open_windows >= 1 and got["keys"] == op.keys >= 1
    assert got["results_pending"] == 1 and got["next_result"] == 4 and got["late"] == 2
    assert got["taken"] == {"CLICKS": {"sequences": 11, "intervals": 2, "first": 1, "last": 12}}
    assert got["lateness"] == 5.0
    assert got["watermark"] == _iso(BASE + 125.0)
    assert got["max_event_time"] == _iso(BASE + 130.0)
    lines = describe(
        {
            "pipeline": "p",
            "operator": "w",
            "bucket": "headrace_state",
            "key": "p.w.head",
            "epoch": 3,
            "saved": "2026-01-01T00:00:00.000000Z",
            "lineage": "2025-12-31T00:00:00.000000Z",
            "size": 2048,
            "chunks": 1,
            "state": got,
        },
        now=dt.datetime(2026, 1, 1, 0, 1, 30, tzinfo=dt.UTC).timestamp(),
    )
    text = "\n".join(lines)
    assert "epoch 3, saved 2026-01-01T00:00:00.000000Z (1m30s ago), 2.0 KiB (2,048 bytes)" in text
    assert "tumbling windows of 1m, lateness 5s" in text
    assert f"windows   {op.open_windows} open, of {op.keys} keys" in text
    assert "results   1 pending (not known to be committed when saved), next #4" in text
    assert "taken     CLICKS: 11 sequences above the ack floor in 2 intervals (1..12)" in text


def test_decode_of_keyed_state_and_of_what_is_no_snapshot() -> None:
    keyed = decode(_payload(kind="map", windows=None, keyed=[("a", 1, 0.0), ("b", 2, 0.0)]))
    assert keyed["kind"] == "map" and keyed["keys"] == 2 and keyed["open_windows"] is None
    with pytest.raises(ValueError, match="newer than this headrace reads"):
        decode(_payload(format=99))
    with pytest.raises(ValueError, match="not the snapshot"):
        decode(zlib.compress(pickle.dumps([1, 2])))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_confirm_asks_on_a_terminal_only() -> None:
    out = io.StringIO()
    assert confirm("Reset it?", _Terminal("y\n"), out) is True
    assert out.getvalue() == "Reset it? [y/N] "
    assert confirm("Reset it?", _Terminal("YES\n"), io.StringIO()) is True
    assert confirm("Reset it?", _Terminal("\n"), io.StringIO()) is False
    assert confirm("Reset it?", _Terminal(""), io.StringIO()) is False  # end of input
    with pytest.raises(StateCommandError, match="confirm with --yes"):
        confirm("Reset it?", io.StringIO("y\n"), io.StringIO())


def _figures(**kw: Any) -> dict[str, Any]:
    base = {
        "kind": "window",
        "keys": 120,
        "open_windows": 240,
        "watermark": 1000.0,
        "max_event_time": 1030.0,
        "watermark_lag": 30.0,
        "event_time_lag": 31.5,
        "late": 3,
        "held": 17,
        "results_pending": 2,
        "results_emitted": 50,
        "skipped_redeliveries": 0,
        "snapshots": 42,
        "snapshot_bytes": 12_288,
        "snapshot_seconds": 0.126,
        "epoch": 42,
    }
    return {**base, **kw}


def _stats(state: dict[str, Any]) -> dict[str, Any]:
    return {**PipelineStats().snapshot(), STATEFUL: state}


def test_metrics_of_stateful_operators() -> None:
    state = {
        "per-minute": _figures(),
        'odd "name"': _figures(kind="map", open_windows=0, watermark_lag=None, event_time_lag=None),
    }
    text = render(Snapshot(pipeline="p", stats=_stats(state), states={}))
    lines = text.splitlines()
    a = 'pipeline="p",operator="per-minute"'
    b = 'pipeline="p",operator="odd \\"name\\""'
    for line in [
        f"headrace_state_keys{{{a}}} 120",
        f"headrace_state_open_windows{{{a}}} 240",
        f"headrace_state_watermark_lag_seconds{{{a}}} 30.0",
        f"headrace_state_event_time_lag_seconds{{{a}}} 31.5",
        f"headrace_state_late_records_total{{{a}}} 3",
        f"headrace_state_held_messages{{{a}}} 17",
        f"headrace_state_results_pending{{{a}}} 2",
        f"headrace_state_snapshots_total{{{a}}} 42",
        f"headrace_state_snapshot_bytes{{{a}}} 12288",
        f"headrace_state_snapshot_seconds_sum{{{a}}} 0.126",
        f"headrace_state_snapshot_seconds_count{{{a}}} 42",
        "# TYPE headrace_state_late_records_total counter",
        "# TYPE headrace_state_snapshot_seconds summary",
        f"headrace_state_keys{{{b}}} 120",
    ]:
        assert line in lines, line
    assert f"headrace_state_watermark_lag_seconds{{{b}}}" not in text  # no watermark: no sample
    typed = [line.split()[2] for line in lines if line.startswith("# TYPE ")]
    assert len(typed) == len(set(typed))
    # A pipeline without stateful operators has none of these metrics.
    plain = render(Snapshot(pipeline="p", stats=PipelineStats().snapshot(), states={}))
    assert "headrace_state_" not in plain


def _sample(state: dict[str, Any]) -> Sample:
    return Sample(
        pipeline="p",
        uptime=5.0,
        stats=_stats(state),
        states={"stateful:per-minute": "running"},
        rate=0.0,
        out_rate=0.0,
    )


def test_progress_shows_stateful_operators() -> None:
    state = {"per-minute": _figures(), "totals": _figures(kind="map", open_windows=0, keys=9)}
    out = io.StringIO()
    PlainLines(out).progress(_sample(state))
    line = out.getvalue()
    for part in [
        "state_keys=129",
        "windows_open=240",
        "wm_lag=30.0s",
        "event_lag=31.5s",
        "late=6",
        "state_held=34",
        "results_pending=4",
        "snapshots=84",
    ]:
        assert f" {part} " in line, line
    out = io.StringIO()
    PlainLines(out).progress(_sample({}))
    assert "state_keys" not in out.getvalue()

    view = LiveView(io.StringIO())
    view._width = lambda: 400  # type: ignore[method-assign]
    lines = view._block(_sample(state))
    [head] = [line for line in lines if line.startswith("  state ")]
    assert head.endswith("2 stateful   windows 240 open, wm lag 30s, late 6")
    [windows] = [line for line in lines if line.startswith("    per-minute")]
    assert windows.endswith(
        "  120 keys, 240 windows open, wm lag 30s (31s behind the clock), late 3, held 17, "
        "pending 2, snapshots 42 (last 12.0 KiB, avg 3.0ms)"
    )
    [keyed] = [line for line in lines if line.startswith("    totals")]
    assert "  9 keys, late 3," in keyed and "windows" not in keyed
    assert not [line for line in view._block(_sample({})) if line.startswith("  state ")]


def test_state_figures_of_a_run_and_of_workers() -> None:
    class Stage:
        def __init__(self, **kw: Any) -> None:
            from headrace.pipeline.stateful import StateStats

            self.stats = StateStats(**kw)

    stages = {
        "stateful:w": Stage(watermark=100.0, max_event_time=105.0, open_windows=4, epoch=3),
        "stateful:m": Stage(keys=2),
        "map:parse": object(),
    }
    found = state_figures(stages, now=160.0)
    assert set(found) == {"w", "m"}
    assert found["w"]["watermark_lag"] == 5.0 and found["w"]["event_time_lag"] == 60.0
    assert found["w"]["open_windows"] == 4
    assert found["m"]["watermark_lag"] is None and found["m"]["event_time_lag"] is None
    json.dumps(found)  # goes into JSON progress lines as it is

    # With --workers: per operator, the figures of the worker with the newest snapshot.
    owner, fenced, plain = Worker(0), Worker(1), Worker(2)
    owner.report({"messages_in": 5, STATEFUL: {"w": {"epoch": 9, "keys": 3}}}, now=1.0)
    fenced.report({"messages_in": 1, STATEFUL: {"w": {"epoch": 2, "keys": 1}}}, now=1.0)
    plain.report({"messages_in": 1}, now=1.0)
    total = combine_stats([fenced, owner, plain])
    assert total[STATEFUL] == {"w": {"epoch": 9, "keys": 3}}
    assert total["messages_in"] == 7
    assert STATEFUL not in combine_stats([plain])


@pytest.mark.slow
async def test_bad_arguments_exit_2() -> None:
    done = await run_headrace("state", "reset", "onlypipeline")
    assert done.returncode == 2
    done = await run_headrace("state", "show")
    assert done.returncode == 2
    done = await run_headrace("state", "show", "--help")
    assert done.returncode == 0
    assert b"unpickles" in done.stdout and b"--decode" in done.stdout
    done = await run_headrace("state", "reset", "--help")
    assert b"StateFenced" in done.stdout


async def test_no_server_exits_2(tmp_path: Path) -> None:
    from tests.servers import free_port

    done = await run_headrace(
        "state", "show", "p", "--nats", f"nats://127.0.0.1:{free_port()}", "--connect-timeout", "1"
    )
    assert done.returncode == 2
    assert b"headrace state show: cannot connect to NATS" in done.stderr


@pytest.mark.slow
async def test_heads_name_their_operator_whatever_its_key(nats_server: Any) -> None:
    """Names that are not one key token are hashed in the key; the head records them, and
    `show` names the operator so. A head written before heads recorded names is shown under
    its token. A snapshot that does not decode is said, exit code 2."""
    url = nats_server.url
    async with connect(url) as nc:
        js = JetStream(nc)
        store = await SnapshotStore.open(js, "my pipeline", "per.minute")
        head = await store.save(b"not a snapshot", "2026-01-01T00:00:00.000000Z")
        assert store.prefix.count(".") == 1
        assert all(token.startswith("h") for token in store.prefix.split("."))  # hashes
        old = attrs.evolve(head, pipeline="", operator="")
        await store.kv.put(f"{store.prefix.split('.')[0]}.legacy.head", old.to_json())
    rows = json_lines(await state(url, "show", "my pipeline", "--json"))
    assert [(r["pipeline"], r["operator"]) for r in rows] == [
        ("my pipeline", "legacy"),
        ("my pipeline", "per.minute"),
    ]
    assert rows[1]["key"] == f"{store.prefix}.head" and rows[1]["epoch"] == 1
    [one] = json_lines(await state(url, "show", "my pipeline", "per.minute", "--json"))
    assert one == rows[1]
    done = await state(url, "show", "my pipeline", "per.minute", "--decode")
    assert done.returncode == 2
    assert b"the snapshot of my pipeline/per.minute (epoch 1) does not decode here" in done.stderr


CLICKSTREAM = Path(__file__).resolve().parents[2] / "examples" / "clickstream_windows.py"


async def test_run_refuses_several_workers_for_a_stateful_pipeline(nats_server) -> None:
    """A second worker would be fenced off, restarted and fenced again: refused in words
    before any starts (exit 2)."""
    done = await run_headrace("run", str(CLICKSTREAM), "--nats", nats_server.url, "--workers", "2")
    assert done.returncode == 2, done.stderr.decode()
    assert b"keeps state (per-minute), which one worker owns; partition its keys" in done.stderr
