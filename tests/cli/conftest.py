"""Fixtures of the CLI tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _isolated_imports() -> Iterator[None]:
    """load_target puts directories on sys.path and modules in sys.modules: undo that.

    Only the modules loaded from the directories it added are forgotten: dropping a library
    module imported meanwhile (cryptography's, say) would leave its old classes in use by the
    modules that imported it and break isinstance checks in later tests.
    """
    path, modules = list(sys.path), set(sys.modules)
    yield
    added = [p for p in sys.path if p not in path and p]
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) or ""
        if origin and any(origin.startswith(p) for p in added):
            del sys.modules[name]
