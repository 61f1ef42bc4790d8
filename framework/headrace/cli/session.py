"""One connection for one request: what the stream and publish tools share.

``headrace stream``, ``consumer`` and ``pub`` each connect, do a few JetStream calls and exit.
They take the connection options of ``headrace run`` (:mod:`headrace.cli.options`) and end
the same way, so that a script can rely on it:

- 0: done;
- 1: an operational failure, said in one line on standard error, never a traceback: no
  server to connect to (the URLs shown without their credentials), credentials refused, a
  stream or consumer that does not exist (named), an API error of the server;
- 2: a usage error (argparse's, or options that contradict each other).

A command's body is a coroutine function of the :class:`~headrace.jetstream.JetStream` context;
it raises headrace's typed errors, or :class:`ToolError` for a failure it words itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from headrace.cli.options import connect_kwargs
from headrace.errors import HeadraceError, NatsError
from headrace.jetstream import JetStream
from headrace.nats import connect
from headrace.nats.servers import redact_url

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

Body = Callable[[JetStream], Awaitable[int]]


class ToolError(HeadraceError):
    """A failure a command words itself (``stream 'ORDERS' not found``): exit status 1."""


class UsageError(HeadraceError, ValueError):
    """Options that cannot go together, found after argparse: exit status 2."""


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (counts, limits, replicas)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1")
    return value


def say(prog: str, message: str) -> None:
    """``prog: message`` on standard error, as one line."""
    print(f"{prog}: {' '.join(message.split())}", file=sys.stderr, flush=True)


def one_line(error: BaseException) -> str:
    """An error in words: the message of headrace's own errors (they say what to do), the type
    as well for anything else."""
    text = " ".join(str(error).split())
    if isinstance(error, HeadraceError) and text:
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def print_json(obj: Any) -> None:
    """One JSON document on one line of standard output (``--json``)."""
    print(json.dumps(obj, sort_keys=True, default=str), flush=True)


def run_with_jetstream(args: argparse.Namespace, prog: str, body: Body) -> int:
    """Connect as ``args`` say, run ``body`` with the JetStream context, and turn what it
    raises into a line on standard error and the exit status (see the module docs)."""
    try:
        kwargs = connect_kwargs(args, prog)
    except ValueError as exc:
        say(prog, str(exc))
        return EXIT_USAGE
    connected = False

    async def main() -> int:
        nonlocal connected
        async with connect(**kwargs) as nc:
            connected = True
            return await body(JetStream(nc))

    try:
        return trio.run(main)
    except BaseException as exc:  # every error becomes one line and an exit status
        error = _leaf(exc)
        if not isinstance(error, Exception):
            raise
        if isinstance(error, UsageError):
            say(prog, str(error))
            return EXIT_USAGE
        if not connected and isinstance(error, NatsError | OSError | ValueError):
            servers = ", ".join(redact_url(url) for url in kwargs["servers"])
            say(prog, f"cannot connect to NATS ({servers}): {one_line(error)}")
            return EXIT_FAILED
        if isinstance(error, HeadraceError | OSError | ValueError):
            say(prog, one_line(error))
            return EXIT_FAILED
        raise


def bytes_words(n: float) -> str:
    """``512 B``, ``12.0 KiB``, ``3.4 MiB``: a size as the tools print it."""
    if n < 1024:
        return f"{int(n)} B"
    size = n / 1024
    for unit in ("KiB", "MiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
