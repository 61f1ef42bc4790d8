"""What happens when an actor's run loop raises: the restart policies, and the error that
names an actor whose failure escalated (supervision.py has the rules in words)."""

from __future__ import annotations

import attrs

from headrace.errors import HeadraceError


@attrs.frozen(slots=True, kw_only=True)
class Restart:
    """Restart on failure, with exponential backoff, at most ``max_restarts`` in ``within``
    seconds."""

    max_restarts: int = attrs.field(default=3, validator=attrs.validators.ge(0))
    within: float = attrs.field(default=60.0, validator=attrs.validators.gt(0))
    backoff: float = attrs.field(default=0.1, validator=attrs.validators.ge(0))
    backoff_max: float = attrs.field(default=5.0, validator=attrs.validators.ge(0))

    def delay(self, restarts: int) -> float:
        """Seconds to wait before restart number ``restarts`` (1 for the first)."""
        return float(min(self.backoff_max, self.backoff * 2 ** min(restarts - 1, 30)))


@attrs.frozen(slots=True)
class Escalate:
    """Do not restart: the first failure stops whatever the actor runs in."""


RestartPolicy = Restart | Escalate


class ActorFailed(HeadraceError):
    """Raised in place of an actor's error when it escalates out of a restart policy, naming
    the actor; ``__cause__`` is the original error."""

    def __init__(self, actor: str, error: BaseException, restarts: int) -> None:
        suffix = f" after {restarts} restarts" if restarts else ""
        super().__init__(f"actor {actor!r} failed{suffix}: {error!r}")
        self.actor = actor
        self.error = error
        self.restarts = restarts
