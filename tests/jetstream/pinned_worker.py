"""A pipeline worker on a ``pinned_client`` priority group, run as a child process by
``test_priority_groups.py``: ``python pinned_worker.py URL STREAM DURABLE GROUP EXPIRES``.

It runs a pipeline whose source pulls from the durable consumer DURABLE of STREAM as a member of
GROUP (``JetStreamSource(priority_group=GROUP)``) into a memory sink, and prints JSON lines on
stdout: ``running`` once the pipeline runs, then ``committed`` with the stream sequences of each
batch its sink committed (its messages are acked right after). It runs until it is killed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import trio
from headrace.jetstream import ConsumeOptions
from headrace.nats import connect
from headrace.pipeline import BatchPolicy, JetStreamSource, Pipeline
from headrace.pipeline.batch import Batch
from headrace.sinks import MemorySink


def say(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


class SayingSink(MemorySink):
    """A memory sink that says which stream sequences each committed batch held."""

    async def write_batch(self, batch: Batch) -> None:
        await super().write_batch(batch)
        say("committed", seqs=[record.stream_seq for record in batch.records])


async def main(url: str, stream: str, durable: str, group: str, expires: str) -> None:
    # Each idle pull expires after EXPIRES seconds and is sent again, which renews the pin: it
    # must be well under the consumer's priority_timeout.
    pipe = Pipeline("pinned-worker")
    source = JetStreamSource(
        stream=stream,
        durable=durable,
        priority_group=group,
        consume=ConsumeOptions(max_messages=20, expires=float(expires)),
    )
    pipe.source(source).sink(SayingSink(), batch=BatchPolicy(max_messages=20, max_age=0.02))
    async with connect(url, name="pinned-worker") as nc, pipe.running(nc):
        say("running")
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:6])
