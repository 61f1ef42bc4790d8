"""trio I/O over :mod:`headrace.protocol`: the connection supervisor, subscriptions, auth, TLS.

What ``__all__`` lists is the public API; the modules under this package are internal and may
change (docs/architecture.md, "Public and internal").
"""

from headrace._trio import EventWatcher
from headrace.nats.auth import Credentials
from headrace.nats.connection import Connection, connect
from headrace.nats.delivery import SlowConsumerPolicy
from headrace.nats.events import (
    Closed,
    Connected,
    ConnectionEvent,
    Disconnected,
    LameDuck,
    Reconnected,
    ServerErrorEvent,
    ServersDiscovered,
    SlowConsumer,
    Status,
)
from headrace.nats.options import ConnectOptions
from headrace.nats.servers import ServerAddress, redact_url
from headrace.nats.statistics import Statistics
from headrace.nats.subscription import Subscription
from headrace.nats.tls import TLSConfig

__all__ = [
    "Closed",
    "ConnectOptions",
    "Connected",
    "Connection",
    "ConnectionEvent",
    "Credentials",
    "Disconnected",
    "EventWatcher",
    "LameDuck",
    "Reconnected",
    "ServerAddress",
    "ServerErrorEvent",
    "ServersDiscovered",
    "SlowConsumer",
    "SlowConsumerPolicy",
    "Statistics",
    "Status",
    "Subscription",
    "TLSConfig",
    "connect",
    "redact_url",
]
