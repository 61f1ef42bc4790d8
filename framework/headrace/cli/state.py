"""``headrace state``: look at and reset the state of stateful operators (docs/state.md).

    headrace state show PIPELINE [OPERATOR] [--bucket B] [--json] [--decode]
    headrace state reset PIPELINE OPERATOR [--bucket B] [--yes]

Each stateful operator keeps one *head* key in the state bucket (``headrace_state`` unless the
pipeline names another), ``<pipeline>.<operator>.head``, naming its current snapshot, and the
snapshot in chunks beside it (:mod:`headrace.state.snapshots`). The key holds the names as
tokens, which are hashes for names that are long or have other characters than letters,
digits, ``-`` and ``_``; the head records the names themselves (heads written before it did
are shown under their token).

- ``show``: per operator of the pipeline (or the one named), the head: epoch, when it was
  saved, lineage, size and chunks. ``--decode`` also reads the snapshot and says what it holds
  (keys, open windows, the watermark, results pending, the next result's number, late records,
  the stream sequences taken in). Decoding unpickles the snapshot, which runs whatever code
  its bytes name: only with ``--decode``, and only for a bucket trusted like the pipeline's
  code. It never writes: a worker may be running.
- ``reset``: remove the operator's head and chunks; its next run starts afresh, with a new
  lineage. It asks first, unless ``--yes`` (and refuses to go on without ``--yes`` when there
  is no terminal to ask on). It cannot tell whether a worker runs the operator: one that does
  stops with ``StateFenced`` at its next snapshot (its messages since that snapshot are
  redelivered), and if restarted, starts afresh.

Exit code 2 for every error, as ``headrace checkpoints`` and ``outputs``: a bucket, pipeline or
operator with no state, a snapshot that does not decode, a reset not confirmed, no server, bad
arguments.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pickle
import sys
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import attrs

from headrace.cli.options import add_connection_arguments
from headrace.cli.progress import span_words
from headrace.cli.session import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    bytes_words,
    run_with_jetstream,
    say,
)
from headrace.errors import HeadraceError
from headrace.jetstream import JetStream
from headrace.jetstream.kv import (
    BucketNotFound,
    KeyNotFound,
    KeyValue,
    KeyValueConfig,
    leader_bucket,
)
from headrace.state.snapshots import (
    DEFAULT_STATE_BUCKET,
    SnapshotHead,
    SnapshotStore,
    key_token,
)

PROG = "headrace state"
#: Attempts at reading a snapshot that a running worker replaces meanwhile.
READ_ATTEMPTS = 3


class StateCommandError(HeadraceError):
    """A failure ``headrace state`` words itself (no such operator, a reset not confirmed)."""


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "state",
        help="show or reset the state of a pipeline's stateful operators (windows, keyed state)",
        description=(
            "Stateful operators snapshot their state to a KV bucket (headrace_state unless the "
            "pipeline names another; docs/state.md). show: each operator's snapshot (epoch, "
            "saved, lineage, size; --decode: what it holds). reset: remove an operator's "
            "state, so that its next run starts afresh. Exit code 2 for every error: a bucket, "
            "pipeline or operator with no state, a reset not confirmed, no server."
        ),
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    show = actions.add_parser(
        "show",
        help="the snapshots of a pipeline's stateful operators",
        description=(
            "The snapshot of each stateful operator of PIPELINE (or of OPERATOR): epoch, when "
            "it was saved, lineage, size in bytes and chunks. With --decode, also what it "
            "holds: keys, open windows, the watermark, results pending and the next result's "
            "number, late records, the stream sequences taken in. --decode unpickles the "
            "snapshot, which runs any code its bytes name: use it only on a bucket you trust "
            "like the pipeline's code (the worker itself trusts it so), and with the "
            "pipeline's modules importable when keys or values are of its classes. show only "
            "reads: safe while a worker runs."
        ),
    )
    show.add_argument("pipeline", metavar="PIPELINE", help="the pipeline's name")
    show.add_argument(
        "operator", nargs="?", metavar="OPERATOR", help="one stateful operator (its node's name)"
    )
    show.add_argument(
        "--decode",
        action="store_true",
        help="read and unpickle the snapshot to show what it holds (runs code the snapshot "
        "names: only for a trusted bucket)",
    )
    show.add_argument("--json", action="store_true", help="one JSON object per operator and line")
    show.set_defaults(func=show_command)

    reset = actions.add_parser(
        "reset",
        help="remove a stateful operator's state (its next run starts afresh)",
        description=(
            "Remove the state of OPERATOR of PIPELINE: its snapshot head and chunks. Its next "
            "run starts afresh with a new lineage (sinks tell its results from the old ones). "
            "Asks first unless --yes. A worker running the operator meanwhile is not detected: "
            "it stops with StateFenced at its next snapshot, and its messages since the last "
            "snapshot are redelivered."
        ),
    )
    reset.add_argument("pipeline", metavar="PIPELINE", help="the pipeline's name")
    reset.add_argument("operator", metavar="OPERATOR", help="the stateful operator's name")
    reset.add_argument(
        "--yes", action="store_true", help="do not ask (needed when not on a terminal)"
    )
    reset.set_defaults(func=reset_command)

    for sub in (show, reset):
        sub.add_argument(
            "--bucket",
            default=DEFAULT_STATE_BUCKET,
            help=f"the state bucket (the pipeline's state_bucket; {DEFAULT_STATE_BUCKET})",
        )
        add_connection_arguments(sub)


# -- finding the heads ------------------------------------------------------------------------


@attrs.frozen(slots=True)
class Found:
    """One operator's head as read: its key, revision and content."""

    key: str
    revision: int
    head: SnapshotHead

    @property
    def operator(self) -> str:
        """The operator's name; its key token for a head that does not record it."""
        return self.head.operator or self.key.split(".")[1]


async def open_bucket(js: JetStream, bucket: str) -> KeyValue:
    """The state bucket (read from its leader, as the workers do); never made here."""
    return await leader_bucket(js, KeyValueConfig(bucket=bucket), create=False)


async def _read_head(kv: KeyValue, key: str) -> Found | None:
    try:
        entry = await kv.get(key)
    except KeyNotFound:
        return None
    return Found(key, entry.revision, SnapshotHead.from_json(entry.value, f"{kv.bucket}/{key}"))


async def heads(kv: KeyValue, pipeline: str) -> list[Found]:
    """The heads of ``pipeline``'s operators in the bucket, by operator name."""
    found = []
    for key in await kv.keys(f"{key_token(pipeline)}.*.head"):
        one = await _read_head(kv, key)
        # A head that records another pipeline's name shares only the token (a hash).
        if one is not None and one.head.pipeline in ("", pipeline):
            found.append(one)
    return sorted(found, key=lambda f: f.operator)


async def _pipelines(kv: KeyValue) -> list[str]:
    """The pipelines with state in the bucket (tokens for heads without names)."""
    names = set()
    for key in await kv.keys("*.*.head"):
        one = await _read_head(kv, key)
        if one is not None:
            names.add(one.head.pipeline or key.split(".")[0])
    return sorted(names)


async def find(kv: KeyValue, pipeline: str, operator: str | None) -> list[Found]:
    """The heads to show: every operator's of ``pipeline``, or ``operator``'s; a
    :class:`StateCommandError` naming what there is when there is none."""
    if operator is not None:
        key = f"{key_token(pipeline)}.{key_token(operator)}.head"
        one = await _read_head(kv, key)
        if one is not None:
            return [one]
    found = await heads(kv, pipeline)
    if operator is None and found:
        return found
    if found:
        names = ", ".join(f.operator for f in found)
        raise StateCommandError(
            f"pipeline {pipeline!r} has no state of operator {operator!r} in bucket "
            f"{kv.bucket!r} (its stateful operators with state: {names})"
        )
    others = await _pipelines(kv)
    raise StateCommandError(
        f"bucket {kv.bucket!r} holds no state of pipeline {pipeline!r} ("
        + (f"it holds state of: {', '.join(others)}" if others else "it holds none")
        + "; --bucket names another bucket)"
    )


async def read_snapshot(kv: KeyValue, pipeline: str, found: Found) -> tuple[Found, bytes]:
    """The operator's current snapshot, read without touching anything (no sweep of old
    chunks: they may be a running worker's save in progress). A save that replaces it while it
    is read is followed to the new one."""
    for attempt in range(READ_ATTEMPTS):
        store = SnapshotStore(kv, pipeline, found.operator)
        try:
            payload = await store.load(sweep=False)
        except HeadraceError:
            again = await _read_head(kv, found.key)
            if attempt + 1 < READ_ATTEMPTS and again is not None and again != found:
                found = again  # the head moved while its chunks were read
                continue
            raise
        if payload is None or store.head is None or store.revision is None:
            raise StateCommandError(
                f"the state of {pipeline}/{found.operator} was removed while it was read"
            )
        return Found(found.key, store.revision, store.head), payload
    raise AssertionError("unreachable")


# -- what a snapshot holds --------------------------------------------------------------------


def _iso_us(us: int | None) -> str | None:
    if us is None:
        return None
    moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=us)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _assigner(spec: Any) -> dict[str, Any]:
    spec = tuple(spec)
    if spec[0] == "session":
        return {"type": "session", "gap": spec[1] / 1e6}
    return {"type": spec[0], "size": spec[1] / 1e6, "slide": spec[2] / 1e6, "align": spec[3] / 1e6}


def decode(payload: bytes) -> dict[str, Any]:
    """What a stateful operator's snapshot holds (the format of ``StatefulStage._state``),
    in figures: kind, keys, open windows, watermark, results pending, the next result's
    number, late records, the sequences taken in per stream. **Unpickles** ``payload``."""
    from headrace.pipeline.stateful import SNAPSHOT_FORMAT
    from headrace.state.disk import is_file_snapshot, unpack

    file_meta: dict[str, Any] | None = None
    if is_file_snapshot(payload):  # an operator kept on disk: a copy of its state file
        file = unpack(payload)
        try:
            state = file.get_meta("stage")
            file_meta = file.get_meta("windows") or file.get_meta("keyed") or {}
        finally:
            file.close()
    else:
        state = pickle.loads(zlib.decompress(payload))
    if not isinstance(state, dict) or not isinstance(state.get("format"), int):
        raise ValueError("not the snapshot of a stateful operator")
    if state["format"] > SNAPSHOT_FORMAT:
        raise ValueError(
            f"the snapshot is in format {state['format']}, newer than this headrace reads "
            f"({SNAPSHOT_FORMAT})"
        )
    taken = {}
    for stream, intervals in sorted(state.get("taken", {}).items()):
        ivs = list(intervals)
        taken[stream] = {
            "sequences": sum(last - first + 1 for first, last in ivs),
            "intervals": len(ivs),
            "first": ivs[0][0] if ivs else None,
            "last": ivs[-1][1] if ivs else None,
        }
    out: dict[str, Any] = {
        "kind": state["kind"],
        "backend": "memory" if file_meta is None else "disk",
        "keys": 0,
        "open_windows": None,
        "results_pending": len(state["pending"]),
        "next_result": state["next_seq"],
        "late": state.get("late", 0),
        "taken": taken,
    }
    windows = state.get("windows")
    if file_meta is not None:
        out.update(_file_figures(file_meta))
    elif windows is not None:
        open_ = windows["windows"]
        out["keys"] = len({w[0] for w in open_})
        out["open_windows"] = len(open_)
        out["assigner"] = _assigner(windows["assigner"])
        out["lateness"] = windows["lateness"] / 1e6
        out["watermark"] = _iso_us(windows["watermark"])
        out["max_event_time"] = _iso_us(windows["max_event_time"])
    else:
        out["keys"] = len(state.get("keyed") or ())
    return out


def _file_figures(meta: dict[str, Any]) -> dict[str, Any]:
    """:func:`decode`'s figures of a disk operator, from its file's counters."""
    if "windows_open" not in meta:  # keyed state
        return {"keys": meta.get("count", 0)}
    return {
        "keys": meta["keys_open"],
        "open_windows": meta["windows_open"],
        "assigner": _assigner(meta["assigner"]),
        "lateness": meta["lateness"] / 1e6,
        "watermark": _iso_us(meta["watermark"]),
        "max_event_time": _iso_us(meta["max_event_time"]),
    }


def summary(found: Found, bucket: str, pipeline: str) -> dict[str, Any]:
    """One operator's head as the JSON output has it."""
    head = found.head
    return {
        "pipeline": head.pipeline or pipeline,
        "operator": found.operator,
        "bucket": bucket,
        "key": found.key,
        "revision": found.revision,
        "epoch": head.epoch,
        "saved": head.saved,
        "lineage": head.lineage,
        "size": head.size,
        "chunks": head.chunks,
        "digest": head.digest,
        "format": head.format,
    }


# -- in words ---------------------------------------------------------------------------------


def _ago(saved: str, now: float) -> str:
    try:
        at = dt.datetime.fromisoformat(saved.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return ""
    return f" ({span_words(max(now - at, 0.0))} ago)"


def _window_words(assigner: dict[str, Any], lateness: float) -> str:
    kind = assigner["type"]
    if kind == "session":
        text = f"session windows, gap {span_words(assigner['gap'])}"
    elif kind == "sliding":
        text = (
            f"sliding windows of {span_words(assigner['size'])} every "
            f"{span_words(assigner['slide'])}"
        )
    else:
        text = f"tumbling windows of {span_words(assigner['size'])}"
    return f"{text}, lateness {span_words(lateness)}"


def describe(obj: dict[str, Any], now: float) -> list[str]:
    """One operator's state (a :func:`summary`, with ``state`` when decoded) in lines."""
    chunks = (
        f"{obj['chunks']} chunk" + ("s" if obj["chunks"] != 1 else "")
        if obj["chunks"]
        else "its head"  # a small snapshot travels in the head itself
    )
    lines = [
        f"{obj['pipeline']}/{obj['operator']}   bucket {obj['bucket']!r}, key {obj['key']}",
        f"  snapshot  epoch {obj['epoch']}, saved {obj['saved']}{_ago(obj['saved'], now)}, "
        f"{bytes_words(obj['size'])} ({obj['size']:,} bytes) in {chunks}",
        f"  lineage   {obj['lineage']}",
    ]
    state = obj.get("state")
    if state is None:
        return lines
    where = ", kept on disk" if state.get("backend") == "disk" else ""
    if state["open_windows"] is None:
        lines.append(f"  kind      keyed state ({state['kind']}){where}, {state['keys']:,} keys")
    else:
        lines.append(f"  kind      {_window_words(state['assigner'], state['lateness'])}{where}")
        lines.append(f"  windows   {state['open_windows']:,} open, of {state['keys']:,} keys")
        mark = state["watermark"] or "none yet"
        newest = state["max_event_time"] or "none yet"
        lines.append(f"  watermark {mark}   newest event time {newest}")
    lines.append(
        f"  results   {state['results_pending']:,} pending (not known to be committed when "
        f"saved), next #{state['next_result']:,}"
    )
    lines.append(f"  late      {state['late']:,} records")
    for stream, t in state["taken"].items():
        span = f" ({t['first']}..{t['last']})" if t["first"] is not None else ""
        lines.append(
            f"  taken     {stream}: {t['sequences']:,} sequences above the ack floor in "
            f"{t['intervals']:,} interval{'s' if t['intervals'] != 1 else ''}{span}"
        )
    if not state["taken"]:
        lines.append("  taken     nothing above the ack floors")
    return lines


# -- the commands -----------------------------------------------------------------------------


def _run(args: argparse.Namespace, body: Callable[[JetStream], Awaitable[int]]) -> int:
    """Connect and run ``body`` as the stream tools do (:mod:`headrace.cli.session`), with
    exit code 2 for its failures, as ``checkpoints`` and ``outputs``."""
    code = run_with_jetstream(args, f"{PROG} {args.action}", body)
    return EXIT_USAGE if code == EXIT_FAILED else code


async def _bucket(js: JetStream, bucket: str) -> KeyValue:
    try:
        return await open_bucket(js, bucket)
    except BucketNotFound:
        raise StateCommandError(
            f"there is no state bucket {bucket!r} in this NATS system (no stateful pipeline "
            "saved a snapshot to it; --bucket names another: the pipeline's state_bucket)"
        ) from None


def show_command(args: argparse.Namespace) -> int:
    async def body(js: JetStream) -> int:
        kv = await _bucket(js, args.bucket)
        found = await find(kv, args.pipeline, args.operator)
        objs = []
        for one in found:
            state = None
            if args.decode:
                one, payload = await read_snapshot(kv, args.pipeline, one)
                try:
                    state = decode(payload)
                except Exception as exc:
                    raise StateCommandError(
                        f"the snapshot of {args.pipeline}/{one.operator} (epoch "
                        f"{one.head.epoch}) does not decode here: {type(exc).__name__}: {exc} "
                        "(are the classes of its keys and values importable? PYTHONPATH)"
                    ) from None
            obj = summary(one, kv.bucket, args.pipeline)
            if state is not None:
                obj["state"] = state
            objs.append(obj)
        now = time.time()
        for i, obj in enumerate(objs):
            if args.json:
                print(json.dumps(obj, sort_keys=True), flush=True)
                continue
            if i:
                print()
            print("\n".join(describe(obj, now)), flush=True)
        if not args.json and not args.decode:
            print(
                "(--decode also shows what the snapshots hold: keys, windows, results; it "
                "unpickles them)",
                flush=True,
            )
        return EXIT_OK

    return _run(args, body)


def confirm(question: str, stdin: TextIO, out: TextIO) -> bool:
    """Ask ``question`` on ``out`` and read the answer from ``stdin``: True for y or yes.
    :class:`StateCommandError` when ``stdin`` is not a terminal (nobody to answer)."""
    try:
        interactive = stdin.isatty()
    except (AttributeError, ValueError):
        interactive = False
    if not interactive:
        raise StateCommandError(
            "reset removes the operator's state for good: confirm with --yes (standard input "
            "is not a terminal to ask on)"
        )
    out.write(f"{question} [y/N] ")
    out.flush()
    answer = stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def reset_command(args: argparse.Namespace) -> int:
    where = f"{args.pipeline}/{args.operator}"
    if not args.yes:
        found: list[Found] = []

        async def look(js: JetStream) -> int:
            kv = await _bucket(js, args.bucket)
            found.extend(await find(kv, args.pipeline, args.operator))
            return EXIT_OK

        code = _run(args, look)
        if code != EXIT_OK:
            return code
        head = found[0].head
        question = (
            f"Reset the state of {where} in bucket {args.bucket!r} (epoch {head.epoch}, saved "
            f"{head.saved}, {bytes_words(head.size)})? Its next run starts afresh; a worker "
            "running it now stops with StateFenced."
        )
        try:
            yes = confirm(question, sys.stdin, sys.stderr)
        except StateCommandError as exc:
            say(f"{PROG} reset", str(exc))
            return EXIT_USAGE
        if not yes:
            say(f"{PROG} reset", f"not confirmed: the state of {where} is kept")
            return EXIT_USAGE

    async def body(js: JetStream) -> int:
        kv = await _bucket(js, args.bucket)
        store = SnapshotStore(kv, args.pipeline, args.operator)
        one = await _read_head(kv, store.head_key)
        if one is None:
            await find(kv, args.pipeline, args.operator)  # says what there is
        # The head first: a worker saving meanwhile is fenced off at once rather than
        # leaving a head behind; then its chunks (and what the worker wrote meanwhile).
        await kv.purge(store.head_key)
        await store.reset()
        assert one is not None
        print(
            f"reset the state of {where} (bucket {args.bucket!r}): snapshot epoch "
            f"{one.head.epoch} of lineage {one.head.lineage} removed; the operator's next run "
            "starts afresh",
            flush=True,
        )
        return EXIT_OK

    return _run(args, body)
