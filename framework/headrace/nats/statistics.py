"""The connection's counters: what :attr:`Connection.stats <headrace.nats.Connection.stats>`
holds, shared by the driver's tasks and the dial (which counts the handshake's bytes)."""

from __future__ import annotations

import attrs


@attrs.define(slots=True)
class Statistics:
    """Counters over the connection's whole life, across reconnects (ADR-40).

    ``in_bytes`` and ``out_bytes`` count message bytes (header block plus payload), as the
    server's ``/connz`` and the other NATS clients do, so the figures compare. What crossed the
    socket (protocol lines, PINGs, the handshake) is ``in_wire_bytes`` / ``out_wire_bytes``.
    """

    in_msgs: int = 0
    out_msgs: int = 0
    #: Header and payload bytes of the messages received.
    in_bytes: int = 0
    #: Header and payload bytes of the messages published (queued to be sent).
    out_bytes: int = 0
    connects: int = 0
    reconnects: int = 0
    #: Socket writes (``send_all`` calls): far fewer than ``out_msgs`` when writes coalesce.
    writes: int = 0
    #: Bytes read from the socket, everything included.
    in_wire_bytes: int = 0
    #: Bytes written to the socket, everything included.
    out_wire_bytes: int = 0


__all__ = ["Statistics"]
