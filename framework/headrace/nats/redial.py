"""Which server to dial next, when, and when to stop: the reconnect decisions of ADR-40.

Sans-IO, like :class:`~headrace.protocol.session.ClientSession`: the connection supervisor
asks :meth:`Redial.next` with the current time, sleeps until the answer's ``at``, dials, and
reports the outcome (:meth:`Redial.dialing`, :meth:`Redial.failed`, :meth:`Redial.connected`,
:meth:`Redial.lost`). The clock, the socket and the sleeping stay in the driver, so every
decision here is tested without either (``tests/nats/test_redial.py``).

The rules, from ADR-40 and the other clients' behaviour:

- every server never dialled is dialled at once, so the first pass over the pool after a
  loss is immediate;
- a server dialled before waits until its backoff has passed since that dial:
  ``reconnect_wait`` doubled per consecutive failure on it, capped at ``reconnect_wait_max``,
  spread by ``reconnect_jitter`` (or ``reconnect_delay(attempt)`` when given). Pacing from the
  last dial, not the last failure, also slows a server that accepts and drops us at once;
- the server just lost goes to the back of the rotation: the others are tried first;
- after ``max_reconnect_attempts`` consecutive failed dials (``None``: never) the connection
  gives up; a successful handshake starts the count again;
- on the *first* connect, each server is tried once, and credentials or TLS refused end it at
  once (:func:`fatal_on_first_connect`): they would be refused again, and the user should
  hear so now, not after a minute of retries.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import attrs

from headrace.errors import AuthorizationError, ConnectionClosedError, TLSError
from headrace.nats.servers import PoolEntry, ServerPool, backoff_delay


@attrs.frozen(slots=True)
class Dial:
    """Dial ``entry`` at time ``at`` (at once when ``at`` is not after now)."""

    entry: PoolEntry
    at: float


@attrs.frozen(slots=True)
class GiveUp:
    """Stop reconnecting: ``error`` is the last dial's failure, or says no dial was allowed."""

    error: BaseException


def fatal_on_first_connect(error: BaseException) -> bool:
    """Whether a failed first connect ends at once instead of trying the next server."""
    return isinstance(error, (AuthorizationError, TLSError))


class Redial:
    """The reconnect decisions for one connection's server pool (see the module docs)."""

    def __init__(
        self,
        pool: ServerPool,
        *,
        max_attempts: int | None,
        wait: float,
        wait_max: float,
        jitter: float,
        custom: Callable[[int], float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.pool = pool
        self.max_attempts = max_attempts
        self._wait = wait
        self._wait_max = wait_max
        self._jitter = jitter
        self._custom = custom
        self._rng = rng
        #: Consecutive failed dials since the last successful handshake.
        self.attempts = 0
        self._last_error: BaseException | None = None

    def next(self) -> Dial | GiveUp:
        """The next dial, or the end of trying."""
        if self.max_attempts is not None and self.attempts >= self.max_attempts:
            refused = ConnectionClosedError("no reconnect attempts allowed")
            return GiveUp(self._last_error or refused)
        entry = self.pool.next()
        if entry.last_attempt is None:
            return Dial(entry, float("-inf"))
        delay = backoff_delay(
            max(entry.failed_attempts, 1),
            initial=self._wait,
            maximum=self._wait_max,
            jitter=self._jitter,
            rng=self._rng,
            custom=self._custom,
        )
        return Dial(entry, entry.last_attempt + delay)

    def dialing(self, entry: PoolEntry, now: float) -> None:
        """A dial of ``entry`` starts now (its time paces the next one)."""
        entry.last_attempt = now

    def failed(self, entry: PoolEntry, error: BaseException) -> None:
        """The dial of ``entry`` failed with ``error`` (connect, TLS or handshake)."""
        self.attempts += 1
        entry.failed_attempts += 1
        entry.last_error = self._last_error = error

    def connected(self, entry: PoolEntry) -> None:
        """``entry`` completed the handshake: its failures and the attempt count start again."""
        self.attempts = 0
        entry.failed_attempts = 0
        entry.did_connect = True

    def lost(self, entry: PoolEntry) -> None:
        """The connection to ``entry`` ended: try the other servers before coming back."""
        self.pool.demote(entry)


__all__ = ["Dial", "GiveUp", "Redial", "fatal_on_first_connect"]
