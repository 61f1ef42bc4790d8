"""``headrace bench publish``: JetStream publish throughput, every message acknowledged by the
stream, headrace's asynchronous publish against its synchronous one, nats-py's
``publish_async``, and, when they are there, the NATS C client's ``js_PublishAsync`` (libnats)
and nats.js.

One private nats-server with JetStream. For each implementation the parent creates a fresh
stream of its own (file storage, the server's defaults, subjects ``<impl>.>``), then a fresh
process publishes N messages of ``--payload`` bytes to 100 subjects of it, with at most
``--max-pending`` (default 4000, nats.go's default too) PubAcks outstanding, and times from
just before its first publish to its last PubAck. Then the parent checks what the server
holds: exactly N messages, sequences 1..N (nothing lost, nothing stored twice), and the
process's own count of refusals must be 0; a line that fails either says ``error`` instead of
a figure. The stream is deleted before the next implementation.

- ``headrace-async``: ``async with js.async_publisher(max_pending=W)``, one ``await
  pub.publish(...)`` per message; leaving the block waits for every PubAck and raises if any
  failed. Its stats (``peak_pending``, ``failed``) go in the line.
- ``headrace-sync``: ``await js.publish(...)``, one round trip a message: the baseline the
  asynchronous publish exists to beat. It publishes ``min(N, 20000)`` messages (its pace is
  known after that many; N would take minutes).
- ``nats-py``: ``js.publish_async`` with ``publish_async_max_pending=W``, then
  ``publish_async_completed()``, the futures checked for errors at the end.
- ``libnats``: ``js_PublishAsync`` with ``PublishAsync.MaxPending = W`` (a stall wait long
  enough never to fail a publish), then ``js_PublishAsyncComplete``; refusals counted in the
  error handler. Built here with gcc from the source below, against Debian's libnats-dev.
- ``nats.js``: npm ``nats`` v2, ``js.publish()`` promises with at most W unsettled (it has no
  other asynchronous publish); needs node and the package.

The peers run if they are installed: with ``--anchors`` this command installs them as ``bench
consume --anchors`` does (``apt-get install libnats-dev``, ``npm install nats@2``); without,
a missing one is skipped with the reason printed.

Each line has ``msg_per_s``, the peak RSS of the publishing process (``VmHWM``: the Python
children read their own, the peers are sampled from here), its CPU seconds and the server's,
and headrace-async's line has its ratio against every other (``ratio_vs_<impl>``). The
machine is noisy: compare figures of one run, and run it several times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio
from headrace.localserver import LocalServer

from headrace_bench.consume import (
    BenchmarkError,
    _failure,
    _last_json,
    _last_line,
    _libnats_headers,
    _peak_rss_mb,
    _Peer,
    _quiet,
    _run_child,
    _with_server_cpu,
)

#: PubAcks outstanding at once, every implementation (nats.go's and nats-py's default).
MAX_PENDING = 4000
#: Messages the synchronous publish sends (see the module docs).
SYNC_MESSAGES = 20_000
#: How long one implementation may take to get its last PubAck.
COMPLETE_TIMEOUT = 120.0
SUBJECTS = 100
PYTHON_IMPLS = ("headrace-async", "headrace-sync", "nats-py")
PEERS = ("libnats", "nats.js")
_ME = [sys.executable, "-m", "headrace_bench.publish"]

LIBNATS_SOURCE = r"""
// js_PublishAsync: N messages to <prefix>.<i % 100>, at most MAX_PENDING PubAcks in flight.
#include <nats/nats.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long errors = 0;

static void on_error(jsCtx *js, jsPubAckErr *pae, void *closure) {
    (void)js; (void)pae; (void)closure;
    __atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 6) { fprintf(stderr, "usage: URL PREFIX N PAYLOAD MAX_PENDING\n"); return 2; }
    const char *url = argv[1], *prefix = argv[2];
    int n = atoi(argv[3]), size = atoi(argv[4]), window = atoi(argv[5]);
    natsConnection *nc = NULL; jsCtx *js = NULL;
    natsStatus s = natsConnection_ConnectTo(&nc, url);
    if (s != NATS_OK) { fprintf(stderr, "connect: %s\n", natsStatus_GetText(s)); return 1; }
    jsOptions o;
    jsOptions_Init(&o);
    o.PublishAsync.MaxPending = window;
    o.PublishAsync.ErrHandler = on_error;
    o.PublishAsync.StallWait = 600000;
    s = natsConnection_JetStream(&js, nc, &o);
    if (s != NATS_OK) { fprintf(stderr, "jetstream: %s\n", natsStatus_GetText(s)); return 1; }
    char *data = malloc(size > 0 ? size : 1);
    memset(data, 'x', size > 0 ? size : 1);
    char subjects[100][64];
    for (int i = 0; i < 100; i++) snprintf(subjects[i], sizeof subjects[i], "%s.%d", prefix, i);
    int sent = 0;
    double started = now();
    for (; sent < n; sent++) {
        s = js_PublishAsync(js, subjects[sent % 100], data, size, NULL);
        if (s != NATS_OK) { fprintf(stderr, "publish: %s\n", natsStatus_GetText(s)); break; }
    }
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = 120000;
    s = js_PublishAsyncComplete(js, &po);
    double elapsed = now() - started;
    if (s != NATS_OK) fprintf(stderr, "complete: %s\n", natsStatus_GetText(s));
    printf("{\"what\": \"libnats js_PublishAsync (MaxPending %d)\", \"msgs\": %d, "
           "\"refused\": %ld, \"complete\": %s, \"seconds\": %.4f}\n",
           window, sent, __atomic_load_n(&errors, __ATOMIC_RELAXED),
           s == NATS_OK ? "true" : "false", elapsed);
    fflush(stdout);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    free(data);
    return 0;
}
"""

NATSJS_SOURCE = r"""
// nats.js v2: js.publish() promises, at most MAX_PENDING unsettled; N messages to
// <prefix>.<i % 100>.
const { connect } = require("nats");
(async () => {
  const [url, prefix] = [process.argv[2], process.argv[3]];
  const [n, size, window] = process.argv.slice(4, 7).map((v) => parseInt(v));
  const nc = await connect({ servers: url.replace("nats://", "") });
  const js = nc.jetstream();
  const data = new Uint8Array(size).fill(120);
  const subjects = Array.from({ length: 100 }, (_, i) => `${prefix}.${i}`);
  let pending = 0, settled = 0, refused = 0, room = null, finished = null;
  const done = new Promise((resolve) => { finished = resolve; });
  const settle = () => {
    pending--;
    settled++;
    if (room) { const wake = room; room = null; wake(); }
    if (settled === n) finished();
  };
  const started = process.hrtime.bigint();
  for (let i = 0; i < n; i++) {
    while (pending >= window) await new Promise((resolve) => { room = resolve; });
    pending++;
    js.publish(subjects[i % 100], data).then(settle, () => { refused++; settle(); });
  }
  if (n > 0) await done;
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  console.log(JSON.stringify({
    what: `nats.js js.publish() promises (${window} unsettled)`,
    msgs: n, refused, complete: true, seconds,
  }));
  await nc.close();
})().catch((e) => { console.error(String(e)); process.exit(1); });
"""


# -- the Python children --------------------------------------------------------------------------


def _subjects(prefix: str) -> list[str]:
    return [f"{prefix}.{i}" for i in range(SUBJECTS)]


def _child_result(impl: str, n: int, refused: int, elapsed: float, **extra: Any) -> dict[str, Any]:
    return {
        "impl": impl,
        "msgs": n,
        "refused": refused,
        "complete": True,
        "seconds": elapsed,
        "peak_rss_mb": _peak_rss_mb(),
        **extra,
    }


async def _publish_headrace_async(
    url: str, prefix: str, n: int, size: int, window: int
) -> dict[str, Any]:
    from headrace.jetstream import AsyncPublishFailed, JetStream
    from headrace.nats import connect

    data = b"x" * size
    subjects = _subjects(prefix)
    refused = 0
    async with connect(url) as nc:
        js = JetStream(nc)
        started = time.perf_counter()
        cpu_started = time.process_time()
        try:
            async with js.async_publisher(max_pending=window, timeout=COMPLETE_TIMEOUT) as pub:
                publish = pub.publish
                for i in range(n):
                    await publish(subjects[i % SUBJECTS], data)
        except AsyncPublishFailed as failed:
            refused = len(failed.failures)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
    stats = pub.stats
    return _child_result(
        "headrace-async",
        stats.sent,
        refused,
        elapsed,
        what=f"headrace js.async_publisher(max_pending={window})",
        client_cpu_s=round(cpu, 3),
        peak_pending=stats.peak_pending,
        retried=stats.retried,
    )


async def _publish_headrace_sync(url: str, prefix: str, n: int, size: int) -> dict[str, Any]:
    from headrace.jetstream import JetStream, JetStreamError
    from headrace.nats import connect

    data = b"x" * size
    subjects = _subjects(prefix)
    refused = 0
    async with connect(url) as nc:
        js = JetStream(nc)
        started = time.perf_counter()
        cpu_started = time.process_time()
        for i in range(n):
            try:
                await js.publish(subjects[i % SUBJECTS], data)
            except JetStreamError:
                refused += 1
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
    return _child_result(
        "headrace-sync",
        n,
        refused,
        elapsed,
        what="headrace await js.publish() per message",
        client_cpu_s=round(cpu, 3),
    )


async def _publish_natspy(url: str, prefix: str, n: int, size: int, window: int) -> dict[str, Any]:
    import nats  # type: ignore[import-not-found,unused-ignore]

    data = b"x" * size
    subjects = _subjects(prefix)
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=window)
    futures: list[Any] = []
    started = time.perf_counter()
    cpu_started = time.process_time()
    if hasattr(js, "publish_async"):
        what = f"nats-py js.publish_async (max pending {window})"
        futures = [await js.publish_async(subjects[i % SUBJECTS], data) for i in range(n)]
        await asyncio.wait_for(js.publish_async_completed(), COMPLETE_TIMEOUT)
    else:  # nats-py before publish_async: windows of concurrent publishes
        what = f"nats-py asyncio.gather of js.publish, windows of {window}"
        for start in range(0, n, window):
            batch = [
                asyncio.ensure_future(js.publish(subjects[i % SUBJECTS], data))
                for i in range(start, min(start + window, n))
            ]
            await asyncio.wait(batch)
            futures.extend(batch)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    refused = sum(1 for f in futures if f.done() and f.exception() is not None)
    refused += sum(1 for f in futures if not f.done())
    await nc.close()
    return _child_result("nats-py", n, refused, elapsed, what=what, client_cpu_s=round(cpu, 3))


def _child(args: argparse.Namespace) -> None:
    if args.impl == "headrace-async":
        result = trio.run(
            _publish_headrace_async, args.url, args.prefix, args.messages, args.payload, args.window
        )
    elif args.impl == "headrace-sync":
        result = trio.run(
            _publish_headrace_sync, args.url, args.prefix, args.messages, args.payload
        )
    else:
        result = asyncio.run(
            _publish_natspy(args.url, args.prefix, args.messages, args.payload, args.window)
        )
    print(json.dumps(result), flush=True)


# -- the peers ------------------------------------------------------------------------------------


def _prepare_libnats(work: Path, install: bool) -> _Peer:
    gcc = shutil.which("gcc")
    if gcc is None:
        return _Peer("libnats", skipped="no gcc")
    missing = _libnats_headers(install=install)
    if missing is not None:
        return _Peer("libnats", skipped=missing)
    source = work / "libnats_publish.c"
    source.write_text(LIBNATS_SOURCE)
    binary = work / "libnats_publish"
    built = _quiet([gcc, "-O2", str(source), "-o", str(binary), "-lnats"], 300)
    if built.returncode != 0:
        errors = [line for line in built.stderr.splitlines() if "error" in line]
        reason = errors[0][:200] if errors else _last_line(built.stderr)
        return _Peer("libnats", skipped=f"gcc failed: {reason}")
    return _Peer("libnats", [str(binary)])


def _natsjs_modules() -> Path | None:
    """Where ``require("nats")`` finds the package without installing it, if anywhere: the
    ``node_modules`` of ``$NODE_PATH`` or npm's global folder."""
    candidates = [Path(p) for p in os.environ.get("NODE_PATH", "").split(os.pathsep) if p]
    npm = shutil.which("npm")
    if npm is not None:
        root = _quiet([npm, "root", "-g"], 60)
        if root.returncode == 0 and root.stdout.strip():
            candidates.append(Path(root.stdout.strip()))
    for modules in candidates:
        package = modules / "nats" / "package.json"
        if package.is_file():
            try:
                version = json.loads(package.read_text()).get("version", "")
            except ValueError:
                continue
            if str(version).startswith("2."):
                return modules
    return None


def _prepare_natsjs(work: Path, install: bool) -> _Peer:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        return _Peer("nats.js", skipped="no node")
    modules = _natsjs_modules()
    if modules is None:
        if not install:
            return _Peer(
                "nats.js", skipped="npm package nats@2 not installed (--anchors installs it)"
            )
        if npm is None:
            return _Peer("nats.js", skipped="no npm")
        project = work / "node"
        project.mkdir()
        _quiet([npm, "init", "-y"], 120, cwd=project)
        installed = _quiet(
            [npm, "install", "--no-audit", "--no-fund", "--silent", "nats@2"], 600, cwd=project
        )
        modules = project / "node_modules"
        if installed.returncode != 0 or not (modules / "nats").is_dir():
            reason = _last_line(installed.stderr or installed.stdout)
            return _Peer("nats.js", skipped=f"npm install nats@2 failed: {reason}")
    script = work / "natsjs_publish.js"
    script.write_text(NATSJS_SOURCE)
    return _Peer("nats.js", [node, str(script)], env={**os.environ, "NODE_PATH": str(modules)})


# -- the parent: streams, processes, checks, report -----------------------------------------------


def _stream_name(impl: str) -> str:
    return "PUB_" + "".join(c if c.isalnum() else "_" for c in impl).upper()


def _prefix(impl: str) -> str:
    return "pub_" + "".join(c if c.isalnum() else "_" for c in impl)


async def _create_stream(url: str, impl: str) -> None:
    from headrace.jetstream import JetStream, StreamConfig
    from headrace.nats import connect

    async with connect(url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name=_stream_name(impl), subjects=[_prefix(impl) + ".>"]))


async def _check_stream(url: str, impl: str, n: int) -> list[str]:
    """What is wrong with the stream after N publishes (nothing: exactly N, sequences 1..N);
    the stream is deleted either way."""
    from headrace.jetstream import JetStream
    from headrace.nats import connect

    async with connect(url) as nc:
        js = JetStream(nc)
        name = _stream_name(impl)
        state = (await js.stream_info(name)).state
        await js.delete_stream(name)
    problems = []
    if state.messages != n:
        problems.append(f"the stream holds {state.messages} messages, not {n}")
    if (state.first_seq, state.last_seq) != (1, n) and n:
        problems.append(f"its sequences are {state.first_seq}..{state.last_seq}, not 1..{n}")
    return problems


def _measure(
    impl: str, url: str, n: int, size: int, window: int, peer: _Peer | None
) -> dict[str, Any]:
    """Run one implementation against a fresh stream and check what the stream holds."""
    trio.run(_create_stream, url, impl)
    prefix = _prefix(impl)
    if peer is not None:
        cmd = [*peer.command, url, prefix, str(n), str(size), str(window)]
        env = peer.env
    else:
        cmd = [*_ME, "run", "--impl", impl, "--url", url, "--prefix", prefix]
        cmd += ["--messages", str(n), "--payload", str(size), "--window", str(window)]
        env = None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = _run_child(cmd, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = _last_json(child)
    problems = trio.run(_check_stream, url, impl, n)
    result: dict[str, Any] = {"bench": "js-publish", "impl": impl, "expected": n}
    if child.returncode != 0 or line is None:
        result.update(msgs=0, error=_failure(child))
        return result
    result["what"] = line.get("what")
    result["msgs"] = got = int(line.get("msgs", 0))
    if got != n:
        problems.insert(0, f"published {got} of {n} messages")
    if line.get("refused"):
        problems.insert(0, f"{line['refused']} publishes refused")
    if not line.get("complete", False):
        problems.insert(0, "did not get every PubAck")
    if problems:
        result["error"] = "; ".join(problems)
    else:
        seconds = float(line["seconds"])
        result["seconds"] = round(seconds, 3)
        result["msg_per_s"] = round(got / seconds) if seconds > 0 else 0
    result["window"] = window if impl != "headrace-sync" else 1
    for key in ("peak_pending", "retried"):
        if key in line:
            result[key] = line[key]
    if "client_cpu_s" in line:
        result["client_cpu_s"] = line["client_cpu_s"]
    else:  # the whole program's CPU (start-up included: a few ms for libnats, ~0.1 s for node)
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        result["client_cpu_s"] = round(cpu, 3)
    own, sampled = line.get("peak_rss_mb"), child.peak_rss_mb
    result["peak_rss_mb"] = max((v for v in (own, sampled) if v is not None), default=None)
    return result


def _add_ratios(results: list[dict[str, Any]]) -> None:
    ours = next((r for r in results if r["impl"] == "headrace-async"), None)
    if ours is None or not ours.get("msg_per_s"):
        return
    for peer in results:
        if peer is not ours and peer.get("msg_per_s"):
            ours[f"ratio_vs_{peer['impl']}"] = round(ours["msg_per_s"] / peer["msg_per_s"], 2)


def _print_table(results: list[dict[str, Any]]) -> None:
    for r in results:
        impl = r["impl"]
        if "skipped" in r:
            print(f"{impl:>14}: skipped ({r['skipped']})")
            continue
        rss = f"peak RSS {r['peak_rss_mb']} MB" if r.get("peak_rss_mb") is not None else ""
        if "error" in r:
            print(f"{impl:>14}: FAILED: {r['error']}  {rss}".rstrip())
            continue
        ratios = " ".join(f"{k[6:]}={v}" for k, v in r.items() if k.startswith("ratio_"))
        cpu = ""
        if "client_cpu_s_per_100k" in r and "server_cpu_s_per_100k" in r:
            cpu = (
                f"  CPU s/100k: client {r['client_cpu_s_per_100k']:.2f}"
                f" server {r['server_cpu_s_per_100k']:.2f}"
            )
        print(
            f"{impl:>14}: {r['msg_per_s']:>9,} msg/s  window {r['window']:>5}  "
            f"{r['msgs']:,} msgs  {rss}{cpu}  {ratios}".rstrip()
        )


def run(
    messages: int,
    payload: int,
    *,
    max_pending: int = MAX_PENDING,
    anchors: bool = False,
    as_json: bool = False,
    sync_messages: int = SYNC_MESSAGES,
) -> list[dict[str, Any]]:
    """Run the benchmark; print one JSON line per implementation, or a table. Returns every
    line (failures carry ``error``, unavailable peers ``skipped``)."""
    if messages < 1 or payload < 0 or max_pending < 1:
        raise BenchmarkError("--messages and --max-pending must be at least 1, --payload 0 or more")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="headrace-bench-") as tmp:
        peers = [_prepare_libnats(Path(tmp), anchors), _prepare_natsjs(Path(tmp), anchors)]
        with LocalServer(jetstream=True) as server:
            url, pid = server.url, server.pid
            plan: list[tuple[str, int, _Peer | None]] = [
                ("headrace-async", messages, None),
                ("nats-py", messages, None),
                *((p.impl, messages, p) for p in peers if p.command),
                ("headrace-sync", min(messages, sync_messages), None),
            ]
            for impl, n, peer in plan:
                measure: Callable[[], dict[str, Any]] = partial(
                    _measure, impl, url, n, payload, max_pending, peer
                )
                results.append(_with_server_cpu(pid, measure))
    for r in results:
        r["payload"] = payload
    results.extend({"impl": p.impl, "skipped": p.skipped} for p in peers if not p.command)
    _add_ratios(results)
    if as_json:
        for r in results:
            print(json.dumps(r), flush=True)
    else:
        _print_table(results)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m headrace_bench.publish")
    parser.add_argument("role", nargs="?", choices=["run"])
    parser.add_argument("--impl", choices=PYTHON_IMPLS, default="headrace-async")
    parser.add_argument("--url")
    parser.add_argument("--prefix", default="pub_bench")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--payload", type=int, default=128)
    parser.add_argument("--window", type=int, default=MAX_PENDING)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--anchors", action="store_true")
    args = parser.parse_args(argv)
    if args.role:
        _child(args)
        return
    run(
        args.messages,
        args.payload,
        max_pending=args.window,
        anchors=args.anchors,
        as_json=args.json,
    )


if __name__ == "__main__":
    main()
