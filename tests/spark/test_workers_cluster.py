"""Exactly once on the distributed engines: a three-node JetStream cluster (the stream and the
commit bucket replicated three times), a Spark Connect server that every worker's sink writes
through (Spark's own writer, a Spark job per batch), three ``headrace run`` workers; during the
run one NATS node is killed and one worker SIGKILLed. Spark reads back every order once, the
consumer's ack floor reaches the last sequence, and nothing is left staged or unpublished."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from tests.natspy_peer import wait_consumer
from tests.spark.spark_support import commit_state
from tests.spark.workers_support import (
    count_orders,
    create_orders,
    running_workers,
    wait_quiet_output,
    write_pipeline,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

N = 20_000
BATCH = 500
BATCHES = N // BATCH
STALE_AFTER = 8.0


async def wait_commits(natspy: Any, out: Path, at_least: int, timeout: float = 120) -> int:
    """The output's commit count once it reaches ``at_least`` (read through nats-py; polled,
    through the leader elections of a node's death)."""
    commits = 0
    with trio.fail_after(timeout):
        while True:
            try:
                commits = (await commit_state(natspy, out))["commits"]
            except Exception:  # the bucket's leader being elected again, the output not made yet
                commits = 0
            if commits >= at_least:
                return int(commits)
            await trio.sleep(0.1)


async def test_cluster_node_and_worker_killed_during_the_run(
    nats_cluster: Any, connect_url: str, natspy: Any, spark: Any, tmp_path: Path
) -> None:
    await natspy.connect(nats_cluster[0].url)  # node 0 stays up; node 2 is killed
    await create_orders(natspy, N, replicas=3)
    out, control = tmp_path / "out", tmp_path / "control"
    pipeline = write_pipeline(
        tmp_path,
        out,
        control,
        ack_wait=5.0,
        batch=BATCH,
        stage_sleep=1.0,  # 40 batches over 3 workers: about 13 s, time for the faults
        stale_after=STALE_AFTER,
        sink_options={"writer": "spark", "master": connect_url},
    )
    servers = ",".join(nats_cluster.urls)
    async with running_workers(pipeline, servers, tmp_path, 3) as workers:
        # Under way: Spark Connect sessions opened, batches committing.
        try:
            await wait_consumer(natspy, lambda i: i.ack_floor.stream_seq > 0, "ORDERS", "lake", 120)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{workers.transcript()}") from None
        await trio.to_thread.run_sync(nats_cluster.kill_node, 2)
        workers.log.append("killed NATS node 2")
        # A quarter of the batches committed (the commits, not the ack floor, which jumps
        # when redeliveries after the node's death fill its holes): kill a worker.
        commits = await wait_commits(natspy, out, BATCHES // 4)
        assert commits < BATCHES * 3 // 4, "the faults came after the end; slow the workers"
        await workers.kill(1)
        try:
            await wait_consumer(
                natspy,
                lambda i: i.ack_floor.stream_seq == N and i.num_ack_pending == 0,
                "ORDERS",
                "lake",
                timeout=240,
            )
            await wait_quiet_output(out, natspy, timeout=STALE_AFTER * 5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{workers.transcript()}") from None
        codes = await workers.stop_all()
        assert codes == [0, 0, 0], workers.transcript(ended=True)
    assert count_orders(spark, out, N) == {
        "rows": N,
        "duplicates": 0,
        "missing": 0,
        "duplicated_seqs": 0,
    }, workers.log
    state = await commit_state(natspy, out)
    assert state["streams"]["ORDERS"]["floor"] == N, state

    async def bucket_replicas() -> int:
        info = await natspy.nc.jetstream().stream_info("KV_headrace_commits")
        return int(info.config.num_replicas)

    assert await natspy.call(bucket_replicas) == 3  # as replicated as the stream it records
