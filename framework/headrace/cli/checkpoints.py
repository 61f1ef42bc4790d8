"""``headrace checkpoints``: look at and act on checkpointed subscriptions' checkpoints.

    headrace checkpoints list|lagging|failed|reservations [--group G] [--bucket B] [--json]
    headrace checkpoints skip --failing S [--position N] ID [--bucket B]
    headrace checkpoints retry [--failing S] [--position N] ID [--bucket B]
    headrace checkpoints release ID [--bucket B]

``ID`` is ``group/subscription/entity`` (as the views print it) or the KV key. Skip names the
failing message it skips (``failing #S`` in the views); retry acts on that, on a position, or
on the checkpoint as it was when the command started. One that moved meanwhile is refused, so
the same command run twice acts once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import trio

from headrace.cli.options import add_connection_arguments, connect_kwargs

DEFAULT_BUCKET = "checkpoints"
ACTIONS = ("retry", "skip", "release")


def add_parser(commands: Any) -> None:
    from headrace.checkpoints.operators import VIEWS

    parser: argparse.ArgumentParser = commands.add_parser(
        "checkpoints",
        help="list checkpoints (lagging, failed, reserved) and retry, skip or release one",
        description=(
            "Checkpointed subscriptions keep one checkpoint per group, subscription and entity "
            "in a KV bucket. Views: list, lagging, failed, reservations. Actions on one "
            "checkpoint (ID is group/subscription/entity): retry (now, with a fresh retry "
            "budget), skip --failing S (its failing message #S counts as processed), release "
            "(drop its reservation). Skip acts only while the checkpoint still fails at #S, "
            "retry while it is as read when the command starts (or at --failing S or "
            "--position N): run twice, they act once. Exit code 2 for a bucket or checkpoint "
            "that does not exist, or an action refused."
        ),
    )
    parser.add_argument("what", choices=[*VIEWS, *ACTIONS], metavar="VIEW_OR_ACTION")
    parser.add_argument(
        "id", nargs="?", metavar="ID", help="for actions: group/subscription/entity"
    )
    parser.add_argument(
        "--position",
        type=int,
        metavar="N",
        help="retry/skip: only if the checkpoint's position is still N (as the views print "
        "it: N/version); default: as read when the command starts",
    )
    parser.add_argument(
        "--failing",
        type=int,
        metavar="S",
        help="skip (required), retry: only if the checkpoint still fails at message #S (the "
        "stream sequence the views print as 'failing #S')",
    )
    parser.add_argument("--bucket", default=DEFAULT_BUCKET, help=f"KV bucket ({DEFAULT_BUCKET})")
    parser.add_argument("--group", help="views: only this subscription group")
    parser.add_argument("--json", action="store_true", help="views: one JSON object per line")
    add_connection_arguments(parser)
    parser.set_defaults(func=command, adopt_extra=_trailing_id)


def _trailing_id(args: argparse.Namespace, extra: list[str]) -> bool:
    """``skip --failing 7 billing/ledger/orders.2``: argparse takes the positionals before
    the first option only, so an ID after options is left over; it is the ID."""
    if args.id is None and len(extra) == 1 and not extra[0].startswith("-"):
        args.id = extra[0]
        return True
    return False


def parse_id(text: str) -> Any:
    from headrace.checkpoints import CheckpointId

    parts = text.split("/", 2)
    if len(parts) == 3 and all(parts):
        return CheckpointId(*parts)
    return CheckpointId.from_key(text)


def command(args: argparse.Namespace) -> int:
    from headrace.checkpoints import CheckpointError
    from headrace.errors import HeadraceError

    if args.what in ACTIONS and not args.id:
        print(f"headrace checkpoints: {args.what} needs an ID", file=sys.stderr)
        return 2
    if args.what not in ACTIONS and args.id:
        print(f"headrace checkpoints: {args.what} takes no ID", file=sys.stderr)
        return 2
    for flag in ("position", "failing"):
        if getattr(args, flag) is not None and args.what not in ("retry", "skip"):
            print(f"headrace checkpoints: {args.what} takes no --{flag}", file=sys.stderr)
            return 2
    if args.what == "skip" and args.failing is None:
        print(
            "headrace checkpoints: skip needs --failing S, the failing message it skips (as "
            "the views print it: 'failing #S'); a skip loses that event, so it is named",
            file=sys.stderr,
        )
        return 2
    try:
        kwargs = connect_kwargs(args, "headrace-checkpoints")
        lines = trio.run(_run, args, kwargs)
    except (CheckpointError, HeadraceError, ValueError, OSError) as exc:
        print(f"headrace checkpoints: {exc}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0


async def _run(args: argparse.Namespace, kwargs: dict[str, Any]) -> list[str]:
    from headrace.checkpoints import CheckpointStore, operators
    from headrace.jetstream import JetStream
    from headrace.jetstream.kv import key_value
    from headrace.nats import connect

    async with connect(**kwargs) as nc:
        store = CheckpointStore(await key_value(JetStream(nc), args.bucket))
        now = time.time()
        if args.what in ACTIONS:
            cid = parse_id(args.id)
            if args.what == "release":
                cp = await operators.release(store, cid)
                return [operators.describe(cp, now)]
            if args.what == "skip":
                cp = await operators.skip(store, cid, failing=args.failing, position=args.position)
                done = f"skipped {cid} message #{args.failing}"
            else:
                cp = await operators.retry(store, cid, failing=args.failing, position=args.position)
                done = f"retry of {cid} due now at position {cp.position}"
            return [done, operators.describe(cp, now)]
        found = await operators.view(store, args.what, args.group)
        if args.json:
            return [
                json.dumps({"id": str(cp.id), **json.loads(cp.to_json())}, sort_keys=True)
                for cp in found
            ]
        return [operators.describe(cp, now) for cp in found]
