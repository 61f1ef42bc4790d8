"""Errors of the commit protocol.

Two kinds, and the difference matters to a pipeline:

- :class:`OutputConflict` and its subclasses say that the output cannot be written *safely*
  (another pipeline owns it, the stream was recreated, the commit state is gone). Retrying the
  batch would not help and failing its messages (nak, then poison) would lose them, so a sink
  stage that sees one stops the pipeline, leaving the messages it holds to be redelivered after
  their ack wait. The message says what to do.
- :class:`CommitContention` and :class:`CommitStateUnavailable` are transient: the batch fails
  and comes again.
"""

from __future__ import annotations

from headrace.errors import HeadraceError


class CommitError(HeadraceError):
    """Base class of the commit protocol's errors."""


class OutputConflict(CommitError):
    """The output cannot be written without losing or duplicating records; the pipeline stops
    (see the module docs), whatever the sink's restart policy."""

    #: Never restarted by a supervisor (headrace.actors.supervision): it would fail the same.
    restartable = False


class OutputOwned(OutputConflict):
    """The output belongs to another pipeline (or another sink of this one): two pipelines
    writing one output would each believe the other's records are theirs."""


class StreamRecreated(OutputConflict):
    """A stream of the name the output's commits are recorded under was created anew (deleted
    and created again): its sequences start over, so "already committed" would be a lie.

    ``output`` names the output (its directory, where a sink knows it; else its id);
    ``recorded`` and ``current`` are the creation times of the old and the new stream.
    """

    def __init__(self, output: str, stream: str, recorded: str, current: str) -> None:
        self.output = output
        self.stream = stream
        self.recorded = recorded
        self.current = current
        super().__init__(
            f"stream {stream!r} was created at {current}, but output {output} holds the commits "
            f"of a stream {stream!r} created at {recorded}, which was deleted since. Its "
            "sequences start again at 1, so its records would be skipped as already committed. "
            "Write the new stream to a new output, or, to add it to this one, reset the output's "
            f"commits of that stream: headrace outputs reset {output} --stream {stream}"
        )


class CommitStateMissing(OutputConflict):
    """The output names a commit state that is not in the NATS system this worker talks to:
    the bucket or the key was deleted, or the worker is connected to another cluster. Without
    it, a redelivered record could be written twice."""


class CommitStateRefused(OutputConflict):
    """The server refuses this user the commit bucket (a permissions violation): an output
    shared by a pipeline's workers cannot be written without it, and a restart would be
    refused the same way. ``bucket`` and ``subject`` (the refused one) say what to allow; the
    :class:`~headrace.errors.PermissionViolation` is the ``__cause__``."""

    def __init__(self, output: str, bucket: str, subject: str, operation: str) -> None:
        self.output = output
        self.bucket = bucket
        self.subject = subject
        stream = f"KV_{bucket}"
        super().__init__(
            f"output {output}: the server refuses this user the commit bucket {bucket!r} "
            f"({operation} to {subject!r}: permissions violation). The workers of a pipeline "
            "share an output through its commit state there: allow this user to publish to "
            f'"$KV.{bucket}.>", "$JS.API.STREAM.INFO.{stream}", '
            f'"$JS.API.STREAM.MSG.GET.{stream}" and "$JS.API.CONSUMER.CREATE.{stream}.>" '
            f'(and "$JS.API.STREAM.CREATE.{stream}" if the bucket is still to be made), or '
            "write the output from one process (commits='local')"
        )


class CorruptCommitState(OutputConflict):
    """The commit state (or the output's manifest) cannot be read back."""


class CommitContention(CommitError):
    """A commit lost the compare-and-set race too many times in a row, or could not learn
    whether its write landed, within its deadline. Transient: the batch is written again."""

    transient = True


class CommitStateUnavailable(CommitError):
    """The commit state could not be read or written (the connection is down, the bucket's
    stream has no leader). Transient: the batch is written again."""

    transient = True
