"""The stream and publish tools: ``headrace server``, ``stream``, ``pub``, ``consumer``,
``sinks``, each against a real nats-server and checked through nats-py, the independent peer.

Most run in this process through ``headrace.cli.main.main`` (its exit status and output);
``server``, standard input and the plugin listing with a broken plugin run as subprocesses.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest
import trio
from headrace.cli.main import main
from headrace.jetstream import JetStreamAPIError
from headrace.localserver import free_port

from tests.cli.cli_support import HEADRACE, HeadraceProcess, clean_env, headrace, run_headrace
from tests.natspy_peer import NatsPyPeer
from tests.waiting import NO_SUITABLE_PEERS, once_placed

Run = tuple[int, str, str]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """``cli(*args)``: ``headrace *args`` in this process; its exit status, stdout, stderr."""
    monkeypatch.delenv("NATS_URL", raising=False)

    def run(*args: str) -> Run:
        with pytest.raises(SystemExit) as ended:
            main(list(args))
        out, err = capsys.readouterr()
        code = ended.value.code
        return (code if isinstance(code, int) else 1), out, err

    return run


@pytest.fixture
def js(nats_server: Any, natspy: NatsPyPeer) -> Iterator[Any]:
    """nats-py's JetStream context on ``nats_server`` (sync tests call it by ``natspy.run``)."""
    natspy.nc = natspy.run(nats.connect(nats_server.url, allow_reconnect=False))
    yield natspy.nc.jetstream()


# -- stream -----------------------------------------------------------------------------------


def test_stream_add_is_what_nats_py_sees(cli: Any, nats_server: Any, natspy: Any, js: Any) -> None:
    args = [
        "stream", "add", "ORDERS", "--subjects", "orders.>,refunds.*", "--subjects", "audit",
        "--retention", "workqueue", "--storage", "memory", "--replicas", "1",
        "--max-age", "1h30m", "--max-msgs", "1000", "--duplicate-window", "30s",
        "--description", "test orders", "--nats", nats_server.url,
    ]  # fmt: skip
    code, out, err = cli(*args)
    assert (code, err) == (0, "")
    assert out.startswith("Stream ORDERS: test orders\n")
    assert "  subjects:    orders.>, refunds.*, audit\n" in out
    assert "  retention:   workqueue, storage memory, replicas 1\n" in out
    info = natspy.run(js.stream_info("ORDERS"))
    config = info.config
    assert config.subjects == ["orders.>", "refunds.*", "audit"]
    assert config.retention == "workqueue"
    assert config.storage == "memory"
    assert config.num_replicas == 1
    assert config.max_age == 5400
    assert config.max_msgs == 1000
    assert config.duplicate_window == 30
    assert config.description == "test orders"
    # The same configuration again: no error (what a setup script runs every time).
    again = cli(*args[:-2], "--json", "--nats", nats_server.url)
    assert again[0] == 0, again
    assert json.loads(again[1])["config"]["name"] == "ORDERS"


def test_stream_add_defaults_and_refusals(cli: Any, nats_server: Any, natspy: Any, js: Any) -> None:
    code, out, _ = cli("stream", "add", "EVENTS", "--json", "--nats", nats_server.url)
    assert code == 0
    shown = json.loads(out)
    config = natspy.run(js.stream_info("EVENTS")).config
    assert config.subjects == ["EVENTS"] == shown["config"]["subjects"]  # the server's default
    assert (config.retention, config.storage, config.num_replicas) == ("limits", "file", 1)
    code, out, err = cli(
        "stream", "add", "EVENTS", "--storage", "memory", "--nats", nats_server.url
    )
    assert (code, out) == (1, "")
    assert err.startswith("headrace stream add: stream 'EVENTS' exists with another configuration")
    code, _, err = cli("stream", "add", "R3", "--replicas", "3", "--nats", nats_server.url)
    assert code == 1
    assert err.startswith("headrace stream add: ") and "replicas" in err.lower()
    assert len(err.splitlines()) == 1
    code, _, err = cli("stream", "add", "BAD", "--subjects", "a b", "--nats", nats_server.url)
    assert code == 1 and err.startswith("headrace stream add: ") and "Traceback" not in err


@pytest.mark.slow
async def test_stream_add_replicas_on_a_cluster(nats_cluster: Any, natspy: Any) -> None:
    url = nats_cluster.servers[0].url

    async def add() -> subprocess.CompletedProcess[bytes]:
        done = await run_headrace(
            "stream", "add", "R3", "--replicas", "3", "--subjects", "r3.>", "--nats", url
        )
        if done.returncode != 0 and b"err_code 10005" in done.stderr:
            # A fresh cluster may still count a peer offline: retried, as the fixtures do.
            raise JetStreamAPIError(500, NO_SUITABLE_PEERS, done.stderr.decode())
        return done

    done = await once_placed(add)
    assert done.returncode == 0, done.stderr
    assert b"replicas 3" in done.stdout
    await natspy.connect(url)
    info = await natspy.call(natspy.nc.jetstream().stream_info, "R3")
    assert info.config.num_replicas == 3
    assert len(info.cluster.replicas or []) == 2  # besides the leader


def test_stream_info_ls_and_rm(cli: Any, nats_server: Any, natspy: Any, js: Any) -> None:
    natspy.run(js.add_stream(name="A", subjects=["a.>"]))
    natspy.run(js.add_stream(name="B", subjects=["b"]))
    for i in range(3):
        natspy.run(js.publish("a.x", f"{i}".encode()))
    code, out, _ = cli("stream", "ls", "--json", "--nats", nats_server.url)
    assert code == 0
    listed = [json.loads(line) for line in out.splitlines()]
    assert [(s["config"]["name"], s["state"]["messages"]) for s in listed] == [("A", 3), ("B", 0)]
    code, out, _ = cli("stream", "ls", "--subject", "a.y", "--nats", nats_server.url)
    assert code == 0
    assert out.splitlines()[0].split() == [
        "NAME", "SUBJECTS", "MESSAGES", "BYTES", "CONSUMERS", "RETENTION", "STORAGE", "REPLICAS"
    ]  # fmt: skip
    assert [line.split()[:3] for line in out.splitlines()[1:]] == [["A", "a.>", "3"]]
    code, out, _ = cli("stream", "info", "A", "--json", "--nats", nats_server.url)
    assert code == 0
    assert json.loads(out)["state"]["last_seq"] == natspy.run(js.stream_info("A")).state.last_seq
    code, out, _ = cli("stream", "info", "A", "--nats", nats_server.url)
    assert "  messages:    3 (" in out and "seq 1..3" in out
    code, out, err = cli("stream", "rm", "A", "--nats", nats_server.url)
    assert (code, out, err) == (0, "deleted stream A\n", "")
    with pytest.raises(nats.js.errors.NotFoundError):
        natspy.run(js.stream_info("A"))
    assert natspy.run(js.stream_info("B")).config.name == "B"
    for action in ("rm", "info"):
        code, out, err = cli("stream", action, "A", "--nats", nats_server.url)
        assert (code, out) == (1, "")
        assert err == f"headrace stream {action}: stream 'A' not found\n"


# -- pub --------------------------------------------------------------------------------------


def test_pub_stores_headers_and_msg_ids(cli: Any, nats_server: Any, natspy: Any, js: Any) -> None:
    natspy.run(js.add_stream(name="S", subjects=["s.>"]))
    code, out, err = cli(
        "pub", "s.new", "--data", '{"n": {n}}', "--count", "3", "--msg-id", "order-{n}",
        "--header", "Source:test", "--header", "Try:{n}", "--nats", nats_server.url,
    )  # fmt: skip
    assert code == 0, err
    assert out.splitlines() == ["S seq 1", "S seq 2", "S seq 3"]
    assert err.startswith("headrace pub: published 3 messages to s.new in ")
    assert err.rstrip().endswith(": stream S seq 1..3")
    for n in (1, 2, 3):
        msg = natspy.run(js.get_msg("S", n))
        assert json.loads(msg.data) == {"n": n}
        assert msg.subject == "s.new"
        assert msg.headers["Nats-Msg-Id"] == f"order-{n}"
        assert msg.headers["Source"] == "test"
        assert msg.headers["Try"] == str(n)


def test_pub_reports_duplicates(cli: Any, nats_server: Any, natspy: Any, js: Any) -> None:
    natspy.run(js.add_stream(name="S", subjects=["s.>"]))
    code, out, err = cli(
        "pub", "s.x", "--data", "same", "--msg-id", "once", "--count", "3", "--json",
        "--nats", nats_server.url,
    )  # fmt: skip
    assert (code, err) == (0, "")
    summary = json.loads(out)
    assert summary["published"] == 3
    assert summary["duplicates"] == 2
    assert summary["stored"] == 1
    assert (summary["stream"], summary["first_seq"], summary["last_seq"]) == ("S", 1, 1)
    assert summary["error"] is None
    assert natspy.run(js.stream_info("S")).state.messages == 1
    code, out, err = cli("pub", "s.x", "--data", "again", "--msg-id", "once", "--nats",
                         nats_server.url)  # fmt: skip
    assert code == 0
    assert out == "S seq 1 duplicate (msg id 'once' already stored)\n"
    assert "1 duplicate not stored" in err


def test_pub_json_lines_and_raw_files(
    cli: Any, nats_server: Any, natspy: Any, js: Any, tmp_path: Path
) -> None:
    natspy.run(js.add_stream(name="S", subjects=["s.>"]))
    lines = tmp_path / "orders.jsonl"
    lines.write_text('{"id": 1}\n\n{"id": 2, "k": "{n}"}\r\n')
    code, out, _ = cli("pub", "s.x", "--file", str(lines), "--count", "2", "--quiet",
                       "--nats", nats_server.url)  # fmt: skip
    assert (code, out) == (0, "")
    stored = [natspy.run(js.get_msg("S", seq)).data for seq in range(1, 5)]
    assert stored == [b'{"id": 1}', b'{"id": 2, "k": "2"}', b'{"id": 1}', b'{"id": 2, "k": "4"}']
    code, _, _ = cli("pub", "s.x", "--file", str(lines), "--raw", "--nats", nats_server.url)
    assert code == 0
    # As it is, but for {n} (the only message: 1).
    assert natspy.run(js.get_msg("S", 5)).data == lines.read_bytes().replace(b"{n}", b"1")
    pretty = tmp_path / "pretty.json"
    pretty.write_text('{\n  "id": 1\n}\n')
    code, out, err = cli("pub", "s.x", "--file", str(pretty), "--nats", nats_server.url)
    assert (code, out) == (2, "")
    assert err.startswith(f"headrace pub: line 1 of {pretty} is not JSON (")
    assert "--raw publishes the whole input as one message" in err
    assert natspy.run(js.stream_info("S")).state.messages == 5  # nothing of it published
    code, _, err = cli("pub", "s.x", "--file", str(tmp_path / "nope"), "--nats", nats_server.url)
    assert code == 2 and "cannot read" in err and "No such file" in err


async def test_pub_from_standard_input(nats_server: Any, natspy: Any) -> None:
    await natspy.connect(nats_server.url)
    js = natspy.nc.jetstream()
    await natspy.call(js.add_stream, name="S", subjects=["s.>"])
    with trio.fail_after(30):
        done = await trio.run_process(
            [HEADRACE, "pub", "s.in", "--json", "--nats", nats_server.url],
            stdin=b'{"a": 1}\n{"a": 2}\n',
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=clean_env(),
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stored"] == 2
    assert (await natspy.call(js.get_msg, "S", 2)).data == b'{"a": 2}'


def test_pub_rate_paces_the_publishes(cli: Any, nats_server: Any, natspy: Any, js: Any) -> None:
    natspy.run(js.add_stream(name="S", subjects=["s.>"]))
    code, out, _ = cli("pub", "s.r", "--data", "x", "--count", "6", "--rate", "20", "--json",
                       "--nats", nats_server.url)  # fmt: skip
    assert code == 0
    summary = json.loads(out)
    assert summary["stored"] == 6
    assert summary["seconds"] >= 5 / 20  # the sixth goes 5 intervals after the first
    assert summary["msgs_per_s"] <= 24


def test_pub_failures_in_one_line(cli: Any, nats_server: Any, natspy: Any, js: Any) -> None:
    code, out, err = cli("pub", "nobody.listens", "--data", "x", "--nats", nats_server.url)
    assert (code, out) == (1, "")
    assert err == (
        "headrace pub: no stream captures subject 'nobody.listens'; create a stream with that "
        "subject, or publish to a subject a stream listens on\n"
    )
    code, _, err = cli("pub", "bad subject", "--data", "x", "--nats", nats_server.url)
    assert code == 1 and err.startswith("headrace pub: invalid subject 'bad subject'")
    code, _, err = cli("pub", "s.*", "--data", "x", "--nats", nats_server.url)
    assert code == 1 and "wildcard" in err
    code, out, err = cli("pub", "nobody.listens", "--data", "x", "--json", "--nats",
                         nats_server.url)  # fmt: skip
    assert code == 1
    assert json.loads(out)["published"] == 0
    assert "no stream captures subject" in json.loads(out)["error"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("pub", "s", "--data", "x", "--file", "f"), "not allowed with argument"),
        (("pub", "s", "--data", "x", "--raw"), "--raw applies to --file or standard input"),
        (("pub", "s", "--data", "x", "--count", "0"), "must be at least 1"),
        (("pub", "s", "--data", "x", "--rate", "-1"), "must be positive"),
        (("pub", "s", "--data", "x", "--header", "novalue"), "a header is NAME:VALUE"),
        (("stream", "add"), "the following arguments are required: NAME"),
        (("stream", "add", "X", "--max-age", "soon"), "is not a duration"),
        (("stream", "add", "X", "--retention", "forever"), "invalid choice"),
        (("stream",), "the following arguments are required: ACTION"),
        (("consumer", "info", "S"), "the following arguments are required: NAME"),
        (("server", "--port", "70000"), "not a port number"),
        (("stream", "ls", "--password", "p"), "--password needs --user"),
    ],
)
def test_usage_errors_exit_2(cli: Any, args: tuple[str, ...], message: str) -> None:
    code, out, err = cli(*args)
    assert (code, out) == (2, "")
    assert message in err


def test_no_server_exits_1_without_the_password(cli: Any) -> None:
    url = f"nats://alice:s3cret@127.0.0.1:{free_port()}"
    for args in (("stream", "ls"), ("pub", "a.b", "--data", "x"), ("consumer", "ls", "S")):
        code, out, err = cli(*args, "--nats", url, "--connect-timeout", "2")
        assert (code, out) == (1, ""), args
        assert err.startswith(f"headrace {args[0]}")
        assert "cannot connect to NATS (nats://alice:***@127.0.0.1:" in err
        assert "s3cret" not in err and len(err.splitlines()) == 1


# -- consumer ---------------------------------------------------------------------------------


def test_consumer_ls_and_info(cli: Any, nats_server: Any, natspy: Any, js: Any) -> None:
    from nats.js.api import ConsumerConfig

    natspy.run(js.add_stream(name="S", subjects=["s.>"]))
    for i in range(4):
        natspy.run(js.publish("s.a" if i % 2 else "s.b", b"x"))
    natspy.run(
        js.add_consumer(
            "S",
            ConsumerConfig(durable_name="lake", filter_subject="s.a", ack_wait=7, max_deliver=5),
        )
    )
    natspy.run(js.add_consumer("S", ConsumerConfig(durable_name="all")))
    code, out, _ = cli("consumer", "ls", "S", "--json", "--nats", nats_server.url)
    assert code == 0
    listed = {c["name"]: c for c in map(json.loads, out.splitlines())}
    assert set(listed) == {"all", "lake"}
    assert listed["lake"]["num_pending"] == 2 and listed["all"]["num_pending"] == 4
    code, out, _ = cli("consumer", "ls", "S", "--nats", nats_server.url)
    assert [line.split()[:4] for line in out.splitlines()[1:]] == [
        ["all", "pull", "explicit", "4"],
        ["lake", "pull", "explicit", "2"],
    ]
    code, out, _ = cli("consumer", "info", "S", "lake", "--json", "--nats", nats_server.url)
    info = json.loads(out)
    assert info["config"]["filter_subject"] == "s.a"
    assert info["config"]["ack_wait"] == 7_000_000_000  # the API's nanoseconds
    code, out, _ = cli("consumer", "info", "S", "lake", "--nats", nats_server.url)
    assert code == 0
    assert out.splitlines()[0] == "Consumer lake on stream S"
    assert "  filter:      s.a" in out and "ack wait 7s, max deliver 5" in out
    assert "  pending:     2 to deliver, 0 awaiting ack" in out
    code, out, err = cli("consumer", "info", "S", "nope", "--nats", nats_server.url)
    assert (code, out) == (1, "")
    assert err == "headrace consumer info: consumer 'nope' not found on stream 'S'\n"
    code, _, err = cli("consumer", "ls", "NOPE", "--nats", nats_server.url)
    assert (code, err) == (1, "headrace consumer ls: stream 'NOPE' not found\n")


# -- sinks ------------------------------------------------------------------------------------


def test_sinks_lists_the_plugins_with_their_options(cli: Any) -> None:
    code, out, err = cli("sinks", "--json")
    assert (code, err) == (0, "")
    plugins = {p["name"]: p for p in map(json.loads, out.splitlines())}
    assert {"jsonl", "memory", "stdout"} <= set(plugins)
    try:
        import headrace_spark  # noqa: F401
    except ImportError:
        assert "spark" not in plugins
    else:
        assert plugins["spark"]["target"] == "headrace_spark:SparkSink"
        assert plugins["spark"]["error"] is None
    jsonl = plugins["jsonl"]
    assert jsonl["target"] == "headrace.sinks.jsonl:JsonlSink"
    assert jsonl["distribution"] == "headrace"
    options = {o["name"]: o for o in jsonl["options"]}
    assert options["directory"]["required"] is True
    assert options["fsync"] == {
        "name": "fsync", "default": "True", "required": False, "annotation": "bool",
        "kind": "keyword",
    }  # fmt: skip
    assert plugins["memory"]["options"][0]["name"] == "fail_times"
    code, out, _ = cli("sinks")
    assert code == 0
    assert "jsonl  headrace.sinks.jsonl:JsonlSink  (headrace " in out
    assert "    directory (required)  : str | os.PathLike[str]" in out
    assert "    fsync = True  : bool" in out


def test_a_broken_sink_plugin_is_listed_not_fatal(tmp_path: Path) -> None:
    info = tmp_path / "brokensink-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokensink\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[headrace.sinks]\nbroken = brokensink_missing:Sink\nattrsink = brokensink_ok:Sink\n"
    )
    (tmp_path / "brokensink_ok.py").write_text(
        "import attrs\n\n@attrs.define\nclass Sink:\n"
        '    """An attrs sink."""\n    path: str\n    tags: list = attrs.Factory(list)\n'
    )
    done = subprocess.run(
        [HEADRACE, "sinks", "--json"],
        env=clean_env(PYTHONPATH=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    plugins = {p["name"]: p for p in map(json.loads, done.stdout.splitlines())}
    assert {"jsonl", "memory", "stdout", "broken", "attrsink"} <= set(plugins)
    assert plugins["broken"]["error"].startswith(
        "failed to import: ModuleNotFoundError: No module named 'brokensink_missing'"
    )
    assert plugins["broken"]["distribution"] == "brokensink"
    assert plugins["attrsink"]["summary"] == "An attrs sink."
    assert [(o["name"], o["default"], o["required"]) for o in plugins["attrsink"]["options"]] == [
        ("path", None, True),
        ("tags", "list()", False),
    ]


# -- server -----------------------------------------------------------------------------------


@pytest.mark.slow  # 2.3 s or more of timers: the full suite runs it
async def test_server_serves_until_sigint(natspy: Any, tmp_path: Path) -> None:
    store = tmp_path / "store"
    async with headrace("server", "--port", "0", "--store-dir", str(store)) as proc:
        _, url = await proc.wait_line(lambda line: line.startswith("nats://"), stream="out")
        await proc.wait_line(lambda line: "JetStream ready at " + url in line)
        added = await run_headrace("stream", "add", "KEPT", "--nats", url)
        assert added.returncode == 0, added.stderr
        published = await run_headrace("pub", "KEPT", "--data", "{}", "--nats", url)
        assert published.returncode == 0, published.stderr
        await natspy.connect(url)
        info = await natspy.call(natspy.nc.jetstream().stream_info, "KEPT")
        assert info.state.messages == 1
        await natspy.call(natspy.nc.close)
        proc.proc.send_signal(signal.SIGINT)
        assert await proc.wait_exit() == 0, proc.transcript()
    assert "headrace server: SIGINT: stopping the server" in proc.err
    assert proc.out == [url]
    down = await run_headrace("stream", "ls", "--nats", url, "--connect-timeout", "1")
    assert down.returncode == 1  # the server went with it
    # The store directory outlives it: a new server on it has the stream and its message.
    async with headrace("server", "--port", "0", "--store-dir", str(store), "--json") as proc:
        _, line = await proc.wait_line(lambda line: line.startswith("{"), stream="out")
        shown = json.loads(line)
        assert shown["store_dir"] == str(store.resolve())
        listed = await run_headrace("stream", "ls", "--json", "--nats", shown["url"])
        assert json.loads(listed.stdout)["state"]["messages"] == 1
        proc.proc.send_signal(signal.SIGTERM)
        assert await proc.wait_exit() == 0, proc.transcript()


@asynccontextmanager
async def _server_in_own_group(*args: str) -> AsyncIterator[HeadraceProcess]:
    """``headrace server *args`` leading a process group of its own, as a shell's foreground
    job is: a Ctrl-C at the terminal is a SIGINT to the whole group."""
    proc = await trio.lowlevel.open_process(
        [HEADRACE, "server", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
        start_new_session=True,
    )
    hp = HeadraceProcess(proc, ["server", *args])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hp._read, proc.stdout, hp.out)
        nursery.start_soon(hp._read, proc.stderr, hp.err)
        try:
            yield hp
        finally:
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()


def _children(pid: int) -> list[int]:
    """The child processes of ``pid``, started by any of its threads (Linux)."""
    return [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_server_ctrl_c_at_a_terminal_is_a_clean_stop() -> None:
    """The terminal signals the whole foreground group, nats-server included: the server is
    stopped by headrace (exit 0), not seen dying on its own (exit 1)."""
    async with _server_in_own_group("--port", "0") as proc:
        await proc.wait_line(lambda line: line.startswith("nats://"), stream="out")
        (child,) = _children(proc.proc.pid)
        os.killpg(proc.proc.pid, signal.SIGINT)
        assert await proc.wait_exit() == 0, proc.transcript()
    assert _gone(child)


async def test_server_that_dies_ends_the_command_with_1() -> None:
    async with _server_in_own_group("--port", "0") as proc:
        await proc.wait_line(lambda line: line.startswith("nats://"), stream="out")
        (child,) = _children(proc.proc.pid)
        os.kill(child, signal.SIGKILL)
        assert await proc.wait_exit() == 1, proc.transcript()
    assert _gone(child)
    assert proc.err[-1].startswith("headrace server: nats-server exited with status -9")


async def test_server_port_in_use(nats_server: Any) -> None:
    done = await run_headrace("server", "--port", str(nats_server.port))
    assert done.returncode == 1
    assert done.stdout == b""
    assert done.stderr.decode() == (
        f"headrace server: port {nats_server.port} on 127.0.0.1 is in use (another server?): "
        "choose another with --port, or --port 0 for a free one\n"
    )


def test_help_lists_the_tools() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "headrace", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=clean_env(),
    ).stdout
    for command in ("server", "stream", "pub", "consumer", "sinks"):
        assert f"    {command} " in shown, command


def test_a_port_whose_last_server_died_is_not_in_use() -> None:
    """A connection the server closed first stays in TIME-WAIT on its port for a minute after
    the server is gone: nats-server binds it again (SO_REUSEADDR), so `headrace server` must
    not read it as in use; a port something listens on still is."""
    from headrace.cli.server import _port_taken

    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert _port_taken(port)  # listening: in use
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server's side closes first: TIME-WAIT on its port
        client.recv(1)
        client.close()
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    waiting = [r for r in rows if r[1].endswith(f":{port:04X}") and r[3] == "06"]
    assert waiting, "no TIME-WAIT (06) connection on the port: the test made none"
    assert not _port_taken(port)


@pytest.mark.slow
async def test_pub_says_the_connection_was_lost(nats_server_factory: Any, natspy: Any) -> None:
    """Issue 23: publishing while the server went away said "no reply within 5s", which reads
    as a server that does not answer; the connection was lost, and the message's fate is
    unknown."""
    server = nats_server_factory()
    await natspy.connect(server.url)
    await natspy.call(natspy.nc.jetstream().add_stream, name="S", subjects=["s.>"])
    args = ("pub", "s.x", "--data", "x", "--count", "100000", "--rate", "100", "--timeout", "1")
    async with headrace(*args, "--nats", server.url) as proc:
        await proc.wait_line(lambda line: line == "S seq 5", stream="out")
        await trio.to_thread.run_sync(server.stop)
        assert await proc.wait_exit() == 1
    [said] = [line for line in proc.err if "connection" in line]
    assert said.startswith(
        "headrace pub: the connection to NATS was lost while publishing message "
    ), said
    assert "it may or may not be stored. Give --msg-id" in said, said
