"""One exception hierarchy: every error headrace and its Spark plugin can raise derives from
``HeadraceError``, so an application catches the whole family with one ``except``.

The test imports every module of ``framework/headrace`` and ``plugins/headrace_spark`` and looks
at every exception class defined in it, so an error class added anywhere later is checked too.
Two kinds are exempt, by rule rather than by name:

- warnings, which must derive from ``HeadraceWarning`` instead;
- private classes (``_Name``): control-flow signals raised and caught inside their module
  (``_NothingToDo`` in the checkpoint workers, ``_ReconnectRequested`` in the connection). They
  never reach an application, and a broad ``except HeadraceError`` inside the library must not
  swallow them.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import warnings
from collections.abc import Iterator
from types import ModuleType

import headrace
import headrace_spark
import pytest
from headrace import HeadraceError, HeadraceWarning


def modules(package: ModuleType) -> Iterator[ModuleType]:
    """The package and every module under it (``__main__`` is not imported: it runs the CLI).
    Modules kept only as deprecated aliases warn when imported; that is not this test's matter."""
    yield package
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        if info.name.rsplit(".", 1)[-1] != "__main__":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                module = importlib.import_module(info.name)
            yield module


def defined_exceptions() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for package in (headrace, headrace_spark):
        for module in modules(package):
            for value in vars(module).values():
                if (
                    inspect.isclass(value)
                    and issubclass(value, BaseException)
                    and value.__module__ == module.__name__
                ):
                    found.append(value)
    return found


EXCEPTIONS = defined_exceptions()


def test_the_walk_finds_the_known_errors():
    """The walk itself works: it finds errors of the core, the layers and the plugin."""
    names = {cls.__qualname__ for cls in EXCEPTIONS}
    assert {"HeadraceError", "ActorFailed", "DecodeError", "SparkSinkError", "DemoError"} <= names
    assert len(EXCEPTIONS) > 80


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_error_is_a_headrace_error(cls: type[BaseException]):
    if cls.__name__.startswith("_"):
        return  # private control flow, see the module docs
    if issubclass(cls, Warning):
        assert issubclass(cls, HeadraceWarning), f"{cls!r} is a warning but no HeadraceWarning"
    else:
        assert issubclass(cls, HeadraceError), f"{cls!r} does not derive from HeadraceError"


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("InvalidSubjectError", ValueError),
        ("InvalidHeaderError", ValueError),
        ("NatsTimeoutError", TimeoutError),
        ("PipelineError", ValueError),
        ("UnknownSink", LookupError),
        ("UnserialisableValue", TypeError),
    ],
)
def test_builtin_bases_are_kept(name: str, builtin: type[BaseException]):
    """Joining the hierarchy keeps the other bases, so ``except ValueError`` still works."""
    (cls,) = {c for c in EXCEPTIONS if c.__name__ == name}
    assert issubclass(cls, HeadraceError) and issubclass(cls, builtin)
