"""``import headrace`` is the front door: the nouns a pipeline author builds with, and the base
classes of the errors they catch; leaf errors stay in their packages, each sub-package with a
curated ``__all__``. The front door loads the pipeline runtime only when one of its names is
used."""

from __future__ import annotations

import importlib
import subprocess
import sys

import headrace
import pytest

PACKAGES = [
    "headrace",
    "headrace.actors",
    "headrace.checkpoints",
    "headrace.commits",
    "headrace.jetstream",
    "headrace.nats",
    "headrace.pipeline",
    "headrace.protocol",
    "headrace.sinks",
]

FIRST_NEEDS = {
    "Pipeline",
    "Node",
    "JetStreamSource",
    "BatchPolicy",
    "Record",
    "SinkRetry",
    "SinkContext",
    "JsonlSink",
    "MemorySink",
    "StdoutSink",
    "RecordsRejected",
    "connect",
    "JetStream",
    "run_until_signal",
    # the error base classes
    "HeadraceError",
    "NatsError",
    "JetStreamError",
    "KeyValueError",
    "CommitError",
    "SinkError",
    "PipelineError",
    "CheckpointError",
}

#: Exceptions at the front door that are no base class: the two a sink raises.
RAISED_BY_SINKS = {"RecordsRejected", "SinkUnavailable"}


def test_the_front_door_has_what_a_pipeline_author_needs_first():
    assert set(headrace.__all__) >= FIRST_NEEDS


def test_the_front_door_lists_base_errors_only():
    """A leaf error (``StreamNotFound``, ``KeyNotFound``) is imported from its package: at the
    front door, an exception class is one others derive from (what ``except`` catches)."""
    leaves = {
        name
        for name in headrace.__all__
        if isinstance(value := getattr(headrace, name), type)
        and issubclass(value, BaseException | Warning)
        and not value.__subclasses__()
    }
    assert leaves == RAISED_BY_SINKS
    assert len(headrace.__all__) < 60


@pytest.mark.parametrize("name", PACKAGES)
def test_every_listed_name_is_there(name: str):
    module = importlib.import_module(name)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing
    assert len(set(module.__all__)) == len(module.__all__)


def test_the_front_door_is_the_same_objects_as_the_packages():
    import headrace.pipeline
    import headrace.sinks

    assert headrace.Pipeline is headrace.pipeline.Pipeline
    assert headrace.JsonlSink is headrace.sinks.JsonlSink
    assert headrace.SinkContext is headrace.pipeline.SinkContext
    assert {"Pipeline", "JsonlSink"} <= set(dir(headrace))


def test_import_headrace_does_not_load_the_pipeline_runtime():
    """``headrace --help`` and ``import headrace`` stay fast: the pipeline is loaded on use."""
    code = (
        "import sys, headrace\n"
        "assert 'headrace.pipeline' not in sys.modules, 'loaded early'\n"
        "headrace.Pipeline\n"
        "assert 'headrace.pipeline' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_names_no_longer_listed_are_gone():
    """Exported by the front door before issue 12, then deprecated there; nothing has been
    released, so the aliases are gone (issue 25): import them from their sub-package."""
    import headrace.jetstream

    assert headrace.jetstream.KeyValue is not None
    assert "KeyValue" not in headrace.__all__
    for name in ("KeyValue", "StreamNotFound", "ConnectionClosedError", "NoSuchThing"):
        with pytest.raises(AttributeError):
            getattr(headrace, name)


def test_a_moved_class_has_one_home():
    """Nothing has been released: a class that moved is imported from where it is now, and
    its old module does not re-export it (issue 25 removed the last such re-exports)."""
    import headrace.pipeline.graph

    assert headrace.PipelineError is headrace.pipeline.PipelineError
    assert not hasattr(headrace.pipeline.graph, "PipelineError")
    assert not hasattr(headrace.pipeline.graph, "OPERATORS")
