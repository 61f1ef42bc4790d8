"""``headrace stream add|info|ls|rm``: create, look at and delete JetStream streams.

    headrace stream add NAME [--subjects S ...] [--retention R] [--storage S] [--replicas N]
                             [--max-msgs N] [--max-bytes N] [--max-age D] [--discard P]
                             [--duplicate-window D] [--description TEXT] [--json]
    headrace stream info NAME [--json]
    headrace stream ls [--subject S] [--json]
    headrace stream rm NAME

So that a first pipeline needs no other tool: the stream it reads is made here. ``add`` is
idempotent (the same configuration again is no error: the server says so), a different
configuration under an existing name is refused by the server, and the message says which
stream. ``--json`` prints the JetStream API's own JSON (durations in nanoseconds), so that
what a script reads is what the nats CLI and the server's documentation describe.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from headrace.cli.options import add_connection_arguments
from headrace.cli.session import (
    ToolError,
    bytes_words,
    positive_int,
    print_json,
    run_with_jetstream,
)
from headrace.jetstream import JetStream, StreamNotFound
from headrace.jetstream.codec import to_json
from headrace.jetstream.errors import StreamAlreadyExists
from headrace.jetstream.stream_config import (
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamInfo,
)

PROG = "headrace stream"
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def duration(text: str) -> float:
    """Seconds, from ``90``, ``1.5``, ``500ms``, ``30s``, ``1h30m``, ``7d`` (an argparse type:
    anything else is a usage error)."""
    try:
        seconds = float(text)
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _DURATION.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match[1]) * _UNITS[match[2]]
            pos = match.end()
        if pos != len(text) or not text:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a duration (seconds, or like 500ms, 30s, 1h30m, 7d)"
            ) from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration cannot be negative")
    return seconds


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "stream",
        help="create, show, list or delete JetStream streams",
        description=(
            "Create (add), show (info), list (ls) or delete (rm) JetStream streams. Exit codes: "
            "0 done, 1 failed (no server, a stream that does not exist, refused by the "
            "server), 2 usage error."
        ),
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    add = actions.add_parser(
        "add",
        help="create a stream (the same configuration again is no error)",
        description=(
            "Create stream NAME. Without --subjects it captures the subject NAME (the "
            "server's default). Durations are seconds or like 500ms, 30s, 1h30m, 7d."
        ),
    )
    add.add_argument("name", metavar="NAME")
    add.add_argument(
        "--subjects",
        metavar="SUBJECT",
        action="append",
        default=[],
        help="a subject the stream captures (wildcards allowed; repeatable, or comma-separated)",
    )
    add.add_argument(
        "--retention",
        choices=[p.value for p in RetentionPolicy],
        default=RetentionPolicy.LIMITS.value,
        help="limits (default): keep until a limit; interest: until every consumer acked; "
        "workqueue: until one consumer acked",
    )
    add.add_argument(
        "--storage",
        choices=[s.value for s in StorageType],
        default=StorageType.FILE.value,
        help="file (default) or memory",
    )
    add.add_argument(
        "--replicas", type=positive_int, default=1, metavar="N", help="copies (default 1)"
    )
    add.add_argument("--max-msgs", type=positive_int, metavar="N", help="at most N messages")
    add.add_argument("--max-bytes", type=positive_int, metavar="N", help="at most N bytes")
    add.add_argument("--max-age", type=duration, metavar="DURATION", help="drop older messages")
    add.add_argument(
        "--discard",
        choices=[p.value for p in DiscardPolicy],
        help="at a limit: drop the oldest (old, the default) or refuse new messages (new)",
    )
    add.add_argument(
        "--duplicate-window",
        type=duration,
        metavar="DURATION",
        help="how long a Nats-Msg-Id is remembered to drop duplicates (server default 2m)",
    )
    add.add_argument("--description", metavar="TEXT")
    add.add_argument("--json", action="store_true", help="print the stream's info as JSON")
    add.set_defaults(func=add_command)

    info = actions.add_parser("info", help="a stream's configuration and state")
    info.add_argument("name", metavar="NAME")
    info.add_argument("--json", action="store_true", help="the JetStream API's JSON")
    info.set_defaults(func=info_command)

    ls = actions.add_parser("ls", help="every stream, with its subjects and message count")
    ls.add_argument("--subject", help="only the streams capturing this subject")
    ls.add_argument("--json", action="store_true", help="one JSON object per stream and line")
    ls.set_defaults(func=ls_command)

    rm = actions.add_parser("rm", help="delete a stream and every message in it")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(func=rm_command)

    for sub in (add, info, ls, rm):
        add_connection_arguments(sub)


def _config(args: argparse.Namespace) -> StreamConfig:
    subjects = [s.strip() for value in args.subjects for s in value.split(",") if s.strip()]
    return StreamConfig(
        name=args.name,
        description=args.description,
        subjects=subjects or None,
        retention=RetentionPolicy(args.retention),
        storage=StorageType(args.storage),
        num_replicas=args.replicas,
        max_msgs=args.max_msgs,
        max_bytes=args.max_bytes,
        max_age=args.max_age,
        discard=DiscardPolicy(args.discard) if args.discard else None,
        duplicate_window=args.duplicate_window,
    )


def add_command(args: argparse.Namespace) -> int:
    async def body(js: JetStream) -> int:
        try:
            info = await js.add_stream(_config(args))
        except StreamAlreadyExists as exc:
            raise ToolError(
                f"stream {args.name!r} exists with another configuration ({exc}); "
                "`headrace stream info` shows it"
            ) from exc
        _show(info, args.json)
        return 0

    return _run(args, body)


def info_command(args: argparse.Namespace) -> int:
    async def body(js: JetStream) -> int:
        _show(await _stream_info(js, args.name), args.json)
        return 0

    return _run(args, body)


def ls_command(args: argparse.Namespace) -> int:
    async def body(js: JetStream) -> int:
        infos = sorted(
            [info async for info in js.streams(subject=args.subject)],
            key=lambda info: info.config.name,
        )
        if args.json:
            for info in infos:
                print_json(to_json(info))
            return 0
        rows = [
            (
                i.config.name,
                ",".join(i.config.subjects or []) or "-",
                str(i.state.messages),
                bytes_words(i.state.bytes),
                str(i.state.consumer_count),
                str(i.config.retention or "limits"),
                str(i.config.storage or "file"),
                str(i.config.num_replicas or 1),
            )
            for i in infos
        ]
        if not rows:
            print("no streams" + (f" capture {args.subject!r}" if args.subject else ""))
            return 0
        header = ("NAME", "SUBJECTS", "MESSAGES", "BYTES", "CONSUMERS", "RETENTION", "STORAGE")
        table([(*header, "REPLICAS"), *rows])
        return 0

    return _run(args, body)


def rm_command(args: argparse.Namespace) -> int:
    async def body(js: JetStream) -> int:
        try:
            await js.delete_stream(args.name)
        except StreamNotFound as exc:
            raise ToolError(f"stream {args.name!r} not found") from exc
        print(f"deleted stream {args.name}")
        return 0

    return _run(args, body)


def _run(args: argparse.Namespace, body: Any) -> int:
    return run_with_jetstream(args, f"{PROG} {args.action}", body)


async def _stream_info(js: JetStream, name: str) -> StreamInfo:
    try:
        return await js.stream_info(name)
    except StreamNotFound as exc:
        raise ToolError(f"stream {name!r} not found") from exc


def _show(info: StreamInfo, as_json: bool) -> None:
    if as_json:
        print_json(to_json(info))
        return
    sys.stdout.write("".join(f"{line}\n" for line in describe(info)))
    sys.stdout.flush()


def describe(info: StreamInfo) -> list[str]:
    """A stream's configuration and state as lines for people."""
    c, s = info.config, info.state

    def limit(value: Any, shown: str | None = None) -> str:
        return "unlimited" if value in (None, -1, 0) else (shown or str(value))

    lines = [
        f"Stream {c.name}" + (f": {c.description}" if c.description else ""),
        f"  subjects:    {', '.join(c.subjects or []) or '-'}",
        f"  retention:   {c.retention or 'limits'}, storage {c.storage or 'file'}, "
        f"replicas {c.num_replicas or 1}",
        f"  limits:      messages {limit(c.max_msgs)}, bytes {limit(c.max_bytes)}, "
        f"age {limit(c.max_age, _seconds(c.max_age or 0))}, discard {c.discard or 'old'}",
    ]
    if c.duplicate_window:
        lines.append(f"  duplicates:  window {_seconds(c.duplicate_window)}")
    span = f", seq {s.first_seq}..{s.last_seq}" if s.messages else ""
    lines.append(f"  messages:    {s.messages} ({bytes_words(s.bytes)}){span}")
    lines.append(f"  consumers:   {s.consumer_count}")
    if info.cluster is not None and info.cluster.name and info.cluster.leader:
        lines.append(f"  leader:      {info.cluster.leader}")
    if info.created is not None:
        lines.append(f"  created:     {info.created.isoformat(timespec='seconds')}")
    return lines


def _seconds(value: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{value:g}s"


def table(rows: list[tuple[str, ...]]) -> None:
    """Print ``rows`` (the first is the header) in aligned columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
