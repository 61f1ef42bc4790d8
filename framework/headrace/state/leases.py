"""Leases on the partitions of a stateful pipeline: each partition owned by one worker at a time.

Several workers share a stateful pipeline by partitioning its keys: the stream maps subjects to
N partitions (a subject transform with ``{{partition(N, token)}}``), each partition is read by
a durable consumer of its own, and each partition is owned by exactly one worker at a time
through a lease in KV. A worker that dies or stalls stops renewing; its leases expire and the
other workers take the partitions over (with their state snapshots). This module is the lease
part: which worker owns which partition, and when that changes. What an owner does with a
partition (its consumer, its state) is the runtime's business.

Two parts, as for windows and their snapshots:

- :class:`LeaseTable`, the decisions, with no I/O and no clock: it is given the leases as read
  from KV, the workers known to be alive and the time (wall-clock seconds, since a lease's
  expiry is read by other hosts), and says which partitions to acquire, which to renew and
  which to give up. Being pure, it is tested by simulating workers against a fake KV.
- :class:`PartitionLeases`, the driver: it reads and writes the leases in a KV bucket
  (``headrace_leases`` by default) by compare-and-set, and loops every third of the ttl.

**One owner at a time** rests on two things. Every write is a compare-and-set on the revision
the writer read (a free key is created, an expired lease updated on its revision, a lease
renewed on the revision its owner wrote), so of two workers racing for a partition exactly one
wins, and a worker whose lease was taken cannot renew it. And a lease is taken only once it has
expired, while its owner counts it as its own only until then (:meth:`LeaseTable.owned`): the
owner stops before the taker starts, provided the hosts' clocks agree to well within the ttl.
A lost compare-and-set is no error: the partition is another worker's, and is reported lost.

**Balance.** The live workers are those whose member key (written at every step, expiring
after the ttl) or a lease of theirs has not expired. With W of them and N partitions, each is
due ``N // W``, and ``N % W`` of them one more: those holding the most, ties broken by worker
id (:func:`fair_shares`). So the shares add up to N, and a worker is never asked to give up a
partition only to take another one back. A worker under its share takes free or expired
partitions (starting from an offset that differs between workers, so that they race less); a
worker over its share gives up the excess, highest partition numbers first. Since the shares
add up to N, whatever one worker holds beyond its share another live worker lacks: a worker
gives up partitions only once another wants them (alone, its share is N). When nobody's view
changes, every partition is owned and the counts differ by at most one.

**Giving up takes two steps.** A partition given up for balance is reported lost by one step
(no longer :meth:`~LeaseTable.owned`, no longer renewed) and its lease deleted only after that
(by :meth:`PartitionLeases.hand_over`: at the start of the next step, or in :meth:`run` as
soon as ``on_change`` has returned), so the owner can stop using it (save its state) before
another worker can take it. :meth:`PartitionLeases.release_all`, on shutdown, deletes every
lease at once: its caller has stopped.

Keys, in the bucket: ``<pipeline>.lease.p<n>`` with a JSON value ``{"owner", "expires",
"partition", "partitions"}`` (``expires`` in Unix seconds; ``partitions`` the N it was taken
under: workers partitioning the keys differently must not run together, and one that finds an
unexpired lease of another N stops with :class:`~headrace.state.errors.LeaseError`), and
``<pipeline>.worker.<worker>`` with ``{"worker", "expires"}``, each worker's sign of life.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import secrets
import socket
import time
import warnings
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

import attrs
import trio

from headrace.jetstream.kv import (
    KeyNotFound,
    KeyValue,
    KeyValueConfig,
    WrongRevision,
    leader_bucket,
)
from headrace.jetstream.transient import is_transient, retry_transient
from headrace.state.errors import LeaseError
from headrace.state.snapshots import key_token

if TYPE_CHECKING:
    from headrace.jetstream.context import JetStream

#: The bucket leases live in unless another is named.
DEFAULT_LEASE_BUCKET = "headrace_leases"
#: Seconds a lease lasts unless renewed.
DEFAULT_TTL = 10.0
#: A lease is renewed once this fraction of its ttl has passed, and the driver steps as often:
#: an owner that misses two steps in a row still holds its leases.
RENEW_AFTER = 1 / 3
#: Seconds :meth:`PartitionLeases.release_all` may take (shielded) before leaving the rest to
#: expire.
RELEASE_TIMEOUT = 5.0

T = TypeVar("T")

#: ``on_change(gained, lost)``: plain or async.
OnChange = Callable[[frozenset[int], frozenset[int]], Awaitable[None] | None]

_LEASE_KEY = re.compile(r"^lease\.p(\d{1,9})$")


def check_ttl(ttl: float) -> float:
    """``ttl`` if it is a positive, finite number of seconds, else ``ValueError``."""
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < math.inf:
        raise ValueError(f"a lease's ttl is a positive number of seconds, not {ttl!r}")
    return float(ttl)


def default_worker_id() -> str:
    """Host, process and a random token: unique among the workers, also after a restart (a
    restarted worker does not inherit its predecessor's leases: they expire)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@attrs.frozen(slots=True)
class Lease:
    """A partition's lease as stored: who owns it, until when (Unix seconds), and the KV
    revision the next compare-and-set on it must name."""

    owner: str
    expires: float
    revision: int

    def live(self, now: float) -> bool:
        return now < self.expires


@attrs.frozen(slots=True)
class LeasePlan:
    """What one step does (see :meth:`LeaseTable.plan`). ``acquire``: free or expired
    partitions to take, in the order to try them. ``renew``: ours, a third of their ttl gone.
    ``give_up``: ours beyond our share, now reported lost, their leases deleted by the next
    hand-over."""

    acquire: tuple[int, ...] = ()
    renew: tuple[int, ...] = ()
    give_up: tuple[int, ...] = ()


@attrs.frozen(slots=True)
class LeaseChanges:
    """The partitions a worker owns now against what it was last told (``kept`` it still
    owns). ``lost`` covers partitions taken by another worker, expired without renewal and
    given up for balance alike: in each case the worker must stop using them."""

    gained: frozenset[int] = frozenset()
    kept: frozenset[int] = frozenset()
    lost: frozenset[int] = frozenset()

    @property
    def owned(self) -> frozenset[int]:
        return self.gained | self.kept

    @property
    def changed(self) -> bool:
        return bool(self.gained or self.lost)


def fair_shares(counts: Mapping[str, int], partitions: int) -> dict[str, int]:
    """How many of ``partitions`` each live worker is due, given how many each holds
    (``counts``, one entry per live worker): ``partitions // W`` each, one more for the
    ``partitions % W`` workers holding the most (ties by id). The shares add up to
    ``partitions``, and ranking by what is held means a balanced split is left as it is."""
    if not counts:
        raise ValueError("no live workers to share the partitions between")
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    each, extra = divmod(partitions, len(ranked))
    return {w: each + (1 if i < extra else 0) for i, w in enumerate(ranked)}


class LeaseTable:
    """One worker's view of the leases, and its decisions (see the module docs). No I/O and
    no clock: ``now`` is always given, in wall-clock seconds.

    A step is: :meth:`plan` with the leases and members just read (which takes in what they
    say and returns what to write); the writes; :meth:`won` or :meth:`refused` for each
    acquire or renew, :meth:`handed_over` for each lease given up and deleted; then
    :meth:`changes` tells the owner what it gained and lost since it was last told."""

    def __init__(self, partitions: int, worker: str, ttl: float = DEFAULT_TTL) -> None:
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"partitions must be a whole number of 1 or more, not {partitions!r}")
        if not worker:
            raise ValueError("a worker needs an id")
        self.partitions = partitions
        self.worker = worker
        self.ttl = check_ttl(ttl)
        #: The leases this worker holds and uses: the last it wrote or read of each.
        self._mine: dict[int, Lease] = {}
        #: Leases given up for balance, still ours in KV until :meth:`handed_over`.
        self._yielding: dict[int, Lease] = {}
        #: What :meth:`changes` last reported as owned.
        self._reported: frozenset[int] = frozenset()

    def __repr__(self) -> str:
        return f"<LeaseTable {self.worker} holds {sorted(self._mine)} of {self.partitions}>"

    @property
    def held(self) -> Mapping[int, Lease]:
        """Our leases (expired ones too, until the next :meth:`plan`), without those given
        up."""
        return dict(self._mine)

    @property
    def yielding(self) -> Mapping[int, Lease]:
        """Leases given up for balance and not deleted yet."""
        return dict(self._yielding)

    def owned(self, now: float) -> frozenset[int]:
        """The partitions this worker may use at ``now``: its leases not expired nor given
        up."""
        return frozenset(p for p, lease in self._mine.items() if lease.live(now))

    def expiry(self, now: float) -> float:
        """When a lease written at ``now`` expires."""
        return now + self.ttl

    def live_workers(
        self, now: float, leases: Mapping[int, Lease | None], members: Mapping[str, float]
    ) -> list[str]:
        """The workers alive at ``now``, by id: this one, those whose member record (worker ->
        expiry) has not expired, and the owners of leases that have not."""
        live = {self.worker}
        live.update(w for w, expires in members.items() if now < expires)
        live.update(
            lease.owner
            for p, lease in leases.items()
            if lease is not None and p < self.partitions and lease.live(now)
        )
        return sorted(live)

    def plan(
        self,
        now: float,
        leases: Mapping[int, Lease | None],
        members: Mapping[str, float] | None = None,
    ) -> LeasePlan:
        """Take in ``leases`` (partition -> lease as read from KV; a partition missing or None
        is free) and decide this step (the rules are the module docs'). ``members`` maps the
        workers known to be alive to when that knowledge expires; with None, the owners of
        unexpired leases are all the workers known. The partitions given up are no longer
        :meth:`owned` from here on; delete their leases, then :meth:`handed_over`."""
        self._observe(now, leases)
        live = self.live_workers(now, leases, members or {})
        counts = dict.fromkeys(live, 0)
        free: list[int] = []
        for p in range(self.partitions):
            lease = leases.get(p)
            if p in self._mine or p in self._yielding:
                continue
            if lease is None or not lease.live(now):
                free.append(p)
            else:
                counts[lease.owner] += 1
        mine = sorted(self._mine)
        counts[self.worker] = len(mine)
        share = fair_shares(counts, self.partitions)[self.worker]
        give_up = tuple(sorted(mine, reverse=True)[: max(0, len(mine) - share)])
        acquire: tuple[int, ...] = ()
        if len(mine) < share and free:
            start = live.index(self.worker) * self.partitions // len(live)
            free.sort(key=lambda p: (p - start) % self.partitions)
            acquire = tuple(free[: share - len(mine)])
        for p in give_up:
            self._yielding[p] = self._mine.pop(p)
        due = self.ttl * (1 - RENEW_AFTER)
        renew = tuple(p for p in sorted(self._mine) if self._mine[p].expires - now <= due)
        return LeasePlan(acquire=acquire, renew=renew, give_up=give_up)

    def _observe(self, now: float, leases: Mapping[int, Lease | None]) -> None:
        """KV is the truth: a lease of ours that another worker took, that was deleted or that
        expired is ours no more; an unexpired one KV says is ours (our write whose answer was
        lost) is. A stale read never shrinks a revision we wrote."""
        for p in range(self.partitions):
            lease = leases.get(p)
            ours = lease is not None and lease.owner == self.worker and lease.live(now)
            if p in self._yielding:
                if ours and lease is not None:
                    self._yielding[p] = max(self._yielding[p], lease, key=_revision)
                else:
                    del self._yielding[p]  # nothing left to hand over
            elif ours and lease is not None:
                known = self._mine.get(p)
                self._mine[p] = lease if known is None else max(known, lease, key=_revision)
            else:
                self._mine.pop(p, None)

    def won(self, partition: int, revision: int, now: float) -> None:
        """An acquire or renew written at ``now`` (its expiry counted from then) succeeded at
        ``revision``."""
        self._mine[partition] = Lease(self.worker, self.expiry(now), revision)

    def refused(self, partition: int) -> None:
        """An acquire or renew lost its compare-and-set: the partition is another worker's."""
        self._mine.pop(partition, None)

    def handed_over(self, partition: int) -> None:
        """A lease given up was deleted (or found taken meanwhile): nothing more to do."""
        self._yielding.pop(partition, None)

    def leave(self) -> Mapping[int, Lease]:
        """Give up every lease (shutting down): none is owned from here on; returns all the
        leases to delete, then :meth:`handed_over` each."""
        self._yielding.update(self._mine)
        self._mine.clear()
        return self.yielding

    def changes(self, now: float) -> LeaseChanges:
        """What changed in :meth:`owned` since the last call (the first call reports all that
        is owned as gained)."""
        owned = self.owned(now)
        before, self._reported = self._reported, owned
        return LeaseChanges(gained=owned - before, kept=owned & before, lost=before - owned)


def _revision(lease: Lease) -> int:
    return lease.revision


@attrs.frozen(slots=True)
class LeaseView:
    """The leases and member records of one pipeline as read at one moment."""

    leases: dict[int, Lease]
    members: dict[str, float]


class PartitionLeases:
    """This worker's leases on the ``partitions`` partitions of ``pipeline``, kept in ``kv``
    (see the module docs). Not safe for two tasks at once: :meth:`run`, or the caller's own
    calls of :meth:`step`, are its only user.

    Failures other than a lost compare-and-set are raised by :meth:`step` (requests are retried
    for up to a third of the ttl while they fail transiently); :meth:`run` says them and goes
    on, reporting leases lost as they expire."""

    def __init__(
        self,
        kv: KeyValue,
        pipeline: str,
        partitions: int,
        *,
        worker: str | None = None,
        ttl: float = DEFAULT_TTL,
    ) -> None:
        self.kv = kv
        self.pipeline = pipeline
        self.table = LeaseTable(partitions, worker or default_worker_id(), ttl)
        self.prefix = key_token(pipeline)
        self.member_key = f"{self.prefix}.worker.{key_token(self.worker)}"
        #: The failure :meth:`run` is riding out, if any.
        self.outage: str | None = None

    def __repr__(self) -> str:
        return f"<PartitionLeases {self.kv.bucket}/{self.prefix} {self.table!r}>"

    @property
    def worker(self) -> str:
        return self.table.worker

    @property
    def partitions(self) -> int:
        return self.table.partitions

    @property
    def ttl(self) -> float:
        return self.table.ttl

    @property
    def where(self) -> str:
        return f"leases of {self.pipeline} (bucket {self.kv.bucket!r})"

    @classmethod
    async def open(
        cls,
        js: JetStream,
        pipeline: str,
        partitions: int,
        *,
        worker: str | None = None,
        ttl: float = DEFAULT_TTL,
        bucket: str = DEFAULT_LEASE_BUCKET,
        replicas: int = 1,
        create: bool = True,
    ) -> PartitionLeases:
        """The leases of ``pipeline`` in ``bucket`` (made if missing and ``create``)."""
        check_ttl(ttl)
        kv = await retry_transient(lambda: _bucket(js, bucket, replicas, create))
        return cls(kv, pipeline, partitions, worker=worker, ttl=ttl)

    def lease_key(self, partition: int) -> str:
        return f"{self.prefix}.lease.p{partition}"

    def owned(self, now: float | None = None) -> frozenset[int]:
        """The partitions this worker may use (at ``now``, by default the wall clock's)."""
        return self.table.owned(time.time() if now is None else now)

    async def _retry(self, request: Callable[[], Awaitable[T]]) -> T:
        # A third of the ttl: a request still failing then has made a renewal late already.
        return await retry_transient(request, deadline=self.ttl * RENEW_AFTER)

    # -- a step -----------------------------------------------------------------------------

    async def step(self, now: float) -> LeaseChanges:
        """One round, as of ``now`` (wall-clock seconds): hand over what the last step gave
        up, say this worker is alive, read every lease, then acquire, renew and give up as
        :meth:`LeaseTable.plan` decides. Returns what changed since the last step."""
        await self.hand_over()
        await self._retry(lambda: self.kv.put(self.member_key, self._member_value(now)))
        view = await self.read(now)
        return await self.apply(view, now)

    async def read(self, now: float) -> LeaseView:
        """Every lease and member record of the pipeline, at one moment (a watch's initial
        pass, on the stream's leader). :class:`LeaseError` for a record that does not decode
        or an unexpired lease taken under another number of partitions."""

        async def entries() -> list[tuple[str, bytes, int]]:
            async with self.kv.watch(f"{self.prefix}.>", ignore_deletes=True) as watcher:
                return [(e.key, e.value, e.revision) async for e in watcher.initial()]

        view = LeaseView(leases={}, members={})
        for key, value, revision in await self._retry(entries):
            rest = key[len(self.prefix) + 1 :]
            if rest.startswith("worker."):
                worker, expires = self._decode_member(key, value)
                view.members[worker] = max(expires, view.members.get(worker, -math.inf))
                continue
            found = _LEASE_KEY.match(rest)
            if found is None:
                continue  # not ours to read
            lease = self._decode_lease(key, int(found.group(1)), value, revision, now)
            if lease is not None:
                view.leases[int(found.group(1))] = lease
        return view

    async def apply(self, view: LeaseView, now: float) -> LeaseChanges:
        """Decide on ``view`` (read at or before ``now``) and write: renewals first, then
        acquisitions. :meth:`step` is :meth:`read` then this; apart, they let a test act as a
        worker that read, stalled, and wrote late."""
        plan = self.table.plan(now, view.leases, view.members)
        for p in plan.renew:
            await self._write(p, self.table.held[p].revision, now)
        for p in plan.acquire:
            lease = view.leases.get(p)
            await self._write(p, None if lease is None else lease.revision, now)
        return self.table.changes(now)

    async def _write(self, partition: int, revision: int | None, now: float) -> None:
        """Create (``revision`` None) or update the lease on ``partition`` by compare-and-set;
        tell the table whether it is ours."""
        key, value = self.lease_key(partition), self._lease_value(partition, now)
        try:
            if revision is None:
                written = await self._retry(lambda: self.kv.create(key, value))
            else:
                written = await self._retry(lambda: self.kv.update(key, value, revision))
        except WrongRevision:  # KeyExists too
            # Another worker's, or our own write whose answer was lost and was retried: read.
            settled = await self._settled(key, value)
            if settled is None:
                self.table.refused(partition)
                return
            written = settled
        self.table.won(partition, written, now)

    async def _settled(self, key: str, value: bytes) -> int | None:
        try:
            entry = await self._retry(lambda: self.kv.get(key))
        except KeyNotFound:
            return None
        return entry.revision if entry.value == value else None

    async def hand_over(self) -> frozenset[int]:
        """Delete the leases given up (for balance, by an earlier step; or all, by
        :meth:`release_all`), each on its revision: one taken meanwhile (it had expired) is
        left to its new owner. Returns the partitions handed over. Call it once the owner has
        stopped using them: :meth:`step` does at its start, :meth:`run` after ``on_change``."""
        done: set[int] = set()
        for p, lease in sorted(self.table.yielding.items()):
            key = self.lease_key(p)
            try:
                await self._retry(lambda key=key, lease=lease: self.kv.delete(key, lease.revision))  # type: ignore[misc]
            except WrongRevision:
                pass
            self.table.handed_over(p)
            done.add(p)
        return frozenset(done)

    # -- running ----------------------------------------------------------------------------

    async def run(
        self,
        on_change: OnChange | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Step every third of the ttl until cancelled; started once the first step is done
        (and ``on_change`` told of what it gained). ``on_change(gained, lost)`` (plain or
        async) is called whenever the partitions owned change, including leases that expired
        because steps failed; it runs inside the loop, so it must be short (it delays the
        renewals), and what it was told is lost must be out of use when it returns: then the
        leases given up for balance are handed over.

        A transient failure (no answer, no stream leader) is said once (a warning, and
        :attr:`outage`) and tried again at the next step; anything else, :class:`LeaseError`
        included, is raised. Cancelling ends the loop where it is and releases nothing: the
        caller stops using the partitions, then calls :meth:`release_all` (or lets the leases
        expire)."""
        period = self.ttl * RENEW_AFTER
        told: frozenset[int] = frozenset()  # what on_change knows is owned
        while True:
            began = trio.current_time()
            with trio.move_on_after(period) as scope:
                try:
                    await self.step(time.time())
                except Exception as exc:
                    if isinstance(exc, LeaseError) or not is_transient(exc):
                        raise
                    self._outage(f"{type(exc).__name__}: {exc}")
                else:
                    self._recovered()
            if scope.cancelled_caught:
                self._outage(f"a step took longer than {period:g} s")
            owned = self.table.owned(time.time())  # leases may have expired meanwhile
            gained, lost, told = owned - told, told - owned, owned
            if (gained or lost) and on_change is not None:
                result = on_change(gained, lost)
                if inspect.isawaitable(result):
                    await result
            if self.table.yielding:
                with trio.move_on_after(period):
                    try:
                        await self.hand_over()
                    except Exception as exc:
                        if not is_transient(exc):
                            raise
                        self._outage(f"{type(exc).__name__}: {exc}")
            task_status.started()
            task_status = trio.TASK_STATUS_IGNORED
            await trio.sleep_until(began + period)

    async def release_all(self, *, timeout: float = RELEASE_TIMEOUT) -> frozenset[int]:
        """Give up every lease at once and delete them, and this worker's member record, so
        the others take the partitions over at their next step instead of after the ttl. For
        shutting down, once the partitions are out of use: shielded from cancellation, bounded
        by ``timeout`` seconds, best effort (a lease not deleted expires). Returns the
        partitions given up."""
        leaving = frozenset(self.table.leave())
        with trio.CancelScope(shield=True), trio.move_on_after(timeout):
            try:
                await self.hand_over()
                await self._retry(lambda: self.kv.delete(self.member_key))
            except Exception as exc:
                self._outage(f"releasing: {type(exc).__name__}: {exc}")
        self.table.changes(time.time())  # what the owner was told is over: it stopped
        return leaving

    def _outage(self, text: str) -> None:
        if self.outage is None:
            warnings.warn(
                f"{self.where}, worker {self.worker!r}: {text} (trying again)",
                RuntimeWarning,
                stacklevel=2,
            )
        self.outage = text

    def _recovered(self) -> None:
        self.outage = None

    # -- values -----------------------------------------------------------------------------

    def _lease_value(self, partition: int, now: float) -> bytes:
        return json.dumps(
            {
                "owner": self.worker,
                "expires": self.table.expiry(now),
                "partition": partition,
                "partitions": self.partitions,
            },
            sort_keys=True,
        ).encode()

    def _member_value(self, now: float) -> bytes:
        data = {"worker": self.worker, "expires": self.table.expiry(now)}
        return json.dumps(data, sort_keys=True).encode()

    def _decode_lease(
        self, key: str, partition: int, raw: bytes, revision: int, now: float
    ) -> Lease | None:
        """The lease, or None for an expired one of a partition this worker does not have
        (taken under a larger N: nothing to take over, nothing to fear)."""
        data = _json_object(raw)
        owner, expires, written_for, count = (
            data.get(k) for k in ("owner", "expires", "partition", "partitions")
        )
        if (
            not isinstance(owner, str)
            or not _is_number(expires)
            or not _is_int(written_for)
            or not _is_int(count)
            or written_for != partition
        ):
            raise LeaseError(
                f"{self.where}: the lease {key!r} does not decode ({raw[:200]!r}); delete the "
                "key if no worker of another headrace uses it"
            )
        lease = Lease(owner, float(expires), revision)
        if count != self.partitions and lease.live(now):
            raise LeaseError(
                f"{self.where}: worker {owner!r} holds partition {partition} of "
                f"{count}, this worker partitions into {self.partitions}: workers that split "
                "the keys differently must not run at once (stop the others, or let their "
                "leases expire)"
            )
        if partition >= self.partitions:
            return None
        return lease

    def _decode_member(self, key: str, raw: bytes) -> tuple[str, float]:
        data = _json_object(raw)
        worker, expires = data.get("worker"), data.get("expires")
        if not isinstance(worker, str) or not _is_number(expires):
            raise LeaseError(f"{self.where}: the member record {key!r} does not decode")
        return worker, float(expires)


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


async def _bucket(js: JetStream, bucket: str, replicas: int, create: bool) -> KeyValue:
    config = KeyValueConfig(
        bucket=bucket,
        description="headrace: leases on the partitions of stateful pipelines",
        history=1,
        replicas=replicas,
    )
    # Leader reads: a replica behind would show a lease as free that was just taken (the
    # compare-and-set would refuse the write, but a worker could keep losing races).
    return await leader_bucket(js, config, create=create)
