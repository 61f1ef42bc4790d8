"""Fixtures of the CLI tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _isolated_imports() -> Iterator[None]:
    """load_target puts directories on sys.path and modules in sys.modules: undo that."""
    path, modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        del sys.modules[name]
