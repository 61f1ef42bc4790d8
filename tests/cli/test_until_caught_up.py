"""`headrace run --until-caught-up` as a process against a real nats-server: a backfill that
exits by itself, 0 only when every message the stream held is written once and acked; the
usual non-zero codes of docs/failures.md otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cli.cli_support import (
    consumer_info,
    create_stream,
    publish,
    read_jsonl,
    run_headrace,
    write_pipeline,
)
from tests.procs import json_events

BACKFILL = """\
def bad_three(order):
    if order["id"] == 3:
        raise ValueError("order 3 is poison")
    return order

pipeline = Pipeline(
    "backfill", nak_delay=0.05, nak_delay_max=0.1, max_deliveries=2, dead_letter=DEAD_LETTER
)
flow = pipeline.source(JetStreamSource(stream="ORDERS", durable="backfill")).map(json.loads)
if POISON:
    flow = flow.map(bad_three)
flow.sink(JsonlSink(OUT), name="files", batch=BatchPolicy(max_messages=7, max_age=0.05))
"""


def backfill(tmp_path: Path, *, poison: bool = False, dead_letter: str | None = None) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    body = f"OUT = {str(out)!r}\nPOISON = {poison!r}\nDEAD_LETTER = {dead_letter!r}\n" + BACKFILL
    return write_pipeline(tmp_path, body)


def events(stderr: bytes) -> list[dict[str, Any]]:
    return json_events(stderr.decode().splitlines())


async def test_exits_0_once_caught_up_with_every_message_written_once(
    nats_server, natspy, tmp_path: Path
) -> None:
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 40)
    path = backfill(tmp_path)
    done = await run_headrace(
        "run", f"{path}:pipeline", "--nats", nats_server.url, "--until-caught-up", "--json-logs"
    )
    assert done.returncode == 0, done.stderr.decode()
    assert sorted(r["value"]["id"] for r in read_jsonl(tmp_path / "out")) == list(range(40))
    said = [e["event"] for e in events(done.stderr)]
    assert said.index("caught_up") < said.index("stopped")
    info = await consumer_info(natspy, "backfill")
    assert info.ack_floor.stream_seq == 40 and info.num_ack_pending == 0


async def test_a_poison_message_dead_lettered_still_exits_0(
    nats_server, natspy, tmp_path: Path
) -> None:
    await create_stream(natspy, nats_server.url)
    await create_stream(natspy, nats_server.url, "DLQ")
    await publish(natspy, 10)
    path = backfill(tmp_path, poison=True, dead_letter="dlq.orders")
    done = await run_headrace(
        "run", f"{path}:pipeline", "--nats", nats_server.url, "--until-caught-up"
    )
    assert done.returncode == 0, done.stderr.decode()
    assert sorted(r["value"]["id"] for r in read_jsonl(tmp_path / "out")) == [
        i for i in range(10) if i != 3
    ]
    dlq = await natspy.call(natspy.nc.jetstream().stream_info, "DLQ")
    assert dlq.state.messages == 1


async def test_a_poison_message_terminated_unkept_exits_4(
    nats_server, natspy, tmp_path: Path
) -> None:
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 10)
    path = backfill(tmp_path, poison=True)
    done = await run_headrace(
        "run", f"{path}:pipeline", "--nats", nats_server.url, "--until-caught-up"
    )
    assert done.returncode == 4, done.stderr.decode()
    assert len(read_jsonl(tmp_path / "out")) == 9


async def test_with_workers_is_a_usage_error(nats_server, tmp_path: Path) -> None:
    path = backfill(tmp_path)
    done = await run_headrace(
        "run", f"{path}:pipeline", "--nats", nats_server.url, "--until-caught-up",
        "--workers", "2",
    )  # fmt: skip
    assert done.returncode == 2
    assert b"--until-caught-up cannot be combined with --workers" in done.stderr


STUCK = """\
from headrace.pipeline import SinkRetry

class Lake:
    \"\"\"A sink that fails every write with a plain error: every part of every batch fails,
    which is what an outage looks like.\"\"\"

    def write_batch(self, batch):
        raise OSError("the lake refuses everything")

pipeline = Pipeline("stuck", drain_timeout=1.0, sink_retry=SinkRetry(backoff=0.05, backoff_max=0.2))
pipeline.source(JetStreamSource(stream="ORDERS", durable="stuck")).map(json.loads).sink(
    Lake(), name="lake", batch=BatchPolicy(max_messages=16, max_age=0.05)
)
"""


@pytest.mark.slow
async def test_a_stuck_sink_is_said_and_timeout_ends_the_run_with_5(
    nats_server, natspy, tmp_path: Path
) -> None:
    """Every part of every batch fails: the sink is taken for down, a sink_stuck event says
    what was tried and what to do; --timeout drains and exits 5 instead of running on."""
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 16)
    path = write_pipeline(tmp_path, STUCK)
    done = await run_headrace(
        "run", f"{path}:pipeline", "--nats", nats_server.url, "--until-caught-up",
        "--timeout", "3", "--json-logs",
    )  # fmt: skip
    assert done.returncode == 5, done.stderr.decode()
    said = events(done.stderr)
    stuck = [e for e in said if e["event"] == "sink_stuck"]
    assert stuck, [e["event"] for e in said]
    text = str(stuck[0]["error"])
    assert "a batch of 16 messages failed" in text and "every part failed" in text
    assert "transient=False" in text
    [late] = [e for e in said if e["event"] == "not_caught_up"]
    assert late["timeout"] == 3.0
    reason = [e for e in said if e["event"] == "exit_reason"]
    assert reason and "not caught up within --timeout 3s" in str(reason[-1])
    info = await consumer_info(natspy, "stuck")
    assert info.ack_floor.stream_seq == 0  # nothing acked: every message comes again


async def test_timeout_without_until_caught_up_is_a_usage_error(tmp_path: Path) -> None:
    path = backfill(tmp_path)
    done = await run_headrace("run", f"{path}:pipeline", "--timeout", "3")
    assert done.returncode == 2
    assert b"--timeout is how long --until-caught-up may take" in done.stderr
