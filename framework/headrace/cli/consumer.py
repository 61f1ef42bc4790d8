"""``headrace consumer ls|info|pause|resume``: a stream's consumers, where each one is, and
stopping one's deliveries for a while.

    headrace consumer ls STREAM [--json]
    headrace consumer info STREAM NAME [--json]
    headrace consumer pause STREAM NAME [--until TIME | --for DURATION] [--json]
    headrace consumer resume STREAM NAME [--json]

A pipeline's sources are durable consumers; these show how far each got (delivered, acked),
what it still has to read (pending) and what waits for an ack or a redelivery, without a
second tool. ``--json`` prints the JetStream API's JSON (durations in nanoseconds).

``pause`` (nats-server 2.11+) stops the server delivering to every client of the consumer, such
as every worker of a pipeline, until ``--until`` (an ISO 8601 / RFC 3339 time with a timezone),
for ``--for`` (seconds, or ``30s``, ``1h30m``), or without either until ``resume``. The workers
keep running and lose nothing; they wait.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Awaitable
from typing import Any, TypeVar

import attrs

from headrace.cli.options import add_connection_arguments
from headrace.cli.session import ToolError, positive_int, print_json, run_with_jetstream, say
from headrace.cli.stream import duration, table
from headrace.jetstream import (
    ConsumerInfo,
    ConsumerNotFound,
    ConsumerPause,
    JetStream,
    StreamNotFound,
)
from headrace.jetstream.codec import format_time, to_json
from headrace.jetstream.pause import INDEFINITELY

PROG = "headrace consumer"
T = TypeVar("T")


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "consumer",
        help="list a stream's consumers, show, pause, resume, update or delete one",
        description=(
            "List the consumers of STREAM (ls) or show one (info): its configuration, how far "
            "it delivered and acked, what is pending; pause or resume one's deliveries "
            "(nats-server 2.11+). Exit codes: 0 done, 1 failed (no server, a stream or "
            "consumer that does not exist), 2 usage error."
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
    pause = actions.add_parser(
        "pause",
        help="stop delivering to every client of a consumer, for a while or until resumed",
    )
    pause.add_argument("stream", metavar="STREAM")
    pause.add_argument("name", metavar="NAME")
    when = pause.add_mutually_exclusive_group()
    when.add_argument(
        "--until",
        type=pause_time,
        metavar="TIME",
        help="when deliveries start again: ISO 8601 with a timezone (2026-01-31T12:00:00Z)",
    )
    when.add_argument(
        "--for",
        dest="for_",
        type=duration,
        metavar="DURATION",
        help="how long from now: seconds, or like 30s, 1h30m (neither: until resume)",
    )
    pause.add_argument("--json", action="store_true", help="the JetStream API's JSON")
    pause.set_defaults(func=pause_command)
    resume = actions.add_parser("resume", help="deliver again to a paused consumer's clients")
    resume.add_argument("stream", metavar="STREAM")
    resume.add_argument("name", metavar="NAME")
    resume.add_argument("--json", action="store_true", help="the JetStream API's JSON")
    resume.set_defaults(func=resume_command)
    rm = actions.add_parser(
        "rm", help="delete a consumer: its place in the stream and what it waited on acks for"
    )
    rm.add_argument("stream", metavar="STREAM")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(func=rm_command)
    update = actions.add_parser(
        "update", help="change what a consumer allows in flight and how long it waits for acks"
    )
    update.add_argument("stream", metavar="STREAM")
    update.add_argument("name", metavar="NAME")
    update.add_argument(
        "--max-ack-pending",
        type=positive_int,
        metavar="N",
        help="messages delivered and not yet acked the server allows (a pipeline's batches "
        "must fit in it)",
    )
    update.add_argument(
        "--ack-wait",
        type=duration,
        metavar="DURATION",
        help="how long a delivery waits for its ack",
    )
    update.add_argument("--json", action="store_true", help="the JetStream API's JSON")
    update.set_defaults(func=update_command)
    for sub in (ls, info, pause, resume, rm, update):
        add_connection_arguments(sub)


def pause_time(text: str) -> dt.datetime:
    """An argparse type: an ISO 8601 time with a timezone (``Z`` or an offset); a time
    without one is a usage error (the server would not know which moment it is)."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time (ISO 8601, like 2026-01-31T12:00:00Z)"
        ) from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no timezone: add Z (UTC) or an offset such as +02:00"
        )
    return value


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
        return _show_info(args, info)

    return run_with_jetstream(args, f"{PROG} info", body)


def _show_info(args: argparse.Namespace, info: ConsumerInfo) -> int:
    """A consumer's info: the API's JSON with ``--json``, else :func:`describe`'s lines."""
    if args.json:
        print_json(to_json(info))
    else:
        for line in describe(info):
            print(line)
    return 0


def pause_command(args: argparse.Namespace) -> int:
    until = args.until if args.until is not None else args.for_

    async def body(js: JetStream) -> int:
        return _show_pause(
            args, await _on_consumer(args, js.pause_consumer(args.stream, args.name, until))
        )

    return run_with_jetstream(args, f"{PROG} pause", body)


def resume_command(args: argparse.Namespace) -> int:
    async def body(js: JetStream) -> int:
        return _show_pause(
            args, await _on_consumer(args, js.resume_consumer(args.stream, args.name))
        )

    return run_with_jetstream(args, f"{PROG} resume", body)


def rm_command(args: argparse.Namespace) -> int:
    async def body(js: JetStream) -> int:
        await _on_consumer(args, js.delete_consumer(args.stream, args.name))
        print(f"deleted consumer {args.name} of stream {args.stream}")
        return 0

    return run_with_jetstream(args, f"{PROG} rm", body)


def update_command(args: argparse.Namespace) -> int:
    changes: dict[str, Any] = {}
    if args.max_ack_pending is not None:
        changes["max_ack_pending"] = args.max_ack_pending
    if args.ack_wait is not None:
        changes["ack_wait"] = args.ack_wait
    if not changes:
        say(f"{PROG} update", "nothing to change: give --max-ack-pending or --ack-wait")
        return 2

    async def body(js: JetStream) -> int:
        info = await _on_consumer(args, js.consumer_info(args.stream, args.name))
        updated = await _on_consumer(
            args, js.update_consumer(args.stream, attrs.evolve(info.config, **changes))
        )
        return _show_info(args, updated)

    return run_with_jetstream(args, f"{PROG} update", body)


async def _on_consumer(args: argparse.Namespace, call: Awaitable[T]) -> T:
    try:
        return await call
    except StreamNotFound as exc:
        raise ToolError(f"stream {args.stream!r} not found") from exc
    except ConsumerNotFound as exc:
        raise ToolError(f"consumer {args.name!r} not found on stream {args.stream!r}") from exc


def _show_pause(args: argparse.Namespace, answer: ConsumerPause) -> int:
    if args.json:
        print_json(to_json(answer))
    elif answer.paused:
        print(f"consumer {args.name} on stream {args.stream} {pause_state(answer)}")
    else:
        print(f"consumer {args.name} on stream {args.stream} is not paused: it delivers")
    return 0


def pause_state(pause: ConsumerPause | ConsumerInfo) -> str:
    """``paused until <time> (<n>s left)``, or ``paused until resumed`` for an open pause."""
    until = pause.pause_until if isinstance(pause, ConsumerPause) else pause.config.pause_until
    if until is None or until >= INDEFINITELY:
        return "paused until resumed"
    left = f" ({pause.pause_remaining:.0f}s left)" if pause.pause_remaining is not None else ""
    return f"paused until {format_time(until)}{left}"


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
        lines.append(f"  {pause_state(info)}")
    return lines
