"""The commit state of one output in a JetStream KV bucket, changed by compare-and-set.

:class:`CommitCoordinator` is the driver of state.py: it keeps the last state it read or wrote
and its revision, applies a change to it, and writes the result conditional on that revision
(``Nats-Expected-Last-Subject-Sequence``, ADR-8). The server orders all writes of the key, so
of two workers committing overlapping records exactly one wins; the other reads the newer state
and sees the overlap.

The three ways a write can end, and what follows:

- accepted: the new state and revision are kept;
- refused (:class:`~headrace.jetstream.kv.WrongRevision`): someone wrote first. Read again
  (from the stream leader, never a lagging replica) and apply the change again. Each refusal
  means another worker's write succeeded, so the workers as a whole always progress; one worker
  backs off with jitter after a few refusals in a row, and gives up
  (:class:`CommitContention`) only after ``max_attempts`` or its deadline;
- no answer (a timeout, the connection lost): the write is *in doubt*. It may have landed.
  Read again until a read succeeds and apply the change again: every change is idempotent (a
  commit by its attempt's token), so a write that did land is recognised, not repeated.

Reads and writes go to the bucket's stream leader; ``deadline`` bounds a change, server
failovers included (a replicated bucket elects a new leader within seconds).
"""

from __future__ import annotations

import contextlib
import random
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping

import trio

from headrace.commits.errors import (
    CommitContention,
    CommitStateMissing,
    CommitStateRefused,
    CommitStateUnavailable,
    OutputOwned,
)
from headrace.commits.identity import Attempt, StreamIdentity, now_ms
from headrace.commits.seqset import SeqSet
from headrace.commits.state import CommitOutcome, CommitState, Committed, Overlap
from headrace.errors import PermissionViolation
from headrace.jetstream.context import JetStream
from headrace.jetstream.kv import (
    BucketNotFound,
    KeyExists,
    KeyNotFound,
    KeyValue,
    KeyValueConfig,
    Operation,
    WrongRevision,
    leader_bucket,
)
from headrace.jetstream.transient import is_transient, retry_transient

#: The bucket every output's commit state lives in unless told otherwise.
DEFAULT_BUCKET = "headrace_commits"
#: Revisions kept per output: the current state and a few before it, to look at after the fact.
HISTORY = 5
#: A change gives up after this many refusals in a row...
MAX_ATTEMPTS = 200
#: ... or after this many seconds (in-doubt writes and failovers included).
DEADLINE = 60.0
#: One request to the bucket waits this long before its write counts as in doubt.
REQUEST_TIMEOUT = 5.0
#: Refusals in a row before a writer steps aside for a random moment (jitter).
JITTER_AFTER = 4
#: After a refusal, how long the watch may take to bring the newer state before it is read.
WATCH_CATCH_UP = 0.5


class CommitCoordinator:
    """One output's commit state, shared with every other worker of the output (see the
    module docs). Made by :meth:`open`."""

    def __init__(
        self,
        kv: KeyValue,
        state: CommitState,
        revision: int,
        *,
        worker: str,
        max_attempts: int = MAX_ATTEMPTS,
        deadline: float = DEADLINE,
    ) -> None:
        self.kv = kv
        self.key = state.output
        self.state = state
        self.revision = revision
        self.worker = worker
        self.max_attempts = max_attempts
        self.deadline = deadline
        #: Commits this worker made, writes refused because another came first, writes whose
        #: answer was lost, and commits that found part of their records committed already.
        self.commits = 0
        self.refused = 0
        self.in_doubt = 0
        self.overlaps = 0
        #: The most refusals one change met before it was written (bounded retries, measured).
        self.max_refusals = 0
        #: Whether :meth:`watch` is keeping the state current.
        self.watching = False
        self._advanced = trio.Event()

    def __repr__(self) -> str:
        return f"<CommitCoordinator {self.kv.bucket}/{self.key} rev {self.revision}>"

    @classmethod
    async def open(
        cls,
        js: JetStream,
        *,
        output: str,
        owner: str,
        worker: str,
        bucket: str = DEFAULT_BUCKET,
        replicas: int = 1,
        create: bool = False,
    ) -> CommitCoordinator:
        """The coordinator of ``output`` (its id), owned by ``owner`` (the pipeline and sink).

        ``create``: make the bucket (with ``replicas``) and the state if missing; else a
        missing state is :class:`CommitStateMissing`. A state owned by someone else is
        :class:`OutputOwned`.
        """
        with _refused(output, bucket):
            return await cls._open(js, output, owner, worker, bucket, replicas, create)

    @classmethod
    async def _open(
        cls,
        js: JetStream,
        output: str,
        owner: str,
        worker: str,
        bucket: str,
        replicas: int,
        create: bool,
    ) -> CommitCoordinator:
        kv = await retry_transient(lambda: _bucket(js, bucket, replicas, create))
        try:
            entry = await retry_transient(lambda: kv.get(output))
        except KeyNotFound:
            if not create:
                raise CommitStateMissing(
                    f"output {output}: its commit state (key {output!r} in bucket {bucket!r}) "
                    "is not in this NATS system: it was deleted, or this worker is connected to "
                    "another one. Without it, records committed before could be written again. "
                    "Connect to the right servers, or start a new output (another directory)"
                ) from None
            state = CommitState(output=output, owner=owner)
            try:
                # (Retried only while nothing answers: a create that landed unseen is then
                # refused as KeyExists, and the state read back is the same.)
                revision = await retry_transient(lambda: kv.create(output, state.to_json()))
            except KeyExists:
                entry = await retry_transient(lambda: kv.get(output))
            else:
                return cls(kv, state, revision, worker=worker)
        state = CommitState.from_json(entry.value, f"commit state {bucket}/{output}")
        if state.owner != owner:
            raise OutputOwned(
                f"output {output} is written by {state.owner!r}, not by {owner!r}: two "
                "pipelines (or two sinks) cannot share an output. Give this one its own output"
            )
        await _may_write(kv, output, entry.value)
        return cls(kv, state, entry.revision, worker=worker)

    # -- reading ----------------------------------------------------------------------------

    async def refresh(self) -> CommitState:
        """Read the current state (from the stream leader), retrying transient failures (a
        leader being elected, a reconnect) for up to ``deadline`` seconds:
        :class:`CommitStateUnavailable` after that."""
        await self._read_until(trio.current_time() + self.deadline, None)
        return self.state

    async def _read(self) -> None:
        with trio.fail_after(REQUEST_TIMEOUT):
            try:
                entry = await self.kv.get(self.key)
            except (KeyNotFound, BucketNotFound) as exc:
                raise CommitStateMissing(
                    f"output {self.key}: its commit state was deleted from bucket "
                    f"{self.kv.bucket!r} while the output was being written ({exc})"
                ) from exc
        state = CommitState.from_json(entry.value, f"commit state {self.kv.bucket}/{self.key}")
        if entry.revision >= self.revision:  # (the watch may have brought a newer one meanwhile)
            self.state, self.revision = state, entry.revision
            self._advanced.set()
            self._advanced = trio.Event()

    # -- changing ---------------------------------------------------------------------------

    async def commit(
        self,
        attempt: Attempt,
        seqs: Mapping[StreamIdentity, SeqSet],
        *,
        floors: Mapping[StreamIdentity, int] | None = None,
        forget: Iterable[str] = (),
    ) -> CommitOutcome:
        """Commit ``seqs`` as ``attempt`` (see :meth:`CommitState.commit`); ``forget``: this
        worker's earlier attempts that it has published since, taken out on the way."""
        outcome: list[CommitOutcome] = []
        published = list(forget)

        def change(state: CommitState) -> CommitState:
            result = state.commit(
                attempt, self.worker, seqs, at=now_ms(), floors=floors, forget=published
            )
            outcome.append(result)
            return result.state if isinstance(result, Committed) else state

        await self.change(change)
        result = outcome[-1]
        if isinstance(result, Committed):
            # Found committed on the first look: an earlier call committed it. Found so only
            # on a later look (after a write in doubt, or the watch bringing it): this call's
            # write landed, and it is this worker's commit like any other.
            first = outcome[0]
            self.commits += 0 if isinstance(first, Committed) and first.already else 1
        elif isinstance(result, Overlap):
            self.overlaps += 1
        return result

    async def change(
        self, change: Callable[[CommitState], CommitState], *, confirm_unchanged: bool = False
    ) -> CommitState:
        """Write ``change(state)``, retrying as the module docs say; a change that returns the
        state it was given writes nothing. ``confirm_unchanged``: such a change is tried once
        more on a fresh read first (for a change that the state kept here, perhaps older than
        the key's, could not apply yet: taking out an attempt another worker committed)."""
        deadline = trio.current_time() + self.deadline
        refusals = 0
        doubt: BaseException | None = None
        while True:
            if doubt is not None:
                await self._read_until(deadline, doubt)
                doubt = None
            new = change(self.state)
            if new is self.state and confirm_unchanged:
                confirm_unchanged = False
                await self._read_until(deadline, None)
                new = change(self.state)
            if new is self.state:
                return new
            try:
                with trio.fail_after(REQUEST_TIMEOUT), _refused(self.key, self.kv.bucket):
                    revision = await self.kv.update(self.key, new.to_json(), self.revision)
            except WrongRevision as exc:
                refusals += 1
                self.refused += 1
                if refusals >= self.max_attempts or trio.current_time() > deadline:
                    raise CommitContention(
                        f"output {self.key}: {refusals} writes of the commit state in a row "
                        "were refused (other workers wrote first); the batch comes again"
                    ) from exc
                if refusals > JITTER_AFTER:
                    # Several workers keep writing at the same instant: step aside for a
                    # random moment so that they do not collide in lockstep. (A refusal alone
                    # means another worker's write landed: nothing to wait for.)
                    await trio.sleep(random.uniform(0, min(0.05, 0.001 * 2**refusals)))
                await self._catch_up(exc.current, deadline, exc)
                continue
            except Exception as exc:
                # No answer, or an answer that is not a verdict on the write (nobody listening
                # while a leader is elected): it may have landed. Read until we know.
                if not (is_transient(exc) or isinstance(exc, BucketNotFound)):
                    raise
                self.in_doubt += 1
                if trio.current_time() > deadline:
                    raise CommitStateUnavailable(
                        f"output {self.key}: the commit state could not be written within "
                        f"{self.deadline:.0f}s ({exc!r})"
                    ) from exc
                doubt = exc
                continue
            self.max_refusals = max(self.max_refusals, refusals)
            self._observe(new, revision)
            return new

    # -- keeping up with the other workers ---------------------------------------------------

    def _observe(self, state: CommitState, revision: int) -> None:
        """A state at ``revision``, from this worker's write or the watch: kept if newer."""
        if revision > self.revision:
            self.state, self.revision = state, revision
            self._advanced.set()
            self._advanced = trio.Event()

    async def _catch_up(self, current: int | None, deadline: float, cause: BaseException) -> None:
        """After a refusal: wait for the watch to bring revision ``current`` (what the server
        said the key is at), or read it."""
        if self.watching and current is not None:
            with trio.move_on_after(WATCH_CATCH_UP):
                while self.revision < current:
                    await self._advanced.wait()
            if self.revision >= current:
                return
        await self._read_until(deadline, cause)

    async def watch(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the state here current (run in a nursery, until cancelled): every change
        another worker writes comes to this worker as it lands, so its next compare-and-set
        names the key's current revision and is refused only when two writes cross. Without
        it, with several workers committing, most writes are refused once and pay a read.
        A watch that fails only warns: the state is read again on refusals, as without one."""
        started = False
        try:
            async with self.kv.watch(self.key, updates_only=True) as watcher:
                self.watching = True
                task_status.started()
                started = True
                async for entry in watcher:
                    if entry.operation is Operation.PUT and entry.revision > self.revision:
                        where = f"commit state {self.kv.bucket}/{self.key}"
                        self._observe(CommitState.from_json(entry.value, where), entry.revision)
        except Exception as exc:
            warnings.warn(
                f"output {self.key}: the watch of its commit state ended ({exc!r}); the state "
                "is read again when a write is refused",
                RuntimeWarning,
                stacklevel=1,
            )
        finally:
            self.watching = False
        if not started:
            task_status.started()  # (nothing to watch with: the caller goes on without)

    async def _read_until(self, deadline: float, cause: BaseException | None) -> None:
        """Read the state, retrying transient failures until ``deadline``."""
        try:
            await retry_transient(self._read, deadline=max(0.0, deadline - trio.current_time()))
        except CommitStateMissing:
            raise
        except Exception as exc:
            if not is_transient(exc):
                raise
            after = f", after {cause!r}" if cause is not None else ""
            raise CommitStateUnavailable(
                f"output {self.key}: the commit state could not be read within "
                f"{self.deadline:.0f}s ({exc!r}{after})"
            ) from exc

    async def fence(self, horizon: int) -> CommitState:
        """Raise the horizon (attempts started before it can no longer commit)."""
        return await self.change(lambda state: state.fence(horizon))

    async def forget(self, tokens: list[str]) -> CommitState:
        """Take published attempts out of the unpublished ones."""
        return await self.change(lambda state: state.forget(tokens), confirm_unchanged=True)

    async def report_floors(self, floors: Mapping[StreamIdentity, int]) -> CommitState:
        """Raise the streams' floors to the consumers' ack floors."""
        return await self.change(lambda state: state.with_floors(floors), confirm_unchanged=True)


@contextlib.contextmanager
def _refused(output: str, bucket: str) -> Iterator[None]:
    """A permissions violation on the bucket is :class:`CommitStateRefused`: it names what to
    allow, and stops the pipeline (exit 2) instead of failing batch after batch."""
    try:
        yield
    except PermissionViolation as exc:
        raise CommitStateRefused(output, bucket, exc.subject, exc.operation) from exc


async def _may_write(kv: KeyValue, output: str, value: bytes) -> None:
    """Check, before the first batch, that this user may write the state: a write
    conditional on the key having no message at all, which the server refuses (the state
    was just read) with a wrong last sequence when the user may write it, and with a
    permissions violation when not. Were it ever to land (the key purged meanwhile), it
    writes the state just read."""
    try:
        with trio.fail_after(REQUEST_TIMEOUT):
            await kv.update(output, value, 0)
    except Exception as exc:
        # (No answer, or no leader: the first batch's write will tell.)
        if not (isinstance(exc, WrongRevision) or is_transient(exc)):
            raise


async def _bucket(js: JetStream, bucket: str, replicas: int, create: bool) -> KeyValue:
    config = KeyValueConfig(
        bucket=bucket,
        description="headrace: commit state of the outputs of pipelines",
        history=HISTORY,
        replicas=replicas,
    )
    try:
        return await leader_bucket(js, config, create=create)
    except BucketNotFound:
        raise CommitStateMissing(
            f"the commit bucket {bucket!r} does not exist in this NATS system"
        ) from None
