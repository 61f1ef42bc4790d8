"""A checkpoint host whose handler has an outside effect, fenced as docs/checkpoints.md says
(test_fencing.py): group "billing", workers only (the test runs the global consumer).

Each handled event takes ``work`` seconds, then appends ``[seq, owner, fence]`` to the
entity's log in the KV bucket "effects", refused when the log has seen a higher fencing token
(a stale holder) and skipped when it already has the event (idempotent by entity and
position). One line per step on stdout: ``enter OWNER SEQ FENCE TIME``, ``exit OWNER SEQ FENCE
TIME HELD OUTCOME``, ``warning TEXT`` (the workers' warnings, a lost reservation among them).
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from typing import Any

import trio
from headrace.checkpoints import (
    CheckpointStore,
    CheckpointWorkers,
    HandlerContext,
    Subscription,
    SubscriptionGroup,
)
from headrace.jetstream import JetStream
from headrace.jetstream.kv import KeyNotFound, KeyValue, WrongRevision, key_value
from headrace.nats import connect


async def fenced_append(kv: KeyValue, ctx: HandlerContext, owner: str) -> str:
    """The effect: applied, refused (a higher fence was seen) or duplicate (already there)."""
    key = ctx.checkpoint.stream.replace(".", "_")
    while True:
        try:
            entry = await kv.get(key)
            state, revision = json.loads(entry.value), entry.revision
        except KeyNotFound:
            state, revision = {"fence": 0, "log": []}, None
        if ctx.fence < state["fence"]:
            return "refused"
        if state["log"] and ctx.seq <= state["log"][-1][0]:
            return "duplicate"
        value = json.dumps(
            {"fence": ctx.fence, "log": [*state["log"], [ctx.seq, owner, ctx.fence]]}
        ).encode()
        try:
            if revision is None:
                await kv.create(key, value)
            else:
                await kv.update(key, value, revision)
        except WrongRevision:
            continue
        return "applied"


async def main(url: str, owner: str, work: float, reservation: float) -> None:
    def show(message: Any, *_: Any, **__: Any) -> None:
        print(f"warning {message}", flush=True)

    warnings.showwarning = show
    async with connect(url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await key_value(js, "cp"))
        effects = await key_value(js, "effects")

        async def handle(msg: Any, ctx: HandlerContext) -> None:
            print(f"enter {owner} {msg.seq} {ctx.fence} {time.time():.6f}", flush=True)
            await trio.sleep(work)
            # Deliberately no ctx.ensure_held(): the fence alone must stop a stale write.
            outcome = await fenced_append(effects, ctx, owner)
            held = ctx.held()
            print(f"exit {owner} {msg.seq} {ctx.fence} {time.time():.6f} {held} {outcome}")
            sys.stdout.flush()

        group = SubscriptionGroup(
            name="billing",
            subscriptions=[Subscription(name="ledger", subjects=["orders.>"], handler=handle)],
        )
        workers = CheckpointWorkers(
            js,
            "EVENTS",
            group,
            store,
            owner=owner,
            reservation=reservation,
            poll_interval=0.05,
            recovery_interval=0.1,
        )
        await workers.run()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
