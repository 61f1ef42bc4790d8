"""Checkpointed subscriptions: each order's events in order, orders in parallel, a failing
order retried and parked without holding up the others.

Run it (it starts its own nats-server):

    .venv/bin/python examples/checkpointed_orders.py

Order 3's payment handler fails every time: it is retried twice, then parked as failed, while
orders 1, 2, 4 and 5 are billed to the end. Then, as an operator would, the example skips the
failing event and order 3 goes on.
"""

from __future__ import annotations

import time

import trio
from headrace.checkpoints import (
    CheckpointId,
    CheckpointStore,
    CheckpointWorkers,
    GlobalConsumer,
    RetryPolicy,
    Status,
    Subscription,
    SubscriptionGroup,
    operators,
)
from headrace.jetstream import JetStream, KeyValueConfig, StreamConfig, create_key_value
from headrace.localserver import LocalServer
from headrace.nats import connect

EVENTS = ["created", "paid", "shipped"]
last_of_order_3 = trio.Event()


async def bill(msg: object) -> None:
    subject = msg.subject  # type: ignore[attr-defined]
    if subject == "orders.3.paid":
        raise RuntimeError("card declined")
    print(f"  billed {subject}")
    if subject == "orders.3.shipped":
        last_of_order_3.set()


async def main() -> None:
    with LocalServer() as server:
        async with connect(server.url) as nc:
            js = JetStream(nc)
            await js.add_stream(
                StreamConfig(name="ORDERS", subjects=["orders.>"], allow_direct=True)
            )
            for event in EVENTS:
                for order in range(1, 6):
                    await js.publish(
                        f"orders.{order}.{event}", b"{}", headers={"Headrace-Type": event}
                    )

            store = CheckpointStore(
                await create_key_value(js, KeyValueConfig(bucket="checkpoints"))
            )
            group = SubscriptionGroup(
                name="billing",
                subscriptions=[Subscription(name="ledger", subjects=["orders.*.*"], handler=bill)],
            )
            quick = RetryPolicy(max_retries=2, initial_delay=0.2, max_delay=0.5, jitter=False)
            stuck = CheckpointId("billing", "ledger", "orders.3")
            async with trio.open_nursery() as nursery:
                await nursery.start(GlobalConsumer(js, "ORDERS", group, store).run)
                await nursery.start(CheckpointWorkers(js, "ORDERS", group, store, retry=quick).run)
                while True:  # wait until order 3 is parked (a demo's loop, not a test)
                    await trio.sleep(0.2)
                    stored = await store.get(stuck)
                    if stored is not None and stored.checkpoint.status is Status.FAILED:
                        break
                print("failed checkpoints:")
                for cp in await operators.view(store, "failed"):
                    print("  " + operators.describe(cp, time.time()))
                print("skipping the declined payment:")
                assert stored.checkpoint.failing_seq is not None
                await operators.skip(store, stuck, failing=stored.checkpoint.failing_seq)
                await last_of_order_3.wait()
                nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
