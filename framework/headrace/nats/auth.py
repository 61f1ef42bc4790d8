"""Credentials and the CONNECT options they become.

Supported: user and password, token (both also from the URL), an nkey seed (the server's
nonce signed with it), and a creds file (a user JWT plus its seed, as ``nsc`` writes them). The
seed and creds files are read again on every connect, so rotated credentials are picked up on
reconnect without restarting.
"""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path
from typing import Any

import attrs
import nkeys

from headrace.errors import AuthorizationError, NatsError
from headrace.nats.servers import ServerAddress

_BLOCK_RE = re.compile(
    r"-{3,}[^\n]*BEGIN[^\n]*-{3,}[ \t]*\r?\n(.+?)\r?\n[ \t]*-{3,}[^\n]*END[^\n]*-{3,}",
    re.DOTALL,
)


@attrs.frozen(slots=True)
class Credentials:
    """What the user gave us to authenticate with; at most one of each kind is used.

    Precedence when several are set: creds file, then nkey seed, then token, then user and
    password (URL credentials override the latter two for that server).
    """

    user: str | None = None
    password: str | None = attrs.field(default=None, repr=False)
    token: str | None = attrs.field(default=None, repr=False)
    nkey_seed: str | None = attrs.field(default=None, repr=False)
    creds_file: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.password is not None and self.user is None:
            raise ValueError("a password needs a user")


def _read_seed(value: str) -> bytes:
    """An nkey seed given inline (``SU...``) or as the path of a file holding it."""
    text = value.strip()
    if not text.startswith("S") or os.path.sep in text or Path(text).is_file():
        try:
            text = Path(value).expanduser().read_text()
        except OSError as exc:
            raise NatsError(f"cannot read nkey seed file {value!r}: {exc}") from exc
        blocks = _BLOCK_RE.findall(text)
        text = blocks[-1].strip() if blocks else text.strip()
    return text.encode()


def read_creds_file(path: str | os.PathLike[str]) -> tuple[str, bytes]:
    """The (user JWT, seed) of a ``.creds`` file; a clear error if it is not one."""
    try:
        text = Path(path).expanduser().read_text()
    except OSError as exc:
        raise NatsError(f"cannot read creds file {str(path)!r}: {exc}") from exc
    blocks = [b.strip() for b in _BLOCK_RE.findall(text)]
    if len(blocks) < 2:
        raise NatsError(
            f"creds file {str(path)!r} must hold a user JWT block and an nkey seed block"
        )
    return blocks[0], blocks[1].encode()


def sign_nonce(seed: bytes, nonce: str) -> tuple[str, str]:
    """(public key, signature) for ``nonce``: ed25519, base64url without padding."""
    try:
        kp = nkeys.from_seed(seed)
    except Exception as exc:  # nkeys raises its own plain exception types
        raise NatsError(f"invalid nkey seed: {exc.__class__.__name__}") from exc
    try:
        sig = kp.sign(nonce.encode())
        public = kp.public_key.decode()
    finally:
        kp.wipe()
    return public, base64.urlsafe_b64encode(sig).rstrip(b"=").decode()


def auth_fields(creds: Credentials, address: ServerAddress, nonce: str | None) -> dict[str, Any]:
    """The authentication part of CONNECT for ``address`` given the server's ``nonce``."""
    fields: dict[str, Any] = {}
    if creds.creds_file is not None:
        jwt, seed = read_creds_file(creds.creds_file)
        if nonce is None:
            raise AuthorizationError(
                "the server sent no nonce, so it cannot check a creds file; is it in "
                "operator (JWT) mode?"
            )
        _, sig = sign_nonce(seed, nonce)
        fields["jwt"] = jwt
        fields["sig"] = sig
        return fields
    if creds.nkey_seed is not None:
        if nonce is None:
            raise AuthorizationError(
                "the server sent no nonce, so it cannot check an nkey; is nkey auth enabled?"
            )
        public, sig = sign_nonce(_read_seed(creds.nkey_seed), nonce)
        fields["nkey"] = public
        fields["sig"] = sig
        return fields
    token = address.token if address.token is not None else creds.token
    if token is not None and address.user is None:
        fields["auth_token"] = token
        return fields
    user = address.user if address.user is not None else creds.user
    password = address.password if address.user is not None else creds.password
    if user is not None:
        fields["user"] = user
        fields["pass"] = password or ""
    return fields
