"""Exactly once with several workers on one output, under the faults that break it in
production (workers_support.py runs them): every scenario publishes tens of thousands of
orders with unique ids, runs ``headrace run`` workers of one pipeline on one durable consumer
into one Spark sink output, injects its faults, waits until the server says every message is
acked, and then asserts on what Spark reads back: 0 missing, 0 duplicated; the consumer's ack
floor at the stream's last sequence; nothing left staged, nothing committed and unpublished.

The workers write with Arrow's writer (no JVM per worker on a two-core machine); the commit
protocol around the write is the same for Spark's writer, which test_workers_cluster.py
runs (Spark Connect, a NATS cluster).
"""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.natspy_peer import consumer_info, wait_consumer
from tests.spark.workers_support import (
    HEADRACE,
    count_orders,
    create_orders,
    running_workers,
    wait_quiet_output,
    write_pipeline,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

N = 30_000
ACK_WAIT = 3.0
STALE_AFTER = 6.0


def all_acked(n: int) -> Any:
    return lambda info: info.ack_floor.stream_seq == n and info.num_ack_pending == 0


async def finish(
    natspy: Any, spark: Any, workers: Any, out: Path, n: int = N, *, timeout: float = 180
) -> dict[str, Any]:
    """Wait until everything is acked and the output is quiet, stop the workers (they must exit
    0), and check what Spark reads back."""
    exact = {"rows": n, "duplicates": 0, "missing": 0, "duplicated_seqs": 0}
    try:
        await wait_consumer(natspy, all_acked(n), "ORDERS", "lake", timeout=timeout)
        # Acked means visible, whoever acked: no sweep needed for that.
        assert count_orders(spark, out, n) == exact, workers.log
        state = await wait_quiet_output(out, natspy, timeout=STALE_AFTER * 4)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{workers.transcript()}") from None
    codes = await workers.stop_all()
    assert codes == [0] * len(codes), workers.transcript(ended=True)
    info = await consumer_info(natspy, "ORDERS", "lake")
    assert info.ack_floor.stream_seq == n and info.num_pending == 0, info
    assert info.num_ack_pending == 0, info
    counted = count_orders(spark, out, n)
    assert counted == exact, (counted, workers.log)
    assert state["streams"]["ORDERS"]["floor"] == n, state
    return state


async def test_random_sigkills_of_three_workers(
    nats_server: Any, natspy: Any, spark: Any, tmp_path: Path
) -> None:
    await natspy.connect(nats_server.url)
    await create_orders(natspy, N)
    out, control = tmp_path / "out", tmp_path / "control"
    # About 1,000 orders a second a worker (a batch of 250 takes 0.25 s): 10 s at least for the
    # run, 5 s on average for the kills.
    pipeline = write_pipeline(
        tmp_path, out, control, ack_wait=ACK_WAIT, stale_after=STALE_AFTER, stage_sleep=0.25
    )
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    async with running_workers(pipeline, nats_server.url, tmp_path, 3) as workers:
        workers.log.append(f"seed {seed}")
        await wait_consumer(natspy, lambda i: i.ack_floor.stream_seq > 0, "ORDERS", "lake", 60)
        for kill in range(10):
            if kill == 5:
                # One kill lands exactly between a commit and its ack: the attempt is
                # committed, not published, its messages unacked.
                (control / "kill-after-commit").touch()
                killer = await workers.wait_stdout_event("killing", timeout=30)
                with trio.fail_after(10):
                    await workers.current[killer].proc.wait()
                workers.ended.append(workers.current[killer])
                workers.log.append(f"worker {killer} killed itself after a commit")
                await workers.start(killer)
                continue
            await trio.sleep(rng.uniform(0.2, 0.8))  # a random moment: the fault itself
            info = await consumer_info(natspy, "ORDERS", "lake")
            assert info.ack_floor.stream_seq < N, "the run ended before the kills; slow it"
            await workers.kill(rng.randrange(3))
        # (The attempt committed by the worker that killed itself was published by another
        # worker's sweep: had it not been, its orders would be missing below.)
        await finish(natspy, spark, workers, out)


async def test_a_server_sigkill_and_restart_under_three_workers(
    nats_server: Any, natspy: Any, spark: Any, tmp_path: Path
) -> None:
    """nats-server itself is SIGKILLed mid-run and started again (same port and store): the
    workers reconnect, the consumer state the server kept may be behind what was acked (the
    redeliveries meet their commits in the state), and every order is still read back once."""
    await natspy.connect(nats_server.url)
    await create_orders(natspy, N)
    out, control = tmp_path / "out", tmp_path / "control"
    pipeline = write_pipeline(
        tmp_path, out, control, ack_wait=ACK_WAIT, stale_after=STALE_AFTER, stage_sleep=0.25
    )
    async with running_workers(pipeline, nats_server.url, tmp_path, 3) as workers:
        await wait_consumer(natspy, lambda i: i.ack_floor.stream_seq > N // 4, "ORDERS", "lake", 60)
        info = await consumer_info(natspy, "ORDERS", "lake")
        assert info.num_pending > 0, "the run ended before the restart; slow it"
        await trio.to_thread.run_sync(lambda: nats_server.restart(kill=True))
        workers.log.append("nats-server SIGKILLed and restarted")
        await natspy.connect(nats_server.url)  # (the peer does not reconnect by itself)
        await finish(natspy, spark, workers, out)
    # Each worker lost the server and came back (rather than ending or starting after it).
    reconnects = [e["stats"]["reconnects"] for w in workers.ended for e in w.log_events("stopped")]
    assert len(reconnects) == 3 and min(reconnects) >= 1, reconnects


@pytest.mark.parametrize("n_workers", [1, 3])
async def test_workers_stalled_past_ack_wait(
    nats_server: Any, natspy: Any, spark: Any, tmp_path: Path, n_workers: int
) -> None:
    await natspy.connect(nats_server.url)
    await create_orders(natspy, N)
    out, control = tmp_path / "out", tmp_path / "control"
    pipeline = write_pipeline(tmp_path, out, control, ack_wait=ACK_WAIT, stale_after=STALE_AFTER)
    async with running_workers(pipeline, nats_server.url, tmp_path, n_workers) as workers:
        for stall in range(3):
            await wait_consumer(
                natspy,
                lambda i, s=stall: i.ack_floor.stream_seq > N * s // 4,
                "ORDERS",
                "lake",
                60,
            )
            await workers.stall(stall % n_workers, ACK_WAIT + 2)
        state = await finish(natspy, spark, workers, out)
    reports = workers.sink_reports()
    # The stalls made the server redeliver what the stalled worker held (this is what the
    # test is about), and the output still holds each order once.
    redelivered = sum(
        e["stats"]["redeliveries"] for w in workers.ended for e in w.log_events("stopped")
    )
    assert redelivered > 0, reports
    assert state["commits"] == sum(r["commits"] for r in reports), (state, reports)


async def test_a_write_that_hangs_past_ack_wait(
    nats_server: Any, natspy: Any, spark: Any, tmp_path: Path
) -> None:
    """One worker's write hangs for twice the ack wait (a slow Spark job): its loop keeps the
    messages it holds from redelivery (+WPI), and when the write ends they are committed
    once, with everything else the other workers wrote meanwhile."""
    await natspy.connect(nats_server.url)
    await create_orders(natspy, N)
    out, control = tmp_path / "out", tmp_path / "control"
    pipeline = write_pipeline(tmp_path, out, control, ack_wait=ACK_WAIT, stale_after=STALE_AFTER)
    async with running_workers(pipeline, nats_server.url, tmp_path, 3) as workers:
        await wait_consumer(natspy, lambda i: i.ack_floor.stream_seq > 0, "ORDERS", "lake", 60)
        (control / "hang").write_text(str(ACK_WAIT * 2))
        index = await workers.wait_stdout_event("hanging", timeout=30)
        hung = workers.current[index]
        workers.log.append(f"worker {index}'s write hangs")
        await finish(natspy, spark, workers, out)
    (stopped,) = hung.log_events("stopped")
    assert stopped["stats"]["in_progress"] > 0, stopped


async def test_two_workers_commit_the_same_redelivered_batch_at_once(
    nats_server: Any, natspy: Any, spark: Any, tmp_path: Path
) -> None:
    """The race forced: worker A stages a batch and waits before its commit; it is stopped
    past the ack wait, so worker B receives the same messages again, stages them, and waits
    too; then both commit at the same moment. Exactly one commit holds each order."""
    n = 2_000
    await natspy.connect(nats_server.url)
    await create_orders(natspy, n)
    out, control = tmp_path / "out", tmp_path / "control"
    pipeline = write_pipeline(
        tmp_path, out, control, ack_wait=ACK_WAIT, stale_after=60, batch=n, stage_sleep=0
    )
    (control / "gate").touch()
    async with running_workers(pipeline, nats_server.url, tmp_path, 1) as workers:
        a = workers.current[0]
        await wait_for_files(control, "waiting-", 1)
        a.proc.send_signal(signal.SIGSTOP)  # A holds its staged batch, unacked
        try:
            # Past the ack wait the server redelivers A's messages to B.
            await trio.sleep(ACK_WAIT + 1)
            await workers.start(1)
            await wait_for_files(control, "waiting-", 2)
        finally:
            a.proc.send_signal(signal.SIGCONT)
        waiting = sorted(p.name for p in control.glob("waiting-*"))
        (control / "gate").unlink()
        (control / "go").touch()  # both commit now
        state = await finish(natspy, spark, workers, out, n)
    reports = workers.sink_reports()
    assert len(reports) == 2 and len(waiting) == 2, (reports, waiting)
    # Both staged the same orders; one commit won them, the other found them committed (at
    # least once: on a loaded machine the loser's messages can pass their ack wait again
    # before "go", come back once more and overlap a second time; the output is exact either
    # way, which finish() checks).
    assert sum(r["overlaps"] for r in reports) >= 1, reports
    assert state["commits"] == sum(r["commits"] for r in reports), (state, reports)


async def test_eight_workers_share_one_output(
    nats_server: Any, natspy: Any, spark: Any, tmp_path: Path
) -> None:
    """Eight workers on a two-core machine, no faults: every commit succeeds (no batch
    failed), and the compare-and-set races they run into are retried a bounded number of
    times."""
    await natspy.connect(nats_server.url)
    await create_orders(natspy, N)
    out, control = tmp_path / "out", tmp_path / "control"
    pipeline = write_pipeline(
        tmp_path, out, control, ack_wait=10, stale_after=STALE_AFTER, stage_sleep=0.02
    )
    async with running_workers(pipeline, nats_server.url, tmp_path, 8) as workers:
        state = await finish(natspy, spark, workers, out)
    reports = workers.sink_reports()
    assert len(reports) == 8, reports
    stopped = [e["stats"] for w in workers.ended for e in w.log_events("stopped")]
    assert all(s["batches_failed"] == 0 and s["errors"] == 0 for s in stopped), stopped
    assert sum(s["records_out"] for s in stopped) >= N
    assert state["commits"] == sum(r["commits"] for r in reports)
    # Refusals happen (eight writers of one key), each resolved within a few retries.
    worst = max(r["max_refusals"] for r in reports)
    assert worst <= 20, reports


async def wait_for_files(directory: Path, prefix: str, count: int, timeout: float = 60) -> None:
    """Until ``count`` files named ``prefix...`` exist (written by the workers: polled)."""
    with trio.fail_after(timeout):
        while len(list(directory.glob(prefix + "*"))) < count:  # noqa: ASYNC110, ASYNC240
            await trio.sleep(0.05)


async def test_a_recreated_stream_is_refused_until_its_commits_are_reset(
    nats_server: Any, natspy: Any, spark: Any, tmp_path: Path
) -> None:
    """A stream deleted and created again under its name starts its sequences at 1 again. The
    output's commits of the old stream must not make the new one's records look committed:
    the worker stops with the documented error (exit 2), writes and acks nothing; after
    ``headrace outputs reset`` the new stream is written."""
    first, second = 2_000, 1_000
    await natspy.connect(nats_server.url)
    await create_orders(natspy, first)
    out, control = tmp_path / "out", tmp_path / "control"
    pipeline = write_pipeline(tmp_path, out, control, stale_after=STALE_AFTER, stage_sleep=0)
    async with running_workers(pipeline, nats_server.url, tmp_path, 2) as workers:
        await finish(natspy, spark, workers, out, first)

    async def recreate() -> None:
        await natspy.nc.jetstream().delete_stream("ORDERS")

    await natspy.call(recreate)
    await create_orders(natspy, second, start=10_000)
    async with running_workers(pipeline, nats_server.url, tmp_path, 1) as workers:
        worker = workers.current[0]
        with trio.fail_after(60):
            code = await worker.proc.wait()
        with trio.move_on_after(10):
            await worker.wait_eof()
    stderr = "\n".join(worker.err)
    assert code == 2, worker.transcript()
    assert "stream 'ORDERS' was created at" in stderr, stderr
    assert f"headrace outputs reset {out} --stream ORDERS" in stderr, stderr
    info = await consumer_info(natspy, "ORDERS", "lake")
    assert info.ack_floor.stream_seq == 0, info  # nothing acked, nothing terminated
    assert count_orders(spark, out, first) == {
        "rows": first,
        "duplicates": 0,
        "missing": 0,
        "duplicated_seqs": 0,
    }

    shown = await run_headrace("outputs", "show", str(out), "--json", "--nats", nats_server.url)
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert summary["state"]["streams"]["ORDERS"]["floor"] == first, summary
    reset = await run_headrace(
        "outputs", "reset", str(out), "--stream", "ORDERS", "--nats", nats_server.url
    )
    assert reset.returncode == 0, reset.stderr
    assert b"commits of stream 'ORDERS'" in reset.stdout and b"are forgotten" in reset.stdout

    async with running_workers(pipeline, nats_server.url, tmp_path, 1) as workers:
        await wait_consumer(natspy, all_acked(second), "ORDERS", "lake", timeout=60)
        assert await workers.stop_all() == [0]
    rows = spark.read.parquet(str(out)).select("data").collect()
    ids = sorted(json.loads(bytes(r["data"]))["id"] for r in rows)
    assert ids == [*range(first), *range(10_000, 10_000 + second)]


async def run_headrace(*args: str) -> Any:
    with trio.fail_after(60):
        return await trio.run_process(
            [HEADRACE, *args], capture_stdout=True, capture_stderr=True, check=False
        )
