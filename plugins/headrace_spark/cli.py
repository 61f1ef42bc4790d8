"""``headrace demo``: JetStream orders -> pipeline -> Spark parquet, then checked.

The plugin's own command, registered the way any plugin adds one: the entry point
``demo = "headrace_spark.cli:add_parser"`` in the ``headrace.commands`` group (see
plugins/headrace_spark/pyproject.toml). The framework loads it only for ``headrace demo`` and
for help. The job itself (:mod:`headrace_spark.demo`) is imported when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import trio

DEFAULT_MESSAGES = 200_000
DEFAULT_BATCH = 50_000


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_parser(commands: Any) -> None:
    """Add ``demo`` to ``headrace``'s subcommands (``commands``: argparse's subparsers action)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "demo",
        help="the main job, end to end: JetStream orders into Spark parquet, checked",
        description=(
            "Start a nats-server (unless --nats), publish JSON orders with headers to a stream, "
            "run the pipeline JetStream -> decode -> Spark sink into parquet partitioned by "
            "day, read the files back and check every order is there exactly once. Exit code 0 "
            "when it is, 1 when an order is missing or duplicated, 2 when the demo cannot run "
            "(no Java, no pyspark, a server it cannot reach)."
        ),
    )
    parser.add_argument(
        "--nats",
        metavar="URL",
        default=None,
        help="use this server (the demo creates and deletes stream HEADRACE_DEMO on it)",
    )
    parser.add_argument(
        "--messages",
        type=_positive,
        default=DEFAULT_MESSAGES,
        help=f"orders to publish ({DEFAULT_MESSAGES})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("headrace-demo"),
        help="output directory (./headrace-demo); a previous demo output there is replaced",
    )
    parser.add_argument(
        "--spark-master",
        metavar="URL",
        default="local[*]",
        help="local[*] (default), spark://host:port, or sc://host:port for Spark Connect",
    )
    parser.add_argument(
        "--batch",
        type=_positive,
        default=DEFAULT_BATCH,
        help=f"records per Spark write (at most; {DEFAULT_BATCH})",
    )
    parser.add_argument(
        "--writer",
        choices=["spark", "arrow"],
        default="spark",
        help="how the sink writes each batch: a Spark job (default) or Arrow's parquet writer",
    )
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from headrace.errors import HeadraceError, NoServersError
    from headrace.localserver import LocalServerError
    from headrace.pipeline import restore_gc, tune_gc

    from headrace_spark import demo as job

    problem = job.environment_problem()
    if problem is not None:
        print(f"headrace demo: {problem}", file=sys.stderr)
        return 2
    out = args.out.resolve()
    # The collector settings for streaming (gc_tuning.py), put back for in-process callers.
    gc_settings = tune_gc()
    try:
        result = trio.run(
            lambda: job.demo(
                nats_url=args.nats,
                messages=args.messages,
                out=out,
                spark_master=args.spark_master,
                batch=args.batch,
                writer=args.writer,
            )
        )
    except KeyboardInterrupt:
        print("\nheadrace demo: interrupted", file=sys.stderr)
        return 130
    except BaseException as exc:
        error = _leaf(exc)
        if isinstance(error, job.DemoError | LocalServerError):
            print(f"headrace demo: {error}", file=sys.stderr)
            return 2
        if isinstance(error, NoServersError):
            print(f"headrace demo: cannot connect to NATS ({args.nats}): {error}", file=sys.stderr)
            return 2
        if isinstance(error, HeadraceError | OSError):
            print(f"headrace demo: {_one_line(error)}", file=sys.stderr)
            return 2
        raise
    finally:
        restore_gc(gc_settings)
    print(job.summary(result, out))
    return 0 if result.ok else 1


def _leaf(exc: BaseException) -> BaseException:
    """The first non-group exception of ``exc`` (Cancelled ones last): what to report."""
    while isinstance(exc, BaseExceptionGroup):
        inner = [e for e in exc.exceptions if not isinstance(e, trio.Cancelled)]
        exc = (inner or list(exc.exceptions))[0]
    return exc


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
