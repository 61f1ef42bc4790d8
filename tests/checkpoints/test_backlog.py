"""The backlog a host keeps from the watch of its group's checkpoints (no server needed):
what it keeps, in which order it hands work out, how much at once, and that an older read
never replaces a newer one."""

from __future__ import annotations

import math

from headrace.checkpoints import Checkpoint, CheckpointId, Status
from headrace.checkpoints.backlog import Backlog
from headrace.checkpoints.store import Stored


def cid(n: int, subscription: str = "ledger") -> CheckpointId:
    return CheckpointId("billing", subscription, f"orders.{n}")


def lagging(n: int, revision: int) -> Stored:
    return Stored(Checkpoint(id=cid(n), version=5, position=2), revision)


def test_lagging_checkpoints_are_handed_out_in_arrival_order_up_to_the_limit() -> None:
    backlog = Backlog(frozenset({"ledger"}))
    for n in (3, 1, 2, 4):
        backlog.note(lagging(n, revision=10 + n))
    first = backlog.due(0.0, busy=set(), limit=2)
    assert [s.checkpoint.id for s in first] == [cid(3), cid(1)]
    assert len(backlog) == 2
    rest = backlog.due(0.0, busy=set(), limit=math.inf)
    assert [s.checkpoint.id for s in rest] == [cid(2), cid(4)]
    assert backlog.due(0.0, busy=set()) == [] and len(backlog) == 0


def test_busy_checkpoints_stay_for_later_and_zero_room_hands_out_nothing() -> None:
    backlog = Backlog(frozenset({"ledger"}))
    backlog.note(lagging(1, revision=1))
    backlog.note(lagging(2, revision=2))
    assert backlog.due(0.0, busy=set(), limit=0) == []
    taken = backlog.due(0.0, busy={cid(1)})
    assert [s.checkpoint.id for s in taken] == [cid(2)]
    assert [s.checkpoint.id for s in backlog.due(0.0, busy=set())] == [cid(1)]


def test_what_is_kept_and_what_is_dropped() -> None:
    backlog = Backlog(frozenset({"ledger"}))
    caught_up = Stored(Checkpoint(id=cid(1), version=5, position=5), 1)
    reserved = Stored(Checkpoint(id=cid(2), version=5).reserve("host", 0.0, 60.0), 2)
    other = Stored(Checkpoint(id=cid(3, "welcome"), version=5), 3)
    failed = Stored(Checkpoint(id=cid(4), version=5, status=Status.FAILED), 4)
    for stored in (caught_up, reserved, other, failed):
        backlog.note(stored)
    assert len(backlog) == 0
    backlog.note(lagging(5, revision=5))
    backlog.note(Stored(Checkpoint(id=cid(5), version=5).reserve("host", 0.0, 60.0), 6))
    assert len(backlog) == 0  # reserved by someone since: dropped


def test_an_older_read_never_replaces_a_newer_one() -> None:
    backlog = Backlog(frozenset({"ledger"}))
    backlog.note(Stored(Checkpoint(id=cid(1), version=9, position=2), 20))
    # The safety-net poll read it before the watch's change: caught up, revision 15.
    backlog.note(Stored(Checkpoint(id=cid(1), version=2, position=2), 15))
    (taken,) = backlog.due(0.0, busy=set())
    assert taken.revision == 20 and taken.checkpoint.version == 9


def test_retries_come_when_due_and_before_lagging_ones() -> None:
    backlog = Backlog(frozenset({"ledger"}))
    retry = Stored(
        Checkpoint(id=cid(1), version=5, position=2, status=Status.RETRY, retry_at=100.0), 1
    )
    backlog.note(lagging(2, revision=2))
    backlog.note(retry)
    assert backlog.next_retry() == 100.0
    assert [s.checkpoint.id for s in backlog.due(50.0, busy=set())] == [cid(2)]
    assert backlog.due(99.0, busy=set()) == []
    backlog.note(lagging(3, revision=3))
    due = backlog.due(100.0, busy=set(), limit=1)
    assert [s.checkpoint.id for s in due] == [cid(1)]
    assert backlog.next_retry() == math.inf
