"""``headrace bench``: the benchmark command, registered through the ``headrace.commands``
entry-point group (``bench = "headrace_bench.cli:add_parser"`` in bench/pyproject.toml).

This module stays light: ``headrace bench --help`` and the refusals of misused options import
no benchmark, nats-py or Spark; each benchmark's module is imported when it runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(commands: Any) -> None:
    """Add ``bench`` to ``headrace``'s subcommands (``commands`` is argparse's subparsers
    action; the parser it makes is of the framework's parser class)."""
    bench = commands.add_parser(
        "bench",
        help="measure headrace against the clients a user would pick instead",
        description=(
            "Benchmarks print one line (or JSON object) per implementation, measured in the "
            "same run, with headrace's ratio against each peer and peak RSS."
        ),
    )
    bench.add_argument(
        "what",
        choices=[
            "core",
            "consume",
            "publish",
            "pipeline",
            "e2e",
            "checkpoints",
            "scale",
            "spark",
            "range-read",
            "windows",
        ],
        help=(
            "core: core NATS subscriber throughput vs nats-py; consume: JetStream consume "
            "throughput (ack none and ack every message) vs nats-py fetch; publish: JetStream "
            "publish throughput, every message acknowledged by the stream: headrace's "
            "asynchronous publish vs its synchronous one, nats-py publish_async, and libnats "
            "js_PublishAsync and nats.js when installed (--anchors installs them); pipeline: a "
            "source-map-sink pipeline acking after commit vs the same loop in nats-py; e2e: "
            "JetStream into Spark parquet files through SparkSink, acking after commit, vs "
            "nats-py fetch + PySpark Rows (needs the spark extra and Java); checkpoints: "
            "events/s through checkpointed subscriptions over 200 entities with a 1 ms handler "
            "vs a serial nats-py loop (--messages: use 10000 or so); scale: N worker processes "
            "sharing one consumer and one Spark output (Arrow writer, shared commits) vs one "
            "process with the local ledger (needs the spark extra, not Java); spark: JetStream "
            "into parquet through Spark's engine (the jetstream data source: a streaming query "
            "per --partitions value and a batch read) vs the pipeline into SparkSink and the "
            "nats-py + PySpark loop (needs the spark extra and Java); range-read: one range of "
            "a stream read as a jetstream source task reads it (batched Direct Get) vs an "
            "ordered consumer and an ephemeral ack-none pull consumer (needs the spark extra); "
            "windows: per-user counts of JSON clicks in one-minute tumbling windows of event "
            "time (lateness 30 s) through a pipeline's window operator, exactly once with its "
            "snapshots in KV, vs Bytewax 0.21 fed by nats-py fetch (acked when fetched), both "
            "checked against the counts computed from the generated clicks"
        ),
    )
    bench.add_argument(
        "--messages",
        type=int,
        default=None,
        help=(
            "default: 200000 (checkpoints: 10000; spark and range-read: 300000; windows: "
            "1000000 clicks)"
        ),
    )
    bench.add_argument(
        "--payload",
        type=int,
        default=None,
        help="bytes per message (128; not for e2e, scale, windows)",
    )
    bench.add_argument(
        "--entities",
        type=int,
        default=None,
        help=(
            "checkpoints: entities the events are spread over (200); windows: users the "
            "clicks are spread over (1000: more users, more state)"
        ),
    )
    bench.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="checkpoints only: the workers' concurrency (default: theirs, min(CPUs x 5, 20))",
    )
    bench.add_argument(
        "--window-size",
        type=int,
        default=None,
        help=(
            "windows only: the tumbling windows' size in seconds (60); with many --entities, "
            "a longer window keeps more windows open at once (more state)"
        ),
    )
    bench.add_argument("--json", action="store_true", help="one JSON object per line")
    bench.add_argument(
        "--anchors",
        action="store_true",
        help=(
            "consume: also run the peer anchors (libnats, nats.js) from ../shared/anchors "
            "against the same stream; publish: install the peers it runs when found (libnats, "
            "nats.js). Either may apt-get install libnats-dev and npm install nats@2 (off by "
            "default: it installs software and needs the network)"
        ),
    )
    bench.add_argument(
        "--max-pending",
        type=int,
        default=None,
        help=(
            "publish only: PubAcks outstanding at once, every implementation (4000, nats.go's "
            "default)"
        ),
    )
    bench.add_argument(
        "--buffer",
        type=int,
        default=None,
        help=(
            "consume, pipeline, e2e, scale, spark and windows: headrace's consume max_messages "
            "(defaults 10000 and the pipeline benchmark's own; see bench/README.md); range-read: "
            "the messages per Direct Get batch and the pull consumer's buffer (10000)"
        ),
    )
    bench.add_argument(
        "--anchor-window",
        type=int,
        default=None,
        help=(
            "consume with --anchors: the anchors' pull window ($ANCHOR_BATCH; default: "
            "headrace's --buffer, so both pull the same number of messages at a time)"
        ),
    )
    bench.add_argument(
        "--batch",
        type=int,
        default=None,
        help=(
            "e2e, scale and spark: records per batch, every implementation (defaults: e2e and "
            "spark 100000, scale 10000; spark: the sparksink and naive lines)"
        ),
    )
    bench.add_argument(
        "--workers",
        type=_worker_counts,
        default=None,
        metavar="N,N,...",
        help="scale only: the worker counts to measure, comma-separated (default: 1,2,4)",
    )
    bench.add_argument(
        "--partitions",
        type=_partition_counts,
        default=None,
        metavar="N,N,...",
        help=(
            "spark only: the streaming source's numPartitions, one line each, comma-separated "
            "(default: 1,2,4; the batch read runs at the source's default and at 2)"
        ),
    )
    bench.add_argument(
        "--spark-master",
        default=None,
        metavar="URL",
        help="e2e only: the Spark master of both sessions (default: local[*])",
    )
    bench.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    from headrace.localserver import LocalServerError

    if args.messages is None:
        args.messages = {
            "checkpoints": 10_000,
            "spark": 300_000,
            "range-read": 300_000,
            "windows": 1_000_000,
        }.get(args.what, 200_000)
    if args.anchors and args.what not in ("consume", "publish"):
        print(
            "headrace bench: --anchors applies to `bench consume` and `bench publish` only",
            file=sys.stderr,
        )
        return 2
    if args.max_pending is not None and args.what != "publish":
        print("headrace bench: --max-pending applies to `bench publish` only", file=sys.stderr)
        return 2
    if args.anchor_window is not None and not args.anchors:
        print("headrace bench: --anchor-window needs --anchors", file=sys.stderr)
        return 2
    if args.what not in ("e2e", "scale", "spark") and args.batch is not None:
        print(
            "headrace bench: --batch applies to `bench e2e`, `bench scale` and `bench spark` only",
            file=sys.stderr,
        )
        return 2
    if args.what != "spark" and args.partitions is not None:
        print("headrace bench: --partitions applies to `bench spark` only", file=sys.stderr)
        return 2
    if args.what != "e2e" and args.spark_master is not None:
        print("headrace bench: --spark-master applies to `bench e2e` only", file=sys.stderr)
        return 2
    if args.what != "scale" and args.workers is not None:
        print("headrace bench: --workers applies to `bench scale` only", file=sys.stderr)
        return 2
    if args.what == "e2e":
        return _bench_e2e(args)
    if args.what == "scale":
        return _bench_scale(args)
    if args.what == "spark":
        return _bench_spark(args)
    if args.what == "range-read":
        return _bench_range_read(args)
    if args.what == "windows":
        return _bench_windows(args)
    if args.what == "publish":
        return _bench_publish(args)
    if args.payload is None:
        args.payload = 128
    if args.what == "core":
        from headrace_bench import core

        try:
            core.run(args.messages, args.payload, list(core.IMPLS), args.json)
        except LocalServerError as exc:
            print(f"headrace bench: {exc}", file=sys.stderr)
            return 2
    elif args.what == "consume":
        from headrace_bench import consume

        try:
            results = consume.run(
                args.messages,
                args.payload,
                anchors=args.anchors,
                as_json=args.json,
                buffer=args.buffer or consume.HEADRACE_BUFFER,
                anchor_window=args.anchor_window,
            )
        except (LocalServerError, consume.BenchmarkError) as exc:
            print(f"headrace bench: {exc}", file=sys.stderr)
            return 2
        if any(r["impl"] == "headrace" and "error" in r for r in results):
            return 1  # headrace failed a correctness check: no figure to trust
    elif args.what == "checkpoints":
        from headrace_bench import checkpoints, consume

        try:
            results = checkpoints.run(
                args.messages,
                entities=args.entities or checkpoints.ENTITIES,
                concurrency=args.concurrency,
                as_json=args.json,
            )
        except (LocalServerError, consume.BenchmarkError) as exc:
            print(f"headrace bench: {exc}", file=sys.stderr)
            return 2
        if any(r["impl"] == "headrace-checkpoints" and "error" in r for r in results):
            return 1
    elif args.what == "pipeline":
        from headrace_bench import consume, pipeline

        try:
            kwargs = {"buffer": args.buffer} if args.buffer else {}
            results = pipeline.run(args.messages, args.payload, as_json=args.json, **kwargs)
        except (LocalServerError, consume.BenchmarkError) as exc:
            print(f"headrace bench: {exc}", file=sys.stderr)
            return 2
        if any(r["impl"] == "headrace-pipeline" and "error" in r for r in results):
            return 1
    return 0


def _bench_e2e(args: argparse.Namespace) -> int:
    from headrace.localserver import LocalServerError

    from headrace_bench import consume, e2e

    if args.payload is not None:
        print(
            "headrace bench: `bench e2e` publishes JSON orders of about 150 bytes; --payload "
            "does not apply",
            file=sys.stderr,
        )
        return 2
    try:
        results = e2e.run(
            args.messages,
            batch=args.batch or e2e.BATCH,
            buffer=args.buffer or e2e.BUFFER,
            spark_master=args.spark_master or "local[*]",
            as_json=args.json,
        )
    except (LocalServerError, consume.BenchmarkError) as exc:
        print(f"headrace bench: {exc}", file=sys.stderr)
        return 2
    if any(r["impl"].startswith("headrace") and not r.get("verified") for r in results):
        return 1  # headrace failed a check: no figure to trust
    return 0


def _bench_scale(args: argparse.Namespace) -> int:
    from headrace.localserver import LocalServerError

    from headrace_bench import consume, scale

    if args.payload is not None:
        print(
            "headrace bench: `bench scale` publishes JSON orders of about 150 bytes; --payload "
            "does not apply",
            file=sys.stderr,
        )
        return 2
    try:
        results = scale.run(
            args.messages,
            workers=args.workers or scale.WORKERS,
            batch=args.batch or scale.BATCH,
            buffer=args.buffer or scale.BUFFER,
            as_json=args.json,
        )
    except (LocalServerError, consume.BenchmarkError) as exc:
        print(f"headrace bench: {exc}", file=sys.stderr)
        return 2
    if any(not r.get("verified") for r in results):
        return 1  # every implementation is headrace's: a failed check leaves no figure to trust
    return 0


def _bench_spark(args: argparse.Namespace) -> int:
    from headrace.localserver import LocalServerError

    from headrace_bench import consume
    from headrace_bench import spark as spark_bench

    try:
        results = spark_bench.run(
            args.messages,
            payload=args.payload or spark_bench.PAYLOAD,
            partitions=args.partitions or spark_bench.PARTITIONS,
            batch=args.batch or spark_bench.BATCH,
            buffer=args.buffer or spark_bench.BUFFER,
            as_json=args.json,
        )
    except (LocalServerError, consume.BenchmarkError) as exc:
        print(f"headrace bench: {exc}", file=sys.stderr)
        return 2
    if any(not r.get("verified") for r in results):
        return 1  # a line wrote other than every message once: no figure to trust
    return 0


def _bench_range_read(args: argparse.Namespace) -> int:
    from headrace.localserver import LocalServerError

    from headrace_bench import consume, range_read

    try:
        results = range_read.run(
            args.messages,
            args.payload or range_read.PAYLOAD,
            fetch=args.buffer or range_read.FETCH,
            as_json=args.json,
        )
    except (LocalServerError, consume.BenchmarkError) as exc:
        print(f"headrace bench: {exc}", file=sys.stderr)
        return 2
    if any("error" in r for r in results):
        return 1
    return 0


def _bench_publish(args: argparse.Namespace) -> int:
    from headrace.localserver import LocalServerError

    from headrace_bench import consume, publish

    try:
        results = publish.run(
            args.messages,
            128 if args.payload is None else args.payload,
            max_pending=args.max_pending or publish.MAX_PENDING,
            anchors=args.anchors,
            as_json=args.json,
        )
    except (LocalServerError, consume.BenchmarkError) as exc:
        print(f"headrace bench: {exc}", file=sys.stderr)
        return 2
    if any(r["impl"].startswith("headrace") and "error" in r for r in results):
        return 1  # headrace failed a check: no figure to trust
    return 0


def _bench_windows(args: argparse.Namespace) -> int:
    from headrace.localserver import LocalServerError

    from headrace_bench import consume, windows

    if args.payload is not None:
        print(
            "headrace bench: `bench windows` publishes JSON clicks of about 60 bytes; --payload "
            "does not apply",
            file=sys.stderr,
        )
        return 2
    try:
        results = windows.run(
            args.messages,
            buffer=args.buffer or windows.BUFFER,
            users=args.entities or windows.USERS,
            window_s=args.window_size or windows.WINDOW_S,
            as_json=args.json,
        )
    except (LocalServerError, consume.BenchmarkError) as exc:
        print(f"headrace bench: {exc}", file=sys.stderr)
        return 2
    if any(not r.get("verified") for r in results):
        return 1  # a line's windows differ from the expected counts: no figure to trust
    return 0


def _partition_counts(text: str) -> tuple[int, ...]:
    """``--partitions 1,2,4`` (bench spark); imported only when the option is given."""
    from headrace_bench.spark import parse_partitions

    try:
        return parse_partitions(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _worker_counts(text: str) -> tuple[int, ...]:
    """``--workers 1,2,4`` (bench scale); imported only when the option is given."""
    from headrace_bench.scale import parse_workers

    try:
        return parse_workers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
