"""``headrace``: the command-line entry point.

The built-in subcommands (``run``, ``graph``, ``checkpoints``, ``outputs``, ``state``, ...)
each live in their own module and register their parser here. Other distributions add theirs
through the ``headrace.commands`` entry-point group (:mod:`headrace.cli.plugins`): the Spark
plugin's ``demo`` and the benchmarks' ``bench``.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import NoReturn

from headrace._version import __version__


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are an ``exit_reason`` event with ``--json-logs``
    (:mod:`headrace.cli.jsonlogs`); the subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        from headrace.cli import jsonlogs

        if jsonlogs.active() is None:
            super().error(message)
        jsonlogs.say(
            self.prog, f"{message} (usage: {' '.join(self.format_usage().split())})", exit_code=2
        )
        sys.exit(2)


def _wants_json_logs(argv: list[str]) -> bool:
    """``headrace run`` with ``--json-logs`` (or an abbreviation argparse accepts, down to
    ``--json``) before any ``--``: known before the arguments are parsed, so that a usage error
    is JSON too."""
    if argv[:1] != ["run"]:
        return False
    for arg in argv:
        if arg == "--":
            return False
        if len(arg) >= len("--json") and "--json-logs".startswith(arg):
            return True
    return False


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``headrace`` parser for ``argv``: with every plugin command when ``argv`` is None,
    else only those it may need (:func:`headrace.cli.plugins.add_commands`)."""
    parser = _Parser(
        prog="headrace",
        description=(
            "Stream pipelines from structured-concurrency actors on trio: "
            "NATS JetStream in, sink plugins out."
        ),
    )
    parser.add_argument("--version", action="version", version=f"headrace {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    from headrace.cli import (
        checkpoints,
        consumer,
        graph,
        outputs,
        plugins,
        pub,
        run,
        server,
        sinks,
        state,
        stream,
    )

    checkpoints.add_parser(commands)
    run.add_parser(commands)
    graph.add_parser(commands)
    outputs.add_parser(commands)
    state.add_parser(commands)
    server.add_parser(commands)
    stream.add_parser(commands)
    pub.add_parser(commands)
    consumer.add_parser(commands)
    sinks.add_parser(commands)
    plugins.add_commands(commands, builtin=list(commands.choices), argv=argv)
    return parser


def _default_sigint() -> None:
    """Take SIGINT back if it came ignored: a shell starts a script's background job with
    SIGINT ignored, Python keeps that, and a SIGINT before ``run`` installs its own handling
    (while the pipeline is imported, the connection made) was lost (issue 23). The workers of
    ``--workers`` are in a process group of their own, so a terminal's Ctrl-C still reaches
    the supervisor only."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> None:
    _default_sigint()
    args_given = sys.argv[1:] if argv is None else argv
    if _wants_json_logs(args_given):
        # Before anything else runs: from here on standard error carries JSON lines only,
        # whatever writes there (tracebacks, warnings, logging, usage errors).
        from headrace.cli.jsonlogs import JsonLogs

        JsonLogs(sys.stderr).install()
    parser = build_parser(args_given)
    args, extra = parser.parse_known_args(args_given)
    adopt = getattr(args, "adopt_extra", None)
    if extra and (adopt is None or not adopt(args, extra)):
        parser.parse_args(args_given)  # argparse's own error for what nothing took, exit 2
    if args.command is None:
        parser.print_help()
        sys.exit(0)
    try:
        code = args.func(args)
    except KeyboardInterrupt:
        # Interrupted before `run` installed its signal handling (while importing TARGET).
        from headrace.cli import jsonlogs

        jsonlogs.say("headrace", "interrupted", exit_code=128 + 2)
        code = 128 + 2
    sys.exit(code)
