"""What the server's ``-ERR`` texts mean, as typed exceptions (ADR-40 "Error Handling").

The texts are not typed on the wire, so they are matched case-insensitively on the phrases the
server uses. Terminal errors are followed by the server closing the connection; the client
ends the session at once with the typed error, so the reconnect logic and the ``Disconnected``
event carry the real reason rather than a bare end-of-file.
"""

from __future__ import annotations

import re

from headrace.errors import (
    AuthorizationError,
    PermissionViolation,
    ServerError,
    StaleConnectionError,
)

# "... for Publish to "x"", "... for Subscription to "x" using queue "q"", and
# "... for Publish with Reply of "r"" (the operation is then "reply", the subject the reply).
_PERMISSION_RE = re.compile(
    r"permissions violation for (publish|subscription)(?: to| with reply of)? \"?([^\"\s]+)\"?"
    r"(?:\s+using queue \"?([^\"\s]+)\"?)?",
    re.IGNORECASE,
)

_AUTH_PHRASES = (
    "authorization violation",
    "authentication expired",
    "authentication revoked",
    "authentication timeout",
    "user authentication",
    "account authentication",
)

_TERMINAL_PHRASES = (
    "secure connection - tls required",
    "maximum connections exceeded",
    "maximum account active connections exceeded",
    "connection throttling is active",
    "maximum payload violation",
    "invalid client protocol",
    "no responders requires headers support",
    "unknown protocol operation",
    "failed account registration",
    "slow consumer",
)


def classify(message: str) -> ServerError | StaleConnectionError:
    """The typed exception for the server text ``message``."""
    lower = message.lower()
    if "stale connection" in lower:
        return StaleConnectionError(f"the server reported a stale connection: {message}")
    match = _PERMISSION_RE.search(message)
    if match:
        operation = match.group(1).lower()
        if "with reply of" in lower:
            operation = "reply"
        return PermissionViolation(message, operation, match.group(2), match.group(3))
    if any(p in lower for p in _AUTH_PHRASES):
        return AuthorizationError(message)
    return ServerError(message)


def is_terminal(error: BaseException) -> bool:
    """Whether the server closes the connection after sending this error."""
    if isinstance(error, AuthorizationError | StaleConnectionError):
        return True
    if isinstance(error, PermissionViolation):
        return False
    if isinstance(error, ServerError):
        lower = error.message.lower()
        return any(p in lower for p in _TERMINAL_PHRASES)
    return False
