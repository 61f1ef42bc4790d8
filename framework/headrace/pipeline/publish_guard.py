"""The publish guard: a pipeline stops when the server refuses the publishes it depends on.

A pipeline publishes its acks (``$JS.ACK.<stream>.<consumer>...``: acks, naks, terms, ``+WPI``)
and, for poison messages, copies to its dead-letter subject. A user without permission to
publish there gets nothing back but a ``-ERR Permissions Violation`` naming the subject; the
message is dropped. Unnoticed, that is a stuck state that looks healthy: the stats count the
acks, the server redelivers every message after ack_wait, for ever, a poison message is naked
again and again instead of being kept, and a drain ends as if all was well.

The connection tells whoever asks of each refused publish (:meth:`Connection.on_publish_denied`).
The guard asks for the pipeline's subjects and fails with a typed error naming the subject:
:class:`AckRefused` for an ack of one of its sources' consumers, :class:`DeadLetterRefused` for
its dead letter. It runs under ``Escalate``, so that stops the pipeline with that error; what
was taken and not acked is redelivered by the server after ack_wait, nothing is terminated.
(A consume or push subscription also ends with :class:`AckRefused` on its own; the guard
covers what happens after the source stopped taking, such as the last acks of a drain.)

The guard is given its run (``PipelineRun``, runtime.py, which imports this module) as a
:class:`GuardedRun`: the connection to watch, the pipeline and its sources, nothing more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import trio

from headrace.actors.actor import Actor
from headrace.errors import PermissionViolation
from headrace.jetstream.ack_reply import parse_ack_reply
from headrace.jetstream.errors import AckRefused, InvalidAckReply
from headrace.pipeline.errors import PipelineError

if TYPE_CHECKING:
    from headrace.nats.connection import Connection
    from headrace.pipeline.nodes import PipelineGraph
    from headrace.pipeline.stages import SourceStage


class GuardedRun(Protocol):
    """What the guard needs of its run: the connection that reports refused publishes, the
    pipeline (its name and dead letter), and its sources (their streams and bound consumers,
    whose ``$JS.ACK`` subjects are the run's)."""

    @property
    def nc(self) -> Connection: ...

    @property
    def pipeline(self) -> PipelineGraph: ...

    @property
    def sources(self) -> Sequence[SourceStage]: ...


class DeadLetterRefused(PipelineError):
    """The server refuses the pipeline's dead-letter publishes (a permissions violation): a
    poison message could never be kept, only naked again. ``subject`` is the dead letter; the
    :class:`~headrace.errors.PermissionViolation` is the ``__cause__``."""

    restartable = False  # a restart would be refused the same way

    def __init__(self, pipeline: str, subject: str) -> None:
        super().__init__(
            f"pipeline {pipeline!r}: the server refuses to let this user publish to its "
            f"dead_letter subject {subject!r} (permissions violation): allow it, or leave "
            "dead_letter unset"
        )
        self.subject = subject


class PublishGuard(Actor[None]):
    """Fails with the first refused publish of its pipeline (see the module docs)."""

    def __init__(self, run: GuardedRun) -> None:
        super().__init__("publish-guard", inbox_size=0)
        self.run_ = run
        self.refused: Exception | None = None
        self._refused = trio.Event()

    async def run(self) -> None:
        stop_watching = self.run_.nc.on_publish_denied("", self._on_publish_denied)
        try:
            await self._refused.wait()
        finally:
            stop_watching()
        assert self.refused is not None
        raise self.refused

    def _on_publish_denied(self, violation: PermissionViolation) -> None:
        """In the connection's reader: keep the first refusal that is the pipeline's."""
        if self.refused is not None:
            return
        error = self._ours(violation.subject)
        if error is not None:
            error.__cause__ = violation
            self.refused = error
            self._refused.set()

    def _ours(self, subject: str) -> Exception | None:
        run = self.run_
        if subject == run.pipeline.dead_letter:
            return DeadLetterRefused(run.pipeline.name, subject)
        if not subject.startswith("$JS.ACK."):
            return None
        try:
            meta = parse_ack_reply(subject)
        except InvalidAckReply:
            return None
        for source in run.sources:
            spec = source.node.source
            if (
                spec is not None
                and spec.stream == meta.stream
                and source.consumer_name == meta.consumer
            ):
                return AckRefused(meta.stream, meta.consumer, subject)
        return None  # another consumer's acks, on a connection the pipeline shares
