"""``headrace bench range-read``: how a Spark task of the ``jetstream`` source should read its
range of stream sequences, in plain Python (no Spark): the batched Direct Gets the reader uses
(``JetStreamAPI.direct_get_batch``, ADR-31) against a consumer made for the range and deleted
after it (an ordered push consumer, and an ephemeral pull consumer with ack none), both
starting at the range's first sequence (``deliver_policy`` ``by_start_sequence``).

Setup: one private nats-server with JetStream (file storage); stream ``RANGE`` (subjects
``range.>``, ``allow_direct``) loaded with N messages of ``--payload`` bytes (300,000 x 128 B by
default), every publish acknowledged. Then each implementation, in a fresh process of its own,
reads sequences 1 to N once, as one task reads its range:

- ``direct-get-batch``: ``direct_get_batch(stream, fetch, seq=next)`` (the general API: a
  ``StoredMessage`` per message, its headers parsed) until the range is read (``fetch`` 10,000
  by default: the source's ``fetchBatch``);
- ``reader``: the source's own task code, ``headrace_spark.datasource.reading.read_range``
  (batched Direct Gets whose answers are read straight into columns, the stream checked
  first): what a Spark task does besides handing the batches to Spark;
- ``ordered-consumer``: ``js.subscribe(stream=..., ordered=True)`` with ``by_start_sequence``
  (an ephemeral push consumer, flow control, no acks), ``next_batch()`` until the range's end;
- ``pull-ack-none``: ``create_consumer`` of an ephemeral pull consumer (ack none,
  ``by_start_sequence``), ``consume(max_messages=fetch)`` and ``next_batch()`` until the
  range's end, then ``delete``.

Each turns every message into the source's row (subject, data, the message's own headers, the
stream sequence, the time it was stored in microseconds) and the rows into Arrow batches of
``fetch`` rows with the source's schema, as the task hands them to Spark; the sequences are
checked (1 to N, each once, in order). The clock runs from before the connection is made to
after the consumer is deleted (the direct reads have nothing to delete): what one task pays;
imports are off it. Figures: ``msg_per_s``, the client's CPU seconds (``client_cpu_s``, all its
threads) and nats-server's (measured from the parent over the child's life) per 100k messages,
and the child's peak RSS (``VmHWM``); ``ratio_vs_reader``: each line's msg/s over the
reader's.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio
from headrace.localserver import LocalServer

from headrace_bench.consume import (
    BenchmarkError,
    _cpu_seconds,
    _failure,
    _last_json,
    _peak_rss_mb,
    _run_child,
    _stored,
)

STREAM = "RANGE"
SUBJECTS = "range.>"
IMPLS = ("reader", "direct-get-batch", "ordered-consumer", "pull-ack-none")
MESSAGES = 300_000
PAYLOAD = 128
#: Messages per Direct Get batch, and the pull consumer's consume buffer (the source's
#: ``fetchBatch`` default).
FETCH = 10_000
LOAD_WINDOW = 2000
#: A read that gets nothing for this long has stalled (reported, not waited out).
IDLE = 10.0
CHILD_TIMEOUT = 600.0
_ME = [sys.executable, "-m", "headrace_bench.range_read"]


def payload(i: int, size: int) -> bytes:
    """Message ``i``'s body: ``size`` bytes, different for each message (parquet and the
    server's compression, if any, see no constant)."""
    unit = f"m-{i:010d}-".encode()
    return (unit * (size // len(unit) + 1))[:size]


async def load(url: str, n: int, size: int, stream: str, subjects: str) -> dict[str, Any]:
    """Create ``stream`` (``allow_direct``) and publish ``n`` messages of ``size`` bytes on 16
    subjects under ``subjects`` (a ``prefix.>`` wildcard), every one acknowledged."""
    from headrace.jetstream import JetStream, StreamConfig, publish_acked
    from headrace.nats import connect

    prefix = subjects.removesuffix(">")
    names = [f"{prefix}{k}" for k in range(16)]
    async with connect(url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name=stream, subjects=[subjects], allow_direct=True))
        messages = ((names[i % 16], payload(i, size), None) for i in range(n))
        done = await publish_acked(nc, messages, window=LOAD_WINDOW)
        stored = await _stored(js, n, done.refused, stream)
        info = await js.stream_info(stream)
    return {
        "stored": stored,
        "load_msg_per_s": round(done.msg_per_s),
        "payload_bytes": done.payload_bytes,
        "stream_bytes": info.state.bytes,
    }


class _Seqs:
    """Checks that the sequences read are 1 to N, each once, in order."""

    def __init__(self) -> None:
        self.next = 1
        self.problems: list[str] = []

    def bad(self, seq: int) -> None:
        if len(self.problems) < 3:
            self.problems.append(f"read sequence {seq}, expected {self.next}")


# -- the implementations (in the children) ----------------------------------------------------


class _Rows:
    """The source's rows as Arrow batches of ``fetch`` rows (the schema of
    ``headrace_spark.datasource.reading.ARROW_SCHEMA``), built from what a read returns: what
    the source's task does with every message, whichever way it was read."""

    def __init__(self, fetch: int) -> None:
        import pyarrow as pa
        from headrace_spark.datasource import ARROW_SCHEMA

        self.pa = pa
        self.schema = ARROW_SCHEMA
        self.fetch = fetch
        self.batches = 0
        self.subjects: list[str] = []
        self.data: list[bytes] = []
        self.headers: list[Any] = []
        self.seqs: list[int] = []
        self.times: list[int | None] = []

    def add(self, subject: str, data: bytes, headers: Any, seq: int, micros: int | None) -> None:
        self.subjects.append(subject)
        self.data.append(data)
        self.headers.append(headers)
        self.seqs.append(seq)
        self.times.append(micros)
        if len(self.seqs) >= self.fetch:
            self.take()

    def take(self) -> None:
        pa, schema, n = self.pa, self.schema, len(self.seqs)
        if not n:
            return
        pa.RecordBatch.from_arrays(
            [
                pa.array(self.subjects, pa.string()),
                pa.array(self.data, pa.binary()),
                pa.array(self.headers, schema.field("headers").type),
                pa.array([STREAM] * n, pa.string()),
                pa.array(self.seqs, pa.int64()),
                pa.array(self.times, schema.field("timestamp").type),
            ],
            schema=schema,
        )
        self.batches += 1
        self.subjects, self.data, self.headers, self.seqs, self.times = [], [], [], [], []


async def _direct(url: str, n: int, fetch: int) -> dict[str, Any]:
    from headrace.jetstream import JetStream
    from headrace.nats import connect
    from headrace.state import to_micros
    from headrace_spark.datasource import user_headers

    seqs = _Seqs()
    rows = _Rows(fetch)
    requests = 0
    async with connect(url) as nc:
        js = JetStream(nc)
        while seqs.next <= n:
            want = min(fetch, n - seqs.next + 1)
            with trio.move_on_after(IDLE):
                got = await js.direct_get_batch(STREAM, want, seq=seqs.next)
            requests += 1
            if not got.messages:
                break  # stalled: reported
            expected = seqs.next
            for stored in got.messages:
                when = stored.time
                rows.add(
                    stored.subject,
                    stored.data,
                    user_headers(stored.headers),
                    stored.seq,
                    None if when is None else to_micros(when),
                )
                if stored.seq != expected:
                    seqs.bad(stored.seq)
                expected = stored.seq + 1
            seqs.next = expected
        rows.take()
    return {"seqs": seqs, "requests": requests, "arrow_batches": rows.batches}


async def _reader(url: str, n: int, fetch: int) -> dict[str, Any]:
    from headrace.commits import StreamIdentity
    from headrace.jetstream import JetStream
    from headrace.nats import connect
    from headrace_spark.datasource import SequenceRange, SourceSpec, read_range

    seqs = _Seqs()
    batches = 0
    # The task's range as the driver plans it (off the clock in Spark too: the driver's work).
    async with connect(url) as nc:
        created = StreamIdentity.of(
            STREAM, (await JetStream(nc).stream_info(STREAM)).created
        ).created
    spec = SourceSpec.from_options(
        {"servers": url, "stream": STREAM, "fetchBatch": str(fetch)}, streaming=False
    )
    part = SequenceRange(0, STREAM, created, 1, n)

    async def emit(batch: Any) -> None:
        nonlocal batches
        batches += 1
        column = batch.column(batch.schema.get_field_index("seq"))
        first, last = column[0].as_py(), column[-1].as_py()
        if first != seqs.next or last - first + 1 != batch.num_rows:
            seqs.bad(first)
        seqs.next = last + 1

    await read_range(spec, part, emit)
    return {"seqs": seqs, "arrow_batches": batches}


async def _ordered(url: str, n: int, fetch: int) -> dict[str, Any]:
    from headrace.jetstream import ConsumerConfig, DeliverPolicy, JetStream
    from headrace.nats import connect

    seqs = _Seqs()
    rows = _Rows(fetch)
    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=1)
    async with connect(url) as nc:
        js = JetStream(nc)
        async with js.subscribe(stream=STREAM, ordered=True, config=config) as sub:
            while seqs.next <= n:
                batch = []
                with trio.move_on_after(IDLE):
                    batch = await sub.next_batch()
                if not batch:
                    break
                _check_consumed(seqs, rows, batch)
                rows.take()
            recreated = getattr(sub, "recreated", 0)
    return {"seqs": seqs, "recreated": recreated, "arrow_batches": rows.batches}


async def _pull(url: str, n: int, fetch: int) -> dict[str, Any]:
    from headrace.jetstream import AckPolicy, ConsumerConfig, DeliverPolicy, JetStream
    from headrace.nats import connect

    seqs = _Seqs()
    rows = _Rows(fetch)
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE,
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=1,
        inactive_threshold=60.0,  # the server removes it if this process dies
    )
    async with connect(url) as nc:
        js = JetStream(nc)
        info = await js.create_consumer(STREAM, config)
        consumer = await js.pull_consumer(STREAM, info.name)
        try:
            async with consumer.consume(max_messages=fetch) as messages:
                while seqs.next <= n:
                    batch = []
                    with trio.move_on_after(IDLE):
                        batch = await messages.next_batch()
                    if not batch:
                        break
                    _check_consumed(seqs, rows, batch)
                rows.take()
                requests = messages.requests_sent
        finally:
            with trio.CancelScope(shield=True):
                await consumer.delete()
    return {"seqs": seqs, "pull_requests": requests, "arrow_batches": rows.batches}


def _check_consumed(seqs: _Seqs, rows: _Rows, batch: list[Any]) -> None:
    expected = seqs.next
    for msg in batch:
        meta = msg.metadata
        hdrs = msg.headers
        rows.add(
            msg.subject,
            msg.data,
            None if hdrs is None else list(hdrs.as_dict().items()) or None,
            meta.stream_seq,
            meta.timestamp_ns // 1000,
        )
        if meta.stream_seq != expected:
            seqs.bad(meta.stream_seq)
        expected = meta.stream_seq + 1
    seqs.next = expected


READERS: dict[str, Callable[[str, int, int], Awaitable[dict[str, Any]]]] = {
    "direct-get-batch": _direct,
    "reader": _reader,
    "ordered-consumer": _ordered,
    "pull-ack-none": _pull,
}


def _child(args: argparse.Namespace) -> dict[str, Any]:
    from headrace.pipeline import tune_gc

    # Imports off the clock (a task's Python worker has them loaded after its first task);
    # the reader's module brings pyarrow and pyspark, about 1 s.
    for module in ("headrace.jetstream", "headrace.nats", "headrace_spark.datasource"):
        importlib.import_module(module)
    from headrace_spark.datasource import read_range  # noqa: F401 - loads the reader's module

    tune_gc()
    started = time.perf_counter()
    cpu = time.process_time()
    raw = trio.run(READERS[args.impl], args.url, args.messages, args.fetch)
    elapsed = time.perf_counter() - started
    cpu_s = time.process_time() - cpu
    seqs: _Seqs = raw.pop("seqs")
    problems = list(seqs.problems)
    if seqs.next != args.messages + 1:
        problems.append(f"read up to sequence {seqs.next - 1}, not {args.messages}")
    return {
        "impl": args.impl,
        "msgs": seqs.next - 1,
        "seconds": elapsed,
        "client_cpu_s": round(cpu_s, 3),
        "peak_rss_mb": _peak_rss_mb(),
        "problems": problems,
        **raw,
    }


# -- the parent -------------------------------------------------------------------------------


def _measure(impl: str, url: str, n: int, fetch: int, server_pid: int | None) -> dict[str, Any]:
    cmd = [*_ME, "child", "--impl", impl, "--url", url]
    cmd += ["--messages", str(n), "--fetch", str(fetch)]
    before = _cpu_seconds(server_pid) if server_pid is not None else None
    child = _run_child(cmd, timeout=CHILD_TIMEOUT)
    server_cpu = (
        _cpu_seconds(server_pid) - before if server_pid is not None and before is not None else None
    )
    raw = _last_json(child)
    result: dict[str, Any] = {"bench": "range-read", "impl": impl, "expected": n, "fetch": fetch}
    if child.returncode != 0 or raw is None:
        result.update(msgs=0, error=_failure(child))
        return result
    problems = raw.pop("problems")
    seconds = raw.pop("seconds")
    result["msgs"] = raw.pop("msgs")
    if problems:
        result["error"] = "; ".join(problems)
    else:
        result["seconds"] = round(seconds, 3)
        result["msg_per_s"] = round(n / seconds) if seconds > 0 else 0
        result["client_cpu_s_per_100k"] = round(raw["client_cpu_s"] * 100_000 / n, 3)
        if server_cpu is not None:
            result["server_cpu_s"] = round(server_cpu, 3)
            result["server_cpu_s_per_100k"] = round(server_cpu * 100_000 / n, 3)
    raw.pop("impl", None)
    result.update(raw)
    return result


def _print_table(results: list[dict[str, Any]], load: dict[str, Any], size: int) -> None:
    print(
        f"stream loaded: {load['stored']:,} messages x {size} B at {load['load_msg_per_s']:,} "
        "msg/s; each implementation reads sequences 1 to N once"
    )
    for r in results:
        if "error" in r:
            print(f"{r['impl']:>17}: FAILED: {r['error']}")
            continue
        ratio = r.get("ratio_vs_reader")
        print(
            f"{r['impl']:>17}: {r['msg_per_s']:>9,} msg/s  {r['seconds']:6.2f} s  CPU s/100k: "
            f"client {r['client_cpu_s_per_100k']:.2f} server "
            f"{r.get('server_cpu_s_per_100k', float('nan')):.2f}  peak RSS "
            f"{r['peak_rss_mb']} MB" + (f"  ({ratio}x reader)" if ratio else "")
        )


def run(
    messages: int = MESSAGES,
    size: int = PAYLOAD,
    *,
    fetch: int = FETCH,
    impls: tuple[str, ...] = IMPLS,
    as_json: bool = False,
) -> list[dict[str, Any]]:
    """Load the stream, read it once per implementation (each in its own process), print JSON
    lines or a table; returns the lines (a failed read has ``error`` and no figures)."""
    if messages < 1 or size < 1 or fetch < 1:
        raise BenchmarkError("--messages, --payload and the fetch size must be at least 1")
    with LocalServer(jetstream=True) as server:
        loaded = trio.run(load, server.url, messages, size, STREAM, SUBJECTS)
        measure = partial(_measure, url=server.url, n=messages, fetch=fetch)
        results = [measure(impl, server_pid=server.pid) for impl in impls]
    base = next((r for r in results if r["impl"] == "reader"), None)
    for r in results:
        r["payload"] = size
        if base is not None and r is not base and r.get("msg_per_s") and base.get("msg_per_s"):
            r["ratio_vs_reader"] = round(r["msg_per_s"] / base["msg_per_s"], 2)
    if as_json:
        for r in results:
            print(json.dumps(r), flush=True)
    else:
        _print_table(results, loaded, size)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m headrace_bench.range_read")
    parser.add_argument("role", nargs="?", choices=["child"])
    parser.add_argument("--impl", choices=IMPLS, default="direct-get-batch")
    parser.add_argument("--url")
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--payload", type=int, default=PAYLOAD)
    parser.add_argument("--fetch", type=int, default=FETCH)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.role == "child":
        print(json.dumps(_child(args)), flush=True)
    else:
        run(args.messages, args.payload, fetch=args.fetch, as_json=args.json)


if __name__ == "__main__":
    main()
