"""`headrace graph TARGET`: the Mermaid diagram, and errors as messages with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from headrace.cli.target import load_target

from tests.cli.cli_support import run_headrace, write_pipeline

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orders_pipeline.py"

PIPE = """\
def make():
    pipe = Pipeline("graphed")
    a = pipe.source(JetStreamSource(stream="A", durable="a"))
    b = pipe.source(JetStreamSource(stream="B", pull=False), name="b")
    merged = pipe.merge(a, b)
    merged.map(json.loads, name="decode").sink(MemorySink(), name="mem")
    merged.sink(JsonlSink("out"), name="files")
    return pipe

broken = Pipeline("broken")
broken.source(JetStreamSource(stream="A"))
"""


async def test_graph_prints_the_mermaid_diagram(tmp_path: Path) -> None:
    path = write_pipeline(tmp_path, PIPE)
    result = await run_headrace("graph", f"{path}:make")
    assert result.returncode == 0, result.stderr.decode()
    text = result.stdout.decode()
    assert text == load_target(f"{path}:make").describe()
    lines = text.splitlines()
    assert lines[0] == "flowchart LR"
    assert "  %% pipeline graphed" in lines
    for actor in (
        "source:a",
        "consume-buffer:A/a",
        "heartbeat-monitor:<ephemeral>",
        "map:decode",
        "merge:merge",
        "batcher:mem",
        "sink:files",
        "ack-tracker",
    ):
        assert f'"{actor}"' in text, actor
    assert result.stderr == b""


async def test_graph_of_the_example_in_module_form(tmp_path: Path) -> None:
    result = await run_headrace("graph", "orders_pipeline:make_pipeline", cwd=EXAMPLE.parent)
    assert result.returncode == 0, result.stderr.decode()
    text = result.stdout.decode()
    assert 'source orders: ORDERS/orders-lake (pull)"]' in text
    assert '"map:decode"' in text and '"filter:is_order"' in text and '"sink:lake"' in text
    by_path = await run_headrace("graph", str(EXAMPLE))  # the module's `pipeline`
    assert by_path.stdout == result.stdout


async def test_graph_invalid_pipeline(tmp_path: Path) -> None:
    path = write_pipeline(tmp_path, PIPE)
    result = await run_headrace("graph", f"{path}:broken")
    assert result.returncode == 2
    assert result.stdout == b""
    err = result.stderr.decode()
    assert err.startswith("headrace graph: invalid pipeline: pipeline 'broken' has no sink")
    assert "Traceback" not in err
    drawn = await run_headrace("graph", "--no-validate", f"{path}:broken")
    assert drawn.returncode == 0
    assert '"source:a"' in drawn.stdout.decode()


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("{dir}/missing.py:pipe", "missing.py: no such file"),
        ("{path}:nothing", "has no attribute 'nothing'"),
        (
            "{path}:json.loads",
            "is not a Pipeline, and as a pipeline factory it must take no arguments",
        ),
        ("no_such_module_xyz:pipe", "no module named 'no_such_module_xyz'"),
    ],
)
async def test_graph_bad_target(tmp_path: Path, target: str, message: str) -> None:
    path = write_pipeline(tmp_path, PIPE)
    result = await run_headrace("graph", target.format(dir=tmp_path, path=path))
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.startswith("headrace graph: ") and message in err, err
    assert "Traceback" not in err
    assert err.count("\n") == 1  # one line, no traceback


async def test_graph_usage_error() -> None:
    result = await run_headrace("graph")
    assert result.returncode == 2
    assert "the following arguments are required: TARGET" in result.stderr.decode()
