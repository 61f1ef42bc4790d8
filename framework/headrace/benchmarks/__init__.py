"""Deprecated: the benchmarks moved out of the headrace package.

They are the ``headrace-bench`` distribution now (``bench/`` in the repository, module
``headrace_bench``), installed by the checkout's set-up; ``headrace bench`` works as before.
``from headrace.benchmarks import consume`` still finds ``headrace_bench.consume`` through this
module, with a DeprecationWarning, until the next release removes it. The lookup is by name at
run time, so the framework still imports nothing of the benchmarks.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

_MOVED = "headrace.benchmarks moved to headrace_bench (bench/ in the repository)"

warnings.warn(f"{_MOVED}; import headrace_bench instead", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> ModuleType:
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return importlib.import_module(f"headrace_bench.{name}")
    except ModuleNotFoundError as exc:
        raise AttributeError(
            f"{_MOVED}, which has no module {name!r} or is not installed ({exc})"
        ) from None
