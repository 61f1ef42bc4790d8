"""A checkpoint host in its own process for test_worker_loop.py's server-restart test: the
global consumer and workers of group "billing", one line per handled event on stdout, until
it is told to stop (SIGTERM). A run that ends by itself exits non-zero: that is the bug the
test looks for (a server restart ending the workers). Outages are said on stdout too
("outage workers: ...", "outage consumer: ..."), when they begin."""

from __future__ import annotations

import sys
from typing import Any

import trio
from headrace.checkpoints import (
    CheckpointStore,
    CheckpointWorkers,
    GlobalConsumer,
    Subscription,
    SubscriptionGroup,
)
from headrace.jetstream import JetStream
from headrace.jetstream.kv import key_value
from headrace.nats import connect


async def main(url: str, owner: str) -> None:
    async def handle(msg: Any) -> None:
        await trio.sleep(0.002)
        print(f"handled {msg.subject} {msg.seq}", flush=True)

    group = SubscriptionGroup(
        name="billing",
        subscriptions=[Subscription(name="ledger", subjects=["orders.>"], handler=handle)],
    )
    async with connect(url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await key_value(js, "cp"))
        workers = CheckpointWorkers(
            js,
            "EVENTS",
            group,
            store,
            owner=owner,
            reservation=3.0,
            recovery_interval=0.5,
            poll_interval=0.05,  # polls meet the restarts for sure (they ended hosts before)
        )
        consumer = GlobalConsumer(js, "EVENTS", group, store, max_wait=0.05)

        async def report() -> None:
            # The outages as they begin, for the test to wait on (their warnings go to stderr).
            said: dict[str, str | None] = {"workers": None, "consumer": None}
            while True:
                for what, now in (("workers", workers.outage), ("consumer", consumer.outage)):
                    if now and now != said[what]:
                        print(f"outage {what}: {now}", flush=True)
                    said[what] = now
                await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            await nursery.start(consumer.run)
            await nursery.start(workers.run)
            nursery.start_soon(report)
            print("ready", flush=True)
    sys.exit(3)  # not reached unless the run ended: the test reads this as the failure


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
