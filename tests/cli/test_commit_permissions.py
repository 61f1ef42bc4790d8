"""A user the server refuses the commit bucket is told so before the first batch, with what to
allow, and the run ends with exit code 2: a supervisor does not restart a run that would be
refused the same way (issue 23: the first batch failed with a bare permissions violation, exit
1, restarted for ever; with the state already made, batches failed for ever).

Real nats-server with users; nats-py (as the admin) publishes and reads the consumer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cli.cli_support import (
    consumer_info,
    create_stream,
    publish,
    run_headrace,
    write_pipeline,
)

pytestmark = pytest.mark.slow

JSONL = """\
pipeline = Pipeline("lake")
pipeline.source(JetStreamSource(stream="ORDERS", durable="lake")).sink(
    JsonlSink(OUT), name="out", batch=BatchPolicy(max_messages=10, max_age=0.1)
)
"""

AUTH = """\
authorization {
  users: [
    { user: "admin", password: "admin-pw" }
    { user: "writer", password: "writer-pw", permissions: {
        publish: { deny: ["$KV.headrace_commits.>"] }
    } }
  ]
}
"""


def refused(stderr: bytes) -> str:
    text = stderr.decode()
    [said] = [line for line in text.splitlines() if line.startswith("headrace run: ")]
    assert "CommitStateRefused" in said and "commit bucket 'headrace_commits'" in said, text
    assert '"$KV.headrace_commits.>"' in said and "commits='local'" in said, said
    return said


async def test_a_user_refused_the_commit_bucket_is_stopped_before_the_first_batch(
    nats_server_factory: Any, natspy: Any, tmp_path: Path
) -> None:
    server = nats_server_factory(auth=AUTH)
    admin = f"nats://admin:admin-pw@127.0.0.1:{server.port}"
    writer = f"nats://writer:writer-pw@127.0.0.1:{server.port}"
    await create_stream(natspy, admin)
    await publish(natspy, 20)
    out = tmp_path / "out"
    path = write_pipeline(tmp_path, f"OUT = {str(out)!r}\n" + JSONL)
    args = ("run", str(path), "--until-caught-up", "--nats")

    # No commit state yet: making it is refused.
    done = await run_headrace(*args, writer)
    assert done.returncode == 2, done.stderr.decode()
    refused(done.stderr)

    # Made by a user who may: the writer is stopped at open, before the first batch, though
    # it could read the state.
    done = await run_headrace(*args, admin)
    assert done.returncode == 0, done.stderr.decode()
    await publish(natspy, 20)
    written = sorted(p.name for p in out.glob("*.jsonl"))
    done = await run_headrace(*args, writer)
    assert done.returncode == 2, done.stderr.decode()
    assert "(publish to '$KV.headrace_commits." in refused(done.stderr)
    assert sorted(p.name for p in out.glob("*.jsonl")) == written
    info = await consumer_info(natspy, "lake")
    # Nothing taken from the 20 new messages: none delivered, none acked.
    assert info.ack_floor.stream_seq == 20 and info.num_ack_pending == 0
    assert info.num_pending == 20
