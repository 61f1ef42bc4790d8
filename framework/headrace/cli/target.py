"""Loading the pipeline a ``TARGET`` names: ``path/to/file.py:name`` or ``package.module:name``.

``name`` is an attribute of the module (dots reach further: ``module:factories.orders``); it is
either a :class:`~headrace.pipeline.Pipeline` or a callable that takes no arguments and returns
one. Without ``:name`` the module's ``pipeline`` attribute is used, or its only Pipeline.

A file is imported under its own name (its directory first on ``sys.path``, so that it can
import its neighbours); a module is imported with the current directory on ``sys.path``, as
``python -m`` would. Every way this can go wrong raises :class:`TargetError` with a message that
says what to fix, and, for an error raised by the user's code, where it was raised.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from headrace.errors import HeadraceError
from headrace.pipeline.graph import Pipeline

DEFAULT_ATTRIBUTE = "pipeline"


class TargetError(HeadraceError):
    """A TARGET that does not name a pipeline: the message says why."""


def split_target(target: str) -> tuple[str, str | None]:
    """``(location, attribute)``; the attribute is ``None`` when the target has no ``:name``.

    The last colon separates them, except a colon that is part of a Windows drive (``C:\\x.py``).
    """
    if not target or not target.strip():
        raise TargetError("TARGET is empty: give path/to/file.py:name or package.module:name")
    location, sep, attribute = target.rpartition(":")
    if not sep or (len(location) == 1 and attribute[:1] in ("\\", "/")):
        return target, None
    if not location:
        raise TargetError(f"TARGET {target!r} names no file or module before the ':'")
    if not attribute:
        raise TargetError(f"TARGET {target!r} names no attribute after the ':'")
    return location, attribute


def _is_file_location(location: str) -> bool:
    return location.endswith(".py") or os.sep in location or "/" in location


def load_target(target: str) -> Pipeline:
    """The :class:`Pipeline` that ``target`` names; see the module docs."""
    location, attribute = split_target(target)
    module = _import_file(location) if _is_file_location(location) else _import_module(location)
    if attribute is None:
        obj, attribute = _default_object(module, location)
    else:
        obj = _resolve(module, attribute, location)
    return _to_pipeline(obj, f"{location}:{attribute}")


def _where(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of ``exc``'s traceback, outside importlib."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
    if not frames:
        return ""
    frame = frames[-1]
    return f" (at {frame.filename}:{frame.lineno})"


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text + _where(exc)


def _import_file(location: str) -> ModuleType:
    path = Path(location).expanduser()
    if not path.exists():
        raise TargetError(f"{location}: no such file")
    if path.is_dir():
        raise TargetError(f"{location} is a directory, not a Python file")
    if path.suffix != ".py":
        raise TargetError(f"{location} is not a Python file (.py)")
    path = path.resolve()
    name = path.stem if path.stem.isidentifier() else "headrace_target"
    if name in sys.modules:
        existing = getattr(sys.modules[name], "__file__", None)
        if existing is None or Path(existing).resolve() != path:
            name = f"headrace_target_{name}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - only for odd suffixes
        raise TargetError(f"{location}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    directory = str(path.parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    sys.modules[name] = module  # dataclasses, pickling and the like look modules up by name
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[name]
        raise TargetError(f"{location}, line {exc.lineno}: syntax error: {exc.msg}") from None
    except BaseException as exc:
        del sys.modules[name]
        if not isinstance(exc, Exception):
            raise
        raise TargetError(f"importing {location} failed: {_describe(exc)}") from exc
    return module


def _import_module(location: str) -> ModuleType:
    if not all(part.isidentifier() for part in location.split(".")):
        raise TargetError(
            f"{location!r} is neither a Python file (path/to/file.py) nor a module name "
            "(package.module)"
        )
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(location)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (location == exc.name or location.startswith(exc.name + ".")):
            raise TargetError(
                f"no module named {exc.name!r} (looked for {location!r} on sys.path, the "
                "current directory first); for a file, give its path: path/to/file.py:name"
            ) from None
        raise TargetError(f"importing {location} failed: {_describe(exc)}") from exc
    except SyntaxError as exc:
        raise TargetError(f"{exc.filename}, line {exc.lineno}: syntax error: {exc.msg}") from None
    except Exception as exc:
        raise TargetError(f"importing {location} failed: {_describe(exc)}") from exc


def _resolve(module: ModuleType, attribute: str, location: str) -> Any:
    obj: Any = module
    walked: list[str] = []
    for part in attribute.split("."):
        if not part.isidentifier():
            raise TargetError(f"{attribute!r} is not an attribute name (in {location})")
        try:
            obj = getattr(obj, part)
        except AttributeError:
            owner = location if not walked else f"{location}:{'.'.join(walked)}"
            names = [n for n in dir(obj) if not n.startswith("__")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TargetError(f"{owner} has no attribute {part!r}{hint}") from None
        walked.append(part)
    return obj


def _default_object(module: ModuleType, location: str) -> tuple[Any, str]:
    if hasattr(module, DEFAULT_ATTRIBUTE):
        return getattr(module, DEFAULT_ATTRIBUTE), DEFAULT_ATTRIBUTE
    found = [(k, v) for k, v in vars(module).items() if isinstance(v, Pipeline)]
    if len(found) == 1:
        name, obj = found[0]
        return obj, name
    if not found:
        raise TargetError(
            f"{location} has no attribute {DEFAULT_ATTRIBUTE!r} and no Pipeline object: "
            f"name one, as {location}:NAME"
        )
    names = ", ".join(k for k, _ in found)
    raise TargetError(f"{location} holds several pipelines ({names}): name one, as {location}:NAME")


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"


def _to_pipeline(obj: Any, where: str) -> Pipeline:
    if isinstance(obj, Pipeline):
        return obj
    if not callable(obj):
        raise TargetError(
            f"{where} is {_a(type(obj).__name__)}, not a Pipeline or a function returning one"
        )
    if inspect.iscoroutinefunction(obj):
        raise TargetError(
            f"{where} is an async function; a pipeline factory must be a plain function "
            "returning the Pipeline"
        )
    try:
        inspect.signature(obj).bind()
    except TypeError as exc:
        raise TargetError(
            f"{where} is not a Pipeline, and as a pipeline factory it must take no arguments: {exc}"
        ) from None
    except ValueError:
        pass  # no signature to check (some builtins): calling it will tell
    try:
        made = obj()
    except Exception as exc:
        raise TargetError(f"calling {where}() failed: {_describe(exc)}") from exc
    if not isinstance(made, Pipeline):
        raise TargetError(f"{where}() returned {_a(type(made).__name__)}, not a Pipeline")
    return made
