"""Connection options, with ADR-40's defaults unless noted, validated on construction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from headrace._validators import non_negative, positive
from headrace.nats.auth import Credentials
from headrace.nats.delivery import SlowConsumerPolicy
from headrace.nats.servers import ServerAddress, redact_url
from headrace.nats.tls import TLSConfig
from headrace.protocol.commands import check_subject

DEFAULT_URL = "nats://127.0.0.1:4222"


def _servers(value: str | Sequence[str]) -> tuple[str, ...]:
    urls = (value,) if isinstance(value, str) else tuple(value)
    if not urls:
        raise ValueError("give at least one server URL")
    for url in urls:
        ServerAddress.parse(url)  # fail early, with the URL in the message
    return urls


def _redacted(urls: tuple[str, ...]) -> str:
    """The repr of the server URLs, with their passwords and tokens redacted."""
    return repr(tuple(redact_url(url) for url in urls))


def _inbox_prefix(_inst: object, _attribute: attrs.Attribute[Any], value: str) -> None:
    check_subject(value, what="inbox prefix")


@attrs.frozen(slots=True, kw_only=True)
class ConnectOptions:
    """Everything :func:`headrace.nats.connect` accepts.

    Times are in seconds. Where ADR-40 gives a default it is used; the others follow what
    the NATS reference clients do and are noted.
    """

    servers: tuple[str, ...] = attrs.field(
        default=(DEFAULT_URL,), converter=_servers, repr=_redacted
    )
    #: Client name shown by the server's monitoring.
    name: str | None = None
    credentials: Credentials = attrs.field(factory=Credentials)
    #: TLS settings; ``None`` means TLS only if a URL says ``tls://`` or the server requires it
    #: (then with the system trust store).
    tls: TLSConfig | None = None
    connect_timeout: float = attrs.field(default=5.0, validator=positive)
    ping_interval: float = attrs.field(default=120.0, validator=positive)
    max_pings_out: int = attrs.field(default=2, validator=positive)
    allow_reconnect: bool = True
    #: Consecutive failed reconnect attempts before giving up; ``None`` tries forever.
    #: (60, as the Go and Python clients; ADR-40 leaves it to the client.)
    max_reconnect_attempts: int | None = 60
    #: Least time between two dials of one server; doubles per consecutive failure on that
    #: server, up to ``reconnect_wait_max``.
    reconnect_wait: float = attrs.field(default=0.25, validator=non_negative)
    reconnect_wait_max: float = attrs.field(default=5.0, validator=non_negative)
    #: Fraction by which each wait is randomly lengthened or shortened.
    reconnect_jitter: float = attrs.field(default=0.25, validator=non_negative)
    #: Custom backoff: seconds between dials of a server after ``n`` consecutive failures on it
    #: (``n`` >= 1); replaces the formula.
    reconnect_delay: Callable[[int], float] | None = None
    retry_on_failed_connect: bool = False
    #: Keep the given order of servers instead of shuffling them.
    dont_randomize: bool = False
    ignore_discovered_servers: bool = False
    #: Bytes of publishes kept while disconnected; 0 refuses publishing while disconnected.
    reconnect_buffer_size: int = attrs.field(default=8 * 1024 * 1024, validator=non_negative)
    #: Bytes queued for the socket above which ``publish`` waits for the writer.
    write_buffer_size: int = attrs.field(default=1024 * 1024, validator=positive)
    #: Default pending limits and policy of a subscription (Go client defaults).
    pending_msgs_limit: int = attrs.field(default=512 * 1024, validator=positive)
    pending_bytes_limit: int = attrs.field(default=64 * 1024 * 1024, validator=positive)
    slow_consumer_policy: SlowConsumerPolicy = SlowConsumerPolicy.DROP
    inbox_prefix: str = attrs.field(default="_INBOX", validator=_inbox_prefix)
    no_echo: bool = False
    pedantic: bool = False
    #: Default time limit of ``request`` and ``flush``.
    request_timeout: float = attrs.field(default=5.0, validator=positive)
    #: How long ``drain`` waits for subscribers to read what is buffered.
    drain_timeout: float = attrs.field(default=30.0, validator=positive)
    max_control_line: int = attrs.field(default=4096, validator=positive)
    #: Bytes asked of the socket per read.
    read_size: int = attrs.field(default=256 * 1024, validator=positive)

    def __attrs_post_init__(self) -> None:
        if self.max_reconnect_attempts is not None and self.max_reconnect_attempts < 0:
            raise ValueError("max_reconnect_attempts must be >= 0, or None for no limit")
        if self.reconnect_wait_max < self.reconnect_wait:
            raise ValueError("reconnect_wait_max must be at least reconnect_wait")

    @property
    def wants_tls(self) -> bool:
        """Whether the client requires TLS whatever the server says."""
        return self.tls is not None or any(ServerAddress.parse(u).tls for u in self.servers)
