"""Finding and loading sink plugins through the ``headrace.sinks`` entry point group."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
from headrace.errors import HeadraceError
from headrace.sinks import (
    GROUP,
    JsonlSink,
    MemorySink,
    SinkLoadError,
    StdoutSink,
    UnknownSink,
    available_sinks,
    load_sink,
)

EntryPoint = importlib.metadata.EntryPoint


@pytest.fixture
def extra_plugins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[EntryPoint]:
    """Entry points added to the installed ones (append to the list); plugin modules may be
    written to ``tmp_path``, which is on ``sys.path``."""
    extras: list[EntryPoint] = []
    real = importlib.metadata.entry_points

    def fake(*, group: str) -> importlib.metadata.EntryPoints:
        found: list[EntryPoint] = [*real(group=group)]
        found += [ep for ep in extras if ep.group == group]
        return importlib.metadata.EntryPoints(found)

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    monkeypatch.syspath_prepend(str(tmp_path))
    return extras


def plugin(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=GROUP)


def test_the_built_ins_are_registered() -> None:
    sinks = available_sinks()
    assert {"jsonl", "memory", "stdout"} <= set(sinks)
    assert sinks["jsonl"].value == "headrace.sinks.jsonl:JsonlSink"
    assert list(sinks) == sorted(sinks)


def test_load_by_name_with_options(tmp_path: Path) -> None:
    jsonl = load_sink("jsonl", directory=tmp_path / "out", fsync=False)
    assert isinstance(jsonl, JsonlSink)
    assert jsonl.directory == tmp_path / "out" and jsonl.fsync is False
    memory = load_sink("memory", fail_times=2, delay=0.5)
    assert isinstance(memory, MemorySink)
    assert (memory.fail_times, memory.delay) == (2, 0.5)
    assert isinstance(load_sink("stdout"), StdoutSink)


def test_unknown_name_lists_the_choices() -> None:
    with pytest.raises(UnknownSink) as info:
        load_sink("parquet")
    err = info.value
    assert isinstance(err, HeadraceError) and isinstance(err, LookupError)
    assert err.name == "parquet"
    assert {"jsonl", "memory", "stdout"} <= set(err.available)
    assert "'parquet'" in str(err) and "jsonl, memory" in str(err)


def test_plugin_that_raises_on_import(extra_plugins: list[EntryPoint], tmp_path: Path) -> None:
    (tmp_path / "sinkplugin_broken.py").write_text("raise RuntimeError('no driver installed')\n")
    extra_plugins.append(plugin("broken", "sinkplugin_broken:BrokenSink"))
    assert "broken" in available_sinks()
    with pytest.raises(SinkLoadError) as info:
        load_sink("broken")
    err = info.value
    assert err.name == "broken" and err.target == "sinkplugin_broken:BrokenSink"
    assert "'broken'" in str(err) and "failed to import" in str(err)
    assert "no driver installed" in str(err)
    assert isinstance(err.__cause__, RuntimeError)


def test_plugin_whose_module_is_missing(extra_plugins: list[EntryPoint]) -> None:
    extra_plugins.append(plugin("ghost", "sinkplugin_not_installed:Sink"))
    with pytest.raises(SinkLoadError, match=r"'ghost'.*failed to import") as info:
        load_sink("ghost")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_plugin_object_that_is_not_callable(
    extra_plugins: list[EntryPoint], tmp_path: Path
) -> None:
    (tmp_path / "sinkplugin_const.py").write_text("SINK = 42\n")
    extra_plugins.append(plugin("const", "sinkplugin_const:SINK"))
    with pytest.raises(SinkLoadError, match=r"'const'.*not a class or factory"):
        load_sink("const")


def test_bad_options_name_the_plugin(tmp_path: Path) -> None:
    with pytest.raises(SinkLoadError, match=r"'memory'.*could not be created with colour='red'"):
        load_sink("memory", colour="red")
    with pytest.raises(SinkLoadError, match="fail_times must not be negative") as info:
        load_sink("memory", fail_times=-1)
    assert isinstance(info.value.__cause__, ValueError)


def test_a_plugin_factory(extra_plugins: list[EntryPoint], tmp_path: Path) -> None:
    (tmp_path / "sinkplugin_factory.py").write_text(
        "from headrace.sinks import MemorySink\n"
        "def make(*, slow):\n"
        "    return MemorySink(delay=1.0 if slow else 0.0)\n"
    )
    extra_plugins.append(plugin("factory", "sinkplugin_factory:make"))
    sink = load_sink("factory", slow=True)
    assert isinstance(sink, MemorySink) and sink.delay == 1.0
