"""The exception hierarchy shared by every layer.

Every error headrace raises derives from :class:`HeadraceError`, so an application can catch the
whole family in one place, and each says what went wrong in words that suggest what to do. The
layers add their own subclasses next to the code that raises them; the ones here are the wire
protocol's and the connection's, which everything above builds on.
"""

from __future__ import annotations

from collections.abc import Sequence


class HeadraceError(Exception):
    """Base class of every error raised by headrace."""


# -- protocol ---------------------------------------------------------------------------------


class ProtocolError(HeadraceError):
    """Bytes that do not follow the NATS client protocol, in either direction.

    Raised by the parser for malformed frames from the server (the connection is then unusable
    and is re-established) and by the encoders for a command we refuse to send. When the parser
    raises, ``events`` holds the complete events that preceded the bad frame in the same feed.
    """

    events: Sequence[object] = ()


class ControlLineTooLong(ProtocolError):
    """A protocol line exceeded ``max_control_line`` before its CRLF."""


class MaxPayloadExceeded(ProtocolError):
    """A message is larger than the server's ``max_payload``.

    Raised before anything is sent: the server would answer with ``-ERR 'Maximum Payload
    Violation'`` and close the connection, which would hurt every other user of it.
    """


class InvalidSubjectError(ProtocolError, ValueError):
    """A subject, queue group or reply subject that the protocol cannot carry."""


class InvalidHeaderError(ProtocolError, ValueError):
    """A header name or value that cannot be encoded, or a header block that the strict
    ``parse_header_block`` cannot parse (received blocks are read leniently: see
    :class:`MalformedHeaderWarning`)."""


class HeadraceWarning(UserWarning):
    """Base class of the warnings headrace issues (``warnings.warn``)."""


class MalformedHeaderWarning(HeadraceWarning):
    """A received message's header block had lines that could not be read.

    A message's headers come from whoever published it, and the server relays (and a stream
    stores) them unchecked. The unreadable lines are left out and the rest is kept, so one bad
    message cannot make a subscription, a consume or a KV bucket unusable; this warning says
    which message and which lines, once per message.
    """


# -- connection -------------------------------------------------------------------------------


class NatsError(HeadraceError):
    """An error of the NATS connection layer."""


class ConnectionClosedError(NatsError):
    """The connection is closed (by the user, or after reconnect attempts ran out).

    ``__cause__`` holds the last error seen when the close was not requested.
    """


class NoServersError(NatsError):
    """No server in the pool could be connected to.

    ``errors`` maps each server URL tried to the error it gave.
    """

    def __init__(self, message: str, errors: dict[str, BaseException] | None = None) -> None:
        super().__init__(message)
        self.errors: dict[str, BaseException] = dict(errors or {})


class ServerError(NatsError):
    """The server sent ``-ERR``. ``message`` is the server's text, unquoted."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class AuthorizationError(ServerError):
    """The server refused our credentials (``Authorization Violation`` and its relatives)."""


class PermissionViolation(ServerError):
    """A publish or subscribe on a subject the user has no permission for.

    ``operation`` is ``"publish"``, ``"subscription"`` or ``"reply"`` (publishing with a reply
    subject the user may not use), ``subject`` the subject named by the server and ``queue`` the
    queue group when the server mentioned one.
    """

    def __init__(
        self, message: str, operation: str, subject: str, queue: str | None = None
    ) -> None:
        super().__init__(message)
        self.operation = operation
        self.subject = subject
        self.queue = queue


class ConnectionLostError(NatsError):
    """The connection was lost while an operation depended on it (a flush, for instance).

    The client reconnects on its own; what was in flight may not have reached the server.
    """


class StaleConnectionError(NatsError):
    """The server stopped answering PINGs (``max_pings_out`` outstanding), or said so."""


class TLSError(NatsError):
    """TLS could not be set up: a handshake or verification failure, or a TLS mismatch."""


class OutboundBufferFull(NatsError):
    """Publishing while disconnected filled the reconnect buffer.

    Nothing was queued for this call; publish again after the ``Reconnected`` event.
    """


class NoRespondersError(NatsError):
    """A request reached no subscriber (the server's 503 status)."""

    def __init__(self, subject: str) -> None:
        super().__init__(f"no responders are listening on {subject!r}")
        self.subject = subject


class NatsTimeoutError(NatsError, TimeoutError):
    """An operation did not complete within its time limit."""


class ConnectTimeout(NatsTimeoutError):
    """The server did not complete the handshake within ``connect_timeout``."""


class FlushTimeout(NatsTimeoutError):
    """The server did not answer a flush's PING in time."""


class RequestTimeout(NatsTimeoutError):
    """A request got no reply within its timeout."""


class DrainTimeout(NatsTimeoutError):
    """Draining did not finish in time; ``unread`` messages were buffered and not read."""

    def __init__(self, message: str, unread: int = 0) -> None:
        super().__init__(message)
        self.unread = unread


class SubscriptionClosedError(NatsError):
    """The subscription was unsubscribed or drained; it delivers nothing more."""
