"""A checkpoint host that SIGKILLs itself in the middle of handling one event (test_workers.py's
killed-host test): the global consumer and workers of group "billing", one line per handled
event on stdout, reservations of one second."""

from __future__ import annotations

import os
import signal
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


async def main(url: str, die_on: str) -> None:
    async def handle(msg: Any) -> None:
        if msg.subject == die_on:
            os.kill(os.getpid(), signal.SIGKILL)  # holding this and other reservations
        print(f"handled {msg.subject} {msg.seq}", flush=True)

    group = SubscriptionGroup(
        name="billing",
        subscriptions=[Subscription(name="ledger", subjects=["orders.>"], handler=handle)],
    )
    async with connect(url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await key_value(js, "cp"))
        workers = CheckpointWorkers(
            js, "EVENTS", group, store, owner="doomed", reservation=1.0, poll_interval=0.02
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(GlobalConsumer(js, "EVENTS", group, store, max_wait=0.05).run)
            await nursery.start(workers.run)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
