"""A checkpoint host whose global consumer SIGKILLs the process while it holds a batch
(test_lost_events.py): the batch was fetched, none of it written or acked. The consumer is
created with the default ack wait, so the test measures the bound a killed host leaves."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import trio
from headrace.checkpoints import CheckpointStore, GlobalConsumer, Subscription, SubscriptionGroup
from headrace.jetstream import JetStream
from headrace.jetstream.kv import key_value
from headrace.nats import connect


class DyingStore(CheckpointStore):
    """The first checkpoint write of a batch kills the host, holding the whole batch."""

    async def change(self, *args: Any, **kwargs: Any) -> Any:
        print("holding a batch", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


async def main(url: str) -> None:
    group = SubscriptionGroup(
        name="billing", subscriptions=[Subscription(name="ledger", subjects=["orders.>"])]
    )
    async with connect(url) as nc:
        js = JetStream(nc)
        store = DyingStore(await key_value(js, "cp"))
        await GlobalConsumer(js, "EVENTS", group, store, max_wait=0.05).run()


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
