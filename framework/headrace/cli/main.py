"""``headrace``: the command-line entry point.

The built-in subcommands (``run``, ``graph``, ``checkpoints``, ``outputs``, ``state``, ...)
each live in their own module and register their parser here. Other distributions add theirs
through the ``headrace.commands`` entry-point group (:mod:`headrace.cli.plugins`): the Spark
plugin's ``demo`` and the benchmarks' ``bench``.
"""

from __future__ import annotations

import argparse
import difflib
import signal
import sys
from typing import Any, NoReturn

from headrace._version import __version__


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are an ``exit_reason`` event with ``--json-logs``
    (:mod:`headrace.cli.jsonlogs`); the subcommands' parsers are of this class too. Options
    are never abbreviated: argparse's prefix matching ran ``--worker 2`` as ``--workers 2``
    (issue 23); a typo is an error that suggests the option meant."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        from headrace.cli import jsonlogs

        if jsonlogs.active() is None:
            super().error(message)
        jsonlogs.say(
            self.prog,
            f"{message} (usage: {' '.join(self.format_usage().split()).removeprefix('usage: ')})",
            exit_code=2,
        )
        sys.exit(2)


def _wants_json_logs(argv: list[str]) -> bool:
    """``headrace run`` with ``--json-logs`` before any ``--``: known before the arguments are
    parsed, so that a usage error is JSON too."""
    if argv[:1] != ["run"]:
        return False
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--json-logs":
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


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """The parser of the (sub)command ``args`` ran: ``headrace state show``'s for
    ``state show``; the top-level one if none."""
    found: argparse.ArgumentParser = parser
    while True:
        subs = [a for a in found._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs and subs[0].dest else None
        if not subs or chosen not in subs[0].choices:
            return found
        found = subs[0].choices[chosen]


def unrecognized(extra: list[str], parser: argparse.ArgumentParser) -> str:
    """argparse's ``unrecognized arguments`` message, with the option each ``--typo`` most
    likely meant (``--until-caughtup``: ``--until-caught-up``)."""
    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    said = []
    for arg in extra:
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, options, n=1, cutoff=0.7)
        said.append(f"{arg} (did you mean {close[0]}?)" if arg.startswith("--") and close else arg)
    return f"unrecognized arguments: {' '.join(said)}"


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
        # The command's own parser says it, with its usage and the option meant.
        own = _command_parser(parser, args)
        own.error(unrecognized(extra, own))
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
    _end(code)


def _end(code: int) -> NoReturn:
    """Exit with ``code``; without finalizing the interpreter when a sink call still runs
    (one abandoned by a run that ended during a sync sink's ``open()``, say): finalization
    would stop its thread where it stands, which aborts a C++ extension such as DuckDB (exit
    134, issue 23). Everything the run had to say is printed by now."""
    sink_threads = sys.modules.get("headrace.pipeline.sink_thread")
    if sink_threads is not None and sink_threads.calls_running():
        from headrace.cli.exits import exit_now

        exit_now(code)
    sys.exit(code)
