"""Server addresses, the server pool, and the reconnect backoff (ADR-40).

Pure logic, no I/O: which server to try next and how long to wait first. The connection
supervisor asks the pool for the next server, reports the outcome, and sleeps what
:func:`backoff_delay` says.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from urllib.parse import unquote, urlsplit

import attrs

DEFAULT_PORT = 4222
_SCHEMES = {"nats": False, "tls": True}
#: What stands in for a password or token in a URL that is shown.
REDACTED = "***"


def redact_url(url: str) -> str:
    """``url`` as written, but with its password or token replaced by ``***``: the one way a
    server URL given by the user is shown (error messages, reprs, logs).

    ``nats://user:secret@host`` becomes ``nats://user:***@host`` (the user name helps find which
    account was refused); ``nats://token@host`` becomes ``nats://***@host``. Works on any text,
    a URL that does not parse included (its error message must not leak either): everything up
    to the last ``@`` after the scheme is credentials. Text without ``@`` is returned as is.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, hostpart = rest.rpartition("@")
    if not at:
        return url
    user, colon, _secret = userinfo.partition(":")
    masked = f"{user}:{REDACTED}" if colon else REDACTED
    return f"{scheme}{sep}{masked}@{hostpart}"


@attrs.frozen(slots=True)
class ServerAddress:
    """One server URL, split into what the connection needs.

    ``nats://[user:password@|token@]host[:port]`` or ``tls://...``; a bare ``host[:port]`` means
    ``nats://``. Credentials in the URL override the connection's own.
    """

    host: str
    port: int = DEFAULT_PORT
    tls: bool = False
    user: str | None = None
    # Never shown: a repr lands in logs and tracebacks.
    password: str | None = attrs.field(default=None, repr=False)
    token: str | None = attrs.field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str) -> ServerAddress:
        """Parse a server URL; a clear ``ValueError`` for anything we cannot connect to (the URL
        it shows has its credentials redacted)."""
        if not isinstance(url, str) or not url.strip():
            raise ValueError(f"server URL must be a non-empty string, not {url!r}")
        shown = redact_url(url.strip())
        text = url.strip()
        if "://" not in text:
            text = "nats://" + text
        parts = urlsplit(text)
        scheme = parts.scheme.lower()
        if scheme in ("ws", "wss"):
            raise ValueError(f"{shown!r}: websocket connections are not supported; use nats://")
        if scheme not in _SCHEMES:
            raise ValueError(f"{shown!r}: unknown scheme {scheme!r}; use nats:// or tls://")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"{shown!r}: a server URL has no path, query or fragment")
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"{shown!r}: invalid port") from exc
        host = parts.hostname
        if not host:
            raise ValueError(f"{shown!r}: no host")
        user = unquote(parts.username) if parts.username is not None else None
        password = unquote(parts.password) if parts.password is not None else None
        token = None
        if user is not None and password is None:
            token, user = user, None
        return cls(
            host=host,
            port=port if port is not None else DEFAULT_PORT,
            tls=_SCHEMES[scheme],
            user=user,
            password=password,
            token=token,
        )

    @property
    def hostport(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        """The URL without credentials, safe to log."""
        return f"{'tls' if self.tls else 'nats'}://{self.hostport}"


@attrs.define(slots=True, eq=False)
class PoolEntry:
    """A server in the pool and what we know about our attempts on it."""

    address: ServerAddress
    discovered: bool = False
    #: Consecutive failed attempts (reset by a successful handshake).
    failed_attempts: int = 0
    did_connect: bool = False
    last_error: BaseException | None = None
    #: ``trio.current_time()`` of the last dial, which paces the next one.
    last_attempt: float | None = None
    #: The name to check the TLS certificate against, when not the address's host.
    tls_name: str | None = None


class ServerPool:
    """The servers we may connect to: the configured ones plus those learned from INFO.

    Order is randomized unless ``randomize`` is false (ADR-40 "retain servers order").
    :meth:`next` rotates through the pool; the supervisor decides when to wait.
    """

    def __init__(
        self,
        urls: Iterable[str],
        *,
        randomize: bool = True,
        use_discovered: bool = True,
        rng: random.Random | None = None,
    ) -> None:
        self._rng = rng or random.Random()
        self.randomize = randomize
        self.use_discovered = use_discovered
        self._entries: list[PoolEntry] = []
        self.replace(urls)

    def replace(self, urls: Iterable[str]) -> None:
        """Use exactly ``urls`` from now on (ADR-40 custom server pool); discovered ones go."""
        entries: list[PoolEntry] = []
        seen: set[str] = set()
        for url in urls:
            address = ServerAddress.parse(url)
            if address.hostport not in seen:
                seen.add(address.hostport)
                entries.append(PoolEntry(address))
        if not entries:
            raise ValueError("the server pool needs at least one server URL")
        if self.randomize:
            self._rng.shuffle(entries)
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterable[PoolEntry]:
        return iter(list(self._entries))

    @property
    def entries(self) -> list[PoolEntry]:
        return list(self._entries)

    def next(self) -> PoolEntry:
        """The server to try next; it moves to the back of the rotation."""
        entry = self._entries.pop(0)
        self._entries.append(entry)
        return entry

    def demote(self, entry: PoolEntry) -> None:
        """Move ``entry`` to the back, so that the others are tried first (a server just lost)."""
        if entry in self._entries:
            self._entries.remove(entry)
            self._entries.append(entry)

    def add_discovered(self, hostports: Iterable[str], *, source: PoolEntry) -> list[ServerAddress]:
        """Add servers from INFO ``connect_urls`` sent by ``source``; return the new ones.

        They inherit the source's scheme and URL credentials, and check TLS certificates
        against the source's host name (a discovered address is often a bare IP).
        """
        if not self.use_discovered:
            return []
        template = source.address
        tls_name = source.tls_name or template.host
        known = {e.address.hostport for e in self._entries}
        added: list[ServerAddress] = []
        fresh: list[PoolEntry] = []
        for hostport in hostports:
            try:
                address = ServerAddress.parse(("tls://" if template.tls else "nats://") + hostport)
            except ValueError:
                continue
            if address.hostport in known:
                continue
            address = attrs.evolve(
                address, user=template.user, password=template.password, token=template.token
            )
            known.add(address.hostport)
            added.append(address)
            fresh.append(PoolEntry(address, discovered=True, tls_name=tls_name))
        if self.randomize:
            self._rng.shuffle(fresh)
        self._entries.extend(fresh)
        return added


def backoff_delay(
    attempt: int,
    *,
    initial: float,
    maximum: float,
    jitter: float,
    rng: random.Random | None = None,
    custom: Callable[[int], float] | None = None,
) -> float:
    """Seconds between two dials of a server after ``attempt`` consecutive failures (>= 1).

    Exponential: ``initial * 2**(attempt-1)`` capped at ``maximum``, then spread by
    ``±jitter`` (a fraction) so that many clients do not return in step (ADR-40). A ``custom``
    function of the attempt number replaces the formula.
    """
    if custom is not None:
        return max(0.0, float(custom(attempt)))
    base = min(maximum, initial * 2.0 ** min(attempt - 1, 62))
    spread: float = (rng or random).uniform(-jitter, jitter) if jitter else 0.0
    return max(0.0, base * (1.0 + spread))
