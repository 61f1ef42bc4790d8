"""``headrace consumer pause|resume`` and the paused state in ``consumer info``, against a real
nats-server, with nats-py (which knows the pause API) reading what the commands did."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import nats
import pytest
from headrace.cli.main import main
from headrace.jetstream.codec import parse_time

from tests.natspy_peer import NatsPyPeer

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
    """nats-py's JetStream context, with stream S and durable pull consumer C."""
    from nats.js.api import ConsumerConfig

    natspy.nc = natspy.run(nats.connect(nats_server.url, allow_reconnect=False))
    js = natspy.nc.jetstream()
    natspy.run(js.add_stream(name="S", subjects=["s.>"]))
    natspy.run(js.add_consumer("S", ConsumerConfig(durable_name="C")))
    yield js


def paused(natspy: NatsPyPeer, js: Any) -> tuple[bool, str | None]:
    info = natspy.run(js.consumer_info("S", "C"))
    return bool(info.paused), info.config.pause_until


def test_pause_for_until_and_resume(cli: Any, nats_server: Any, natspy: Any, js: Any) -> None:
    url = ("--nats", nats_server.url)
    before = dt.datetime.now(dt.UTC)
    code, out, err = cli("consumer", "pause", "S", "C", "--for", "1h", *url)
    assert (code, err) == (0, "")
    assert out.startswith("consumer C on stream S paused until ")
    assert out.rstrip().endswith("s left)")
    is_paused, until = paused(natspy, js)
    assert is_paused and until is not None
    assert before + dt.timedelta(hours=1) <= parse_time(until) <= before + dt.timedelta(hours=2)
    code, out, _ = cli("consumer", "info", "S", "C", *url)
    assert code == 0
    assert "  paused until " in out and "s left)" in out
    code, out, _ = cli("consumer", "info", "S", "C", "--json", *url)
    assert json.loads(out)["paused"] is True
    # --until, as JSON: the server's answer.
    code, out, _ = cli(
        "consumer", "pause", "S", "C", "--until", "2099-01-31T13:00:00+01:00", "--json", *url
    )
    answer = json.loads(out)
    assert code == 0 and answer["paused"] is True
    assert answer["pause_until"].startswith("2099-01-31T12:00:00")
    assert paused(natspy, js)[1].startswith("2099-01-31T12:00:00")
    # Neither: until resumed.
    code, out, _ = cli("consumer", "pause", "S", "C", *url)
    assert (code, out) == (0, "consumer C on stream S paused until resumed\n")
    code, out, _ = cli("consumer", "info", "S", "C", *url)
    assert "  paused until resumed" in out
    code, out, _ = cli("consumer", "resume", "S", "C", *url)
    assert (code, out) == (0, "consumer C on stream S is not paused: it delivers\n")
    assert paused(natspy, js)[0] is False
    code, out, _ = cli("consumer", "info", "S", "C", *url)
    assert "paused" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--until", "2099-01-31T12:00:00"), "has no timezone"),
        (("--until", "tomorrow"), "is not a time"),
        (("--for", "-5"), "cannot be negative"),
        (("--for", "soon"), "is not a duration"),
        (("--for", "5", "--until", "2099-01-31T12:00:00Z"), "not allowed with argument"),
    ],
)
def test_bad_times_are_usage_errors(cli: Any, args: tuple[str, ...], message: str) -> None:
    code, out, err = cli("consumer", "pause", "S", "C", *args, "--nats", "nats://127.0.0.1:1")
    assert (code, out) == (2, "")
    assert message in err


def test_missing_stream_or_consumer(cli: Any, nats_server: Any, natspy: Any, js: Any) -> None:
    url = ("--nats", nats_server.url)
    code, out, err = cli("consumer", "pause", "S", "NOPE", "--for", "10", *url)
    assert (code, out) == (1, "")
    assert err == "headrace consumer pause: consumer 'NOPE' not found on stream 'S'\n"
    code, _, err = cli("consumer", "resume", "NOPE", "C", *url)
    assert (code, err) == (1, "headrace consumer resume: stream 'NOPE' not found\n")
    assert paused(natspy, js)[0] is False


def test_update_and_rm(cli: Any, nats_server: Any, natspy: Any, js: Any) -> None:
    """`consumer update` changes max_ack_pending and ack_wait in place (nats-py reads them);
    `consumer rm` deletes the consumer; both name what is missing; an update with nothing to
    change is a usage error (issue 23: there was neither command)."""
    url = ("--nats", nats_server.url)
    code, out, err = cli("consumer", "update", "S", "C", "--max-ack-pending", "10000",
                         "--ack-wait", "45s", *url)  # fmt: skip
    assert code == 0, err
    assert "Consumer C on stream S" in out
    info = natspy.run(js.consumer_info("S", "C"))
    assert info.config.max_ack_pending == 10000 and info.config.ack_wait == 45.0
    code, _, err = cli("consumer", "update", "S", "C", *url)
    assert code == 2 and "nothing to change" in err
    code, _, err = cli("consumer", "update", "S", "NOPE", "--max-ack-pending", "5", *url)
    assert code == 1 and "consumer 'NOPE' not found on stream 'S'" in err
    code, out, err = cli("consumer", "rm", "S", "C", *url)
    assert code == 0 and out == "deleted consumer C of stream S\n", err
    assert natspy.run(js.consumers_info("S")) == []
    code, _, err = cli("consumer", "rm", "S", "C", *url)
    assert code == 1 and "consumer 'C' not found on stream 'S'" in err
