"""Exactly once across a crash between the Spark commit and the ack.

A child process runs a pipeline from a durable JetStream consumer into a parquet SparkSink and
SIGKILLs itself from ``on_commit`` after its second commit: that batch is in the ledger and its
files are in place, but ``write_batch`` never returned, so its messages were never acked. A
second child consumes everything again (the redeliveries included) until nats-py sees every
message acked; the output, read by Spark, then holds each message exactly once, and the second
child reports the redelivered committed records as skipped.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from headrace.sinks import CONTROL
from headrace_spark.ledger import CommitLedger

from tests.natspy_peer import consumer_info, wait_consumer
from tests.spark.spark_procs import child

pytestmark = [pytest.mark.spark, pytest.mark.slow]

M = 300  # messages, in batches of 50 (crash_child.py)
KILL_AFTER = 2


async def add_stream_and_publish(natspy: Any, count: int) -> list[int]:
    """Stream ``S`` (subjects ``s.>``) with ``count`` messages (data: their index), published
    through nats-py; their stream sequences."""

    async def go() -> list[int]:
        js = natspy.nc.jetstream()
        await js.add_stream(name="S", subjects=["s.>"])
        return [(await js.publish("s.x", b"%d" % i)).seq for i in range(count)]

    return await natspy.call(go)


async def test_sigkill_after_commit_before_ack_writes_each_message_once(
    nats_server: Any, natspy: Any, spark: Any, tmp_path: Path
) -> None:
    await natspy.connect(nats_server.url)
    assert await add_stream_and_publish(natspy, M) == list(range(1, M + 1))
    out = tmp_path / "out"

    # 1. Killed from on_commit after its second commit: committed, never acked.
    async with child(
        "crash_child.py", nats_server.url, str(out), "--kill-after", str(KILL_AFTER), cwd=tmp_path
    ) as first:
        code = await first.wait_exit(timeout=90)
        assert code == -signal.SIGKILL, f"exit {code}\n" + first.transcript()
    commits = first.events("commit")
    assert [c["n"] for c in commits] == list(range(1, KILL_AFTER + 1)), first.transcript()
    assert all(c["skipped"] == 0 for c in commits)

    ledger = CommitLedger(out / CONTROL / "ledger")
    ledger.load()
    committed = ledger.committed["S"]
    assert len(committed) == sum(c["rows"] for c in commits)
    last_committed = committed.intervals[-1][1]

    # The server agrees that the last committed batch was never acked.
    info = await consumer_info(natspy)
    assert info.ack_floor.stream_seq < last_committed, info
    assert info.num_ack_pending > 0, info
    assert info.ack_floor.stream_seq < M

    # 2. Again, without the kill, until every message is acked.
    async with child("crash_child.py", nats_server.url, str(out), cwd=tmp_path) as second:
        await second.wait_event("ready", timeout=90)
        try:
            await wait_consumer(
                natspy,
                lambda i: i.ack_floor.stream_seq == M and i.num_ack_pending == 0,
                timeout=90,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{second.transcript()}") from None
        second.signal(signal.SIGTERM)
        code = await second.wait_exit(timeout=60)
        assert code == 0, f"exit {code}\n" + second.transcript()
    (done,) = second.events("done")
    sink = done["sink"]
    # At least the batch committed before the kill came again and was left out.
    assert sink["duplicates_skipped"] >= sum(c["rows"] for c in commits[-1:]), done
    assert sink["rows_written"] == M - len(committed), done
    assert sink["recovered_removed"] == 0 and sink["recovered_rolled"] == 0, done
    assert done["stats"]["redeliveries"] >= sink["duplicates_skipped"], done

    info = await consumer_info(natspy)
    assert info.num_pending == 0 and info.num_ack_pending == 0, info

    rows = [r.asDict() for r in spark.read.parquet(str(out)).collect()]
    seqs = sorted(r["stream_seq"] for r in rows)
    assert len(rows) == M
    assert seqs == list(range(1, M + 1))
    assert {r["data"] for r in rows} == {b"%d" % i for i in range(M)}
    assert all(r["stream"] == "S" and r["subject"] == "s.x" for r in rows)
    # Nothing of an attempt is left: every data file is one the ledger committed.
    ledger.load()
    assert len(ledger.committed["S"]) == M
    files = {p.relative_to(out).as_posix() for p in out.rglob("part-*")}
    assert files == ledger.files
    assert not list(out.rglob(".part-*"))
