"""Pull consumer priority groups (ADR-42): configuration, the pull fields, the pin, unpin.

The rules without a server first (the configuration checks, the request body, the pull flow's
pin), then against a real nats-server (2.15 in the venv: ``overflow``, ``pinned_client`` and
``prioritized``). nats-py, which does not know priority groups, publishes and reads the
consumer's raw info as the independent peer. The last test runs two pipeline workers as
processes on a ``pinned_client`` group and SIGKILLs the pinned one.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from headrace.jetstream import (
    AckPolicy,
    ConsumerConfig,
    ConsumerNotFound,
    JetStream,
    PinGained,
    PinLost,
    PriorityGroupConfigError,
    PriorityGroupError,
    PriorityGroupMissing,
    PriorityGroupNotFound,
    PriorityGroupState,
    PriorityPolicy,
    PriorityPolicyMismatch,
    PriorityPull,
    PriorityPullRefused,
    PullRequest,
    StreamConfig,
    UnknownPriorityGroup,
)
from headrace.jetstream.pull_flow import PULL, PullFlow, Unpinned
from headrace.jetstream.pull_status import status_error
from headrace.nats import connect
from headrace.pipeline import JetStreamSource

from tests.jetstream.js_pull_support import natspy_publish, poll_consumer, seq_of
from tests.procs import LineProcess
from tests.waiting import FAST, EventLog

GROUP = "jobs"


def grouped(policy: PriorityPolicy, name: str = "C", **config: Any) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=name,
        ack_policy=AckPolicy.EXPLICIT,
        priority_groups=[GROUP],
        priority_policy=policy,
        **config,
    )


# -- without a server -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "err_code"),
    [
        ({"priority_policy": PriorityPolicy.OVERFLOW}, 10159),
        ({"priority_groups": [GROUP]}, 10196),
        ({"priority_groups": [GROUP], "priority_policy": PriorityPolicy.NONE}, 10196),
        ({"priority_timeout": 5.0}, 10197),
        ({"priority_groups": [""], "priority_policy": "overflow"}, 10161),
        ({"priority_groups": ["a.b"], "priority_policy": "overflow"}, 10162),
        ({"priority_groups": ["x" * 17], "priority_policy": "overflow"}, 10162),
        ({"priority_groups": [GROUP], "priority_policy": "sticky"}, 10025),
        (
            {"priority_groups": [GROUP], "priority_policy": "overflow", "deliver_subject": "d"},
            10178,
        ),
    ],
)
def test_config_refuses_what_the_server_refuses(config, err_code):
    with pytest.raises(PriorityGroupConfigError) as caught:
        ConsumerConfig(durable_name="C", **config)
    assert caught.value.err_code == err_code
    assert isinstance(caught.value, ValueError)


def test_policy_given_as_text_becomes_the_enum():
    config = ConsumerConfig(priority_groups=["a-b/c=d_1"], priority_policy="pinned_client")
    assert config.priority_policy is PriorityPolicy.PINNED_CLIENT


def test_pull_request_body_carries_the_group_fields():
    pull = PriorityPull(group=GROUP, min_pending=10, min_ack_pending=3)
    body = PullRequest(batch=5, expires=1.0, priority=pull, id="PIN").to_json()
    assert body == {
        "batch": 5,
        "expires": 1_000_000_000,
        "group": GROUP,
        "min_pending": 10,
        "min_ack_pending": 3,
        "id": "PIN",
    }
    body = PullRequest(batch=1, priority=PriorityPull(group=GROUP, priority=0)).to_json()
    assert body == {"batch": 1, "group": GROUP, "priority": 0}
    assert "group" not in PullRequest(batch=1).to_json()


@pytest.mark.parametrize(
    "fields",
    [
        {"group": ""},
        {"group": "no spaces"},
        {"group": GROUP, "min_pending": 0},
        {"group": GROUP, "min_ack_pending": -1},
        {"group": GROUP, "priority": 10},
        {"group": GROUP, "priority": True},
    ],
)
def test_priority_pull_refuses_bad_values(fields):
    with pytest.raises(ValueError):
        PriorityPull(**fields)


def test_a_pin_id_needs_a_group():
    with pytest.raises(ValueError, match="pin id"):
        PullRequest(batch=1, id="PIN")


def flow(refill: bool = True) -> PullFlow:
    return PullFlow(
        batch=10,
        expires=1.0,
        heartbeat=None,
        refill=refill,
        stream="S",
        consumer="C",
        subject="$JS.API.CONSUMER.MSG.NEXT.S.C",
        priority=PriorityPull(group=GROUP),
    )


def test_flow_sends_the_pin_back_and_forgets_it_on_423():
    f = flow()
    first = f.pull(0.0, True)
    assert first is not None and first.id is None and first.priority == PriorityPull(group=GROUP)
    f.received(4, 0, 0.1)
    assert f.pinned("PIN-1") is True
    assert f.pinned("PIN-1") is False  # the same pin again is not news
    f.taken(4, 0)
    second = f.pull(0.2, True)
    assert second is not None and second.id == "PIN-1" and second.batch == 4
    assert f.pending_msgs == 10
    # Another client was pinned: the requests that carried PIN-1 are refused.
    decision = f.status(423, "Nats-Pin-Id mismatch", 0, 0, 0.3)
    assert decision == Unpinned("PIN-1", "Nats-Pin-Id mismatch")
    assert f.pin_id is None and f.pending_msgs == 0
    third = f.pull(0.4, True)
    assert third is not None and third.id is None and third.batch == 10


def test_423_without_a_pin_stays_quiet():
    f = flow()
    f.pull(0.0, True)
    assert f.status(423, "Nats-Wrong-Pin-Id", 10, 0, 0.1) is PULL
    assert f.pin_id is None and not f.ended


def test_fetch_forgets_the_pin_on_423():
    f = flow(refill=False)
    f.pinned("PIN-1")
    request = f.pull(0.0, True)
    assert request is not None and request.id == "PIN-1"
    f.status(423, "Nats-Pin-Id mismatch", 0, 0, 0.1)
    assert f.ended and f.error is None and f.pin_id is None


@pytest.mark.parametrize(
    ("description", "cls"),
    [
        ("Bad Request - Priority Group missing", PriorityGroupMissing),
        ("Bad Request - Invalid Priority Group", UnknownPriorityGroup),
        ("Bad Request - Not a Overflow Priority consumer", PriorityPolicyMismatch),
        ("Bad Request - Not a Pinned Client Priority consumer", PriorityPolicyMismatch),
        ("Bad Request - Priority must be between 0 and 9", PriorityPolicyMismatch),
    ],
)
def test_pull_refusals_have_their_classes(description, cls):
    error = status_error(400, description)
    assert type(error) is cls
    assert isinstance(error, PriorityPullRefused) and error.status == 400


def test_other_bad_requests_stay_generic():
    assert not isinstance(status_error(400, "Bad Request"), PriorityGroupError)


def test_source_checks_its_group_against_the_config_it_creates():
    config = grouped(PriorityPolicy.PINNED_CLIENT, priority_timeout=60)
    source = JetStreamSource(stream="S", durable="C", config=config, priority_group=GROUP)
    assert source.consume_options().priority_pull == PriorityPull(group=GROUP)
    with pytest.raises(PriorityGroupMissing):
        JetStreamSource(stream="S", durable="C", config=config)
    with pytest.raises(UnknownPriorityGroup):
        JetStreamSource(stream="S", durable="C", config=config, priority_group="other")
    with pytest.raises(PriorityPolicyMismatch):
        JetStreamSource(stream="S", durable="C", config=config, priority_group=GROUP, min_pending=5)
    with pytest.raises(PriorityGroupError, match="pull"):
        JetStreamSource(stream="S", durable="C", pull=False, priority_group=GROUP)
    with pytest.raises(PriorityGroupError, match="need group"):
        JetStreamSource(stream="S", durable="C", min_ack_pending=5)
    with pytest.raises(PriorityGroupError, match="shorter than priority_timeout"):
        JetStreamSource(  # the default expires (30 s) would let a 20 s pin lapse when idle
            stream="S",
            durable="C",
            config=grouped(PriorityPolicy.PINNED_CLIENT, priority_timeout=20),
            priority_group=GROUP,
        )
    overflow = JetStreamSource(
        stream="S",
        durable="C",
        config=grouped(PriorityPolicy.OVERFLOW),
        priority_group=GROUP,
        min_pending=100,
    )
    assert overflow.consume_options().priority_pull == PriorityPull(group=GROUP, min_pending=100)


# -- against a real server --------------------------------------------------------------------


async def add_stream(js: JetStream) -> None:
    await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))


async def raw_info(natspy: Any, consumer: str) -> dict[str, Any]:
    """The consumer's info as the server sends it, read by nats-py."""

    async def go() -> Any:
        reply = await natspy.nc.request(f"$JS.API.CONSUMER.INFO.S.{consumer}", b"", timeout=5)
        return json.loads(reply.data)

    result: dict[str, Any] = await natspy.call(go)
    return result


@pytest.mark.parametrize(
    ("policy", "extra"),
    [
        (PriorityPolicy.OVERFLOW, {}),
        (PriorityPolicy.PINNED_CLIENT, {"priority_timeout": 7.5}),
        (PriorityPolicy.PRIORITIZED, {}),
    ],
)
async def test_config_round_trips(nats_server, natspy, policy, extra):
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await add_stream(js)
        created = await js.create_consumer("S", grouped(policy, **extra))
        info = await js.consumer_info("S", "C")
        for got in (created, info):
            assert got.config.priority_groups == [GROUP]
            assert got.config.priority_policy is policy
            assert got.priority_groups == [PriorityGroupState(group=GROUP)]
        if extra:
            assert info.config.priority_timeout == 7.5
        raw = await raw_info(natspy, "C")
        assert raw["config"]["priority_groups"] == [GROUP]
        assert raw["config"]["priority_policy"] == policy.value
        if extra:
            assert raw["config"]["priority_timeout"] == 7_500_000_000
        # Binding again with the same settings is no drift (ADR-15).
        async with js.pull_subscribe(stream="S", durable="C", config=grouped(policy, **extra)):
            pass


async def test_server_refusals_are_typed(nats_server):
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await add_stream(js)
        # Past the client's checks (``extra`` goes out as is): the server's own answer.
        bare = ConsumerConfig(durable_name="X", extra={"priority_policy": "overflow"})
        with pytest.raises(PriorityGroupConfigError) as caught:
            await js.create_consumer("S", bare)
        assert caught.value.err_code == 10159
        await js.create_consumer("S", grouped(PriorityPolicy.PINNED_CLIENT))
        with pytest.raises(PriorityGroupNotFound):
            await js.unpin_consumer("S", "C", "other")
        with pytest.raises(ConsumerNotFound):
            await js.unpin_consumer("S", "nope", GROUP)
        with pytest.raises(PriorityGroupConfigError):
            await js.unpin_consumer("S", "C", "not valid")


async def test_pulls_that_do_not_fit_are_refused_before_sending(nats_server, natspy):
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await add_stream(js)
        await js.create_consumer("S", grouped(PriorityPolicy.PINNED_CLIENT, priority_timeout=4))
        await js.create_consumer("S", grouped(PriorityPolicy.OVERFLOW, name="O"))
        await js.create_consumer("S", ConsumerConfig(durable_name="N", ack_policy="explicit"))
        await natspy_publish(natspy, 3)
        pinned = await js.pull_consumer("S", "C")
        overflow = await js.pull_consumer("S", "O")
        plain = await js.pull_consumer("S", "N")
        with pytest.raises(PriorityGroupMissing):
            await pinned.fetch(1, expires=1)
        with pytest.raises(UnknownPriorityGroup):
            await pinned.fetch(1, expires=1, group="other")
        with pytest.raises(UnknownPriorityGroup, match="no priority groups"):
            await plain.fetch(1, expires=1, group=GROUP)  # the server would ignore the group
        with pytest.raises(PriorityPolicyMismatch):
            await pinned.fetch(1, expires=1, group=GROUP, min_pending=2)
        with pytest.raises(PriorityPolicyMismatch):
            await overflow.fetch(1, expires=1, group=GROUP, priority=1)
        with pytest.raises(PriorityGroupError, match="need group"):
            await overflow.fetch(1, expires=1, min_ack_pending=1)
        # The pin would lapse between an idle consume's pulls.
        with pytest.raises(PriorityGroupError, match="shorter than the priority_timeout"):
            async with pinned.consume(group=GROUP, expires=4):
                pass
        with pytest.raises(PriorityGroupMissing):
            async with pinned.consume(expires=1):
                pass
        with pytest.raises(PriorityGroupMissing):
            await pinned.next(expires=1)
        for name in ("C", "O", "N"):
            raw = await raw_info(natspy, name)
            assert raw["delivered"]["consumer_seq"] == 0  # nothing was pulled


async def test_the_servers_refusal_of_a_stale_handle_is_typed(nats_server, natspy):
    """A handle bound before the consumer was made again with groups pulls without one: the
    server's 400 ends the fetch and the consume with the typed error."""
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await add_stream(js)
        await js.create_consumer("S", ConsumerConfig(durable_name="C", ack_policy="explicit"))
        stale = await js.pull_consumer("S", "C")
        await js.delete_consumer("S", "C")
        await js.create_consumer("S", grouped(PriorityPolicy.OVERFLOW))
        await natspy_publish(natspy, 2)
        with pytest.raises(PriorityGroupMissing) as caught:
            await stale.fetch(1, expires=1)
        assert caught.value.description == "Bad Request - Priority Group missing"
        async with stale.consume(expires=1) as messages:
            with trio.fail_after(5), pytest.raises(PriorityGroupMissing):
                await messages.next_batch()


@pytest.mark.slow  # 2.3 s or more of timers: the full suite runs it
async def test_overflow_serves_a_threshold_pull_only_past_it(nats_server, natspy):
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await add_stream(js)
        await js.create_consumer("S", grouped(PriorityPolicy.OVERFLOW))
        consumer = await js.pull_consumer("S", "C")
        await natspy_publish(natspy, 3)
        # 3 pending: a pull that waits for 5 gets nothing before it expires.
        assert await consumer.fetch(5, expires=1, group=GROUP, min_pending=5) == []
        # The threshold holds message by message: with 5 pending, a pull for 5 with
        # min_pending 3 gets 3 (served at 5, 4 and 3 pending, not at 2).
        await natspy_publish(natspy, 2, start=3)
        got = await consumer.fetch(5, expires=1, group=GROUP, min_pending=3)
        assert [seq_of(m) for m in got] == [1, 2, 3]
        # 3 unacked, 2 pending: min_pending 3 is not met, min_ack_pending 3 is.
        assert await consumer.fetch(1, expires=1, group=GROUP, min_pending=3) == []
        more = await consumer.fetch(2, expires=1, group=GROUP, min_ack_pending=3)
        assert [seq_of(m) for m in more] == [4, 5]
        for msg in got + more:
            await msg.ack_sync()
        # A consume with a threshold takes part once the backlog reaches it.
        async with consumer.consume(group=GROUP, min_pending=4, expires=1) as messages:
            await natspy_publish(natspy, 3, start=5)
            with trio.move_on_after(2.5):  # two of its requests expire meanwhile
                await messages.next_batch()
                pytest.fail("a pull with min_pending 4 was served with 3 pending")
            await natspy_publish(natspy, 3, start=8)
            with trio.fail_after(5):
                taken: list[int] = []
                while len(taken) < 3:
                    taken += [seq_of(m) for m in await messages.next_batch()]
            assert taken == [6, 7, 8]  # served at 6, 5 and 4 pending
        info = await poll_consumer(natspy, lambda i: i.num_pending == 3)
        assert info.delivered.stream_seq == 8


@pytest.mark.slow  # 2.3 s or more of timers: the full suite runs it
async def test_prioritized_serves_the_lower_priority_first(nats_server, natspy):
    await natspy.connect(nats_server.url)
    async with (
        connect(nats_server.url, **FAST) as nc_low,
        connect(nats_server.url, **FAST) as nc_high,
    ):
        js = JetStream(nc_low)
        await add_stream(js)
        await js.create_consumer("S", grouped(PriorityPolicy.PRIORITIZED))
        first = await JetStream(nc_low).pull_consumer("S", "C")
        second = await JetStream(nc_high).pull_consumer("S", "C")
        got: dict[str, list[int]] = {"0": [], "5": []}

        async def pull(consumer: Any, priority: int) -> None:
            msgs = await consumer.fetch(3, expires=3, group=GROUP, priority=priority)
            got[str(priority)] += [seq_of(m) for m in msgs]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pull, second, 5)
            nursery.start_soon(pull, first, 0)
            await poll_consumer(natspy, lambda i: i.num_waiting == 2)
            await natspy_publish(natspy, 3)
        assert got == {"0": [1, 2, 3], "5": []}


async def test_fetch_keeps_the_pin_between_calls_and_forgets_it_on_423(nats_server, natspy):
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await add_stream(js)
        await js.create_consumer("S", grouped(PriorityPolicy.PINNED_CLIENT, priority_timeout=30))
        consumer = await js.pull_consumer("S", "C")
        await natspy_publish(natspy, 4)
        first = await consumer.fetch(2, expires=1, group=GROUP)
        assert [seq_of(m) for m in first] == [1, 2]
        pin = consumer.pin_id
        assert pin is not None and first[0].headers is not None
        assert first[0].headers.get("Nats-Pin-Id") == pin
        info = await js.consumer_info("S", "C")
        assert info.priority_groups is not None
        assert info.priority_groups[0].pinned_client_id == pin
        # The next fetch sends the pin back: still the pinned client, same pin.
        second = await consumer.next(expires=1, group=GROUP)
        assert second is not None and seq_of(second) == 3 and consumer.pin_id == pin
        await consumer.unpin(GROUP)
        # Its old id is refused (423): the fetch returns nothing and forgets it ...
        assert await consumer.fetch(1, expires=1, group=GROUP) == []
        assert consumer.pin_id is None
        # ... and the next one, without an id, is pinned anew.
        third = await consumer.fetch(1, expires=1, group=GROUP)
        assert [seq_of(m) for m in third] == [4]
        assert consumer.pin_id not in (None, pin)


async def test_only_the_pinned_client_gets_messages_and_unpin_moves_the_pin(nats_server, natspy):
    await natspy.connect(nats_server.url)
    async with (
        connect(nats_server.url, **FAST) as nc_a,
        connect(nats_server.url, **FAST) as nc_b,
    ):
        js = JetStream(nc_a)
        await add_stream(js)
        await js.create_consumer("S", grouped(PriorityPolicy.PINNED_CLIENT, priority_timeout=30))
        handles = {
            "a": await JetStream(nc_a).pull_consumer("S", "C"),
            "b": await JetStream(nc_b).pull_consumer("S", "C"),
        }
        received: dict[str, list[int]] = {"a": [], "b": []}
        changed = trio.Event()
        logs: dict[str, EventLog] = {}

        async def worker(name: str, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            nonlocal changed
            async with handles[name].consume(group=GROUP, expires=2, max_messages=50) as msgs:
                logs[name] = EventLog(msgs.events())
                async with trio.open_nursery() as inner:
                    inner.start_soon(logs[name].run)
                    task_status.started()
                    while True:
                        batch = await msgs.next_batch()
                        for msg in batch:
                            await msg.ack()
                        received[name] += [seq_of(m) for m in batch]
                        changed.set()
                        changed = trio.Event()

        async def until_received(total: int) -> None:
            with trio.fail_after(10):
                while len(received["a"]) + len(received["b"]) < total:
                    await changed.wait()

        async with trio.open_nursery() as nursery:
            await nursery.start(worker, "a")
            await nursery.start(worker, "b")
            await poll_consumer(natspy, lambda i: i.num_waiting == 2)
            await natspy_publish(natspy, 30)
            await until_received(30)
            holder = "a" if received["a"] else "b"
            standby = "b" if holder == "a" else "a"
            assert sorted(received[holder]) == list(range(1, 31)) and received[standby] == []
            gained = await logs[holder].wait_for(PinGained)
            assert gained.group == GROUP and handles[holder].pin_id == gained.pin_id
            info = await js.consumer_info("S", "C")
            assert info.priority_groups is not None
            state = info.priority_groups[0]
            assert state.pinned_client_id == gained.pin_id and state.pinned_ts is not None
            assert logs[standby].of(PinGained) == []

            await js.unpin_consumer("S", "C", GROUP)
            await natspy_publish(natspy, 30, start=30)
            await until_received(60)
            lost = await logs[holder].wait_for(PinLost)
            assert lost.pin_id == gained.pin_id and handles[holder].pin_id is None
            moved = await logs[standby].wait_for(PinGained)
            assert moved.pin_id != gained.pin_id
            assert sorted(received[standby]) == list(range(31, 61))
            assert sorted(received[holder]) == list(range(1, 31))
            info = await js.consumer_info("S", "C")
            assert info.priority_groups is not None
            assert info.priority_groups[0].pinned_client_id == moved.pin_id
            nursery.cancel_scope.cancel()


# -- the test: hot standby takes over from a killed pinned worker ---------------------

WORKER = Path(__file__).resolve().parent / "pinned_worker.py"
#: How long the server keeps the pin of a worker that stopped pulling: five of the workers'
#: pull intervals, so that a worker slowed down by a loaded machine keeps its pin.
PIN_TIMEOUT = 5.0
#: The workers' consume expires: an idle worker pulls again that often, renewing its pin.
WORKER_EXPIRES = 1.0


class Worker(LineProcess):
    """``pinned_worker.py`` running; its stdout lines are JSON events."""

    transcript_lines = (40, 20)

    def __init__(self, proc: trio.Process, name: str) -> None:
        super().__init__(proc, f"worker {name}")
        self.name = name

    @property
    def committed(self) -> list[int]:
        return [seq for event in self.events("committed") for seq in event["seqs"]]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        try:
            with trio.fail_after(timeout):
                while not predicate():
                    if self.eof:
                        raise AssertionError("the worker ended\n" + self.transcript())
                    await self._changed.wait()
        except trio.TooSlowError:
            raise AssertionError(f"not within {timeout}s\n" + self.transcript()) from None


@asynccontextmanager
async def worker_process(url: str, name: str) -> AsyncIterator[Worker]:
    argv = [sys.executable, str(WORKER), url, "S", "C", GROUP, str(WORKER_EXPIRES)]
    async with trio.open_nursery() as nursery:
        proc = await trio.lowlevel.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        worker = Worker(proc, name)
        nursery.start_soon(worker._read, proc.stdout, worker.out)
        nursery.start_soon(worker._read, proc.stderr, worker.err)
        try:
            yield worker
        finally:
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()


async def wait_any(workers: list[Worker], predicate: Callable[[], bool], timeout: float) -> None:
    """Until ``predicate()`` holds, woken by any worker's output."""
    try:
        with trio.fail_after(timeout):
            while True:
                # Each worker's event as of now, taken before the check: output that comes
                # while the waiters start sets these (a worker replaces its event when set).
                changed = [w._changed for w in workers]
                if predicate():
                    return
                async with trio.open_nursery() as nursery:
                    for event in changed:

                        async def woken(event: trio.Event = event) -> None:
                            await event.wait()
                            nursery.cancel_scope.cancel()

                        nursery.start_soon(woken)
    except trio.TooSlowError:
        said = "\n".join(w.transcript() for w in workers)
        raise AssertionError(f"not within {timeout}s\n{said}") from None


@pytest.mark.slow
async def test_standby_worker_takes_over_from_a_killed_pinned_worker(nats_server, natspy):
    """Two pipeline workers (processes) on one ``pinned_client`` group: the pinned one takes
    every message; SIGKILLed, its pin lapses after ``priority_timeout`` and the standby takes
    the rest. Every message is delivered once and acked once across the two."""
    first, second = 40, 40
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await add_stream(js)
        await js.create_consumer(
            "S", grouped(PriorityPolicy.PINNED_CLIENT, priority_timeout=PIN_TIMEOUT)
        )
        async with (
            worker_process(nats_server.url, "a") as a,
            worker_process(nats_server.url, "b") as b,
        ):
            workers = [a, b]
            for w in workers:
                await w.wait_for(lambda w=w: bool(w.events("running")), timeout=30)
            # Both are pulling: the pin goes to one of them with the first message.
            await poll_consumer(natspy, lambda i: i.num_waiting >= 2, timeout=15)
            await natspy_publish(natspy, first)
            await wait_any(workers, lambda: len(a.committed) + len(b.committed) >= first, 60)
            pinned, standby = (a, b) if a.committed else (b, a)
            assert sorted(pinned.committed) == list(range(1, first + 1)), pinned.transcript()
            assert standby.committed == []
            # Every message of the pinned worker is acked: killing it now loses no ack.
            await poll_consumer(
                natspy,
                lambda i: i.ack_floor.stream_seq == first and i.num_ack_pending == 0,
                timeout=15,
            )
            old_pin = (await js.consumer_info("S", "C")).priority_groups[0].pinned_client_id
            assert old_pin is not None

            pinned.signal(signal.SIGKILL)
            await pinned.proc.wait()
            killed = trio.current_time()
            await natspy_publish(natspy, second, start=first)
            await standby.wait_for(lambda: len(standby.committed) >= second, timeout=30)
            took = trio.current_time() - killed
            assert sorted(standby.committed) == list(range(first + 1, first + second + 1))

            info = await poll_consumer(
                natspy,
                lambda i: i.ack_floor.stream_seq == first + second and i.num_ack_pending == 0,
                timeout=15,
            )
            # Delivered once each (no redelivery), acked once each (the floor, nothing pending).
            assert info.delivered.consumer_seq == first + second
            assert info.num_redelivered == 0
            assert set(pinned.committed).isdisjoint(standby.committed)
            state = (await js.consumer_info("S", "C")).priority_groups[0]
            assert state.pinned_client_id not in (None, old_pin)
            # The standby waited for the pin to lapse (a margin below for timer granularity).
            print("TOOK", took)
            assert took >= PIN_TIMEOUT * 0.5, took


@pytest.mark.slow  # idle for three pin lifetimes
async def test_a_pin_of_one_second_or_less_is_consumable(nats_server, natspy):
    """Issue 24: ``expires`` had to be at least 1 s and below the pin's timeout, so a
    pinned_client consumer whose pin lasts 1 s or less could not be consumed at all. Such a
    consume pulls with a shorter ``expires`` (and heartbeat) and keeps its pin while idle for
    longer than the pin lasts."""
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url, **FAST) as nc:
        js = JetStream(nc)
        await add_stream(js)
        await js.create_consumer("S", grouped(PriorityPolicy.PINNED_CLIENT, priority_timeout=0.8))
        consumer = await js.pull_consumer("S", "C")
        with pytest.raises(PriorityGroupError, match="must be shorter than the priority_timeout"):
            async with consumer.consume(group=GROUP, expires=1):
                pass
        async with consumer.consume(group=GROUP, expires=0.4, max_messages=20) as msgs:
            log = EventLog(msgs.events())
            async with trio.open_nursery() as nursery:
                nursery.start_soon(log.run)
                await natspy_publish(natspy, 5)
                with trio.fail_after(10):
                    first = [seq_of(m) for m in await msgs.next_batch()]
                gained = await log.wait_for(PinGained)
                # Idle for three pin lifetimes: the consume's own pulls renew the pin.
                await trio.sleep(2.4)
                await natspy_publish(natspy, 5, start=5)
                seqs = list(first)
                with trio.fail_after(10):
                    while len(seqs) < 10:
                        seqs += [seq_of(m) for m in await msgs.next_batch()]
                assert sorted(seqs) == list(range(1, 11))
                assert log.of(PinLost) == [] and consumer.pin_id == gained.pin_id
                nursery.cancel_scope.cancel()

        # Below 1 s only there: another consumer keeps ADR-37's floor.
        await js.create_consumer("S", ConsumerConfig(durable_name="PLAIN"))
        plain = await js.pull_consumer("S", "PLAIN")
        with pytest.raises(ValueError, match="at least 1 second"):
            async with plain.consume(expires=0.4):
                pass
