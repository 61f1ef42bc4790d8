"""The commit state's transitions (state.py), without I/O: each one on its own, then a state
machine of several workers committing through compare-and-set, as the coordinator drives them.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from headrace.commits import (
    Attempt,
    CommitState,
    Committed,
    CorruptCommitState,
    Expired,
    Lease,
    LeaseLost,
    Overlap,
    SeqSet,
    StreamCommits,
    StreamIdentity,
    StreamRecreated,
    Unpublished,
    seqbits,
)
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

S = StreamIdentity("S", "2026-01-01T00:00:00.000000Z")
T = StreamIdentity("T", "2026-01-02T00:00:00.000000Z")
S_NEW = StreamIdentity("S", "2026-03-01T00:00:00.000000Z")  # S deleted and created again


def fresh() -> CommitState:
    return CommitState(output="out-1", owner="pipe/sink")


def attempt(batch: str, started: int = 1_000, nonce: str = "00000000") -> Attempt:
    return Attempt(batch, started, nonce)


def seqs(*spans: tuple[int, int] | int) -> SeqSet:
    out = SeqSet()
    for span in spans:
        if isinstance(span, int):
            out.add(span)
        else:
            out.add_range(*span)
    return out


def members(part: SeqSet) -> set[int]:
    return {n for a, b in part.intervals for n in range(a, b + 1)}


def committed(outcome: Any) -> CommitState:
    assert isinstance(outcome, Committed), outcome
    assert not outcome.already
    return outcome.state


def same(a: CommitState, b: CommitState) -> None:
    """Field by field (a failure names the field)."""
    for field in attrs.fields(CommitState):
        assert getattr(a, field.name) == getattr(b, field.name), field.name
    assert a == b


# -- commit ----------------------------------------------------------------------------------------


def test_first_commit_records_identity_attempt_and_folds_into_the_floor() -> None:
    a = attempt("a")
    state = committed(fresh().commit(a, "w1", {S: seqs((1, 5), (8, 9))}, at=77))
    assert state.streams["S"] == StreamCommits(S.created, 5, seqs((8, 9)))
    assert state.unpublished == {a.token: Unpublished("w1", 77)}
    assert state.commits == 1 and state.horizon == 0
    assert state.mine("w1") == [a.token] and state.mine("w2") == []
    # The hole is filled: the floor continues through the interval above it.
    b = attempt("b")
    state = committed(state.commit(b, "w2", {S: seqs(6, 7)}, at=78))
    assert state.streams["S"] == StreamCommits(S.created, 9, SeqSet())
    assert state.commits == 2 and set(state.unpublished) == {a.token, b.token}


def test_commit_leaves_the_state_it_was_given_alone() -> None:
    before = committed(fresh().commit(attempt("a"), "w", {S: seqs((3, 4))}, at=1))
    snapshot = before.to_json()
    after = committed(before.commit(attempt("b"), "w", {S: seqs((6, 7)), T: seqs(1)}, at=2))
    assert before.to_json() == snapshot
    assert after.streams["S"].seqs == seqs((3, 4), (6, 7))
    assert before.streams["S"].seqs == seqs((3, 4))


def test_overlap_names_exactly_the_committed_part_including_the_floor() -> None:
    state = committed(
        fresh().commit(attempt("a"), "w1", {S: seqs((1, 10), (20, 25)), T: seqs(5)}, at=1)
    )
    outcome = state.commit(
        attempt("b"), "w2", {S: seqs((8, 12), (18, 21), 30), T: seqs((1, 4))}, at=2
    )
    assert isinstance(outcome, Overlap)
    assert outcome.committed == {"S": seqs((8, 10), (20, 21))}  # T's part is new: not named
    assert outcome.count == 5
    # Nothing of the attempt is committed, not even its new part.
    assert outcome.committed["S"].intersection(seqs(30)) == SeqSet()
    assert state.committed_part(S, seqs((11, 19))) == SeqSet()
    assert state.committed_part(T, seqs((1, 9))) == seqs(5)


def test_the_same_attempt_again_is_already_committed() -> None:
    a = attempt("a")
    state = committed(fresh().commit(a, "w1", {S: seqs((1, 3))}, at=1))
    again = state.commit(a, "w1", {S: seqs((1, 3))}, at=2)
    assert again == Committed(state, already=True)
    assert again.state is state  # nothing to write
    assert state.commits == 1


def test_an_attempt_started_before_the_horizon_expires() -> None:
    state = fresh().fence(1_000)
    assert state.commit(attempt("a", 999), "w", {S: seqs(1)}, at=5) == Expired(1_000)
    committed(state.commit(attempt("b", 1_000), "w", {S: seqs(1)}, at=5))  # at the horizon: fine
    # The horizon is checked before the overlap: an old attempt is told to start over.
    state = committed(state.commit(attempt("c", 2_000), "w", {S: seqs(1)}, at=5))
    assert isinstance(state.commit(attempt("d", 1), "w", {S: seqs(1)}, at=5), Expired)


def test_commit_forgets_the_workers_published_attempts() -> None:
    state = fresh()
    tokens = []
    for i in range(4):
        a = attempt(f"a{i}", nonce=f"{i:08x}")
        state = committed(state.commit(a, "w", {S: seqs(10 * i + 1)}, at=i))
        tokens.append(a.token)
    last = attempt("z")
    state = committed(
        state.commit(last, "w", {S: seqs(99)}, at=9, forget=[*tokens[:3], "not-a-token"])
    )
    assert set(state.unpublished) == {tokens[3], last.token}


def test_commit_forgets_every_token_of_a_one_shot_iterable() -> None:
    """``forget`` is an ``Iterable``: a generator must work as well as a list."""
    state = fresh()
    tokens = []
    for i in range(3):
        a = attempt(f"a{i}", nonce=f"{i:08x}")
        state = committed(state.commit(a, "w", {S: seqs(10 * i + 1)}, at=i))
        tokens.append(a.token)
    last = attempt("z")
    outcome = state.commit(last, "w", {S: seqs(99)}, at=9, forget=(t for t in tokens))
    assert set(committed(outcome).unpublished) == {last.token}


def test_commit_with_floors_and_a_recreated_stream() -> None:
    state = committed(fresh().commit(attempt("a"), "w", {S: seqs((1, 3), (7, 8))}, at=1))
    # The worker's ack floor covers 4..6 (filtered messages): the floor goes through 8.
    state = committed(state.commit(attempt("b"), "w", {S: seqs(12)}, at=2, floors={S: 6}))
    assert state.streams["S"] == StreamCommits(S.created, 8, seqs(12))
    # A floor of another stream of that name (or of one not recorded) changes nothing.
    state2 = committed(state.commit(attempt("c"), "w", {T: seqs(3)}, at=3, floors={S_NEW: 50}))
    assert state2.streams["S"] == state.streams["S"]
    with pytest.raises(StreamRecreated) as info:
        state.commit(attempt("d"), "w", {S_NEW: seqs(1)}, at=4)
    assert (info.value.stream, info.value.recorded, info.value.current) == (
        "S",
        S.created,
        S_NEW.created,
    )
    assert "headrace outputs reset out-1 --stream S" in str(info.value)


def test_check_identity() -> None:
    state = committed(fresh().commit(attempt("a"), "w", {S: seqs(1)}, at=1))
    state.check_identity(S)
    state.check_identity(T)  # not recorded: any identity is fine
    with pytest.raises(StreamRecreated):
        state.check_identity(S_NEW)
    with pytest.raises(StreamRecreated):
        state.committed_part(S_NEW, seqs(1))


# -- the other transitions -------------------------------------------------------------------------


def test_with_floors() -> None:
    state = committed(fresh().commit(attempt("a"), "w", {S: seqs(3, (6, 9), 15)}, at=1))
    assert state.with_floors({S: 0}) is state
    assert state.with_floors({T: 10}) is state  # not recorded
    assert state.with_floors({S_NEW: 10}) is state  # another stream of that name
    raised = state.with_floors({S: 5})
    assert raised.streams["S"] == StreamCommits(S.created, 9, seqs(15))  # 6..9 continued it
    assert raised.with_floors({S: 4}) is raised  # never down
    assert raised.with_floors({S: 20}).streams["S"] == StreamCommits(S.created, 20, SeqSet())
    assert state.streams["S"].floor == 0  # a value: the old state is unchanged


def test_forget_fence_reset() -> None:
    a, b = attempt("a"), attempt("b")
    state = committed(fresh().commit(a, "w", {S: seqs(1)}, at=1))
    state = committed(state.commit(b, "w", {T: seqs(1)}, at=1))
    assert state.forget(["nope"]) is state
    assert set(state.forget([a.token, "nope"]).unpublished) == {b.token}
    assert state.fence(0) is state
    assert state.fence(50).horizon == 50
    assert state.fence(50).fence(10).horizon == 50
    assert state.reset_stream("nope") is state
    reset = state.reset_stream("S")
    assert set(reset.streams) == {"T"} and reset.unpublished == state.unpublished
    # The next commit records the new stream's identity; its sequences start over.
    again = committed(reset.commit(attempt("c"), "w", {S_NEW: seqs(1)}, at=2))
    assert again.streams["S"] == StreamCommits(S_NEW.created, 1, SeqSet())


def test_compaction_lease() -> None:
    state = fresh()
    held = state.take_lease("w1", "L1", until=1_000, now=0)
    assert held is not None and held.lease == Lease("w1", "L1", 1_000)
    assert held.take_lease("w2", "L2", until=2_000, now=999) is None  # unexpired: refused
    renewed = held.take_lease("w1", "L1", until=1_500, now=999)  # the holder renews
    assert renewed is not None and renewed.lease == Lease("w1", "L1", 1_500)
    taken = held.take_lease("w2", "L2", until=3_000, now=1_000)  # expired: taken over
    assert taken is not None and taken.lease == Lease("w2", "L2", 3_000)
    assert taken.release_lease("L1") is taken  # not the holder's token
    assert taken.release_lease("L2").lease is None
    assert state.release_lease("L1") is state


def test_commit_compaction() -> None:
    a = attempt("compact", started=500)
    leased = fresh().take_lease("w1", "L1", until=10_000, now=0)
    assert leased is not None
    done = leased.commit_compaction(a, "w1", ["b.parquet", "a.parquet"], at=9, lease="L1")
    assert done.unpublished == {a.token: Unpublished("w1", 9, ("a.parquet", "b.parquet"))}
    assert done.commits == leased.commits  # a compaction commits no records
    assert done.commit_compaction(a, "w1", ["x"], at=10, lease="L1") is done  # again: no change
    with pytest.raises(LeaseLost, match="taken over"):
        leased.commit_compaction(a, "w1", [], at=9, lease="L2")
    with pytest.raises(LeaseLost, match="taken over"):
        fresh().commit_compaction(a, "w1", [], at=9, lease="L1")
    with pytest.raises(LeaseLost, match="horizon"):
        leased.fence(501).commit_compaction(a, "w1", [], at=9, lease="L1")


def test_summary() -> None:
    state = committed(fresh().commit(attempt("a"), "w", {S: seqs((1, 4), (9, 10), 20)}, at=1))
    summary = state.summary()
    assert summary["streams"]["S"] == {
        "created": S.created,
        "floor": 4,
        "committed_above_floor": 3,
        "intervals": 2,
        "last": 20,
    }
    assert summary["commits"] == 1 and summary["lease"] is None
    json.dumps(summary)  # an operator's tool prints it as JSON


# -- the stored form ------------------------------------------------------------------------------


def test_json_round_trip_of_every_part() -> None:
    a, c = attempt("a"), attempt("c", 2_000)
    state = committed(fresh().commit(a, "w1", {S: seqs((1, 4), (9, 10)), T: seqs(7)}, at=5))
    state = state.fence(1_500)
    leased = state.take_lease("w2", "L", until=9_000, now=0)
    assert leased is not None
    state = leased.commit_compaction(c, "w2", ["old/part-1", "part-0"], at=6, lease="L")
    back = CommitState.from_json(state.to_json())
    same(back, state)
    assert back.to_json() == state.to_json()
    same(CommitState.from_json(fresh().to_json()), fresh())


def _stored(**changes: Any) -> bytes:
    raw: dict[str, Any] = {
        "v": 1,
        "output": "o",
        "owner": "p",
        "horizon": 0,
        "commits": 0,
        # 5 and 6 above the floor 3: bits 1 and 2 of a mask whose bit 0 is 4
        "streams": {"S": {"created": S.created, "floor": 3, "above": seqbits.encode(0b110)}},
        "unpublished": {"t": {"worker": "w", "at": 1, "replaces": ["f"]}},
        "lease": {"worker": "w", "token": "L", "until": 5},
    }
    for path, value in changes.items():
        *parents, last = path.split("__")
        where = raw
        for part in parents:
            where = where[part]
        if value is _DROP:
            del where[last]
        else:
            where[last] = value
    return json.dumps(raw).encode()


_DROP = object()


def test_the_stored_form_read_by_hand() -> None:
    state = CommitState.from_json(_stored())
    assert state.streams["S"] == StreamCommits(S.created, 3, seqs((5, 6)))
    assert state.unpublished["t"] == Unpublished("w", 1, ("f",))
    assert state.lease == Lease("w", "L", 5)
    # Optional parts: no commits counter, no replaces, no lease.
    minimal = CommitState.from_json(
        _stored(commits=_DROP, unpublished__t__replaces=_DROP, lease=_DROP)
    )
    assert minimal.commits == 0 and minimal.unpublished["t"].replaces == () and not minimal.lease


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"not json", "JSONDecodeError"),
        (b'{"v": "\x80"}', "UnicodeDecodeError"),
        (b"", "JSONDecodeError"),
        (b"[1, 2]", "not a JSON object"),
        (b"null", "not a JSON object"),
        (_stored(v=2), "unknown version 2"),
        (_stored(v=_DROP), "unknown version None"),
        (_stored(v="1"), "unknown version '1'"),
        (_stored(output=_DROP), "output"),
        (_stored(owner=7), "7 is not a string"),
        (_stored(horizon=None), "None is not an integer"),
        (_stored(horizon=True), "True is not an integer"),
        (_stored(commits="3"), "'3' is not an integer"),
        (_stored(streams=[]), "is not an object"),
        (_stored(streams__S="x"), "TypeError"),
        (_stored(streams__S__created=1), "1 is not a string"),
        (_stored(streams__S__floor=1.5), "1.5 is not an integer"),
        (_stored(streams__S__floor=_DROP), "floor"),
        (_stored(streams__S__above=5), "5 is not a string"),
        (_stored(streams__S__above="!!"), "not an encoded bitmask"),
        (_stored(streams__S__above="AAAA"), "not an encoded bitmask"),  # base64, not deflate
        (_stored(streams__S__above=_DROP), "above"),
        (_stored(unpublished=None), "is not an object"),
        (_stored(unpublished__t=[]), "TypeError"),
        (_stored(unpublished__t__worker=_DROP), "worker"),
        (_stored(unpublished__t__at="soon"), "'soon' is not an integer"),
        (_stored(unpublished__t__replaces=[1]), "1 is not a string"),
        (_stored(lease="L"), "TypeError"),
        (_stored(lease__until=_DROP), "until"),
    ],
)
def test_corrupt_stored_forms_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(CorruptCommitState) as info:
        CommitState.from_json(data, "commit state headrace_commits/o")
    message = str(info.value)
    assert message.startswith("commit state headrace_commits/o cannot be read: "), message
    assert why in message


@pytest.mark.parametrize("replaces", ["part-0", {"part-0": 1}])
def test_replaces_of_the_wrong_type_are_refused(replaces: Any) -> None:
    """``replaces`` names files a roll-forward deletes: a string read as a list of its
    characters would delete files named after single letters."""
    with pytest.raises(CorruptCommitState):
        CommitState.from_json(_stored(unpublished__t__replaces=replaces))


# -- the state machine ----------------------------------------------------------------------------

WORKERS = ("w0", "w1", "w2", "w3")
STREAMS = ("A", "B")
MAX_SEQ = 40


@attrs.define
class Pending:
    """An attempt a worker staged and has not committed yet."""

    attempt: Attempt
    seqs: dict[str, SeqSet]
    generation: dict[str, int]


class Workers(RuleBasedStateMachine):
    """Workers committing overlapping batches of 1-2 streams through compare-and-set.

    ``self.state`` is the value in the bucket, ``self.revision`` its revision. Each worker keeps
    the state it last read or wrote (``views``), perhaps stale, and changes the state as the
    coordinator does: compute the change on its view; nothing to write if it is unchanged;
    written only if its revision is the current one, else re-read and computed again. Sweeps
    fence and forget, operators reset streams, messages are filtered (acked without reaching
    the sink) and ack floors reported. The model (who committed which sequence) is checked
    against the state after every step.
    """

    def __init__(self) -> None:
        super().__init__()
        self.state = CommitState(output="out", owner="pipe/sink")
        self.revision = 1
        self.views: dict[str, tuple[CommitState, int]] = {w: (self.state, 1) for w in WORKERS}
        self.now = 1_000_000
        self.counter = 0
        self.generation = dict.fromkeys(STREAMS, 0)
        self.pending: dict[str, list[Pending]] = {w: [] for w in WORKERS}
        #: Per stream (current generation): committed sequence -> the token that committed it.
        self.owner: dict[str, dict[int, str]] = {s: {} for s in STREAMS}
        #: (stream, generation, sequence) -> token, across resets: "committed once, ever".
        self.ever: dict[tuple[str, int, int], str] = {}
        self.filtered: dict[str, set[int]] = {s: set() for s in STREAMS}
        #: Committed tokens -> (worker, pending), and the ones taken out since.
        self.tokens: dict[str, tuple[str, Pending]] = {}
        self.forgotten: set[str] = set()
        self.commits = 0
        self.horizon = 0
        self.previous: dict[str, tuple[int, int, SeqSet]] = {}
        #: The state the last write was applied to.
        self.applied_to = self.state

    # -- helpers ---------------------------------------------------------------------------------

    def identity(self, stream: str, generation: int | None = None) -> StreamIdentity:
        gen = self.generation[stream] if generation is None else generation
        return StreamIdentity(stream, f"2026-01-01T00:00:00.{gen:06d}Z")

    def write(self, worker: str, change: Callable[[CommitState], CommitState]) -> CommitState:
        """The coordinator's loop: apply to the view, write only on the current revision."""
        view, revision = self.views[worker]
        for _ in range(len(WORKERS) + 2):
            new = change(view)
            if new is view:
                return view
            if revision == self.revision:
                self.applied_to = view
                self.revision += 1
                self.state = new
                self.views[worker] = (new, self.revision)
                return new
            # Refused (WrongRevision): someone wrote first. Read and apply again.
            view, revision = self.state, self.revision
            self.views[worker] = (view, revision)
        raise AssertionError("a change applied to the current state must be written")

    def settled(self, stream: str) -> set[int]:
        return set(self.owner[stream]) | self.filtered[stream]

    def ack_floor(self, stream: str) -> int:
        settled = self.settled(stream)
        floor = 0
        while floor + 1 in settled:
            floor += 1
        return floor

    def in_flight(self, stream: str) -> set[int]:
        gen = self.generation[stream]
        return {
            n
            for pending in self.pending.values()
            for p in pending
            if p.generation.get(stream) == gen
            for a, b in p.seqs[stream].intervals
            for n in range(a, b + 1)
        }

    def new_attempt(self, worker: str, parts: dict[str, SeqSet], started: int) -> Pending:
        self.counter += 1
        a = Attempt(f"{worker}-{self.counter}", started, f"{self.counter:08x}")
        gens = {s: self.generation[s] for s in parts}
        return Pending(a, parts, gens)

    def do_commit(self, worker: str, pending: Pending, floors: bool, forget: bool) -> Any:
        identities = {self.identity(s, g): pending.seqs[s] for s, g in pending.generation.items()}
        floor_map = {self.identity(s): self.ack_floor(s) for s in STREAMS} if floors else None
        published = [
            t for t, (w, _) in self.tokens.items() if w == worker and t not in self.forgotten
        ]
        drop = published if forget else []
        outcome: list[Any] = []
        horizon_before = self.state.horizon

        def change(state: CommitState) -> CommitState:
            result = state.commit(
                pending.attempt, worker, identities, at=self.now, floors=floor_map, forget=drop
            )
            outcome[:] = [result]
            return result.state if isinstance(result, Committed) else state

        self.write(worker, change)
        result = outcome[0]
        already = " (already)" if isinstance(result, Committed) and result.already else ""
        event(f"commit: {type(result).__name__}{already}")
        token = pending.attempt.token
        if isinstance(result, Committed) and not result.already:
            # Written: on the current state, by an attempt within the horizon, each of its
            # sequences for the first time ever.
            assert pending.attempt.started >= self.applied_to.horizon >= horizon_before
            assert token not in self.tokens
            for stream, part in pending.seqs.items():
                gen = pending.generation[stream]
                for a, b in part.intervals:
                    for n in range(a, b + 1):
                        assert (stream, gen, n) not in self.ever, (stream, n, self.ever)
                        assert n not in self.filtered[stream]
                        self.ever[stream, gen, n] = token
                        self.owner[stream][n] = token
            self.tokens[token] = (worker, pending)
            self.forgotten.update(drop)
            self.commits += 1
        elif isinstance(result, Committed):
            # Committed before (perhaps forgotten since, by a worker whose view is older).
            assert token in self.tokens and result.state is self.views[worker][0]
        elif isinstance(result, Overlap):
            assert result.committed and result.count > 0
            for stream, part in result.committed.items():
                assert part.difference(pending.seqs[stream]) == SeqSet(), "not of the attempt"
                assert all(n in self.owner[stream] for n in members(part))
            if self.views[worker][1] == self.revision:  # computed on the current state
                for stream, part in pending.seqs.items():
                    mine = {n for a, b in part.intervals for n in range(a, b + 1)}
                    expected = SeqSet.of(mine & set(self.owner[stream]))
                    assert result.committed.get(stream, SeqSet()) == expected
        else:
            assert isinstance(result, Expired)
            assert pending.attempt.started < result.horizon <= self.state.horizon
        return result

    # -- rules -----------------------------------------------------------------------------------

    @rule(
        worker=st.sampled_from(WORKERS),
        streams=st.sets(st.sampled_from(STREAMS), min_size=1),
        data=st.data(),
        age=st.integers(0, 5_000),
    )
    def stage(self, worker: str, streams: set[str], data: st.DataObject, age: int) -> None:
        """A worker receives a batch (redeliveries included, never filtered messages) and
        stages it as a new attempt that started ``age`` ms ago."""
        parts = {}
        for stream in sorted(streams):
            first = data.draw(st.integers(1, MAX_SEQ), label="first")
            length = data.draw(st.integers(0, 8), label="length")
            extra = data.draw(st.lists(st.integers(1, MAX_SEQ), max_size=3), label="extra")
            wanted = set(range(first, min(first + length, MAX_SEQ) + 1)) | set(extra)
            wanted -= self.filtered[stream]
            if wanted:
                parts[stream] = SeqSet.of(wanted)
        if parts:
            self.pending[worker].append(self.new_attempt(worker, parts, self.now - age))

    @precondition(lambda self: any(self.pending.values()))
    @rule(data=st.data(), floors=st.booleans(), forget=st.booleans())
    def commit(self, data: st.DataObject, floors: bool, forget: bool) -> None:
        worker = data.draw(st.sampled_from([w for w in WORKERS if self.pending[w]]))
        pending = self.pending[worker].pop(data.draw(st.integers(0, 9)) % len(self.pending[worker]))
        result = self.do_commit(worker, pending, floors, forget)
        if isinstance(result, Overlap):
            # The sink redoes the attempt without what is committed, as a new attempt.
            rest = {
                s: part.difference(result.committed.get(s, SeqSet()))
                for s, part in pending.seqs.items()
            }
            rest = {s: part for s, part in rest.items() if part}
            if rest:
                self.pending[worker].append(self.new_attempt(worker, rest, self.now))
        elif isinstance(result, Expired):
            self.pending[worker].append(self.new_attempt(worker, pending.seqs, self.now))

    @precondition(lambda self: any(self.pending.values()))
    @rule(data=st.data())
    def commit_in_doubt(self, data: st.DataObject) -> None:
        """The write lands but its answer is lost: the worker still holds the state before it,
        reads again and applies the change again, which must find the attempt committed."""
        worker = data.draw(st.sampled_from([w for w in WORKERS if self.pending[w]]))
        pending = self.pending[worker].pop(0)
        before = self.views[worker]
        result = self.do_commit(worker, pending, floors=False, forget=False)
        if not (isinstance(result, Committed) and not result.already):
            return  # refused on its merits: nothing was in doubt
        revision = self.revision
        self.views[worker] = before  # the answer never came
        again = self.do_commit(worker, pending, floors=False, forget=False)
        assert isinstance(again, Committed) and again.already
        assert self.revision == revision, "an in-doubt commit was written twice"

    @precondition(lambda self: any(t not in self.forgotten for t in self.tokens))
    @rule(data=st.data())
    def commit_the_same_attempt_again(self, data: st.DataObject) -> None:
        token = data.draw(st.sampled_from(sorted(set(self.tokens) - self.forgotten)))
        worker, pending = self.tokens[token]
        self.views[worker] = (self.state, self.revision)
        revision = self.revision
        result = self.do_commit(worker, pending, floors=False, forget=False)
        assert isinstance(result, Committed) and result.already and result.state is self.state
        assert self.revision == revision

    @precondition(lambda self: bool(self.forgotten))
    @rule(data=st.data())
    def commit_a_forgotten_attempt_again(self, data: st.DataObject) -> None:
        """A delivery of an attempt long published: never committed a second time."""
        token = data.draw(st.sampled_from(sorted(self.forgotten)))
        worker, pending = self.tokens[token]
        if any(self.generation[s] != g for s, g in pending.generation.items()):
            return  # its stream was reset since
        revision = self.revision
        result = self.do_commit(worker, pending, floors=False, forget=False)
        assert isinstance(result, Overlap | Expired | Committed), result
        assert self.revision == revision, "committed a second time"

    @rule(worker=st.sampled_from(WORKERS))
    def refresh(self, worker: str) -> None:
        self.views[worker] = (self.state, self.revision)

    @rule(ms=st.integers(1, 3_000))
    def tick(self, ms: int) -> None:
        self.now += ms

    @rule(stream=st.sampled_from(STREAMS), seq=st.integers(1, MAX_SEQ))
    def filter_message(self, stream: str, seq: int) -> None:
        """A message acked without records for this output (filtered, dead-lettered)."""
        if seq not in self.owner[stream] and seq not in self.in_flight(stream):
            self.filtered[stream].add(seq)

    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def report_floors(self, worker: str, data: st.DataObject) -> None:
        """A worker reports its consumers' ack floors, perhaps lagging behind."""
        floors = {
            self.identity(s): data.draw(st.integers(0, self.ack_floor(s)), label=s) for s in STREAMS
        }
        self.write(worker, lambda state: state.with_floors(floors))

    @rule(worker=st.sampled_from(WORKERS), back=st.integers(0, 6_000))
    def fence(self, worker: str, back: int) -> None:
        """A sweep fences off attempts that started ``back`` ms ago or earlier."""
        horizon = self.now - back
        self.write(worker, lambda state: state.fence(horizon))
        self.horizon = max(self.horizon, horizon)

    @precondition(lambda self: any(t not in self.forgotten for t in self.tokens))
    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def sweep_forgets(self, worker: str, data: st.DataObject) -> None:
        """A sweep rolls forward some committed attempts (of any worker) and forgets them. It
        reads the state first: a change that leaves the view unchanged writes nothing, so
        forgetting tokens the view does not hold yet would be lost."""
        self.views[worker] = (self.state, self.revision)
        live = sorted(set(self.tokens) - self.forgotten)
        tokens = data.draw(st.lists(st.sampled_from(live), min_size=1, unique=True))
        self.write(worker, lambda state: state.forget(tokens))
        self.forgotten.update(tokens)

    @rule(stream=st.sampled_from(STREAMS))
    def reset_stream(self, stream: str) -> None:
        """The stream was deleted and created again; an operator resets the output's commits
        of it, and the workers start again (with fresh views, without the old batches)."""
        self.generation[stream] += 1
        self.state = self.state.reset_stream(stream)
        self.revision += 1
        self.views = {w: (self.state, self.revision) for w in WORKERS}
        for w in WORKERS:
            self.pending[w] = [p for p in self.pending[w] if stream not in p.seqs]
        self.owner[stream] = {}
        self.filtered[stream] = set()
        self.previous.pop(stream, None)

    @rule(stream=st.sampled_from(STREAMS), offset=st.integers(1, 3), seq=st.integers(1, MAX_SEQ))
    def another_stream_of_that_name(self, stream: str, offset: int, seq: int) -> None:
        """A worker consuming a stream recreated under the name, not reset: refused."""
        stranger = self.identity(stream, self.generation[stream] + offset)
        a = Attempt("stranger", self.now, "ffffffff")
        if stream in self.state.streams:
            with pytest.raises(StreamRecreated):
                self.state.check_identity(stranger)
            with pytest.raises(StreamRecreated):
                self.state.commit(a, "w0", {stranger: SeqSet.of([seq])}, at=self.now)
        else:
            self.state.check_identity(stranger)

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def matches_the_model(self) -> None:
        state = self.state
        for stream in STREAMS:
            known = state.streams.get(stream)
            if known is None:
                assert not self.owner[stream]
                continue
            assert known.created == self.identity(stream).created
            floor, above = known.floor, known.seqs
            intervals = above.intervals
            assert all(a[1] + 1 < b[0] for a, b in itertools.pairwise(intervals))
            assert above.first is None or above.first > floor + 1, (floor, intervals)
            held = set(range(1, floor + 1)) | {n for a, b in intervals for n in range(a, b + 1)}
            # Every committed sequence is in the state; what else is there was filtered.
            assert set(self.owner[stream]) <= held
            assert held - set(self.owner[stream]) <= self.filtered[stream]
            assert floor <= self.ack_floor(stream)
            if stream in self.previous:
                old_floor, old_count, old_seqs = self.previous[stream]
                assert floor >= old_floor, "a floor went down"
                gone = old_seqs.difference(above)
                assert gone.first is None or gone.last <= floor, "committed sequences were lost"
                assert len(held) >= old_count
            self.previous[stream] = (floor, len(held), above.copy())
        live = {t: w for t, (w, _) in self.tokens.items() if t not in self.forgotten}
        assert {t: u.worker for t, u in state.unpublished.items()} == live
        assert state.commits == self.commits
        assert state.horizon == self.horizon
        for worker in WORKERS:
            assert sorted(state.mine(worker)) == sorted(t for t, w in live.items() if w == worker)

    @invariant()
    def survives_its_stored_form(self) -> None:
        back = CommitState.from_json(self.state.to_json())
        same(back, self.state)


TestWorkers = Workers.TestCase
