"""``headrace demo`` refusing to run, clearly, before any Spark work (the full run is in
tests/spark/test_demo.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.cli.cli_support import clean_env, create_stream, run_headrace
from tests.servers import free_port


async def test_without_java_names_the_package(tmp_path: Path) -> None:
    # PATH holds the venv's scripts only: python and headrace, no java.
    env = clean_env(PATH=str(Path(sys.executable).parent))
    env.pop("JAVA_HOME", None)
    result = await run_headrace("demo", "--out", str(tmp_path / "out"), env=env)
    assert result.returncode == 2
    err = result.stderr.decode()
    assert "needs a Java 17+ runtime" in err, err
    assert "openjdk-17-jre-headless" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


async def test_refuses_an_output_directory_that_is_not_its_own(tmp_path: Path) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    url = f"nats://127.0.0.1:{free_port()}"
    result = await run_headrace("demo", "--out", str(out), "--nats", url)
    assert result.returncode == 2
    err = result.stderr.decode()
    assert "is not empty and not a headrace output" in err, err
    assert (out / "thesis.tex").read_text() == "years of work"


async def test_unreachable_server_exits_2(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    result = await run_headrace("demo", "--out", str(tmp_path / "out"), "--nats", url)
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.startswith("headrace demo: "), err
    assert url in err
    assert "Traceback" not in err


async def test_leaves_an_existing_stream_alone(nats_server, natspy, tmp_path: Path) -> None:
    await create_stream(natspy, nats_server.url, name="HEADRACE_DEMO")
    result = await run_headrace(
        "demo", "--out", str(tmp_path / "out"), "--nats", nats_server.url, "--messages", "10"
    )
    assert result.returncode == 2
    assert "already has a stream HEADRACE_DEMO" in result.stderr.decode()
    info = await natspy.call(natspy.nc.jetstream().stream_info, "HEADRACE_DEMO")
    assert info.config.name == "HEADRACE_DEMO"  # still there: not the demo's to delete


async def test_rejects_a_non_positive_count(tmp_path: Path) -> None:
    result = await run_headrace("demo", "--messages", "0", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "--messages: must be at least 1, not 0" in result.stderr.decode()
