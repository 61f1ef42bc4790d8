"""Subscriptions choosing work, and the global stream consumer raising checkpoint versions on a
real nats-server (nats-py publishes the events and reads the consumer's ack floor)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from headrace.checkpoints import Checkpoint, CheckpointId
from headrace.checkpoints.global_consumer import GlobalConsumer, durable_name
from headrace.checkpoints.store import CheckpointStore
from headrace.checkpoints.subscription import (
    Subscription,
    SubscriptionGroup,
    subject_matches,
    versions,
)
from headrace.jetstream import JetStream
from headrace.jetstream.kv import KeyValueConfig, create_key_value
from headrace.nats import connect

from tests.natspy_peer import wait_consumer


@pytest.mark.parametrize(
    ("pattern", "subject", "match"),
    [
        ("orders.*.created", "orders.1.created", True),
        ("orders.*.created", "orders.1.paid", False),
        ("orders.>", "orders.1.paid", True),
        ("orders.>", "orders", False),
        ("orders.*", "orders.1.paid", False),
        ("*.*.*", "a.b.c", True),
    ],
)
def test_subject_matching(pattern: str, subject: str, match: bool) -> None:
    assert subject_matches(pattern, subject) is match


GROUP = SubscriptionGroup(
    name="billing",
    subscriptions=[
        Subscription(name="ledger", subjects=["orders.*.>"]),
        Subscription(name="welcome", types=["OrderCreated"], entity_tokens=2),
        Subscription(name="refunds", subjects=["orders.*.refunded"], types=["Refund"]),
    ],
)


def test_a_message_makes_work_for_each_matching_subscription() -> None:
    ids = GROUP.checkpoints_for("orders.7.created", "OrderCreated")
    assert ids == [
        CheckpointId("billing", "ledger", "orders.7"),
        CheckpointId("billing", "welcome", "orders.7"),
    ]
    assert GROUP.checkpoints_for("orders.7.refunded", "Refund")[-1].subscription == "refunds"
    assert GROUP.checkpoints_for("orders.7.refunded", None) == [
        CheckpointId("billing", "ledger", "orders.7")
    ]
    assert GROUP.checkpoints_for("customers.1.created", None) == []


def test_versions_take_the_highest_sequence_per_checkpoint() -> None:
    got = versions(
        GROUP,
        [
            ("orders.1.created", "OrderCreated", 1),
            ("orders.1.paid", None, 4),
            ("orders.2.paid", None, 3),
        ],
    )
    assert got == {
        CheckpointId("billing", "ledger", "orders.1"): 4,
        CheckpointId("billing", "welcome", "orders.1"): 1,
        CheckpointId("billing", "ledger", "orders.2"): 3,
    }


@pytest.mark.parametrize(
    "option",
    [
        {"write_concurrency": 0},
        {"write_concurrency": 1.5},
        {"write_concurrency": True},
        {"ack_wait": 0},
        {"ack_wait": float("nan")},
    ],
)
def test_bad_global_consumer_options_are_refused(option: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(option))):
        GlobalConsumer(None, "EVENTS", GROUP, None, **option)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "x"}, "matches nothing"),
        ({"name": "", "subjects": ["a"]}, "non-empty"),
        ({"name": "x", "subjects": ["a"], "entity_tokens": 0}, "entity_tokens"),
    ],
)
def test_bad_subscriptions_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Subscription(**kwargs)


def test_a_group_names_each_subscription_once() -> None:
    sub = Subscription(name="a", subjects=["x.>"])
    with pytest.raises(ValueError, match="twice"):
        SubscriptionGroup(name="g", subscriptions=[sub, sub])


async def test_global_consumer_raises_versions_and_acks(nats_server: Any, natspy: Any) -> None:
    await natspy.connect(nats_server.url)
    js_py = natspy.nc.jetstream()
    await natspy.call(js_py.add_stream, name="EVENTS", subjects=["orders.>"])
    events = [
        ("orders.1.created", "OrderCreated"),
        ("orders.2.created", "OrderCreated"),
        ("orders.1.paid", "OrderPaid"),
        ("orders.1.refunded", "Refund"),
        ("orders.3.created", "OrderCreated"),
        ("orders.2.paid", "OrderPaid"),
    ]
    for subject, kind in events:
        await natspy.call(js_py.publish, subject, b"{}", headers={"Headrace-Type": kind})

    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        store = CheckpointStore(await create_key_value(js, KeyValueConfig(bucket="cp")))
        consumer = GlobalConsumer(js, "EVENTS", GROUP, store, batch=4, write_concurrency=2)
        async with trio.open_nursery() as nursery:
            await nursery.start(consumer.run)
            await wait_consumer(
                natspy,
                lambda info: info.ack_floor.stream_seq == len(events) and info.num_ack_pending == 0,
                stream="EVENTS",
                durable=durable_name("billing"),
            )
            nursery.cancel_scope.cancel()
        stored = {s.checkpoint.id: s.checkpoint async for s in store.all()}
    ledger = {
        cid.stream: (cp.version, cp.seen_events)
        for cid, cp in stored.items()
        if cid.subscription == "ledger"
    }
    # Each checkpoint's events counted once, whichever of the batches (of 4) they came in.
    assert ledger == {"orders.1": (4, 3), "orders.2": (6, 2), "orders.3": (5, 1)}
    welcome = {
        cid.stream: cp.version for cid, cp in stored.items() if cid.subscription == "welcome"
    }
    assert welcome == {"orders.1": 1, "orders.2": 2, "orders.3": 5}
    assert stored[CheckpointId("billing", "refunds", "orders.1")] == Checkpoint(
        id=CheckpointId("billing", "refunds", "orders.1"), version=4, seen_events=1
    )
    assert all(cp.lagging and cp.position == 0 for cp in stored.values())
    assert consumer.messages == len(events)
