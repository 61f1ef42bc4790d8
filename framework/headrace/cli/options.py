"""The connection options every command that talks to NATS shares, and what they become."""

from __future__ import annotations

import argparse
import os
from typing import Any

from headrace.nats.options import DEFAULT_URL
from headrace.nats.tls import TLSConfig

#: Where ``--password`` and ``--token`` are read from when not given: they keep secrets off
#: command lines (``ps`` shows those to every user of the host); ``--workers`` passes them on
#: to its workers so.
PASSWORD_ENV = "NATS_PASSWORD"
TOKEN_ENV = "NATS_TOKEN"


def default_servers() -> list[str]:
    """``$NATS_URL`` (comma-separated URLs allowed), else ``nats://127.0.0.1:4222``."""
    env = os.environ.get("NATS_URL", "")
    urls = [u.strip() for u in env.split(",") if u.strip()]
    return urls or [DEFAULT_URL]


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("NATS connection")
    group.add_argument(
        "--nats",
        metavar="URL",
        action="append",
        dest="servers",
        help=(
            "a NATS server URL, or several separated by commas; may be repeated (default: "
            f"$NATS_URL, comma-separated, else {DEFAULT_URL})"
        ),
    )
    group.add_argument("--creds", metavar="FILE", help="a .creds file (user JWT and nkey seed)")
    group.add_argument("--nkey", metavar="SEED_OR_FILE", help="an nkey seed, or a file holding one")
    group.add_argument("--user", help="user name (with --password)")
    group.add_argument("--password", help=f"password (with --user; default: ${PASSWORD_ENV})")
    group.add_argument("--token", help=f"an authentication token (default: ${TOKEN_ENV})")
    group.add_argument("--tls-ca", metavar="FILE", help="CA certificates to verify the server with")
    group.add_argument("--tls-cert", metavar="FILE", help="client certificate (PEM)")
    group.add_argument("--tls-key", metavar="FILE", help="client certificate's key (PEM)")
    group.add_argument(
        "--tls-first",
        action="store_true",
        help="TLS handshake before the server's INFO (servers with handshake_first)",
    )
    group.add_argument(
        "--connect-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="time limit of each connection attempt (default 5)",
    )


def connect_kwargs(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """Keyword arguments for :func:`headrace.nats.connect`; ``ValueError`` for bad options."""
    password = args.password if args.password is not None else os.environ.get(PASSWORD_ENV)
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    if args.password is not None and args.user is None:
        raise ValueError("--password needs --user")
    if password is not None and args.user is None:
        password = None  # (from the environment, meant for another tool: not ours to refuse)
    tls: TLSConfig | None = None
    if args.tls_ca or args.tls_cert or args.tls_key or args.tls_first:
        if args.tls_key and not args.tls_cert:
            raise ValueError("--tls-key needs --tls-cert")
        if args.tls_cert and not args.tls_key:
            raise ValueError("--tls-cert needs --tls-key")
        tls = TLSConfig(
            ca_file=args.tls_ca,
            cert_file=args.tls_cert,
            key_file=args.tls_key,
            handshake_first=args.tls_first,
        )
    for option, path in (("--creds", args.creds),):
        if path is not None and not os.path.isfile(os.path.expanduser(path)):
            raise ValueError(f"{option} {path!r}: no such file")
    return {
        "servers": _split(args.servers) or default_servers(),
        "user": args.user,
        "password": password,
        "token": token or None,
        "nkey_seed": args.nkey,
        "creds_file": args.creds,
        "tls": tls,
        "name": name,
        "connect_timeout": args.connect_timeout,
    }


def _split(values: list[str] | None) -> list[str]:
    """``--nats a,b --nats c`` is three servers: a cluster's URLs are often written as one
    comma-separated list, as in $NATS_URL and the nats CLI."""
    return [u.strip() for value in values or () for u in value.split(",") if u.strip()]
