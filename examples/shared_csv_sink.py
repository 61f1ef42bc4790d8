"""A sink plugin of your own whose output any number of workers share, each record once: the
commit protocol's SharedWriter does everything but the writing (docs/sinks.md, "Sharing an
output from a plugin").

Run it (it starts its own nats-server):

    .venv/bin/python examples/shared_csv_sink.py

Two workers of one pipeline (here two runs in one process, as two `headrace run` processes
would be) read one durable consumer and write CSV files into one directory. The first one is
stopped hard after a few batches, as a killed worker would be: what it held and had not acked
comes again to the second, which leaves out whatever of it the first had committed (when the
stop came between a commit and its ack) and writes the rest. Every order is in the directory
once.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import trio
from headrace.commits import Attempt
from headrace.jetstream import ConsumerConfig, JetStream, StreamConfig
from headrace.localserver import LocalServer
from headrace.nats import connect
from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline
from headrace.sinks import SharedWriter, Staged, batch_key, sequences

ORDERS = 500


class Written:
    """Rows written into the directory by every worker here, and an event per threshold: what
    the example waits for instead of polling."""

    def __init__(self) -> None:
        self.rows = 0
        self._waiting: list[tuple[int, trio.Event]] = []

    def add(self, rows: int) -> None:  # on the loop
        self.rows += rows
        for threshold, event in self._waiting:
            if self.rows >= threshold:
                event.set()

    async def wait_for(self, rows: int) -> None:
        event = trio.Event()
        self._waiting.append((rows, event))
        self.add(0)
        await event.wait()


WRITTEN = Written()


class CsvSink:
    """One ``part-<token>.csv`` per batch; async, its file work offloaded by SharedWriter."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.context: Any = None
        self.writer: SharedWriter | None = None

    def bind(self, context: Any) -> None:  # the pipeline's SinkContext, before open()
        self.context = context

    async def open(self) -> None:
        self.writer = await SharedWriter.open(self.context, self.directory, kind="CsvSink")

    async def write_batch(self, batch: Any) -> None:
        assert self.writer is not None
        records = batch.records
        await self.writer.write(
            records,
            sequences(records),
            stage=self.stage,
            published=self.published,
            refresh=any(r.num_delivered > 1 for r in records),
        )

    def stage(self, records: list[Any]) -> Staged:  # in a worker thread
        assert self.writer is not None
        seqs = sequences(records)
        attempt = Attempt.of_batch(batch_key(seqs))
        staging = self.writer.output.staging(attempt)
        staging.mkdir(parents=True)
        with open(staging / f"part-{attempt.token}.csv", "w") as f:
            f.writelines(f"{r.stream_seq},{r.value.decode()}\n" for r in records)
        self.writer.output.sync_staged(attempt)  # durable before the commit
        return Staged(attempt, seqs, len(records))

    def published(self, staged: Staged, files: list[str], skipped: int) -> None:
        trio.from_thread.run_sync(WRITTEN.add, staged.rows)  # (from the writer's thread)

    async def maintain(self) -> None:
        if self.writer is not None:
            await self.writer.maintain()  # a sweep while idle

    async def close(self) -> None:
        if self.writer is not None:
            await self.writer.close()


def pipeline(out: Path, sink: CsvSink) -> Pipeline:
    pipe = Pipeline("orders-csv", drain_timeout=10)
    pipe.source(
        JetStreamSource(stream="ORDERS", durable="csv", config=ConsumerConfig(ack_wait=2.0))
    ).sink(sink, name="csv", batch=BatchPolicy(max_messages=50, max_age=0.2))
    return pipe


async def main(out: Path) -> None:
    with LocalServer() as server:
        async with connect(server.url) as nc:
            js = JetStream(nc)
            await js.add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"]))
            for i in range(ORDERS):
                await js.publish("orders.new", b"order-%d" % i)

            # Worker 1 commits a few batches, then stops hard: what it held is not acked.
            first = CsvSink(out)
            async with pipeline(out, first).running(nc) as run:
                await WRITTEN.wait_for(150)
                run.stop()
            print(f"worker 1 committed {run.stats.batches_committed} batches, then stopped")

            # Worker 2 gets everything else, the first one's unacked messages included.
            second = CsvSink(out)
            async with pipeline(out, second).running(nc) as run:
                await WRITTEN.wait_for(ORDERS)
            assert second.writer is not None
            print(
                f"worker 2 committed {run.stats.batches_committed} batches; it left out "
                f"{second.writer.skipped} records worker 1 had committed"
            )


def check(out: Path) -> None:
    files = sorted(out.glob("*.csv"))
    lines = [line for f in files for line in f.read_text().splitlines()]
    orders = sorted(int(line.split(",")[0]) for line in lines)
    print(f"{len(lines)} lines in {len(files)} files in {out}")
    print("every order once" if orders == list(range(1, ORDERS + 1)) else "WRONG")


if __name__ == "__main__":
    directory = Path(tempfile.mkdtemp(prefix="shared-csv-"))
    trio.run(main, directory)
    check(directory)
