"""Regression tests from a review of the JetStream layer: each demonstrated a defect, now fixed.

Each asserts the behaviour the docs promise (or that structured concurrency requires). None can
hang the run: every wait a defect would make endless is bounded with ``move_on_after`` /
``fail_after`` outside any shield.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from headrace.errors import ConnectionClosedError, DrainTimeout, SubscriptionClosedError
from headrace.jetstream import (
    AckPolicy,
    ConsumerConfig,
    JetStream,
    StreamConfig,
)
from headrace.jetstream.consumer_config import DeliverPolicy
from headrace.jetstream.message import JsMsg, OutstandingAcks, ack_all
from headrace.nats import Disconnected, connect
from headrace.protocol.events import Msg

from tests.jetstream.js_pull_support import publish_n, setup_pull
from tests.waiting import FAST, next_event


@pytest.fixture
async def js(nats_server) -> AsyncIterator[JetStream]:
    async with connect(nats_server.url, **FAST) as nc:
        jsc = JetStream(nc)
        await jsc.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        yield jsc


async def _read(sub: Any, n: int) -> list[Any]:
    got: list[Any] = []
    with trio.fail_after(5):
        while len(got) < n:
            got.append(await sub.next_msg())
    return got


# 1. consume iteration never ends after the connection is closed -----------------------------


async def test_review2_consume_iteration_ends_when_connection_closes(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        async with consumer.consume(max_messages=10, expires=2) as messages:
            await nc.close()
            outcome = "hang"
            with trio.move_on_after(3):
                try:
                    await messages.next_batch()
                    outcome = "message"
                except (SubscriptionClosedError, Exception):
                    outcome = "ended"
            assert outcome == "ended", "consume iteration hangs forever after nc.close()"


# 2. push iteration never ends after the connection is closed; the block then raises an
#    ExceptionGroup from the lifecycle actor instead of ending cleanly -------------------------


async def test_review2_push_iteration_ends_when_connection_closes(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        outcome = "hang"
        try:
            async with js.subscribe("s.x") as sub:
                await nc.close()
                with trio.move_on_after(3):
                    try:
                        await sub.next_msg()
                        outcome = "message"
                    except ConnectionClosedError:
                        # (Issue 24: the error every reader gets when the connection closes.)
                        outcome = "ended"
        except BaseExceptionGroup:
            pass  # finding 3, shown on its own below
        assert outcome == "ended", "push iteration hangs forever after nc.close()"


# 3. the user's own exception is replaced by an ExceptionGroup when the consumer delete fails
#    with a non-JetStream error (closed connection, RequestTimeout while the server is down) ---


async def test_review2_block_error_is_not_hidden_by_lifecycle_crash(nats_server):
    class Mine(Exception):
        pass

    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        caught: BaseException | None = None
        try:
            async with js.subscribe("s.x"):
                await nc.close()
                raise Mine("the user's error")
        except BaseException as exc:
            caught = exc
        assert isinstance(caught, Mine), f"user error replaced by {caught!r}"


async def test_review2_clean_block_exit_raises_exceptiongroup_after_close(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
        caught: BaseException | None = None
        try:
            async with js.subscribe("s.x"):
                await nc.close()
        except BaseException as exc:
            caught = exc
        assert not isinstance(caught, BaseExceptionGroup), f"leaked {caught!r}"


# 4. a second end() request (unsubscribe while a drain runs, e.g. after the drain call was
#    cancelled) is never answered: it waits forever (and the block exit is shielded) ---------


@pytest.mark.slow
async def test_review2_unsubscribe_after_a_cancelled_drain_returns(js):
    cfg = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT)
    async with js.subscribe("s.x", config=cfg) as sub:
        await js.publish("s.x", b"never acked")
        await _read(sub, 1)
        with trio.move_on_after(0.3):
            await sub.drain(timeout=1.5)  # waits for the ack; cancelled by the caller
        returned = False
        with trio.move_on_after(4):  # the drain itself gives up after 1.5 s
            await sub.unsubscribe()
            returned = True
        assert returned, "unsubscribe() never returns: its _End is never read by the actor"


# 5. ack policy "all": acking the last message acks them all, but OutstandingAcks counts one,
#    so a drain always waits its whole timeout ------------------------------------------------


async def test_review2_ack_policy_all_drain_does_not_wait_out_its_timeout(js):
    cfg = ConsumerConfig(ack_policy=AckPolicy.ALL)
    async with js.subscribe("s.x", config=cfg) as sub:
        for i in range(3):
            await js.publish("s.x", b"%d" % i)
        msgs = await _read(sub, 3)
        await msgs[-1].ack()  # acks all three on the server
        start = trio.current_time()
        await sub.drain(timeout=3)
        took = trio.current_time() - start
    assert took < 2.5, f"drain waited {took:.1f}s for acks the server already has"


# 6. ordered consumer recreated before it handed out anything restarts at stream seq 1,
#    ignoring the deliver policy: a "new messages only" subscription replays history --------


@pytest.mark.slow
async def test_review2_ordered_recreation_keeps_deliver_policy(js):
    await publish_n(js, 3)  # history that DeliverPolicy.NEW must not show
    cfg = ConsumerConfig(idle_heartbeat=0.1, deliver_policy=DeliverPolicy.NEW)
    async with js.subscribe("s.x", ordered=True, config=cfg) as sub:
        await js.delete_consumer("S", sub.consumer)  # lost (restart, node loss...)
        got = None
        with trio.move_on_after(2):
            got = await sub.next_msg()  # the heartbeat alarm recreates the consumer
        assert sub.recreated >= 1
        assert got is None, (
            f"replayed old message {got.data!r} (stream seq {got.metadata.stream_seq})"
        )


# 7. ConsumeBuffer.drain raising (DrainTimeout during an outage) leaves the buffer not ended:
#    iteration then hangs forever -------------------------------------------------------------


async def test_review2_consume_drain_timeout_still_ends_iteration(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        consumer = await setup_pull(js)
        with nc.events() as events:
            async with consumer.consume(max_messages=10, expires=2) as messages:
                await trio.to_thread.run_sync(nats_server.stop)
                await next_event(events, Disconnected)
                with pytest.raises(DrainTimeout):
                    await messages.drain(timeout=0.3)
                outcome = "hang"
                with trio.move_on_after(2):
                    try:
                        await messages.next_batch()
                        outcome = "message"
                    except SubscriptionClosedError:
                        outcome = "ended"
                assert outcome == "ended", "iteration hangs after a drain that timed out"


# 8. ack_all with the same message twice acks it twice and decrements the tracker twice ------


class _Conn:
    def __init__(self) -> None:
        self.writes: list[tuple[bytes, int]] = []

    def write_nowait(self, encoded: bytes, messages: int, payload_bytes: int = 0) -> None:
        self.writes.append((encoded, messages))


def test_review2_ack_all_duplicate_message_counted_once():
    tracker = OutstandingAcks()
    tracker.delivered(2)
    conn: Any = _Conn()
    a = JsMsg(Msg("s.x", 1, "$JS.ACK.S.C.1.1.1.0.0", b""), conn, False, tracker)
    ack_all([a, a])
    assert tracker.count == 1, f"one ack counted twice: outstanding {tracker.count}"


# 9. a bad argument checked after the consumer was created leaks the consumer and the NATS
#    subscription ------------------------------------------------------------------------------


async def test_review2_bad_heartbeat_factor_leaks_nothing(js):
    cfg = ConsumerConfig(durable_name="D", idle_heartbeat=1)
    with pytest.raises(ValueError):
        async with js.subscribe("s.x", config=cfg, heartbeat_factor=0.5):
            pass
    assert await js.consumer_names("S") == [], "durable D left on the server"
    # Only the request multiplexer's shared inbox (a wildcard) may remain: no deliver subject.
    assert all(s.subject.endswith(".*") for s in js.nc.subscriptions), (
        "deliver subscription left registered"
    )


# 10. next_batch(0) on a push subscription with buffered messages spins without a checkpoint
#     (get_batch(0) returns [] at once, _take loops): the whole trio run freezes -------------


async def test_review2_push_next_batch_zero_does_not_spin(js):
    """next_batch(0) used to return [] without a checkpoint, and the take loop spun, freezing
    the whole run; it is now refused."""
    async with js.subscribe("s.x") as sub:
        await js.publish("s.x", b"x")
        with pytest.raises(ValueError, match="at least 1"):
            await sub.next_batch(0)
        assert (await sub.next_msg(timeout=5)).data == b"x"
