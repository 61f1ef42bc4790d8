"""``headrace graph TARGET``: the pipeline as a Mermaid flowchart, its actors included."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from headrace.cli.overrides import OverrideError, Overrides
from headrace.cli.target import TargetError, load_target
from headrace.pipeline.errors import PipelineError
from headrace.sinks.errors import SinkLoadError, UnknownSink


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "graph",
        help="print a pipeline's Mermaid diagram",
        description=(
            "Print the Mermaid flowchart of the pipeline TARGET names (path/to/file.py:name or "
            "package.module:name), with the actors it runs as. The pipeline is validated first "
            "(--no-validate draws it anyway). Exit code 2 for a TARGET that does not load or an "
            "invalid pipeline."
        ),
    )
    parser.add_argument("target", metavar="TARGET", help="path/to/file.py:name or module:name")
    parser.add_argument(
        "--no-validate",
        dest="validate",
        action="store_false",
        help="draw the graph even if the pipeline would not run",
    )
    parser.add_argument(
        "--sink",
        metavar="NAME=PLUGIN",
        action="append",
        default=[],
        help="as for `headrace run`: replace sink NAME's sink with a sink plugin",
    )
    parser.add_argument(
        "--sink-option", metavar="NAME.KEY=VALUE", action="append", default=[], help="as for run"
    )
    parser.add_argument(
        "--durable", metavar="[SOURCE=]NAME", action="append", default=[], help="as for run"
    )
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    try:
        pipe = load_target(args.target)
        Overrides.parse(
            sinks=args.sink, sink_options=args.sink_option, durables=args.durable
        ).apply(pipe)
        if args.validate:
            pipe.validate()
    except (TargetError, OverrideError, UnknownSink, SinkLoadError) as exc:
        print(f"headrace graph: {exc}", file=sys.stderr)
        return 2
    except PipelineError as exc:
        print(f"headrace graph: invalid pipeline: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(pipe.describe())
    sys.stdout.flush()
    return 0
