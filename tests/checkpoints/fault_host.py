"""A checkpoint host in its own process for test_host_faults.py's fault campaign: the global
consumer and workers of group "billing". Its handler has an outside effect, done the way
docs/checkpoints.md asks of one: it checks that it still holds the entity, and publishes the
effect to stream EFFECTS with the entity, the message's position and the fencing token, for a
store (here: the test, reading EFFECTS back) to refuse a stale holder's write.

Prints "ready" once its loops run. SIGTERM ends it with exit code 0; a run that ends by itself
exits 3 (the workers or the global consumer gave up)."""

from __future__ import annotations

import signal
import sys
from typing import Any

import trio
from headrace.checkpoints import (
    CheckpointStore,
    CheckpointWorkers,
    GlobalConsumer,
    HandlerContext,
    Subscription,
    SubscriptionGroup,
)
from headrace.jetstream import JetStream
from headrace.jetstream.kv import key_value
from headrace.jetstream.transient import retry_transient
from headrace.nats import connect

#: Seconds a reservation lasts (the test stops a host for longer than this).
RESERVATION = 2.0
#: Handlers a host runs at once (the test's bound on repeats is per fault and per this).
CONCURRENCY = 4


async def main(url: str, owner: str) -> None:
    async with connect(url) as nc:
        js = JetStream(nc)

        async def handle(msg: Any, ctx: HandlerContext) -> None:
            # Work before the effect and after it, for faults to land in both: a fault after
            # the effect and before the position is written makes the event run again.
            await trio.sleep(0.01)
            ctx.ensure_held()
            entity = ctx.checkpoint.stream.rsplit(".", 1)[1]
            effect = f"{msg.subject} {msg.seq} {ctx.fence} {owner}".encode()
            # (The id makes a resend of a publish in doubt one effect: a second run of the
            # event is a new claim, so a new fence and a new id.)
            once = f"{msg.seq}:{ctx.fence}"
            await retry_transient(lambda: js.publish(f"effects.{entity}", effect, msg_id=once))
            await trio.sleep(0.01)

        group = SubscriptionGroup(
            name="billing",
            subscriptions=[Subscription(name="ledger", subjects=["orders.>"], handler=handle)],
        )
        store = CheckpointStore(await key_value(js, "cp"))
        workers = CheckpointWorkers(
            js,
            "EVENTS",
            group,
            store,
            owner=owner,
            concurrency=CONCURRENCY,
            reservation=RESERVATION,
            recovery_interval=0.5,
        )
        # A killed host's batch comes again after 2 s, not the default 5.
        consumer = GlobalConsumer(js, "EVENTS", group, store, max_wait=0.05, ack_wait=2.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(consumer.run)
            await nursery.start(workers.run)
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                print("ready", flush=True)
                async for _ in signals:
                    print(f"stopping handled={workers.handled} lost={workers.lost}", flush=True)
                    nursery.cancel_scope.cancel()
                    return
    sys.exit(3)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
