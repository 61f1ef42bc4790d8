"""``headrace consumer ls|info``: a stream's consumers, and where each one is.

    headrace consumer ls STREAM [--json]
    headrace consumer info STREAM NAME [--json]

A pipeline's sources are durable consumers; these show how far each got (delivered, acked),
what it still has to read (pending) and what waits for an ack or a redelivery, without a
second tool. ``--json`` prints the JetStream API's JSON (durations in nanoseconds).
"""

from __future__ import annotations

import argparse
from typing import Any

from headrace.cli.options import add_connection_arguments
from headrace.cli.session import ToolError, print_json, run_with_jetstream
from headrace.cli.stream import table
from headrace.jetstream import ConsumerInfo, ConsumerNotFound, JetStream, StreamNotFound
from headrace.jetstream.codec import to_json

PROG = "headrace consumer"


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "consumer",
        help="list a stream's consumers, or show one",
        description=(
            "List the consumers of STREAM (ls) or show one (info): its configuration, how far "
            "it delivered and acked, what is pending. Exit codes: 0 done, 1 failed (no server, "
            "a stream or consumer that does not exist), 2 usage error."
        ),
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = actions.add_parser("ls", help="the consumers of STREAM")
    ls.add_argument("stream", metavar="STREAM")
    ls.add_argument("--json", action="store_true", help="one JSON object per consumer and line")
    ls.set_defaults(func=ls_command)
    info = actions.add_parser("info", help="one consumer: configuration and state")
    info.add_argument("stream", metavar="STREAM")
    info.add_argument("name", metavar="NAME")
    info.add_argument("--json", action="store_true", help="the JetStream API's JSON")
    info.set_defaults(func=info_command)
    for sub in (ls, info):
        add_connection_arguments(sub)


def ls_command(args: argparse.Namespace) -> int:
    async def body(js: JetStream) -> int:
        try:
            infos = sorted([c async for c in js.consumers(args.stream)], key=lambda c: c.name)
        except StreamNotFound as exc:
            raise ToolError(f"stream {args.stream!r} not found") from exc
        if args.json:
            for info in infos:
                print_json(to_json(info))
            return 0
        if not infos:
            print(f"stream {args.stream} has no consumers")
            return 0
        rows = [
            (
                c.name,
                "push" if c.config.deliver_subject else "pull",
                str(c.config.ack_policy or "-"),
                str(c.num_pending),
                str(c.num_ack_pending),
                str(c.num_redelivered),
                str(c.ack_floor.stream_seq),
                str(c.delivered.stream_seq),
            )
            for c in infos
        ]
        header = ("NAME", "KIND", "ACK", "PENDING", "ACK_PENDING", "REDELIVERED", "ACK_FLOOR")
        table([(*header, "DELIVERED"), *rows])
        return 0

    return run_with_jetstream(args, f"{PROG} ls", body)


def info_command(args: argparse.Namespace) -> int:
    async def body(js: JetStream) -> int:
        try:
            info = await js.consumer_info(args.stream, args.name)
        except StreamNotFound as exc:
            raise ToolError(f"stream {args.stream!r} not found") from exc
        except ConsumerNotFound as exc:
            raise ToolError(f"consumer {args.name!r} not found on stream {args.stream!r}") from exc
        if args.json:
            print_json(to_json(info))
        else:
            for line in describe(info):
                print(line)
        return 0

    return run_with_jetstream(args, f"{PROG} info", body)


def describe(info: ConsumerInfo) -> list[str]:
    """A consumer's configuration and state as lines for people."""
    c = info.config
    kind = f"push to {c.deliver_subject}" if c.deliver_subject else "pull"
    durable = "durable" if c.durable_name else "ephemeral"
    filters = c.filter_subjects or ([c.filter_subject] if c.filter_subject else [])
    lines = [
        f"Consumer {info.name} on stream {info.stream_name}"
        + (f": {c.description}" if c.description else ""),
        f"  kind:        {kind}, {durable}",
        f"  filter:      {', '.join(filters) or '-'}",
        f"  delivery:    {c.deliver_policy or 'all'}, ack {c.ack_policy or 'explicit'}"
        + (f", ack wait {c.ack_wait:g}s" if c.ack_wait else "")
        + (f", max deliver {c.max_deliver}" if c.max_deliver not in (None, -1) else ""),
        f"  delivered:   stream seq {info.delivered.stream_seq}, "
        f"consumer seq {info.delivered.consumer_seq}",
        f"  ack floor:   stream seq {info.ack_floor.stream_seq}, "
        f"consumer seq {info.ack_floor.consumer_seq}",
        f"  pending:     {info.num_pending} to deliver, {info.num_ack_pending} awaiting ack, "
        f"{info.num_redelivered} redelivered, {info.num_waiting} pull requests waiting",
    ]
    if c.max_ack_pending not in (None, -1):
        lines.append(f"  max ack pending: {c.max_ack_pending}")
    if info.paused:
        lines.append("  paused")
    return lines
