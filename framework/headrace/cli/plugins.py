"""Commands from other distributions: the ``headrace.commands`` entry-point group.

A plugin adds a ``headrace`` subcommand the way it adds a sink (``headrace.sinks``): it declares
an entry point whose name is the command and whose value is a callable that takes argparse's
subparsers action and adds one parser, with ``set_defaults(func=...)`` (a function of the parsed
arguments returning the exit status). The Spark plugin's ``demo`` and the benchmarks' ``bench``
come this way; the framework never imports either by name.

Entry points are loaded only when they can matter. ``headrace run`` (and every worker process it
starts) loads none; ``headrace demo`` loads only the entry points named ``demo``; help, no
command or an unknown one loads them all. So a plugin's import cost (the Spark plugin imports
pyarrow: about 0.2 s and tens of MB) and a plugin that fails to load never reach the commands
that do not use it. A plugin that fails to load is named on standard error and left out.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Sequence
from importlib.metadata import entry_points
from typing import Any

GROUP = "headrace.commands"

# The commands of headrace's own repository that come from distributions of their own, and
# what to install when one is missing: the command then says so (exit status 2), as it did
# while it was built in, instead of argparse's "invalid choice".
KNOWN = {
    "demo": "the Spark plugin: pip install 'headrace[spark]'",
    "bench": (
        "the benchmarks, which are not part of the headrace package: from a checkout of "
        "headrace's repository, pip install -e bench (make does)"
    ),
}


def add_commands(commands: Any, builtin: Collection[str], argv: Sequence[str] | None) -> None:
    """Add the plugin commands that ``argv`` may need to ``commands`` (all when ``argv`` is
    None), then a stand-in for each command of :data:`KNOWN` that nothing provided."""
    wanted = _wanted(argv, builtin)
    if wanted == "":
        return
    seen: set[tuple[str, str]] = set()
    for point in sorted(entry_points(group=GROUP), key=lambda point: point.name):
        if (wanted is not None and point.name != wanted) or (point.name, point.value) in seen:
            continue  # the same entry point twice: one distribution's metadata found twice
        seen.add((point.name, point.value))
        try:
            point.load()(commands)
        except Exception as exc:  # a broken plugin must not take the other commands down
            print(
                f"headrace: left out the command {point.name!r} ({point.value}), which failed "
                f"to load: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
    for name, needs in KNOWN.items():
        if wanted in (None, name) and name not in commands.choices:
            _stand_in(commands, name, needs)


def _wanted(argv: Sequence[str] | None, builtin: Collection[str]) -> str | None:
    """The plugin command ``argv`` names, ``""`` for a built-in one, None when it is not known
    (no arguments, an option first, an unknown name: every plugin command may be shown)."""
    if not argv or argv[0].startswith("-"):
        return None
    return "" if argv[0] in builtin else argv[0]


def _stand_in(commands: Any, name: str, needs: str) -> None:
    # Whatever follows is taken as is and ignored: with no prefix character argparse would
    # ever see, ``--out x`` is two plain arguments, not an option it does not know.
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=f"(not installed: needs {needs.split(':')[0]})",
        add_help=False,
        prefix_chars="\0",
    )
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)

    def missing(args: argparse.Namespace) -> int:
        print(f"headrace {name}: needs {needs}", file=sys.stderr)
        return 2

    parser.set_defaults(func=missing)
