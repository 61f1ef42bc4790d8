"""Child of test_crash.py: a pipeline from a durable JetStream consumer into a parquet
SparkSink, in a process of its own.

    crash_child.py URL OUT [--kill-after N]

With ``--kill-after N`` the sink's ``on_commit`` SIGKILLs this process after its Nth commit:
the ledger holds the batch, its files are in place, and its messages were never acked. Without
it the pipeline runs until SIGTERM, drains, and prints its counters.

stdout, one JSON object a line: ``{"event": "ready"}`` once the consumer is bound,
``{"event": "commit", ...}`` per committed batch, and ``{"event": "done", ...}`` at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

import trio
from headrace.jetstream.consumer_config import ConsumerConfig
from headrace.nats import connect
from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline
from headrace_spark import CommitInfo, SparkSink
from headrace_spark.session import start_session

STREAM = "S"
DURABLE = "C"
#: Short, so that what the killed process held comes again soon; long enough that a batch
#: waiting behind Spark's first (slow) job is not redelivered while it waits.
ACK_WAIT = 4.0


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def main(url: str, out: str, kill_after: int) -> None:
    commits = 0

    def on_commit(info: CommitInfo) -> None:
        nonlocal commits
        commits += 1
        say("commit", n=commits, batch=info.batch, rows=info.rows, skipped=info.skipped)
        if commits == kill_after:
            # Committed (ledger entry, files visible), not acked: write_batch has not returned.
            os.kill(os.getpid(), signal.SIGKILL)

    # The session first, warmed up: the consumer is bound only once Spark is ready, so no
    # delivery waits out its ack_wait behind the JVM starting.
    spark = await trio.to_thread.run_sync(
        lambda: start_session("local[2]", app_name="headrace-crash-child")
    )
    await trio.to_thread.run_sync(lambda: spark.range(10).count())
    # The single-process ledger (commits='local'): test_crash.py reads it. The shared
    # protocol's crash tests are in test_workers.py.
    sink = SparkSink(out, spark=spark, on_commit=on_commit, commits="local")
    pipe = Pipeline("crash", nak_delay=0.05, nak_delay_max=0.2, drain_timeout=30)
    pipe.source(
        JetStreamSource(
            stream=STREAM,
            durable=DURABLE,
            config=ConsumerConfig(ack_wait=ACK_WAIT, max_ack_pending=1000),
        )
    ).sink(sink, name="lake", batch=BatchPolicy(max_messages=50, max_age=0.5))

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with connect(url) as nc:
            async with pipe.running(nc) as run:
                await run.wait_bound()
                say("ready")
                async for _ in signals:
                    break
            # Left the block: drained, everything taken committed and acked.
            stats = run.stats
    say(
        "done",
        sink={
            "batches_committed": sink.batches_committed,
            "rows_written": sink.rows_written,
            "duplicates_skipped": sink.duplicates_skipped,
            "recovered_removed": sink.recovered_removed,
            "recovered_rolled": sink.recovered_rolled,
        },
        stats=stats.snapshot(),
    )
    spark.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("--kill-after", type=int, default=0)
    args = parser.parse_args()
    trio.run(main, args.url, args.out, args.kill_after)
    sys.exit(0)
