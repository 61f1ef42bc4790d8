"""A sink outage through `headrace run`, the way it happens in production: the lake goes away
for 20 s (several times the consumer's ack wait) and comes back. With the defaults, and with a
dead letter and few deliveries allowed, nothing is terminated or dead-lettered, every message is
written exactly once and the run exits 0. With a retry deadline shorter than the outage, the run
exits non-zero and everything it held is delivered again (naked, not terminated).

The sink is the real jsonl sink (its output shared through the commit state, as inside any
pipeline); the outage is a file whose presence makes its writes fail, the way a mount that went
away fails them."""

from __future__ import annotations

import collections
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.cli.cli_support import (
    consumer_info,
    create_stream,
    headrace,
    publish,
    read_jsonl,
    write_pipeline,
)
from tests.natspy_peer import wait_consumer
from tests.procs import json_events

N = 2_000
#: How long the lake is down: the point of the test (four times the consumer's ack wait).
OUTAGE = 20.0

PIPELINE = """\
class Lake(JsonlSink):
    # Down while the file DOWN exists: every write fails as a vanished mount fails it.
    def write_batch(self, batch):
        if DOWN.exists():
            raise OSError("the lake is down")
        super().write_batch(batch)


pipeline = Pipeline("outage", **OPTIONS)
pipeline.source(
    JetStreamSource(
        stream="ORDERS",
        durable="lake",
        config=ConsumerConfig(ack_wait=5.0, max_ack_pending=1000),
    )
).sink(Lake(OUT, fsync=False), name="lake", batch=BatchPolicy(max_messages=100, max_age=0.2))
"""


def pipeline_file(tmp_path: Path, options: str) -> tuple[Path, Path, Path]:
    out, down = tmp_path / "out", tmp_path / "DOWN"
    head = "from pathlib import Path\nfrom headrace.pipeline import SinkRetry\n\n"
    head += f"OUT = {str(out)!r}\nDOWN = Path({str(down)!r})\nOPTIONS = {options}\n"
    return write_pipeline(tmp_path, head + PIPELINE), out, down


def events(process: Any) -> list[dict[str, Any]]:
    """The JSON events on stderr (the one line that says why a run failed is for people)."""
    return json_events(process.err)


def stats(process: Any) -> dict[str, Any]:
    """The last progress event's counters."""
    progress = [e for e in events(process) if e.get("event") in ("progress", "stopped")]
    return dict(progress[-1]["stats"])


def assert_exactly_once(out: Path) -> None:
    seqs = collections.Counter(line["stream_seq"] for line in read_jsonl(out))
    twice = [seq for seq, n in seqs.items() if n > 1]
    assert twice == [], f"{len(twice)} sequences written more than once: {twice[:10]}"
    missing = sorted(set(range(1, N + 1)) - set(seqs))
    assert missing == [], f"{len(missing)} sequences missing: {missing[:10]}"


async def dead_letters(natspy: Any) -> int:
    info = await natspy.call(natspy.nc.jetstream().stream_info, "DLQ")
    return int(info.state.messages)


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    ["dict()", "dict(dead_letter='dlq.outage', max_deliveries=2)"],
    ids=["defaults", "dead-letter"],
)
async def test_an_outage_of_twenty_seconds_loses_and_duplicates_nothing(
    nats_server: Any, natspy: Any, tmp_path: Path, options: str
) -> None:
    await create_stream(natspy, nats_server.url)
    await create_stream(natspy, nats_server.url, "DLQ")
    await publish(natspy, N)
    path, out, down = pipeline_file(tmp_path, options)
    down.touch()
    args = ("run", str(path), "--nats", nats_server.url, "--json-logs", "--interval", "0.2")
    async with headrace(*args) as run:
        await run.wait_event("progress", lambda e: e["stats"]["sink_retries"] >= 2, timeout=30)
        await trio.sleep(OUTAGE)  # the outage itself: time is what is being tested
        during = stats(run)
        assert during["retrying"] == 1 and during["batches_committed"] == 0, during
        assert during["in_progress"] > 0, "held messages were not kept alive past ack_wait"
        down.unlink()
        await wait_consumer(
            natspy,
            lambda i: i.ack_floor.stream_seq == N and i.num_ack_pending == 0,
            stream="ORDERS",
            durable="lake",
            timeout=60,
        )
        run.signal(signal.SIGINT)
        assert await run.wait_exit() == 0, run.transcript()
    final = stats(run)
    assert final["terms"] == 0 and final["dead_lettered"] == 0, final
    assert final["naks"] == 0 and final["terminated_unkept"] == 0, final
    assert final["retrying"] == 0 and final["acks"] == N, final
    info = await consumer_info(natspy, "lake")
    assert info.num_redelivered == 0, "the outage made the server deliver again"
    assert await dead_letters(natspy) == 0
    assert_exactly_once(out)


@pytest.mark.slow
async def test_an_outage_past_the_retry_deadline_fails_the_run_and_terminates_nothing(
    nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    await create_stream(natspy, nats_server.url)
    await create_stream(natspy, nats_server.url, "DLQ")
    await publish(natspy, N)
    options = "dict(dead_letter='dlq.outage', max_deliveries=1, sink_retry=SinkRetry(deadline=3))"
    path, out, down = pipeline_file(tmp_path, options)
    down.touch()
    args = ("run", str(path), "--nats", nats_server.url, "--json-logs", "--interval", "0.2")
    async with headrace(*args) as run:
        code = await run.wait_exit(timeout=60)
    assert code == 1, run.transcript()
    stopped = [e for e in events(run) if e.get("event") == "stopped"]
    assert [e["exit_code"] for e in stopped] == [1]
    errors = [e for e in events(run) if e.get("event") == "error" and e.get("fatal")]
    assert errors and "SinkOutage" in errors[-1]["error"], errors
    final = stats(run)
    assert final["terms"] == 0 and final["dead_lettered"] == 0, final
    assert final["naks"] > 0 and final["acks"] == 0, final
    assert await dead_letters(natspy) == 0
    assert not out.exists() or read_jsonl(out) == []
    # Every message is still the consumer's to deliver: nothing was terminated.
    info = await consumer_info(natspy, "lake")
    assert info.ack_floor.stream_seq == 0
    assert info.num_pending + info.num_ack_pending == N, info
