"""``headrace outputs``: its argument checks and its errors, against a real server where one is
needed. Its work on a real shared output (show, reset after a recreated stream) is tested in
tests/spark/test_workers.py; its sweep in tests/commits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.cli_support import run_headrace


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("reset", "OUT"), b"reset needs --stream NAME"),
        (("show", "OUT", "--stream", "S"), b"--stream applies to reset"),
        (("show", "OUT", "--stale-after", "3"), b"--stale-after applies to sweep"),
        (("sweep", "OUT", "--stale-after", "0"), b"must be positive"),
    ],
)
async def test_bad_arguments_exit_2(tmp_path: Path, args: tuple[str, ...], message: bytes) -> None:
    done = await run_headrace("outputs", *[str(tmp_path) if a == "OUT" else a for a in args])
    assert done.returncode == 2
    assert message in done.stderr


async def test_a_directory_that_is_not_a_shared_output(nats_server: Any, tmp_path: Path) -> None:
    done = await run_headrace("outputs", "show", str(tmp_path), "--nats", nats_server.url)
    assert done.returncode == 2
    assert b"is not an output shared by workers (no _headrace/output.json)" in done.stderr


async def test_a_manifest_whose_state_is_not_there(nats_server: Any, tmp_path: Path) -> None:
    """The manifest names a commit state this NATS system does not have (another cluster, a
    deleted bucket): said, not guessed."""
    control = tmp_path / "_headrace"
    control.mkdir()
    manifest = {
        "version": 1,
        "id": "0123456789abcdef0123456789abcdef",
        "owner": "p/s",
        "bucket": "headrace_commits",
        "created": "2026-11-26T00:00:00+00:00",
    }
    (control / "output.json").write_text(json.dumps(manifest))
    done = await run_headrace("outputs", "show", str(tmp_path), "--nats", nats_server.url)
    assert done.returncode == 2
    assert b"does not exist in this NATS system" in done.stderr
