"""``headrace pub SUBJECT``: publish test data to a stream, every message confirmed.

    headrace pub SUBJECT [--data TEXT | --file PATH] [--raw] [--header K:V ...]
                         [--msg-id ID] [--count N] [--rate R] [--quiet] [--json]

What is published: ``--data TEXT`` (one message), or the lines of ``--file PATH`` or of
standard input (one message per non-blank line, each line JSON: a file that is not JSON lines
is refused before anything is sent, since a pretty-printed document cut into lines is never
what was meant), or with ``--raw`` the whole file as one message, whatever it holds.

``--count N`` publishes it all N times; ``{n}`` in the data, the message id and header values
becomes the message's number (1, 2, ...), so ``--msg-id 'order-{n}'`` gives each its own id
and a fixed ``--msg-id`` lets the stream drop the repeats (its duplicate window). ``--rate R``
paces the publishes at R a second (from the start, so a slow acknowledgement is caught up, not
added); without it they go as fast as each PubAck comes back.

Every publish waits for the stream's PubAck (a JetStream publish, not a core one): the message
is stored when it is reported. Each is printed as ``STREAM seq N`` (``duplicate`` when the
stream dropped it as a repeat of its message id), then a summary on standard error; with
``--json``, only the summary, as one JSON object on standard output. A publish that fails
(no stream captures the subject, no answer in time) ends the command with exit status 1, the
summary saying how many were stored before it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

import attrs
import trio

from headrace.cli.options import add_connection_arguments
from headrace.cli.session import (
    EXIT_FAILED,
    EXIT_USAGE,
    UsageError,
    one_line,
    positive_int,
    print_json,
    run_with_jetstream,
    say,
)
from headrace.errors import ConnectionLostError, HeadraceError, InvalidSubjectError, NatsError
from headrace.jetstream import JetStream
from headrace.jetstream.responses import PubAck
from headrace.protocol import check_subject

PROG = "headrace pub"
PLACEHOLDER = b"{n}"


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: a header is NAME:VALUE")
    return name.strip(), value.strip()


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be positive")
    return value


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "pub",
        help="publish messages to a stream, each confirmed by its PubAck",
        description=(
            "Publish to SUBJECT (a stream must capture it) and wait for each PubAck. The data: "
            "--data TEXT, or one message per line of --file PATH or standard input (JSON "
            "lines; --raw: the whole input as one message). {n} in the data, --msg-id and "
            "header values is the message's number. Exit codes: 0 all stored, 1 a publish "
            "failed (no stream for the subject, no answer), 2 usage error or bad input."
        ),
    )
    parser.add_argument("subject", metavar="SUBJECT")
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--data", metavar="TEXT", help="the message (as is, UTF-8)")
    data.add_argument(
        "--file",
        metavar="PATH",
        help="JSON lines, one message each (- for standard input, the default)",
    )
    parser.add_argument(
        "--raw", action="store_true", help="the whole file (or input) is one message"
    )
    parser.add_argument(
        "--header",
        metavar="NAME:VALUE",
        type=_header,
        action="append",
        default=[],
        help="a header of every message (repeatable; a name given twice has both values)",
    )
    parser.add_argument(
        "--msg-id",
        metavar="ID",
        help="Nats-Msg-Id of each message, for the stream's de-duplication ({n}: its number)",
    )
    parser.add_argument(
        "--count", type=positive_int, default=1, metavar="N", help="publish it all N times (1)"
    )
    parser.add_argument(
        "--rate", type=_rate, metavar="R", help="at most R messages a second (default: no limit)"
    )
    parser.add_argument(
        "--timeout",
        type=_rate,
        default=5.0,
        metavar="SECONDS",
        help="how long each PubAck may take (5)",
    )
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--quiet", action="store_true", help="no line per message, only the summary")
    out.add_argument(
        "--json", action="store_true", help="only the summary, as one JSON object on stdout"
    )
    add_connection_arguments(parser)
    parser.set_defaults(func=command)


def read_messages(args: argparse.Namespace, stdin: BinaryIO) -> list[bytes]:
    """The message templates the arguments name; :class:`UsageError` for input that is not
    what they say (nothing is published then)."""
    if args.data is not None:
        if args.raw:
            raise UsageError("--raw applies to --file or standard input, not --data")
        return [args.data.encode()]
    where = "standard input" if args.file in (None, "-") else args.file
    try:
        if args.file in (None, "-"):
            if stdin.isatty():
                say(PROG, "reading messages from standard input (one per line; Ctrl-D ends)")
            content = stdin.read()
        else:
            with open(args.file, "rb") as f:
                content = f.read()
    except OSError as exc:
        raise UsageError(f"cannot read {where}: {exc.strerror or exc}") from exc
    if args.raw:
        return [content]
    messages = []
    for number, line in enumerate(content.split(b"\n"), start=1):
        line = line.rstrip(b"\r")
        if not line.strip():
            continue
        try:
            json.loads(line.replace(PLACEHOLDER, b"1"))
        except ValueError as exc:
            raise UsageError(
                f"line {number} of {where} is not JSON ({exc}); --raw publishes the whole "
                "input as one message"
            ) from None
        messages.append(line)
    if not messages:
        raise UsageError(f"nothing to publish: {where} has no lines")
    return messages


@attrs.define
class Summary:
    """What was published: the ``--json`` output, and the closing line otherwise."""

    subject: str
    total: int
    published: int = 0
    duplicates: int = 0
    payload_bytes: int = 0
    stream: str | None = None
    first_seq: int | None = None
    last_seq: int | None = None
    seconds: float = 0.0
    error: str | None = None

    def add(self, ack: PubAck, size: int) -> None:
        self.published += 1
        self.payload_bytes += size
        self.stream = ack.stream
        if ack.duplicate:
            self.duplicates += 1
            return
        if self.first_seq is None:
            self.first_seq = ack.seq
        self.last_seq = ack.seq

    def to_json(self) -> dict[str, Any]:
        return {
            **attrs.asdict(self),
            "stored": self.published - self.duplicates,
            "msgs_per_s": round(self.published / self.seconds, 1) if self.seconds else None,
        }

    def text(self) -> str:
        rate = f" ({self.published / self.seconds:.0f} msgs/s)" if self.seconds else ""
        where = ""
        if self.first_seq is not None:
            where = f": stream {self.stream} seq {self.first_seq}..{self.last_seq}"
        plural = "s" if self.duplicates != 1 else ""
        dups = f", {self.duplicates} duplicate{plural} not stored" if self.duplicates else ""
        done = (
            f"{self.published} of {self.total} messages"
            if self.error
            else f"{self.published} message{'s' if self.published != 1 else ''}"
        )
        return f"published {done} to {self.subject} in {self.seconds:.3f}s{rate}{where}{dups}"


def expand(messages: list[bytes], count: int) -> Iterator[tuple[int, bytes]]:
    """``(n, data)`` for every message to publish, ``{n}`` replaced."""
    n = 0
    for _ in range(count):
        for template in messages:
            n += 1
            yield n, template.replace(PLACEHOLDER, str(n).encode())


def _headers(pairs: list[tuple[str, str]], n: int) -> dict[str, str | list[str]] | None:
    if not pairs:
        return None
    headers: dict[str, list[str]] = {}
    for name, value in pairs:
        headers.setdefault(name, []).append(value.replace("{n}", str(n)))
    return {name: values[0] if len(values) == 1 else values for name, values in headers.items()}


def command(args: argparse.Namespace) -> int:
    try:
        messages = read_messages(args, sys.stdin.buffer)
    except UsageError as exc:
        say(PROG, str(exc))
        return EXIT_USAGE
    try:
        check_subject(args.subject)
    except InvalidSubjectError as exc:
        say(PROG, str(exc))
        return EXIT_FAILED
    summary = Summary(subject=args.subject, total=len(messages) * args.count)
    verbose = not (args.quiet or args.json)

    async def body(js: JetStream) -> int:
        started = trio.current_time()
        clock = time.perf_counter()
        nc = js.nc
        reconnects = nc.stats.reconnects
        try:
            for i, (n, data) in enumerate(expand(messages, args.count)):
                if args.rate is not None:
                    await trio.sleep_until(started + i / args.rate)
                msg_id = args.msg_id.replace("{n}", str(n)) if args.msg_id else None
                reconnects = nc.stats.reconnects
                ack = await js.publish(
                    args.subject,
                    data,
                    headers=_headers(args.header, n),
                    msg_id=msg_id,
                    timeout=args.timeout,
                )
                summary.add(ack, len(data))
                if verbose:
                    dup = f" duplicate (msg id {msg_id!r} already stored)" if ack.duplicate else ""
                    print(f"{ack.stream} seq {ack.seq}{dup}")
        except HeadraceError as exc:
            if isinstance(exc, NatsError) and (
                not nc.is_connected or nc.stats.reconnects != reconnects
            ):
                # The request's answer was lost with the connection ("no reply within 5s"
                # said nothing of it: issue 23).
                lost = ConnectionLostError(
                    f"the connection to NATS was lost while publishing message "
                    f"{summary.published + 1} ({one_line(exc)}): it may or may not be stored. "
                    + (
                        "Publishing it again with the same --msg-id stores it once"
                        if args.msg_id
                        else "Give --msg-id (e.g. 'order-{n}') to make publishing again safe"
                    )
                )
                summary.error = one_line(lost)
                raise lost from exc
            summary.error = one_line(exc)
            raise
        finally:
            summary.seconds = time.perf_counter() - clock
            if args.json:
                print_json(summary.to_json())
            elif summary.published or summary.error is None:
                sys.stdout.flush()
                say(PROG, summary.text())
        return 0

    return run_with_jetstream(args, PROG, body)
