"""When a failing checkpoint is tried again, and when it is given up on (Beckett's model).

A handler error puts the checkpoint into retry: the failing message is tried again after a
delay that doubles with each attempt (``initial_delay * 2**(attempt - 1)``, capped at
``max_delay``), with full jitter so that many entities failing together (a database down) do
not come back together. After ``max_retries`` failed retries the checkpoint is failed and waits
for an operator. Per-exception overrides change the number of retries for one kind of error; 0
means fail at once (an error no retry can fix, such as a payload that does not parse).

No I/O and no clock: callers pass the attempt number, the error and a random source.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import attrs

from headrace._validators import non_negative


def _check_overrides(
    _inst: object,
    _attribute: attrs.Attribute[Mapping[type[BaseException], int]],
    value: Mapping[type[BaseException], int],
) -> None:
    for kind, retries in value.items():
        if not (isinstance(kind, type) and issubclass(kind, BaseException)):
            raise TypeError(f"retry overrides are keyed by exception classes, not {kind!r}")
        if retries < 0:
            raise ValueError(f"retries for {kind.__name__} must not be negative, not {retries}")


@attrs.frozen(slots=True)
class Retry:
    """Try again after ``delay`` seconds; this will be retry number ``attempt``."""

    attempt: int
    delay: float


@attrs.frozen(slots=True)
class GiveUp:
    """No retry left (``retries`` were allowed): the checkpoint is failed."""

    retries: int


@attrs.frozen(slots=True, kw_only=True)
class RetryPolicy:
    """Exponential backoff with full jitter, and a retry budget per exception class.

    Defaults are Beckett's: 10 retries, 10 s initial delay, 4 min at most.
    """

    max_retries: int = attrs.field(default=10, validator=non_negative)
    initial_delay: float = attrs.field(default=10.0, validator=non_negative)
    max_delay: float = attrs.field(default=240.0, validator=non_negative)
    #: Retries for an exception class (and its subclasses; the most derived match wins).
    overrides: Mapping[type[BaseException], int] = attrs.field(
        factory=dict, converter=dict, validator=_check_overrides
    )
    jitter: bool = True

    def __attrs_post_init__(self) -> None:
        if self.max_delay < self.initial_delay:
            raise ValueError(
                f"max_delay ({self.max_delay}) is below initial_delay ({self.initial_delay})"
            )

    def retries_for(self, error: BaseException) -> int:
        """The retry budget for ``error``: its closest override in the MRO, else
        ``max_retries``."""
        for kind in type(error).__mro__:
            if kind in self.overrides:
                return self.overrides[kind]
        return self.max_retries

    def ceiling(self, attempt: int) -> float:
        """The longest delay before retry number ``attempt`` (1-based)."""
        if attempt < 1:
            raise ValueError(f"attempts count from 1, not {attempt}")
        # 2**62 is far past any max_delay; the cap keeps the float finite.
        growth: float = 2.0 ** min(attempt - 1, 62)
        return min(self.max_delay, self.initial_delay * growth)

    def decide(
        self, error: BaseException, failed_retries: int, rng: random.Random | None = None
    ) -> Retry | GiveUp:
        """What to do after a failure, ``failed_retries`` retries having failed before it
        (0 for the first failure)."""
        budget = self.retries_for(error)
        if failed_retries >= budget:
            return GiveUp(budget)
        attempt = failed_retries + 1
        ceiling = self.ceiling(attempt)
        delay = (rng or random).uniform(0, ceiling) if self.jitter else ceiling
        return Retry(attempt, delay)
