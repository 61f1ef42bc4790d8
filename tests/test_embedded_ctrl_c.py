"""docs/pipelines.md's plain-trio embedding, interrupted as at a terminal: the pattern the page
shows ends with exit 130 and no traceback, after a drain that acked what was taken (issue 23:
the documented app ended in a BaseExceptionGroup traceback, exit 1, 4 of 4)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.natspy_peer import consumer_info

ROOT = Path(__file__).resolve().parent.parent

APP = """\
import sys

import trio
from headrace import connect
from headrace.pipeline import JetStreamSource, Pipeline
from headrace.sinks import MemorySink

URL = sys.argv[1]
pipe = Pipeline("embedded", drain_timeout=10)
pipe.source(JetStreamSource(stream="S", durable="C")).sink(MemorySink())


async def my_task() -> None:
    await trio.sleep_forever()


async def main() -> None:
    async with connect(URL) as nc, trio.open_nursery() as nursery:
        async with pipe.running(nc) as run:
            nursery.start_soon(my_task)
            await run.wait_bound()
            await run.wait_caught_up()
            print("caught up", flush=True)
            await trio.sleep_forever()

"""


def test_the_page_shows_its_catch_block() -> None:
    page = (ROOT / "docs" / "pipelines.md").read_text()
    assert "except* KeyboardInterrupt:" in page and "sys.exit(130)" in page


@pytest.mark.slow
async def test_ctrl_c_ends_the_documented_app_cleanly(
    nats_server: Any, natspy: Any, tmp_path: Path
) -> None:
    page = (ROOT / "docs" / "pipelines.md").read_text()
    # The page's own catch block, as written, around trio.run(main).
    [catch] = re.findall(r"```python\nimport sys\n\n(try:\n.*?)```", page, re.S)
    (tmp_path / "app.py").write_text(APP + catch)
    await natspy.connect(nats_server.url)
    js = natspy.nc.jetstream()
    await natspy.call(js.add_stream, name="S", subjects=["s.>"])
    for i in range(10):
        await natspy.call(js.publish, "s.x", b"%d" % i)
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(tmp_path / "app.py"), nats_server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    err = bytearray()

    async def collect() -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.receive_some(65536):
            err.extend(chunk)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect)
        out = b""
        with trio.fail_after(30):
            while b"caught up\n" not in out:
                chunk = await proc.stdout.receive_some(65536)
                assert chunk, f"the app ended early:\n{err.decode()}"
                out += chunk
        proc.send_signal(signal.SIGINT)
        with trio.fail_after(30):
            code = await proc.wait()
    text = err.decode()
    assert code == 130, text
    assert "Traceback" not in text, text
    info = await consumer_info(natspy)
    assert info.ack_floor.stream_seq == 10 and info.num_ack_pending == 0
