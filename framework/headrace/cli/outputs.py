"""``headrace outputs``: look at and repair an output shared by workers.

    headrace outputs show PATH [--json]
    headrace outputs sweep PATH [--stale-after SECONDS]
    headrace outputs reset PATH --stream NAME

``PATH`` is the output directory (for a table, its location): its ``_headrace/output.json``
names the commit state, which lives in the KV bucket of the NATS system given by the usual
connection options.

- ``show``: the manifest, the commit state (per stream: identity, floor, what is committed
  above it; the attempts committed and not yet published; the horizon), and the attempts
  staged in the directory;
- ``sweep``: what every worker does on its own every minute, now: publish what dead workers
  committed, delete their attempts that never committed and started more than
  ``--stale-after`` seconds ago (default 300). Safe while workers run;
- ``reset --stream NAME``: forget what the output holds of stream NAME (after the stream was
  deleted and created again: the new stream's records are then written, not skipped). The
  data files stay. Stop the workers first if the old stream may still deliver.

Exit code 2 for an output without a manifest, a commit state that cannot be found, or bad
arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import trio

from headrace.cli.options import add_connection_arguments, connect_kwargs

ACTIONS = ("show", "sweep", "reset")


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "outputs",
        help="show, sweep or reset an output shared by several workers (its commit state)",
        description=(
            "An output written by several workers keeps its commits in a JetStream KV bucket "
            "(docs/scaling.md). show: the commit state and what is staged; sweep: publish what "
            "dead workers committed and delete their stale attempts; reset --stream NAME: "
            "forget a stream's commits (after it was recreated). PATH is the output directory."
        ),
    )
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("path", metavar="PATH", help="the output directory")
    parser.add_argument("--stream", help="reset: the stream whose commits to forget")
    parser.add_argument("--json", action="store_true", help="show: one JSON object")
    parser.add_argument(
        "--stale-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="sweep: attempts older than this that never committed are deleted (300)",
    )
    add_connection_arguments(parser)
    parser.set_defaults(func=command)


def _fail(message: str) -> int:
    print(f"headrace outputs: {message}", file=sys.stderr, flush=True)
    return 2


def command(args: argparse.Namespace) -> int:
    from headrace.errors import HeadraceError

    if args.action == "reset" and not args.stream:
        return _fail("reset needs --stream NAME")
    if args.action != "reset" and args.stream:
        return _fail("--stream applies to reset")
    if args.stale_after is not None and (args.action != "sweep" or not args.stale_after > 0):
        return _fail("--stale-after applies to sweep, and must be positive")
    root = Path(args.path).expanduser().resolve()
    try:
        kwargs = connect_kwargs(args, "headrace-outputs")
        lines = trio.run(_run, args, root, kwargs)
    except (HeadraceError, ValueError, OSError) as exc:
        return _fail(str(exc))
    for line in lines:
        print(line)
    return 0


async def _run(args: argparse.Namespace, root: Path, kwargs: dict[str, Any]) -> list[str]:
    from headrace.commits.coordinator import CommitCoordinator
    from headrace.commits.errors import CommitStateMissing
    from headrace.commits.identity import new_worker_id
    from headrace.jetstream.context import JetStream
    from headrace.nats.connection import connect
    from headrace.sinks.shared_output import STALE_AFTER, SharedOutput, claim, sweep

    output = SharedOutput(root, kind="output")
    manifest = output.read_manifest()
    if manifest is None:
        raise CommitStateMissing(
            f"{root} is not an output shared by workers (no _headrace/output.json)"
        )
    async with connect(**kwargs) as nc:
        js = JetStream(nc)
        worker = new_worker_id()
        if args.action == "sweep":
            coordinator = await claim(
                output, js, owner=manifest.owner, worker=worker, bucket=manifest.bucket, replicas=1
            )
            try:
                report = await sweep(
                    output, coordinator, stale_after=args.stale_after or STALE_AFTER
                )
            finally:
                output.release()
            return [
                f"swept {root}: {report.rolled} committed attempts published, "
                f"{report.removed} stale attempts deleted"
            ]
        coordinator = await CommitCoordinator.open(
            js, output=manifest.id, owner=manifest.owner, worker=worker, bucket=manifest.bucket
        )
        if args.action == "reset":
            if args.stream not in coordinator.state.streams:
                known = sorted(coordinator.state.streams) or ["none"]
                raise ValueError(
                    f"output {root} holds no commits of stream {args.stream!r} "
                    f"(it holds: {', '.join(known)})"
                )
            before = coordinator.state.streams[args.stream]
            await coordinator.change(lambda state: state.reset_stream(args.stream))
            return [
                f"reset {root}: the commits of stream {args.stream!r} (created "
                f"{before.created}, up to sequence {before.last}) are "
                "forgotten; the data files stay"
            ]
        staged = [p.name for _, p in await trio.to_thread.run_sync(output.staged)]
        summary = {
            "path": str(root),
            "manifest": {
                "id": manifest.id,
                "owner": manifest.owner,
                "bucket": manifest.bucket,
                "created": manifest.created,
            },
            "revision": coordinator.revision,
            "state": coordinator.state.summary(),
            "staged": staged,
        }
        if args.json:
            return [json.dumps(summary)]
        return _describe(summary)


def _describe(summary: dict[str, Any]) -> list[str]:
    manifest, state = summary["manifest"], summary["state"]
    lines = [
        f"output      {summary['path']}",
        f"owner       {manifest['owner']}",
        f"state       bucket {manifest['bucket']!r}, key {manifest['id']}, "
        f"revision {summary['revision']}, {state['commits']} commits",
    ]
    for name, stream in state["streams"].items():
        lines.append(
            f"stream      {name} (created {stream['created']}): every sequence up to "
            f"{stream['floor']} settled, {stream['committed_above_floor']} committed above it "
            f"in {stream['intervals']} intervals"
        )
    if not state["streams"]:
        lines.append("stream      none committed yet")
    lines.append(f"unpublished {len(state['unpublished'])} committed attempts not yet in place")
    for token, entry in state["unpublished"].items():
        lines.append(f"            {token} (worker {entry['worker']})")
    lines.append(f"horizon     {state['horizon']} (attempts started before it cannot commit)")
    lines.append(f"staged      {len(summary['staged'])} attempts in _headrace/staging")
    if state["lease"]:
        lease = state["lease"]
        lines.append(f"compaction  by worker {lease['worker']} until {lease['until']}")
    return lines
