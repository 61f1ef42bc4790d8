"""The commit state of one output, and its transitions: the commit protocol without I/O.

Every worker writing an output shares one :class:`CommitState`, stored as one value in a
JetStream KV bucket (coordinator.py) and changed only by compare-and-set on its revision. A
change is a pure function of the state read: this module computes it, the coordinator writes
it, and a lost race means computing it again on the newer state. Nothing here touches a socket
or a file, so the rules can be tested exhaustively on their own.

What the state holds, and why each part is bounded:

- per stream, its identity (the creation time) and the committed sequences: a ``floor`` (every
  sequence up to it is settled: committed, or acked without records for this output) and the
  committed intervals above it. Commits that continue the floor move it, and the consumer's
  ack floor, reported by the workers, moves it over sequences that never reach the sink
  (filtered, dead-lettered), so the intervals are only the holes of what is in flight;
- the *unpublished* attempts: committed, their files perhaps not all in place yet. A worker's
  next commit takes its previous one out; a sweep rolls forward and removes those of workers
  that died, so there is about one per live worker;
- the *horizon*: attempts that started before it can no longer commit. A sweep raises it
  before it deletes the staged files of attempts it believes dead, so an attempt cannot commit
  files that were deleted under it (the compare-and-set orders the two);
- a compaction lease: one compaction of the output at a time, across workers.

A record is committed when the sequence of its message is: the pipeline never splits the
records of one message across two batches of a sink, so (stream identity, sequence) names the
records of a message and each one's index within it is its place in that group.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from headrace.commits.errors import CorruptCommitState, StreamRecreated
from headrace.commits.identity import Attempt, StreamIdentity
from headrace.commits.seqset import SeqSet

#: The version of the state's JSON form.
SCHEMA = 1


@attrs.frozen(slots=True, eq=False)
class StreamCommits:
    """What an output holds of one stream (see the module docs)."""

    created: str
    floor: int = 0
    #: Committed sequences above ``floor`` (never touching it: those become the floor).
    seqs: SeqSet = attrs.field(factory=SeqSet)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StreamCommits):
            return NotImplemented
        return (self.created, self.floor, self.seqs) == (other.created, other.floor, other.seqs)

    def committed_part(self, seqs: SeqSet) -> SeqSet:
        """The sequences of ``seqs`` already committed."""
        found = seqs.intersection(self.seqs)
        if self.floor and seqs.first is not None and seqs.first <= self.floor:
            found.update(seqs.intersection(SeqSet([(seqs.first, self.floor)])))
        return found

    def with_commit(self, seqs: SeqSet, floor: int) -> StreamCommits:
        """Add ``seqs``, raise the floor to ``floor`` (if higher), and fold into the floor
        whatever now continues it."""
        merged = self.seqs.copy()
        merged.update(seqs)
        return StreamCommits(self.created, self.floor, merged).with_floor(floor)

    def with_floor(self, floor: int) -> StreamCommits:
        floor = max(self.floor, floor)
        seqs = self.seqs.copy()
        seqs.discard_through(floor)
        first = seqs.first
        if first is not None and first == floor + 1:
            floor = seqs.intervals[0][1]
            seqs.discard_through(floor)
        if floor == self.floor and seqs == self.seqs:
            return self
        return StreamCommits(self.created, floor, seqs)


@attrs.frozen(slots=True)
class Unpublished:
    """A committed attempt whose files may not all be in place yet."""

    worker: str
    #: When it committed (ms since the epoch, the committer's clock).
    at: int
    #: Files the attempt's files replace (a compaction), deleted when it is rolled forward.
    replaces: tuple[str, ...] = ()


@attrs.frozen(slots=True)
class Lease:
    """The compaction lease: who compacts the output, until when (ms since the epoch)."""

    worker: str
    token: str
    until: int


@attrs.frozen(slots=True)
class Committed:
    """The attempt is committed in ``state``; ``already``: it was before this change (a retry
    after a write whose answer was lost)."""

    state: CommitState
    already: bool = False


@attrs.frozen(slots=True, eq=False)
class Overlap:
    """Part of the attempt is committed already (by another worker, or an earlier delivery):
    ``committed`` maps each stream name to those sequences. The attempt must be redone without
    them, or dropped if nothing is left."""

    committed: dict[str, SeqSet]

    @property
    def count(self) -> int:
        return sum(len(s) for s in self.committed.values())


@attrs.frozen(slots=True)
class Expired:
    """The attempt started before the horizon: its staged files may have been deleted by a
    sweep, so it may not commit. Redo it as a new attempt."""

    horizon: int


CommitOutcome = Committed | Overlap | Expired


class LeaseLost(CorruptCommitState):
    """A compaction's lease was taken over (it ran past its expiry); it must not commit."""


@attrs.frozen(slots=True)
class CommitState:
    """The shared state of one output (see the module docs). Treated as a value: every change
    returns a new state."""

    output: str
    owner: str
    streams: Mapping[str, StreamCommits] = attrs.field(factory=dict)
    unpublished: Mapping[str, Unpublished] = attrs.field(factory=dict)
    horizon: int = 0
    #: Commits so far (diagnostics: how busy the output is).
    commits: int = 0
    lease: Lease | None = None

    # -- questions ------------------------------------------------------------------------

    def check_identity(self, identity: StreamIdentity) -> None:
        """:class:`StreamRecreated` if the output holds commits of another stream of that
        name."""
        known = self.streams.get(identity.name)
        if known is not None and known.created != identity.created:
            raise StreamRecreated(self.output, identity.name, known.created, identity.created)

    def committed_part(self, identity: StreamIdentity, seqs: SeqSet) -> SeqSet:
        """The sequences of ``seqs`` (of that stream) already committed; checks the identity."""
        self.check_identity(identity)
        known = self.streams.get(identity.name)
        return known.committed_part(seqs) if known is not None else SeqSet()

    def mine(self, worker: str) -> list[str]:
        """The unpublished attempts of ``worker``."""
        return [token for token, u in self.unpublished.items() if u.worker == worker]

    # -- changes --------------------------------------------------------------------------

    def commit(
        self,
        attempt: Attempt,
        worker: str,
        seqs: Mapping[StreamIdentity, SeqSet],
        *,
        at: int,
        floors: Mapping[StreamIdentity, int] | None = None,
        forget: Iterable[str] = (),
    ) -> CommitOutcome:
        """Commit ``seqs`` as ``attempt`` of ``worker``, unless part of them is committed
        (:class:`Overlap`) or the attempt is too old (:class:`Expired`). ``floors``: ack
        floors the worker saw (sequences settled); ``forget``: its earlier attempts, now
        published. Idempotent: an attempt already committed returns ``Committed(already)``.
        """
        if attempt.token in self.unpublished:
            return Committed(self, already=True)
        if attempt.started < self.horizon:
            return Expired(self.horizon)
        overlap: dict[str, SeqSet] = {}
        for identity, part in seqs.items():
            found = self.committed_part(identity, part)
            if found:
                overlap[identity.name] = found
        if overlap:
            return Overlap(overlap)
        streams = dict(self.streams)
        for identity, part in seqs.items():
            known = streams.get(identity.name) or StreamCommits(identity.created)
            streams[identity.name] = known.with_commit(part, 0)
        streams = _with_floors(streams, floors)
        drop = set(forget)  # once: ``forget`` may be a one-shot iterator
        unpublished = {t: u for t, u in self.unpublished.items() if t not in drop}
        unpublished[attempt.token] = Unpublished(worker, at)
        return Committed(
            attrs.evolve(self, streams=streams, unpublished=unpublished, commits=self.commits + 1)
        )

    def with_floors(self, floors: Mapping[StreamIdentity, int]) -> CommitState:
        """Raise the floors of the streams whose identity matches (a worker's report of its
        consumers' ack floors)."""
        streams = _with_floors(dict(self.streams), floors)
        return self if streams == self.streams else attrs.evolve(self, streams=streams)

    def forget(self, tokens: Iterable[str]) -> CommitState:
        """Take published attempts out of the unpublished ones."""
        drop = set(tokens) & set(self.unpublished)
        if not drop:
            return self
        kept = {t: u for t, u in self.unpublished.items() if t not in drop}
        return attrs.evolve(self, unpublished=kept)

    def fence(self, horizon: int) -> CommitState:
        """Raise the horizon: attempts started before it can no longer commit."""
        return self if horizon <= self.horizon else attrs.evolve(self, horizon=horizon)

    def reset_stream(self, name: str) -> CommitState:
        """Forget what the output holds of stream ``name`` (an operator's decision, after the
        stream was recreated): the next commit records the new stream's identity."""
        if name not in self.streams:
            return self
        return attrs.evolve(self, streams={k: v for k, v in self.streams.items() if k != name})

    def take_lease(self, worker: str, token: str, until: int, now: int) -> CommitState | None:
        """The state with the compaction lease taken by ``worker``; None while someone else
        holds an unexpired one."""
        held = self.lease
        if held is not None and held.token != token and held.until > now:
            return None
        return attrs.evolve(self, lease=Lease(worker, token, until))

    def release_lease(self, token: str) -> CommitState:
        if self.lease is None or self.lease.token != token:
            return self
        return attrs.evolve(self, lease=None)

    def commit_compaction(
        self, attempt: Attempt, worker: str, replaces: Iterable[str], *, at: int, lease: str
    ) -> CommitState:
        """Commit a compaction: ``attempt``'s files replace ``replaces``. Only under the
        lease (:class:`LeaseLost` otherwise) and within the horizon."""
        if attempt.token in self.unpublished:
            return self
        if self.lease is None or self.lease.token != lease:
            raise LeaseLost(f"output {self.output}: the compaction lease was taken over")
        if attempt.started < self.horizon:
            raise LeaseLost(f"output {self.output}: the compaction started before the horizon")
        unpublished = dict(self.unpublished)
        unpublished[attempt.token] = Unpublished(worker, at, tuple(sorted(replaces)))
        return attrs.evolve(self, unpublished=unpublished)

    # -- the stored form ------------------------------------------------------------------

    def to_json(self) -> bytes:
        data: dict[str, Any] = {
            "v": SCHEMA,
            "output": self.output,
            "owner": self.owner,
            "horizon": self.horizon,
            "commits": self.commits,
            "streams": {
                name: {"created": s.created, "floor": s.floor, "seqs": s.seqs.intervals}
                for name, s in sorted(self.streams.items())
            },
            "unpublished": {
                token: _unpublished_json(u) for token, u in sorted(self.unpublished.items())
            },
        }
        if self.lease is not None:
            data["lease"] = attrs.asdict(self.lease)
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str = "commit state") -> CommitState:
        """Parse the stored form; :class:`CorruptCommitState` naming ``where`` if it is not
        one this version understands."""
        try:
            raw = json.loads(data)
            if not isinstance(raw, dict):
                raise TypeError("not a JSON object")
            if raw.get("v") != SCHEMA:
                raise ValueError(f"unknown version {raw.get('v')!r} (this headrace reads {SCHEMA})")
            streams = {
                str(name): StreamCommits(
                    _str(s["created"]),
                    _int(s["floor"]),
                    SeqSet((_int(a), _int(b)) for a, b in s["seqs"]),
                )
                for name, s in _dict(raw["streams"]).items()
            }
            unpublished = {
                str(token): Unpublished(
                    _str(u["worker"]),
                    _int(u["at"]),
                    tuple(_str(f) for f in _list(u.get("replaces", []))),
                )
                for token, u in _dict(raw["unpublished"]).items()
            }
            lease = raw.get("lease")
            return cls(
                output=_str(raw["output"]),
                owner=_str(raw["owner"]),
                streams=streams,
                unpublished=unpublished,
                horizon=_int(raw["horizon"]),
                commits=_int(raw.get("commits", 0)),
                lease=(
                    Lease(_str(lease["worker"]), _str(lease["token"]), _int(lease["until"]))
                    if lease is not None
                    else None
                ),
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptCommitState(f"{where} cannot be read: {exc!r}") from exc

    def summary(self) -> dict[str, Any]:
        """What an operator wants to see (``headrace outputs show``)."""
        return {
            "output": self.output,
            "owner": self.owner,
            "commits": self.commits,
            "horizon": self.horizon,
            "streams": {
                name: {
                    "created": s.created,
                    "floor": s.floor,
                    "committed_above_floor": len(s.seqs),
                    "intervals": len(s.seqs.intervals),
                    "last": s.seqs.last if s.seqs else s.floor,
                }
                for name, s in sorted(self.streams.items())
            },
            "unpublished": {t: attrs.asdict(u) for t, u in sorted(self.unpublished.items())},
            "lease": attrs.asdict(self.lease) if self.lease is not None else None,
        }


def _with_floors(
    streams: dict[str, StreamCommits], floors: Mapping[StreamIdentity, int] | None
) -> dict[str, StreamCommits]:
    for identity, floor in (floors or {}).items():
        known = streams.get(identity.name)
        if known is not None and known.created == identity.created and floor > known.floor:
            streams[identity.name] = known.with_floor(floor)
    return streams


def _unpublished_json(u: Unpublished) -> dict[str, Any]:
    out: dict[str, Any] = {"worker": u.worker, "at": u.at}
    if u.replaces:
        out["replaces"] = list(u.replaces)
    return out


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not an integer")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"{value!r} is not a list")
    return value


def _dict(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{value!r} is not an object")
    return value
