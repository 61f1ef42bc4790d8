"""TLS settings and the ``ssl.SSLContext`` built from them.

Both flows of ADR-40 run over :class:`trio.SSLStream`: explicit TLS (INFO in clear text, then
the upgrade) and TLS-first (the handshake before INFO, for servers with ``handshake_first``).
"""

from __future__ import annotations

import ssl
from pathlib import Path

import attrs

from headrace.errors import TLSError


def _opt_path(value: str | Path | None) -> str | None:
    return None if value is None else str(Path(value).expanduser())


@attrs.frozen(slots=True, kw_only=True)
class TLSConfig:
    """How to secure the connection.

    ``ca_file`` replaces the system trust store; ``cert_file``/``key_file`` are the client
    certificate for servers that verify clients; ``context`` is used as is when given, and the
    file options are then refused to avoid two sources of truth. ``hostname`` overrides the
    name checked against the server certificate (default: the host of the URL). ``handshake_first``
    selects the TLS-first flow.
    """

    ca_file: str | None = attrs.field(default=None, converter=_opt_path)
    cert_file: str | None = attrs.field(default=None, converter=_opt_path)
    key_file: str | None = attrs.field(default=None, converter=_opt_path)
    context: ssl.SSLContext | None = None
    hostname: str | None = None
    handshake_first: bool = False

    def __attrs_post_init__(self) -> None:
        if self.context is not None and (self.ca_file or self.cert_file or self.key_file):
            raise ValueError("give either an SSLContext or ca/cert/key files, not both")
        if self.key_file and not self.cert_file:
            raise ValueError("key_file needs cert_file")
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"TLS {name} {path!r} does not exist")

    def make_context(self) -> ssl.SSLContext:
        """The context to wrap the socket with; verification is always on."""
        if self.context is not None:
            return self.context
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
            if self.cert_file:
                ctx.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as exc:
            raise TLSError(f"cannot load TLS files: {exc}") from exc
        return ctx
