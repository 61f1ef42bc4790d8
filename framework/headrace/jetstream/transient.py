"""Retrying a JetStream API request whose failure is transient.

In a cluster, a stream whose leader was just lost answers nothing until a new leader is elected
(seconds), and a request in flight when the connection moves to another server times out. An
application that has to get through such a moment (a sink reading its commit state, a stream's
identity) retries with a growing pause until a deadline, rather than fail the work in hand. What
is not transient (a stream that does not exist, a connection closed for good, a refusal) is
raised at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from headrace.errors import ConnectionClosedError, NatsError, ServerError
from headrace.jetstream.errors import (
    JetStreamAPIError,
    JetStreamNotEnabled,
    JetStreamUnavailable,
    NoStreamForSubject,
)

T = TypeVar("T")

#: Seconds a request is retried by default: longer than a replicated stream's leader election.
DEADLINE = 30.0


def is_transient(exc: BaseException) -> bool:
    """A failure worth retrying: no answer (a timeout, the connection lost meanwhile), nobody
    answering (JetStream or a stream leader missing), an API error of the 5xx kind (no
    leader). Not a closed connection, a permission refused, nor any answer that is the
    server's verdict (404 not found, 400, a refused compare-and-set, a missing key)."""
    if isinstance(exc, ConnectionClosedError | ServerError | JetStreamNotEnabled):
        return False
    if isinstance(exc, JetStreamAPIError):
        return exc.code >= 500
    return isinstance(
        exc, NatsError | JetStreamUnavailable | NoStreamForSubject | trio.TooSlowError
    )


async def retry_transient(request: Callable[[], Awaitable[T]], *, deadline: float = DEADLINE) -> T:
    """``await request()``, again after a transient failure (:func:`is_transient`), pausing
    50 ms doubling to 1 s, for up to ``deadline`` seconds; then the last failure is raised."""
    pause = 0.05
    give_up = trio.current_time() + deadline
    while True:
        try:
            return await request()
        except Exception as exc:
            if not is_transient(exc) or trio.current_time() > give_up:
                raise
        await trio.sleep(pause)
        pause = min(2 * pause, 1.0)
