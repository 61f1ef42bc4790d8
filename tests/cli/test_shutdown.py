"""`headrace run` and repeated signals: a signal within a second of the first is the same request
(GNU ``timeout`` signals the process and then its group), a later one stops hard, and the exit
status is always the ``exit_code`` of the last ``stopped`` event.

Every wait is for an event: a line the process prints, its exit, or a nats-py answer. Two waits
are for the clock to pass a point, read from the process's own event times.
"""

from __future__ import annotations

import datetime as dt
import signal
from pathlib import Path
from typing import Any

import pytest
from headrace.shutdown import SAME_REQUEST_WINDOW

from tests.cli.cli_support import consumer_info, create_stream, headrace, publish, write_pipeline

#: A batch that only the drain cuts, and a write that takes a while: the drain is still going
#: when a second signal comes right after the first.
SLOW_DRAIN = """\
pipeline = Pipeline("slow")
pipeline.source(JetStreamSource(stream="ORDERS", durable="slow")).sink(
    MemorySink(delay=1.5), name="out", batch=BatchPolicy(max_messages=1000, max_age=3600)
)
"""

#: A write that never ends: the drain never finishes.
STUCK = """\
class Stuck:
    async def write_batch(self, batch):
        await trio.sleep_forever()

pipeline = Pipeline("stuck", drain_timeout=60)
pipeline.source(JetStreamSource(stream="ORDERS", durable="stuck")).sink(
    Stuck(), name="stuck", batch=BatchPolicy(max_messages=5, max_age=0.1)
)
"""

#: As STUCK, and a close that does not return either (bounded at 10 s by the sink stage, and
#: shielded): the hard stop cannot finish within its 2 s, so the process ends regardless.
STUCK_CLOSE = STUCK.replace(
    "        await trio.sleep_forever()\n",
    "        await trio.sleep_forever()\n\n"
    "    async def close(self):\n"
    "        await trio.sleep_forever()\n",
)

#: A pipeline whose process takes a while to end after its run, as one whose library has work to
#: do at exit (PySpark stopping its JVM): an atexit function that takes 2 s.
SLOW_EXIT = """\
import atexit
import time

atexit.register(time.sleep, 2)

pipeline = Pipeline("slowexit")
pipeline.source(JetStreamSource(stream="ORDERS", durable="slowexit")).sink(
    MemorySink(), name="out", batch=BatchPolicy(max_messages=1000, max_age=3600)
)
"""

JSON_RUN = ("--json-logs", "--interval", "0.1")


def _time(event: dict[str, Any]) -> float:
    """When a JSON event was written (its ``ts``), as a Unix time."""
    return dt.datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()


@pytest.mark.slow  # a few seconds of timers: the full suite runs it
async def test_a_signal_repeated_at_once_is_the_same_request(
    nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 20)
    path = write_pipeline(tmp_path, SLOW_DRAIN)
    async with headrace("run", str(path), "--nats", nats_server.url, *JSON_RUN) as proc:
        await proc.wait_event("progress", lambda e: e["stats"]["ack_pending"] == 20)
        proc.signal(signal.SIGTERM)
        index, draining = await proc.wait_event("draining")
        # At once, as GNU timeout does (the process, then its group); within the second.
        proc.signal(signal.SIGTERM)
        _, repeated = await proc.wait_event("signal_repeated", start=index)
        code = await proc.wait_exit(timeout=20)
    assert repeated["signal"] == "SIGTERM" and repeated["after"] < SAME_REQUEST_WINDOW
    events = proc.events()
    assert [e for e in events if e["event"] == "stopping"] == []
    assert events[-1]["event"] == "stopped" and events[-1]["exit_code"] == 0 == code
    assert events[-1]["stats"]["acks"] == 20
    info = await consumer_info(natspy, "slow")
    assert info.ack_floor.stream_seq == 20 and info.num_ack_pending == 0
    assert draining["signal"] == "SIGTERM"


@pytest.mark.slow  # a few seconds of timers: the full suite runs it
async def test_a_later_signal_stops_hard_with_the_status_it_logs(
    nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 20)
    path = write_pipeline(tmp_path, STUCK)
    async with headrace("run", str(path), "--nats", nats_server.url, *JSON_RUN) as proc:
        await proc.wait_event("progress", lambda e: e["stats"]["ack_pending"] == 20)
        proc.signal(signal.SIGTERM)
        index, draining = await proc.wait_event("draining")
        # The drain waits for a write that never ends; two seconds later, a second signal.
        later = _time(draining) + 2
        await proc.wait_event("progress", lambda e: _time(e) >= later, start=index)
        proc.signal(signal.SIGTERM)
        code = await proc.wait_exit(timeout=10)
    assert code == 128 + signal.SIGTERM
    events = proc.events()
    [stopping] = [e for e in events if e["event"] == "stopping"]
    assert stopping["signal"] == "SIGTERM" and stopping["hard"] is True
    assert _time(stopping) - _time(draining) >= 2
    assert events[-1]["event"] == "stopped" and events[-1]["exit_code"] == code
    info = await consumer_info(natspy, "stuck")
    assert info.ack_floor.stream_seq == 0  # nothing committed, nothing acked: redelivered


@pytest.mark.slow  # a few seconds of timers: the full suite runs it
async def test_a_hard_stop_that_hangs_exits_with_the_status_it_logs(
    nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 20)
    path = write_pipeline(tmp_path, STUCK_CLOSE)
    async with headrace("run", str(path), "--nats", nats_server.url, *JSON_RUN) as proc:
        await proc.wait_event("progress", lambda e: e["stats"]["ack_pending"] == 20)
        proc.signal(signal.SIGINT)
        index, draining = await proc.wait_event("draining")
        later = _time(draining) + SAME_REQUEST_WINDOW
        await proc.wait_event("progress", lambda e: _time(e) > later, start=index)
        proc.signal(signal.SIGINT)
        code = await proc.wait_exit(timeout=10)
    assert code == 128 + signal.SIGINT
    events = proc.events()
    final = events[-1]
    assert final["event"] == "stopped" and final["exit_code"] == code
    assert final["hard"] is True and final["forced"] is True


@pytest.mark.slow  # a few seconds of timers: the full suite runs it
async def test_a_signal_after_the_last_event_does_not_change_the_status(
    nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    """The run said ``stopped exit_code=0``; a signal while the process ends (its atexit work)
    used to meet the default handler again and kill it: status 143 (-SIGTERM)."""
    await create_stream(natspy, nats_server.url)
    await publish(natspy, 10)
    path = write_pipeline(tmp_path, SLOW_EXIT)
    async with headrace("run", str(path), "--nats", nats_server.url, *JSON_RUN) as proc:
        await proc.wait_event("progress", lambda e: e["stats"]["ack_pending"] == 10)
        proc.signal(signal.SIGTERM)
        _, stopped = await proc.wait_event("stopped")
        proc.signal(signal.SIGTERM)
        code = await proc.wait_exit(timeout=10)
    assert stopped["exit_code"] == 0 == code
    assert proc.events()[-1] == stopped
    info = await consumer_info(natspy, "slowexit")
    assert info.ack_floor.stream_seq == 10


#: A pipeline module that takes a while to import, and says when it has started to.
SLOW_IMPORT = """\
import sys
import time

print("importing", flush=True)
time.sleep(20)

pipeline = Pipeline("slowimport")
pipeline.source(JetStreamSource(stream="ORDERS", durable="slowimport")).sink(MemorySink())
"""


async def test_a_sigint_while_starting_is_kept_when_it_came_ignored(
    nats_server: Any, tmp_path: Path
) -> None:
    """A script's background job starts with SIGINT ignored, and Python keeps that: a SIGINT
    before the run installs its own handling (here, while the pipeline module is imported) was
    lost and the run went on. headrace takes SIGINT back at once: interrupted, exit 130."""
    path = write_pipeline(tmp_path, SLOW_IMPORT)
    args = ("run", str(path), "--nats", nats_server.url)
    async with headrace(*args, sigint_ignored=True) as proc:
        await proc.wait_line(lambda line: line == "importing", stream="out")
        proc.signal(signal.SIGINT)
        assert await proc.wait_exit(10) == 130, proc.transcript()
    assert proc.err[-1] == "headrace: interrupted"
