"""Exactly once through the ``jetstream`` Spark format under faults: the Spark queries run in
child processes (jetstream_child.py) so that their driver can be SIGKILLed, and each test counts
what is read back at the end, every id published exactly once (0 missing, 0 duplicated).

- the driver (JVM, Python workers and all) SIGKILLed mid-query, jetstream -> parquet, and the
  query taken over from its checkpoint with ``Trigger.AvailableNow`` by a standby driver;
- nats-server SIGKILLed and restarted (same port, same store) under a running query;
- the leader of an R3 stream killed under a running query while messages are published (each
  publish retried through the election), and the node started again;
- the same driver kill as the first, jetstream -> jetstream, in the middle of a micro-batch's
  publishing: the batch runs again with the same ``Nats-Msg-Id``s, which the stream drops;
- each sink task failing after it published part of its rows, retried by Spark (a batch
  write, then a streaming one).

A query that fails under a fault is started again on its checkpoint (the child's
``--restarts``), as an application keeping it running would; each test reports (with ``-s``)
which way it went and the errors met. What the file sink wrote is read back as Spark reads it
(the files its ``_spark_metadata`` log lists, with pyarrow), the sink's streams with nats-py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow.parquet as pq
import pytest
import trio

from tests.natspy_peer import NatsPyPeer, once_placed_natspy
from tests.spark.spark_procs import Child, child

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.spark_children]

#: How long a child's query may take (a loaded 2-core machine, a JVM starting).
QUERY_TIMEOUT = 150


# -- ids ------------------------------------------------------------------------------------------


def payload(i: int, pad: int = 0) -> bytes:
    return b"id-%d:" % i + b"x" * pad


def ident(data: bytes) -> int:
    return int(bytes(data).split(b":", 1)[0].removeprefix(b"id-").removeprefix(b"row-"))


def exactness(ids: Iterable[int], n: int) -> dict[str, int]:
    """Rows read, ids of ``0 .. n-1`` missing, repeats, and ids that were never published."""
    counts = Counter(ids)
    expected = set(range(n))
    return {
        "rows": sum(counts.values()),
        "missing": len(expected - set(counts)),
        "duplicated": sum(c - 1 for c in counts.values() if c > 1),
        "strangers": len(set(counts) - expected),
    }


def exact(n: int) -> dict[str, int]:
    return {"rows": n, "missing": 0, "duplicated": 0, "strangers": 0}


def committed_files(out: Path) -> set[Path]:
    """The files the file sink committed, as its ``_spark_metadata`` log lists them (what a
    Spark reader of ``out`` reads): a file of a batch whose driver died before the batch's
    log entry is on disk, and is no part of the output."""
    files: set[Path] = set()
    for entry in (out / "_spark_metadata").iterdir():
        if entry.name.startswith("."):
            continue  # checksums, a log entry being written
        version, *lines = entry.read_text().splitlines()
        assert version == "v1", entry
        for line in lines:
            status = json.loads(line)
            path = Path(unquote(urlsplit(status["path"]).path))
            if status["action"] == "add":
                files.add(path)
            else:
                files.discard(path)
    return files


def parquet_ids(out: Path) -> list[int]:
    """The ids in the file sink's output (its committed files only)."""
    ids: list[int] = []
    for path in committed_files(out):
        ids += [ident(d) for d in pq.read_table(path, columns=["data"]).column("data").to_pylist()]
    return ids


def logged(log: Path) -> list[int]:
    """The batch ids in one of a checkpoint's logs (``offsets``: planned, ``commits``: done)."""
    return sorted(int(p.name) for p in log.iterdir() if p.name.isdigit())


def files_on_disk(out: Path) -> int:
    return len(list(out.glob("part-*.parquet")))


# -- nats-py, the independent peer ---------------------------------------------------------------


async def add_stream(natspy: NatsPyPeer, name: str, subjects: list[str], **config: Any) -> Any:
    """A file stream with Direct Get allowed (the source reads with it)."""

    async def go() -> Any:
        js = natspy.nc.jetstream()
        return await once_placed_natspy(
            lambda: js.add_stream(name=name, subjects=subjects, allow_direct=True, **config)
        )

    return await natspy.call(go)


async def stream_info(natspy: NatsPyPeer, name: str) -> Any:
    async def go() -> Any:
        return await natspy.nc.jetstream().stream_info(name)

    return await natspy.call(go)


async def publish_ids(
    natspy: NatsPyPeer, subject: str, ids: range, *, pad: int = 0, chunk: int = 5000
) -> None:
    """Publish ``payload(i)`` for each id, each with a ``Nats-Msg-Id`` and acked by the stream,
    ``chunk`` in flight at a time. An id whose publish was not acked (a stream leader being
    elected) is sent again; the stream drops it if it did land."""

    async def send(todo: list[int]) -> list[int]:
        nc = natspy.nc
        acked: set[int] = set()
        done = asyncio.get_running_loop().create_future()
        prefix = nc.new_inbox()

        async def on_ack(msg: Any) -> None:
            if msg.data.startswith(b'{"stream"'):
                acked.add(int(msg.subject.rsplit(".", 1)[1]))
                if len(acked) == len(todo) and not done.done():
                    done.set_result(None)

        sub = await nc.subscribe(
            prefix + ".*", cb=on_ack, pending_msgs_limit=-1, pending_bytes_limit=-1
        )
        for i in todo:
            await nc.publish(
                subject,
                payload(i, pad),
                reply=f"{prefix}.{i}",
                headers={"Nats-Msg-Id": f"id-{i}"},
            )
        await nc.flush()
        try:
            await asyncio.wait_for(asyncio.shield(done), 5)
        except TimeoutError:
            pass
        await sub.unsubscribe()
        return [i for i in todo if i not in acked]

    for first in range(ids.start, ids.stop, chunk):
        todo = list(range(first, min(first + chunk, ids.stop)))
        for _ in range(6):
            todo = await natspy.call(send, todo)
            if not todo:
                break
        else:
            raise AssertionError(f"{len(todo)} ids could not be published, e.g. {todo[:5]}")


async def stream_ids(natspy: NatsPyPeer, stream: str, subject: str) -> list[int]:
    """The ids of every message ``stream`` holds, read by an ordered consumer of nats-py."""

    async def go() -> list[int]:
        js = natspy.nc.jetstream()
        n = (await js.stream_info(stream)).state.messages
        sub = await js.subscribe(subject, stream=stream, ordered_consumer=True)
        ids = [ident((await sub.next_msg(timeout=10)).data) for _ in range(n)]
        await sub.unsubscribe()
        return ids

    return await trio.to_thread.run_sync(lambda: natspy.run(go(), timeout=60))


class Arrivals:
    """A core subscription of nats-py counting what is published on ``subject`` (every publish,
    a repeat the stream drops included)."""

    def __init__(self, natspy: NatsPyPeer, subject: str) -> None:
        self.natspy = natspy
        self.subject = subject
        self.count = 0
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []

    async def start(self) -> None:
        async def on_msg(_msg: Any) -> None:
            self.count += 1
            for n, future in self._waiting:
                if self.count >= n and not future.done():
                    future.set_result(None)

        async def go() -> None:
            await self.natspy.nc.subscribe(
                self.subject, cb=on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1
            )
            await self.natspy.nc.flush()

        await self.natspy.call(go)

    async def wait(self, n: int, timeout: float = 60) -> int:
        """Until at least ``n`` messages passed; how many did."""

        async def go() -> int:
            future = asyncio.get_running_loop().create_future()
            self._waiting.append((n, future))
            if self.count >= n:
                future.set_result(None)
            await asyncio.wait_for(future, timeout)
            return self.count

        return await trio.to_thread.run_sync(lambda: self.natspy.run(go(), timeout=timeout + 5))

    async def total(self) -> int:
        """Everything published before now: a round trip to the server after the publishers
        were answered, so their messages were delivered here before the PONG."""
        await self.natspy.call(self.natspy.nc.flush)
        return self.count


# -- the children ---------------------------------------------------------------------------------


def stream_args(
    servers: str, stream: str, checkpoint: Path, *into: str, trigger: str, **options: Any
) -> list[str]:
    args = ["stream", servers, stream, str(checkpoint), *into, "--trigger", trigger]
    for name, value in options.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    return args


def process_tree(pid: int) -> set[int]:
    """``pid`` and its descendants, read off /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # ended meanwhile
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = set(), [pid]
    while todo:
        p = todo.pop()
        tree.add(p)
        todo.extend(children.get(p, []))
    return tree


async def kill_driver(running: Child) -> int:
    """SIGKILL the driver, as a crash of its machine: the Python process, its JVM (with the
    executor threads of a local master), the JVM's Python daemon and its workers (the tasks,
    which would otherwise finish publishing the rows they hold). Stopped first (SIGSTOP), all
    of them, so that none does anything more nor forks a new one while they are killed."""
    stopped: set[int] = set()
    while new := process_tree(running.proc.pid) - stopped:
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return await running.wait_exit(timeout=60)


async def wait_stderr(
    running: Child, predicate: Callable[[str], bool], after: int, timeout: float = 60
) -> str:
    """The first line of the child's stderr from index ``after`` on that matches."""
    try:
        with trio.fail_after(timeout):
            while True:
                for line in running.err[after:]:
                    if predicate(line):
                        return line
                if running.eof:
                    raise AssertionError("the child ended first\n" + running.transcript())
                await running._changed.wait()  # (LineProcess: a line came, or a pipe ended)
    except trio.TooSlowError:
        raise AssertionError(f"no such line within {timeout}s\n" + running.transcript()) from None


#: Exceptions that only carry another's message.
WRAPPERS = ("java.", "org.apache", "py4j.", "StreamingQueryException", "pyspark.")
_CAUSE = re.compile(r"^\s*((?:\w+\.)*\w+(?:Error|Exception|Timeout)): (.*)$")


def causes(running: Child) -> list[str]:
    """The distinct errors the child met (its queries' failures, its tasks' in the log), one
    line each: what the test reports as the fault path taken."""
    lines = list(running.err)
    for ended in running.events("ended"):
        lines += (ended["error"] or "").splitlines()
    found: dict[str, None] = {}
    for line in lines:
        if (match := _CAUSE.match(line)) and not match[1].startswith(WRAPPERS):
            found[f"{match[1]}: {match[2][:140]}"] = None
    return list(found)


async def wait_any(
    running: Child, predicate: Callable[[dict[str, Any]], bool], timeout: float = QUERY_TIMEOUT
) -> dict[str, Any]:
    """The first event of any kind that matches."""
    return await running.wait_event(None, predicate, timeout)  # type: ignore[arg-type]


def standby(args: list[str], **options: Any) -> list[str]:
    """The arguments of a driver that takes the query over with AvailableNow (``options``
    changed), started at once and waiting (``--standby``): its JVM starts and warms up while
    the first driver runs, rather than after the kill."""
    args = [*args, "--standby"]
    args[args.index("--trigger") + 1] = "now"
    for name, value in options.items():
        args[args.index(f"--{name.replace('_', '-')}") + 1] = str(value)
    return args


async def take_over(standby: Child) -> None:
    """Start the standby driver's query, which must read to the end and exit 0."""
    await standby.wait_event("ready", timeout=QUERY_TIMEOUT)
    standby.signal(signal.SIGUSR1)
    code = await standby.wait_exit(QUERY_TIMEOUT)
    assert code == 0, f"exit {code}\n" + standby.transcript()
    assert all(e["error"] is None for e in standby.events("ended")), standby.transcript()


async def run_to_end(args: list[str], cwd: Path) -> Child:
    """A child run to its end, which must be a success."""
    async with child("jetstream_child.py", *args, cwd=cwd) as running:
        code = await running.wait_exit(QUERY_TIMEOUT)
        assert code == 0, f"exit {code}\n" + running.transcript()
    assert all(e["error"] is None for e in running.events("ended")), running.transcript()
    return running


#: How many times a child starts again a query that failed (``--restarts``): a query started
#: again at once may find the server still starting.
RESTARTS = 2


async def outlive_the_fault(running: Child, last: int) -> str:
    """After a fault under ``running`` (a processing-time query with ``--restarts``): once it
    read up to sequence ``last``, in its first run or in one started again on its checkpoint
    after a failure, it is stopped and must end cleanly. Which it was."""
    ended = await wait_any(
        running,
        lambda e: (
            (e["event"] == "batch" and e["end"] >= last)
            or (e["event"] == "ended" and e["run"] == RESTARTS)
        ),
    )
    assert ended["event"] == "batch", "the query failed every time\n" + running.transcript()
    running.signal(signal.SIGTERM)
    code = await running.wait_exit(60)
    assert code == 0, f"exit {code}\n" + running.transcript()
    failed = [e for e in running.events("ended") if e["error"]]
    return f"failed {len(failed)} time(s), and its restart read on" if failed else "survived"


def report(what: str, **facts: Any) -> None:
    """What a test saw (shown with ``-s``): which fault paths it took."""
    print(f"\n[{what}]", *(f"  {k}: {v}" for k, v in facts.items()), sep="\n")


def timeline(running: Child) -> str:
    """The child's events and when (seconds since it started), for the report."""
    return " ".join(f"{e['event'][0]}{e.get('batch', '')}@{e['t']:g}" for e in running.events())


# -- the tests ------------------------------------------------------------------------------------


async def test_driver_sigkilled_mid_query_then_available_now(
    nats_server: Any, natspy: NatsPyPeer, tmp_path: Path
) -> None:
    """The driver (JVM, Python workers and all) SIGKILLed after two micro-batches, in the
    middle of a later one; the query started again on its checkpoint with AvailableNow."""
    n = 100_000
    await natspy.connect(nats_server.url)
    await add_stream(natspy, "S", ["s.>"])
    await publish_ids(natspy, "s.x", range(n), chunk=10_000)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = stream_args(
        nats_server.url, "S", checkpoint, "--parquet", str(out), trigger="every", max=10_000
    )
    async with (
        child("jetstream_child.py", *args, cwd=tmp_path) as first,
        child("jetstream_child.py", *standby(args), cwd=tmp_path) as second,
    ):
        await first.wait_event("batch", lambda e: e["batch"] >= 1, timeout=QUERY_TIMEOUT)
        code = await kill_driver(first)
        assert code == -signal.SIGKILL, first.transcript()
        batches = first.events("batch")
        assert batches[-1]["end"] < n, "the query ended before the kill"
        planned, committed = logged(checkpoint / "offsets"), logged(checkpoint / "commits")
        files_at_kill = files_on_disk(out)
        await take_over(second)
    # The batch planned and not committed ran again under its id (and range), then the rest.
    assert second.events("batch")[0]["batch"] == len(committed), second.transcript()
    assert second.events("ended")[-1]["end"] == n, second.transcript()
    assert exactness(parquet_ids(out), n) == exact(n), (batches, second.transcript())
    report(
        "driver SIGKILL, jetstream -> parquet",
        batches_reported_before_kill=len(batches),
        batches_planned_at_kill=planned[-1] + 1,
        batches_committed_at_kill=committed[-1] + 1 if committed else 0,
        parquet_files_at_kill=files_at_kill,
        parquet_files_in_the_end=files_on_disk(out),
        first=timeline(first),
        second=timeline(second),
    )


async def test_server_sigkilled_and_restarted_under_a_query(
    nats_server: Any, natspy: NatsPyPeer, tmp_path: Path
) -> None:
    """nats-server SIGKILLed under a running query, down until the query met the outage (a
    task or a trigger failed), then started again on the same port and store."""
    n = 10_000
    await natspy.connect(nats_server.url)
    await add_stream(natspy, "S", ["s.>"])
    await publish_ids(natspy, "s.x", range(n))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = stream_args(
        nats_server.url,
        "S",
        checkpoint,
        "--parquet",
        str(out),
        "--restarts",
        str(RESTARTS),
        trigger="every",
        max=1000,
        master="local[2,3]",
    )
    async with child("jetstream_child.py", *args, cwd=tmp_path) as running:
        await running.wait_event("batch", lambda e: e["batch"] >= 1, timeout=QUERY_TIMEOUT)
        mark = len(running.err)
        await trio.to_thread.run_sync(nats_server.kill)
        await wait_stderr(running, lambda line: " ERROR " in line, mark)
        await trio.to_thread.run_sync(nats_server.restart)
        outcome = await outlive_the_fault(running, n)
    await natspy.connect(nats_server.url)  # (the peer does not reconnect by itself)
    assert (await stream_info(natspy, "S")).state.messages == n
    assert exactness(parquet_ids(out), n) == exact(n), running.transcript()
    report(
        "nats-server SIGKILL and restart",
        query=outcome,
        errors=causes(running),
        timeline=timeline(running),
    )


async def feed(
    natspy: NatsPyPeer, running: Child, first: int, n: int, chunk: int, done: trio.Event
) -> None:
    """Publish ids ``first`` .. ``n - 1``, ``chunk`` at a time, each time the query has read
    everything published so far: the query reads at the stream's head, right after the
    publishes (where a follower answering a Direct Get may not have them yet)."""
    published = first
    while published < n:
        await running.wait_event("batch", lambda e, p=published: e["end"] >= p, QUERY_TIMEOUT)
        step = min(chunk, n - published)
        await publish_ids(natspy, "s.x", range(published, published + step), chunk=chunk)
        published += step
    done.set()


async def test_stream_leader_killed_under_a_query(
    nats_cluster: Any, natspy: NatsPyPeer, tmp_path: Path
) -> None:
    """The leader of an R3 stream killed under a running query while messages are being
    published; the node started again once the query read on without it. (A node started
    again does not answer Direct Gets before it caught up: nats-server's monitorStream.
    The reads that asked the leader because a replica answered short are counted and
    reported, not required: a follower a few milliseconds behind cannot be forced here.)"""
    before, n, chunk = 3000, 10_000, 1000
    await natspy.connect(nats_cluster[0].url)
    await add_stream(natspy, "S", ["s.>"], num_replicas=3)
    await publish_ids(natspy, "s.x", range(before))
    leader = (await stream_info(natspy, "S")).cluster.leader
    index = int(leader.removeprefix("n"))
    if index == 0:  # the peer stays on a node that lives
        await natspy.call(natspy.nc.close)
        await natspy.connect(nats_cluster[1].url)
    # How often a read ended short and asked the stream leader (a replica behind: reading.py).
    leader_reads = Arrivals(natspy, "$JS.API.STREAM.MSG.GET.S")
    await leader_reads.start()

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = stream_args(
        ",".join(nats_cluster.urls),
        "S",
        checkpoint,
        "--parquet",
        str(out),
        "--restarts",
        str(RESTARTS),
        trigger="every",
        max=chunk,
        master="local[2,3]",
    )
    published = trio.Event()
    async with (
        child("jetstream_child.py", *args, cwd=tmp_path) as running,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(feed, natspy, running, before, n, chunk, published)
        await running.wait_event("batch", lambda e: e["end"] >= before, timeout=QUERY_TIMEOUT)
        await trio.to_thread.run_sync(nats_cluster.kill_node, index)
        # Back once the query read on without it (two more batches; after its restart if it
        # failed), having missed what was published meanwhile.
        killed_at = running.events("batch")[-1]["end"]
        await running.wait_event(
            "batch", lambda e: e["end"] >= killed_at + 2 * chunk, timeout=QUERY_TIMEOUT
        )
        await trio.to_thread.run_sync(lambda: nats_cluster.restart_node(index))
        with trio.fail_after(QUERY_TIMEOUT):
            await published.wait()
        outcome = await outlive_the_fault(running, n)
    assert exactness(parquet_ids(out), n) == exact(n), running.transcript()
    report(
        "stream leader killed (R3)",
        leader=leader,
        query=outcome,
        errors=causes(running),
        reads_that_asked_the_leader=await leader_reads.total(),
        timeline=timeline(running),
    )


async def test_sink_driver_sigkilled_mid_batch(
    nats_server: Any, natspy: NatsPyPeer, tmp_path: Path
) -> None:
    """jetstream -> jetstream: the driver (and its tasks) SIGKILLed while a micro-batch is
    being published; the query started again on its checkpoint publishes that batch again with
    the same message ids, which the stream drops."""
    n, per_batch = 10_000, 2000
    await natspy.connect(nats_server.url)
    await add_stream(natspy, "A", ["a.>"])
    await add_stream(natspy, "B", ["b.>"], duplicate_window=300)
    await publish_ids(natspy, "a.x", range(n))
    arrivals = Arrivals(natspy, "b.x")
    await arrivals.start()
    checkpoint = tmp_path / "checkpoint"
    args = stream_args(
        nats_server.url,
        "A",
        checkpoint,
        "--to-subject",
        "b.x",
        "--to-stream",
        "B",
        trigger="every",
        max=per_batch,
        partitions=2,
        # One PubAck in flight: a batch takes long enough to publish for the kill to land in
        # the middle of it.
        max_in_flight=1,
    )
    async with (
        child("jetstream_child.py", *args, cwd=tmp_path) as first,
        child("jetstream_child.py", *standby(args, max_in_flight=512), cwd=tmp_path) as second,
    ):
        done = await first.wait_event("batch", lambda e: e["batch"] >= 1, timeout=QUERY_TIMEOUT)
        await arrivals.wait(done["end"] + per_batch // 2)  # half of the next batch published
        code = await kill_driver(first)
        assert code == -signal.SIGKILL, first.transcript()
        stored_at_kill = (await stream_info(natspy, "B")).state.messages
        assert stored_at_kill < n, "the query ended before the kill"
        committed = len(logged(checkpoint / "commits"))
        cut = stored_at_kill - committed * per_batch  # published of the batches not committed
        await take_over(second)
    assert second.events("ended")[-1]["end"] == n, second.transcript()
    assert (await stream_info(natspy, "B")).state.messages == n
    assert exactness(await stream_ids(natspy, "B", "b.x"), n) == exact(n)
    published = await arrivals.total()
    # What the killed run published of the batch it did not commit was published again (and
    # dropped by the stream). (0: the kill came between two batches, after a commit.)
    assert 0 <= cut <= per_batch, (stored_at_kill, committed)
    assert published == n + cut, (published, stored_at_kill, committed)
    report(
        "driver SIGKILL, jetstream -> jetstream",
        batches_committed_at_kill=committed,
        stored_at_kill=stored_at_kill,
        published_of_the_uncommitted_batch=f"{cut} of {per_batch}",
        published_in_all=published,
        first=timeline(first),
        second=timeline(second),
    )


async def test_sink_tasks_fail_after_half_and_are_retried(
    nats_server: Any, natspy: NatsPyPeer, tmp_path: Path
) -> None:
    """Each task's first attempt publishes part of its rows and fails (a UDF raises); Spark's
    retry publishes them all again. A batch write (two tasks of 2,000 rows), then a streaming
    one (two micro-batches of one task of 2,000 rows)."""
    n, half = 4000, 1000
    await natspy.connect(nats_server.url)
    await add_stream(natspy, "A", ["a.>"])
    await add_stream(natspy, "B", ["b.>"], duplicate_window=300)
    await add_stream(natspy, "C", ["c.>"], duplicate_window=300)
    await publish_ids(natspy, "a.x", range(n), pad=1000)
    batch_arrivals, stream_arrivals = Arrivals(natspy, "b.x"), Arrivals(natspy, "c.x")
    await batch_arrivals.start()
    await stream_arrivals.start()
    args = ["write", nats_server.url, "b.x", str(n), "--master", "local[2,3]"]
    args += ["--fail-half", str(half), "--stream-from", "A", "--checkpoint", str(tmp_path / "ck")]
    args += ["--to-subject", "c.x", "--to-stream", "C", "--max", "2000", "--partitions", "1"]
    running = await run_to_end(args, tmp_path)
    assert running.events("ended")[-1]["end"] == n, running.transcript()
    for stream, subject, arrivals in (("B", "b.x", batch_arrivals), ("C", "c.x", stream_arrivals)):
        assert (await stream_info(natspy, stream)).state.messages == n, stream
        assert exactness(await stream_ids(natspy, stream, subject), n) == exact(n), stream
        # The first attempts did publish (and the retries again: the stream dropped those).
        assert await arrivals.total() > n, stream
    report(
        "sink task retries",
        batch_write_published=await batch_arrivals.total(),
        streaming_write_published=await stream_arrivals.total(),
        rows=n,
        task_failures=sum(line.startswith("RuntimeError: injected") for line in running.err),
        timeline=timeline(running),
    )
