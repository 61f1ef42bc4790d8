"""The commit protocol: one output written by any number of workers, each record exactly once.

Workers of a pipeline (processes on one host or many, sharing a durable consumer) write one
output. Whichever commits a record first wins; the others find it committed and drop it. They
agree through one value per output in a JetStream KV bucket (``headrace_commits`` by default),
changed only by compare-and-set, so no other infrastructure is needed:

- :mod:`.state`: the commit state and its transitions, without I/O;
- :mod:`.coordinator`: :class:`CommitCoordinator`, which reads and writes it;
- :mod:`.identity`: stream identities, attempt tokens, worker ids.

File outputs (the Spark sink, the jsonl sink) put their files in place with
:class:`headrace.sinks.shared_output.SharedOutput`. See docs/scaling.md.
"""

from headrace.commits.coordinator import DEFAULT_BUCKET, CommitCoordinator
from headrace.commits.errors import (
    CommitContention,
    CommitError,
    CommitStateMissing,
    CommitStateRefused,
    CommitStateUnavailable,
    CorruptCommitState,
    OutputConflict,
    OutputOwned,
    StreamRecreated,
)
from headrace.commits.identity import Attempt, StreamIdentity, new_worker_id, now_ms
from headrace.commits.seqset import SeqSet
from headrace.commits.state import (
    CommitOutcome,
    CommitState,
    Committed,
    Expired,
    Lease,
    LeaseLost,
    Overlap,
    StreamCommits,
    Unpublished,
)

__all__ = [
    "DEFAULT_BUCKET",
    "Attempt",
    "CommitContention",
    "CommitCoordinator",
    "CommitError",
    "CommitOutcome",
    "CommitState",
    "CommitStateMissing",
    "CommitStateRefused",
    "CommitStateUnavailable",
    "Committed",
    "CorruptCommitState",
    "Expired",
    "Lease",
    "LeaseLost",
    "OutputConflict",
    "OutputOwned",
    "Overlap",
    "SeqSet",
    "StreamCommits",
    "StreamIdentity",
    "StreamRecreated",
    "Unpublished",
    "new_worker_id",
    "now_ms",
]
