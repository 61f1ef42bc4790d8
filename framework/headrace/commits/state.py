"""The commit state of one output, and its transitions: the commit protocol without I/O.

Every worker writing an output shares one :class:`CommitState`, stored as one value in a
JetStream KV bucket (coordinator.py) and changed only by compare-and-set on its revision. A
change is a pure function of the state read: this module computes it, the coordinator writes
it, and a lost race means computing it again on the newer state. Nothing here touches a socket
or a file, so the rules can be tested exhaustively on their own.

What the state holds, and why each part is bounded:

- per stream, its identity (the creation time) and the committed sequences: a ``floor`` (every
  sequence up to it is settled: committed, or acked without records for this output) and a
  bitmask of what is committed above it (seqbits.py). Commits that continue the floor move
  it, and the consumer's ack floor, reported by the workers, moves it over sequences that
  never reach the sink (filtered, dead-lettered), so the bitmask spans only what is in
  flight, however the workers' batches interleave;
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
from headrace.commits.seqbits import decode, encode, mask_of, seqset_of, trailing_ones
from headrace.commits.seqset import SeqSet

#: The version of the state's JSON form.
SCHEMA = 1


@attrs.frozen(slots=True, eq=False, init=False)
class StreamCommits:
    """What an output holds of one stream (see the module docs): every sequence up to
    ``floor`` is settled, and ``above`` is the bitmask of the committed sequences after it
    (bit 0 is ``floor + 1``; seqbits.py says why a bitmask). ``seqs`` gives them as a set."""

    created: str
    floor: int
    above: int

    def __init__(
        self, created: str, floor: int = 0, seqs: SeqSet | None = None, *, above: int = 0
    ) -> None:
        if seqs is not None:
            above |= mask_of(seqs, floor + 1)
        self.__attrs_init__(created, floor, above)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StreamCommits):
            return NotImplemented
        return (self.created, self.floor, self.above) == (other.created, other.floor, other.above)

    @property
    def seqs(self) -> SeqSet:
        """The committed sequences above the floor, as a set (a conversion: for looking at)."""
        return seqset_of(self.above, self.floor + 1)

    @property
    def last(self) -> int:
        """The highest committed sequence (the floor if none above it)."""
        return self.floor + self.above.bit_length()

    def committed_part(self, seqs: SeqSet) -> SeqSet:
        """The sequences of ``seqs`` already committed."""
        first = seqs.first
        if first is None:
            return SeqSet()
        found = SeqSet()
        if self.floor and first <= self.floor:
            found = seqs.intersection(SeqSet([(first, self.floor)]))
        if self.above and (seqs.last or 0) > self.floor:
            hit = mask_of(seqs, self.floor + 1) & self.above
            if hit:
                found.update(seqset_of(hit, self.floor + 1))
        return found

    def with_commit(self, seqs: SeqSet, floor: int) -> StreamCommits:
        """Add ``seqs``, raise the floor to ``floor`` (if higher), and fold into the floor
        whatever now continues it."""
        above = self.above | mask_of(seqs, self.floor + 1)
        return StreamCommits(self.created, self.floor, above=above).with_floor(floor)

    def with_floor(self, floor: int) -> StreamCommits:
        above = self.above
        new_floor = self.floor
        if floor > new_floor:
            above >>= floor - new_floor
            new_floor = floor
        run = trailing_ones(above)
        if run:
            above >>= run
            new_floor += run
        if new_floor == self.floor and above == self.above:
            return self
        return StreamCommits(self.created, new_floor, above=above)


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
                name: {"created": s.created, "floor": s.floor, "above": encode(s.above)}
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
                    _str(s["created"]), _int(s["floor"]), above=decode(_str(s["above"]))
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
                    "committed_above_floor": s.above.bit_count(),
                    "intervals": (s.above & ~(s.above << 1)).bit_count(),
                    "last": s.last,
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
