"""The actor runtime: states, inboxes and references, and supervision (Restart, Escalate).

No server is involved. Timing-sensitive parts (restart backoff, the restart window) run on
trio's autojump clock, so backoff delays are checked exactly without real waiting.
"""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing
from headrace.actors import (
    Actor,
    ActorFailed,
    ActorRef,
    ActorState,
    Escalate,
    Restart,
    describe,
    supervise,
)


class Boom(Exception):
    pass


class Scripted(Actor[str]):
    """Receives messages; ``"boom"`` makes its run fail, ``"stop"`` makes it return.

    Records what it received, each run's start time and state, and sets ``failing`` just
    before it raises, so a test can look at the supervisor's reaction.
    """

    def __init__(self, name: str = "scripted", inbox_size: int | float = 16) -> None:
        super().__init__(name, inbox_size=inbox_size)
        self.received: list[str] = []
        self.starts: list[float] = []
        self.states_at_start: list[ActorState] = []
        self.failing = trio.Event()
        self.started = trio.Event()

    async def run(self) -> None:
        self.starts.append(trio.current_time())
        self.states_at_start.append(self.state)
        self.started.set()
        self.started = trio.Event()
        async for message in self.inbox:
            if message == "boom":
                self.failing.set()
                self.failing = trio.Event()
                raise Boom(f"boom #{len(self.starts)}")
            if message == "stop":
                return
            self.received.append(message)


class AlwaysFails(Actor[None]):
    def __init__(self, name: str = "failing", *, after: float = 0.0) -> None:
        super().__init__(name)
        self.after = after
        self.runs = 0
        self.starts: list[float] = []
        self.started = trio.Event()

    async def run(self) -> None:
        self.runs += 1
        self.starts.append(trio.current_time())
        self.started.set()
        self.started = trio.Event()
        await trio.sleep(self.after)
        raise Boom(f"failure {self.runs}")


def _only(group: BaseException) -> BaseException:
    """The single leaf exception of a (nested) exception group."""
    while isinstance(group, BaseExceptionGroup):
        assert len(group.exceptions) == 1, group
        group = group.exceptions[0]
    return group


# -- restarts -----------------------------------------------------------------------------------


async def test_restart_with_exponential_backoff_then_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    actor = Scripted()
    policy = Restart(max_restarts=5, within=1000, backoff=1.0, backoff_max=3.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, actor, policy)
        assert actor.state is ActorState.RUNNING
        for expected_restarts in (1, 2, 3):
            failing = actor.failing
            started = actor.started
            actor.tell("boom")
            await failing.wait()
            # The supervisor has seen the failure and waits out the backoff.
            await trio.testing.wait_all_tasks_blocked()
            assert actor.state is ActorState.RESTARTING
            assert actor.restarts == expected_restarts
            assert isinstance(actor.error, Boom)
            await started.wait()
            assert actor.state is ActorState.RUNNING
        actor.tell("stop")
        await actor.wait_stopped()
    assert actor.state is ActorState.STOPPED
    assert actor.restarts == 3
    # backoff 1, 2, then capped at backoff_max 3
    gaps = [b - a for a, b in zip(actor.starts, actor.starts[1:], strict=False)]
    assert gaps == pytest.approx([1.0, 2.0, 3.0])
    assert actor.states_at_start == [ActorState.RUNNING] * 4


async def test_inbox_survives_a_restart() -> None:
    actor = Scripted()
    for message in ("a", "boom", "b", "c", "stop"):
        assert actor.tell(message)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, actor, Restart(backoff=0))
        with trio.fail_after(5):
            await actor.wait_stopped()
    assert actor.received == ["a", "b", "c"]
    assert actor.restarts == 1
    assert actor.state is ActorState.STOPPED


async def test_restart_delay_is_exponential_and_capped() -> None:
    policy = Restart(backoff=0.1, backoff_max=1.0)
    assert [policy.delay(n) for n in (1, 2, 3, 4, 5, 100)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    )
    with pytest.raises(ValueError):
        Restart(max_restarts=-1)
    with pytest.raises(ValueError):
        Restart(within=0)
    with pytest.raises(ValueError):
        Restart(backoff=-1)


# -- escalation ---------------------------------------------------------------------------------


async def test_too_many_restarts_within_the_window_escalate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    actor = AlwaysFails("worker")
    with pytest.raises(BaseExceptionGroup) as caught:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervise, actor, Restart(max_restarts=2, within=60, backoff=0.5))
            await trio.sleep_forever()
    failure = _only(caught.value)
    assert isinstance(failure, ActorFailed)
    assert failure.actor == "worker"
    assert "'worker'" in str(failure)
    assert "after 2 restarts" in str(failure)
    assert failure.restarts == 2
    assert isinstance(failure.__cause__, Boom)
    assert failure.error is failure.__cause__
    assert str(failure.__cause__) == "failure 3"
    assert actor.runs == 3  # the first run and two restarts
    assert actor.state is ActorState.FAILED
    with trio.fail_after(1):
        await actor.wait_stopped()


async def test_failures_spread_beyond_the_window_do_not_escalate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Fails every 10 s; the window is 5 s with one restart allowed: never two failures in it.
    actor = AlwaysFails("slow-failer", after=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, actor, Restart(max_restarts=1, within=5, backoff=0))
        with trio.fail_after(100):
            while actor.runs < 6:
                await actor.started.wait()
        assert actor.restarts == 5
        assert actor.state is ActorState.RUNNING
        nursery.cancel_scope.cancel()
    assert actor.runs >= 5


async def test_escalate_fails_at_once() -> None:
    actor = AlwaysFails("fragile")
    with pytest.raises(BaseExceptionGroup) as caught:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervise, actor, Escalate())
            await trio.sleep_forever()
    failure = _only(caught.value)
    assert isinstance(failure, ActorFailed)
    assert failure.actor == "fragile"
    assert failure.restarts == 0
    assert "after" not in str(failure)
    assert isinstance(failure.__cause__, Boom)
    assert actor.runs == 1
    assert actor.restarts == 0
    assert actor.state is ActorState.FAILED


class Final(Exception):
    """An error no restart can fix (as headrace.commits' OutputConflict)."""

    restartable = False


class FailsFinally(Actor[None]):
    def __init__(self) -> None:
        super().__init__("final")
        self.runs = 0

    async def run(self) -> None:
        self.runs += 1
        raise Final("the output belongs to another pipeline")


async def test_an_error_that_is_not_restartable_escalates_under_restart() -> None:
    actor = FailsFinally()
    with pytest.raises(BaseExceptionGroup) as caught:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervise, actor, Restart(max_restarts=5, within=60, backoff=0))
            await trio.sleep_forever()
    failure = _only(caught.value)
    assert isinstance(failure, ActorFailed) and isinstance(failure.__cause__, Final)
    assert actor.runs == 1 and actor.restarts == 0
    assert actor.state is ActorState.FAILED


async def test_escalation_cancels_the_siblings() -> None:
    sibling_cancelled = trio.Event()

    async def sibling() -> None:
        try:
            await trio.sleep_forever()
        finally:
            sibling_cancelled.set()

    with pytest.raises(BaseExceptionGroup):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sibling)
            await nursery.start(supervise, AlwaysFails(), Escalate())
    assert sibling_cancelled.is_set()


async def test_a_base_exception_is_not_restarted() -> None:
    class Fatal(BaseException):
        pass

    class Dies(Actor[None]):
        runs = 0

        async def run(self) -> None:
            self.runs += 1
            raise Fatal

    actor = Dies("dies")
    with pytest.raises(BaseExceptionGroup) as caught:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervise, actor, Restart(backoff=0))
    assert isinstance(_only(caught.value), Fatal)
    assert actor.runs == 1
    assert actor.state is ActorState.FAILED


# -- stopping -----------------------------------------------------------------------------------


class Waits(Actor[None]):
    """Runs until cancelled, optionally with child tasks in an inner nursery."""

    def __init__(self, name: str = "waits", *, children: int = 0) -> None:
        super().__init__(name)
        self.children = children

    async def run(self) -> None:
        if self.children:
            async with trio.open_nursery() as inner:
                for _ in range(self.children):
                    inner.start_soon(trio.sleep_forever)
                await trio.sleep_forever()
        await trio.sleep_forever()


@pytest.mark.parametrize("children", [0, 2], ids=["plain", "inner-nursery"])
@pytest.mark.parametrize("how", ["supervise", "start"])
async def test_a_cancelled_actor_is_stopped(children: int, how: str) -> None:
    actor = Waits(children=children)
    async with trio.open_nursery() as nursery:
        if how == "supervise":
            await nursery.start(supervise, actor, Restart())
        else:
            await actor.start(nursery)
        assert actor.state is ActorState.RUNNING
        assert actor.running
        nursery.cancel_scope.cancel()
    assert actor.state is ActorState.STOPPED
    assert actor.error is None
    assert not actor.running
    with trio.fail_after(1):
        await actor.wait_stopped()


@pytest.mark.parametrize("how", ["supervise", "start"])
async def test_stop_cancels_only_that_actor(how: str) -> None:
    actor = Waits(children=1)
    other = Waits("other")
    async with trio.open_nursery() as nursery:
        for a in (actor, other):
            if how == "supervise":
                await nursery.start(supervise, a, Escalate())
            else:
                await a.start(nursery)
        actor.stop()
        with trio.fail_after(2):
            await actor.wait_stopped()
        assert actor.state is ActorState.STOPPED
        assert other.state is ActorState.RUNNING
        nursery.cancel_scope.cancel()


async def test_an_actor_cancelled_while_restarting_is_stopped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    actor = Scripted()
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, actor, Restart(backoff=100))
        failing = actor.failing
        actor.tell("boom")
        await failing.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert actor.state is ActorState.RESTARTING
        nursery.cancel_scope.cancel()
    assert actor.state is ActorState.STOPPED
    with trio.move_on_after(1) as waited:
        await actor.wait_stopped()
    assert not waited.cancelled_caught, "wait_stopped() hangs"


async def test_run_returning_is_stopped() -> None:
    actor = Scripted()
    actor.tell("stop")
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, actor, Escalate())
    assert actor.state is ActorState.STOPPED


async def test_a_failing_unsupervised_actor_is_failed() -> None:
    actor = AlwaysFails()
    with pytest.raises(BaseExceptionGroup) as caught:
        async with trio.open_nursery() as nursery:
            await actor.start(nursery)
    assert isinstance(_only(caught.value), Boom)
    assert actor.state is ActorState.FAILED
    assert isinstance(actor.error, Boom)


async def test_stop_before_start() -> None:
    actor = Waits()
    assert actor.state is ActorState.STARTING
    actor.stop()
    assert actor.state is ActorState.STOPPED
    with trio.fail_after(1):
        await actor.wait_stopped()


# -- references and backpressure ----------------------------------------------------------------


class Gated(Actor[int]):
    """Takes one message each time ``gate`` is opened."""

    def __init__(self, name: str = "gated", inbox_size: int = 2) -> None:
        super().__init__(name, inbox_size=inbox_size)
        self.got: list[int] = []
        self.gate = trio.Semaphore(0)
        self.took = trio.Event()

    async def run(self) -> None:
        while True:
            await self.gate.acquire()
            self.got.append(await self.inbox.receive())
            self.took.set()
            self.took = trio.Event()


async def test_ref_tell_says_no_when_the_inbox_is_full() -> None:
    actor = Gated(inbox_size=2)
    ref = actor.ref
    assert isinstance(ref, ActorRef)
    assert ref.name == "gated"
    assert repr(ref) == "ActorRef('gated')"
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, actor, Escalate())
        assert ref.state is ActorState.RUNNING
        assert ref.tell(1)
        assert ref.tell(2)
        assert not ref.tell(3)  # full: nothing waits, the caller is told
        took = actor.took
        actor.gate.release()
        await took.wait()
        assert ref.tell(4)
        assert not ref.tell(5)
        nursery.cancel_scope.cancel()
    assert actor.got == [1]
    assert ref.state is ActorState.STOPPED


async def test_ref_send_waits_for_room() -> None:
    actor = Gated(inbox_size=1)
    ref = actor.ref
    sent = trio.Event()

    async def sender() -> None:
        await ref.send(1)
        await ref.send(2)  # blocks: the inbox holds 1
        sent.set()

    async with trio.open_nursery() as nursery:
        await actor.start(nursery)
        nursery.start_soon(sender)
        await trio.testing.wait_all_tasks_blocked()
        assert not sent.is_set()  # backpressure
        actor.gate.release()
        with trio.fail_after(2):
            await sent.wait()
        actor.gate.release()
        took = actor.took
        await took.wait()
        nursery.cancel_scope.cancel()
    assert actor.got == [1, 2]


async def test_a_stopped_actor_refuses_messages() -> None:
    actor = Gated()
    async with trio.open_nursery() as nursery:
        await actor.start(nursery)
        actor.stop()
        await actor.wait_stopped()
    assert not actor.ref.tell(1)
    with pytest.raises(trio.ClosedResourceError):
        await actor.ref.send(1)


async def test_a_stopped_supervised_actor_refuses_messages() -> None:
    actor = Gated()
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, actor, Escalate())
        actor.stop()
        await actor.wait_stopped()
    assert actor.state is ActorState.STOPPED
    assert not actor.ref.tell(1)


async def test_unbounded_inbox_and_describe() -> None:
    actor = Gated("unbounded", inbox_size=math.inf)  # type: ignore[arg-type]
    assert all(actor.tell(i) for i in range(1000))
    assert describe([actor, Waits("w")]) == [("unbounded", "starting"), ("w", "starting")]
    assert repr(actor) == "<Gated 'unbounded' starting>"
    with pytest.raises(ValueError):
        Waits("")
