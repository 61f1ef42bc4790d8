"""Loading TARGET (file and module forms, factories, errors) and the command-line overrides."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from headrace.cli.overrides import OverrideError, Overrides, parse_value
from headrace.cli.target import TargetError, load_target, split_target
from headrace.pipeline import Pipeline
from headrace.sinks import JsonlSink, MemorySink, SinkLoadError, StdoutSink, UnknownSink

from tests.cli.cli_support import PIPELINE_HEADER, write_pipeline

PIPE = """\
def build(name="orders"):
    pipe = Pipeline(name)
    pipe.source(JetStreamSource(stream="ORDERS", durable="d")).map(json.loads).sink(
        MemorySink(), name="out"
    )
    return pipe

pipeline = build()
other = 42

def make():
    return build("made")

def needs(arg):
    return build(arg)

def broken():
    raise RuntimeError("no config")

def not_a_pipeline():
    return "nope"

async def async_factory():
    return build()

class Holder:
    inner = build("inner")
"""

#: The line of PIPE's ``raise RuntimeError`` in the written file.
RAISE_LINE = (PIPELINE_HEADER + "\n" + PIPE).splitlines().index(
    '    raise RuntimeError("no config")'
) + 1


@pytest.fixture
def pipe_file(tmp_path: Path) -> Path:
    return write_pipeline(tmp_path, PIPE)


def test_split_target() -> None:
    assert split_target("a/b.py:pipe") == ("a/b.py", "pipe")
    assert split_target("pkg.mod:obj.attr") == ("pkg.mod", "obj.attr")
    assert split_target("a/b.py") == ("a/b.py", None)
    for bad in ("", "  ", ":x", "mod:"):
        with pytest.raises(TargetError):
            split_target(bad)


def test_file_with_pipeline_object(pipe_file: Path) -> None:
    pipe = load_target(f"{pipe_file}:pipeline")
    assert isinstance(pipe, Pipeline)
    assert pipe.name == "orders"
    assert [n.name for n in pipe.sinks] == ["out"]


def test_file_with_factory(pipe_file: Path) -> None:
    assert load_target(f"{pipe_file}:make").name == "made"


def test_file_nested_attribute(pipe_file: Path) -> None:
    assert load_target(f"{pipe_file}:Holder.inner").name == "inner"


def test_file_without_name_uses_pipeline_attribute(pipe_file: Path) -> None:
    assert load_target(str(pipe_file)).name == "orders"


def test_file_without_name_finds_the_only_pipeline(tmp_path: Path) -> None:
    path = write_pipeline(
        tmp_path,
        """\
        orders = Pipeline("only")
        orders.source(JetStreamSource(stream="S")).sink(MemorySink())
        """,
    )
    assert load_target(str(path)).name == "only"


def test_file_without_name_and_several_pipelines(tmp_path: Path) -> None:
    path = write_pipeline(tmp_path, 'a = Pipeline("a")\nb = Pipeline("b")\n')
    with pytest.raises(TargetError, match=r"several pipelines \(a, b\)"):
        load_target(str(path))


def test_file_without_name_and_no_pipeline(tmp_path: Path) -> None:
    path = write_pipeline(tmp_path, "x = 1\n")
    with pytest.raises(TargetError, match="no attribute 'pipeline' and no Pipeline"):
        load_target(str(path))


def test_file_relative_path_and_sibling_import(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "helpers.py").write_text("STREAM = 'FROM_HELPER'\n")
    write_pipeline(
        tmp_path,
        """\
        import helpers
        pipeline = Pipeline("p")
        pipeline.source(JetStreamSource(stream=helpers.STREAM)).sink(MemorySink())
        """,
        name="with_sibling.py",
    )
    monkeypatch.chdir(tmp_path)
    pipe = load_target("./with_sibling.py:pipeline")
    assert pipe.sources[0].source.stream == "FROM_HELPER"


def test_module_form(tmp_path: Path, monkeypatch) -> None:
    package = tmp_path / "mypipes"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write_pipeline(package, PIPE, name="orders.py")
    monkeypatch.chdir(tmp_path)  # module targets are looked up from the current directory
    assert load_target("mypipes.orders:pipeline").name == "orders"
    assert load_target("mypipes.orders:make").name == "made"
    assert load_target("mypipes.orders").name == "orders"


@pytest.mark.parametrize(
    ("suffix", "message"),
    [
        (":other", r":other is an int, not a Pipeline or a function returning one"),
        (":missing", r"has no attribute 'missing'"),
        (":Holder.nothing", r":Holder has no attribute 'nothing'"),
        (":needs", r"must take no arguments: missing a required argument: 'arg'"),
        (
            ":broken",
            rf"calling .*:broken\(\) failed: RuntimeError: no config \(at .*pipe.py:{RAISE_LINE}\)",
        ),
        (":not_a_pipeline", r"not_a_pipeline\(\) returned a str, not a Pipeline"),
        (":async_factory", r"is an async function"),
    ],
)
def test_file_attribute_errors(pipe_file: Path, suffix: str, message: str) -> None:
    with pytest.raises(TargetError, match=message):
        load_target(f"{pipe_file}{suffix}")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match=r"nope\.py: no such file"):
        load_target(f"{tmp_path}/nope.py:pipeline")


def test_directory_and_not_python(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="is a directory"):
        load_target(f"{tmp_path}/:x")
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(TargetError, match=r"not a Python file \(\.py\)"):
        load_target(f"{tmp_path}/data.txt:x")


def test_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.py"
    path.write_text("x = 1\ndef (:\n")
    with pytest.raises(TargetError, match=r"bad\.py, line 2: syntax error"):
        load_target(f"{path}:x")


def test_import_error_names_the_place(tmp_path: Path) -> None:
    path = tmp_path / "fails.py"
    path.write_text("x = 1\nraise ValueError('bad setting')\n")
    with pytest.raises(
        TargetError, match=r"importing .* failed: ValueError: bad setting \(at .*fails\.py:2\)"
    ):
        load_target(f"{path}:x")
    assert "fails" not in sys.modules


def test_missing_dependency_of_a_file(tmp_path: Path) -> None:
    path = tmp_path / "deps.py"
    path.write_text("import no_such_dependency_xyz\n")
    with pytest.raises(TargetError, match="No module named 'no_such_dependency_xyz'"):
        load_target(f"{path}:x")


def test_module_not_found() -> None:
    with pytest.raises(TargetError, match=r"no module named 'no_such_module_xyz'"):
        load_target("no_such_module_xyz:pipeline")
    with pytest.raises(TargetError, match="neither a Python file"):
        load_target("not-a-module:pipeline")


def test_module_with_missing_dependency(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "needsdep.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TargetError, match=r"importing needsdep failed: ModuleNotFoundError"):
        load_target("needsdep:x")


# -- overrides ---------------------------------------------------------------------------------


def test_parse_value() -> None:
    assert parse_value("10") == 10
    assert parse_value("true") is True
    assert parse_value("null") is None
    assert parse_value('"x"') == "x"
    assert parse_value("out/dir") == "out/dir"


def test_sink_override_with_plugin_and_options(pipe_file: Path, tmp_path: Path) -> None:
    pipe = load_target(f"{pipe_file}:pipeline")
    Overrides.parse(
        sinks=["out=jsonl"],
        sink_options=[f"out.directory={tmp_path / 'files'}", "out.fsync=false"],
    ).apply(pipe)
    sink = pipe.node("out").sink_obj
    assert isinstance(sink, JsonlSink)
    assert sink.directory == tmp_path / "files"
    assert sink.fsync is False
    Overrides.parse(sinks=["out=stdout"]).apply(pipe)
    assert isinstance(pipe.node("out").sink_obj, StdoutSink)
    pipe.validate()


def test_sink_override_errors(pipe_file: Path) -> None:
    pipe = load_target(f"{pipe_file}:pipeline")
    with pytest.raises(OverrideError, match=r"no sink named 'lake' \(its sinks: out\)"):
        Overrides.parse(sinks=["lake=jsonl"]).apply(pipe)
    with pytest.raises(UnknownSink, match="no sink named 'nosuch'"):
        Overrides.parse(sinks=["out=nosuch"]).apply(pipe)
    with pytest.raises(SinkLoadError, match="could not be created"):
        Overrides.parse(sinks=["out=memory"], sink_options=["out.colour=1"]).apply(pipe)
    with pytest.raises(OverrideError, match="no --sink out=PLUGIN"):
        Overrides.parse(sink_options=["out.x=1"]).apply(pipe)
    for bad in (["out"], ["=jsonl"], ["out="]):
        with pytest.raises(OverrideError, match="NAME=PLUGIN"):
            Overrides.parse(sinks=bad)
    with pytest.raises(OverrideError, match=r"NAME\.key=value"):
        Overrides.parse(sink_options=["novalue"])
    assert isinstance(pipe.node("out").sink_obj, MemorySink)  # unchanged by the failures


def test_durable_and_drain_timeout_overrides(pipe_file: Path) -> None:
    pipe = load_target(f"{pipe_file}:pipeline")
    Overrides.parse(durables=["other"], drain_timeout=2.5).apply(pipe)
    assert pipe.sources[0].source.durable == "other"
    assert pipe.drain_timeout == 2.5
    Overrides.parse(durables=["d=third"]).apply(pipe)  # the source node keeps its name, "d"
    assert pipe.sources[0].source.durable == "third"
    with pytest.raises(OverrideError, match="no source named 'x'"):
        Overrides.parse(durables=["x=y"]).apply(pipe)
    with pytest.raises(OverrideError, match="must be positive"):
        Overrides.parse(drain_timeout=0)


def test_durable_override_needs_the_source_with_several(tmp_path: Path) -> None:
    path = write_pipeline(
        tmp_path,
        """\
        pipeline = Pipeline("two")
        a = pipeline.source(JetStreamSource(stream="A", durable="a"))
        b = pipeline.source(JetStreamSource(stream="B", durable="b"))
        pipeline.merge(a, b).sink(MemorySink())
        """,
    )
    pipe = load_target(str(path))
    with pytest.raises(OverrideError, match=r"has 2 sources \(a, b\); say which"):
        Overrides.parse(durables=["z"]).apply(pipe)
    Overrides.parse(durables=["b=z"]).apply(pipe)
    assert [n.source.durable for n in pipe.sources] == ["a", "z"]
