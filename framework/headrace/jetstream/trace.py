"""A trace of a JetStream context's API requests, for logging and OpenTelemetry.

nats.go's ``WithClientTrace`` calls a hook as each API request is sent and as its answer
arrives; a user porting code, or tracing every call a pipeline makes to JetStream, wants the
same here. :class:`ClientTrace` holds the two hooks; :class:`~headrace.jetstream.JetStream`
(``trace=``) calls them around every request of :meth:`JetStreamAPI.api_request`: stream and
consumer management, stored-message reads through the leader, KV bucket management. Not the
message traffic itself (publishes, pulls, acks, Direct Gets), whose volume would swamp a
trace, as in nats.go.

The hooks run in the calling task, synchronously: they must not block. An exception raised
by one is raised from the request (a broken hook is a bug to see, not to hide).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from headrace.protocol.events import Msg

#: ``request_sent(subject, payload)``.
RequestSent = Callable[[str, bytes], None]
#: ``response_received(subject, msg)``: the request's subject and the answer as it came.
ResponseReceived = Callable[[str, Msg], None]


@attrs.frozen(slots=True)
class ClientTrace:
    """The hooks of a JetStream API trace (see the module docs); either may be left out."""

    request_sent: RequestSent | None = None
    response_received: ResponseReceived | None = None
