"""headrace.shutdown's parts on their own: the rule (StopLadder) and the handlers
(SignalCatcher), with signals this process raises at itself while the handlers are in place."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from headrace.shutdown import Arrival, SignalCatcher, Step, StopLadder


def steps(times: list[float], window: float = 1.0) -> list[Step]:
    ladder = StopLadder(window)
    return [ladder.feed(Arrival(signal.SIGTERM, at)).step for at in times]


def test_the_ladder() -> None:
    assert steps([10.0]) == [Step.DRAIN]
    # GNU timeout: the process, then its group, microseconds apart.
    assert steps([10.0, 10.000_05]) == [Step.DRAIN, Step.REPEAT]
    assert steps([10.0, 10.5, 11.2]) == [Step.DRAIN, Step.REPEAT, Step.HARD]
    assert steps([10.0, 12.0, 12.1, 13.5, 20.0]) == [
        Step.DRAIN,
        Step.HARD,
        Step.REPEAT,
        Step.FORCE,
        Step.FORCE,
    ]
    # The window counts from the last step taken, not from the last signal: a signal every
    # half second still climbs.
    assert steps([0.0, 0.5, 1.0, 1.5, 2.0]) == [
        Step.DRAIN,
        Step.REPEAT,
        Step.HARD,
        Step.REPEAT,
        Step.FORCE,
    ]
    # Window 0: every signal is a step (a worker, whose supervisor means each one).
    assert steps([5.0, 5.0001, 5.0002], window=0) == [Step.DRAIN, Step.HARD, Step.FORCE]


def test_the_ladder_says_how_long_since() -> None:
    ladder = StopLadder()
    first = ladder.feed(Arrival(signal.SIGINT, 3.0))
    again = ladder.feed(Arrival(signal.SIGTERM, 3.25))
    assert (first.since, first.signal) == (None, signal.SIGINT)
    assert (again.step, again.since, again.signal) == (Step.REPEAT, 0.25, signal.SIGTERM)
    assert ladder.level is Step.DRAIN and ladder.steps == [first, again]
    with pytest.raises(ValueError, match="window"):
        StopLadder(-1)


@pytest.fixture
def recorded() -> Iterator[list[int]]:
    """SIGUSR1 and SIGUSR2 handled by a recorder for the test: what a catcher's predecessor
    sees."""
    seen: list[int] = []

    def record(signum: int, frame: Any) -> None:
        seen.append(signum)

    before = {s: signal.signal(s, record) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    try:
        yield seen
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


async def test_signals_are_received_in_order(recorded: list[int]) -> None:
    with SignalCatcher((signal.SIGUSR1, signal.SIGUSR2)) as catcher:
        signal.raise_signal(signal.SIGUSR1)  # before anyone receives: kept
        with trio.fail_after(5):
            first = await catcher.receive()

            async def later() -> None:
                await trio.lowlevel.checkpoint()
                signal.raise_signal(signal.SIGUSR2)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(later)
                second = await catcher.receive()
    assert (first.signal, second.signal) == (signal.SIGUSR1, signal.SIGUSR2)
    assert first.at <= second.at
    assert catcher.received == [first, second] and catcher.unread == []
    assert recorded == []


async def test_signals_not_read_are_never_raised_again(recorded: list[int]) -> None:
    """trio.open_signal_receiver raises them again, with the previous handler, when its block
    ends: a duplicated SIGTERM killed `headrace run` after it had logged exit_code=0."""
    with SignalCatcher((signal.SIGUSR1,)) as catcher:
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGUSR1)
        await trio.lowlevel.checkpoint()
    assert [a.signal for a in catcher.unread] == [signal.SIGUSR1, signal.SIGUSR1]
    assert recorded == []
    # The previous handler is back.
    signal.raise_signal(signal.SIGUSR1)
    assert recorded == [signal.SIGUSR1]


def test_settled_signals_go_to_the_callback(recorded: list[int]) -> None:
    late: list[Arrival] = []
    with SignalCatcher((signal.SIGUSR1, signal.SIGUSR2)) as catcher:
        signal.raise_signal(signal.SIGUSR1)  # caught, not read
        catcher.settle(late.append)
        assert [a.signal for a in late] == [signal.SIGUSR1]
        signal.raise_signal(signal.SIGUSR2)  # straight to the callback, in the handler
        assert [a.signal for a in late] == [signal.SIGUSR1, signal.SIGUSR2]
    assert catcher.unread == [] and recorded == []


def test_one_installation_at_a_time() -> None:
    with (
        SignalCatcher((signal.SIGUSR1,)) as catcher,
        pytest.raises(RuntimeError, match="installed already"),
    ):
        catcher.install()
    with pytest.raises(ValueError, match="no signals"):
        SignalCatcher(())
