"""The import contract of docs/architecture.md section 2, checked on the source with ``ast``.

Every ``import`` in ``framework/headrace``, ``plugins/headrace_spark`` and
``bench/headrace_bench`` is an edge of the import graph, wherever it stands (a lazy import inside
a function counts), except imports under ``if TYPE_CHECKING:``, which never run. Four rules:

- a layer imports only layers below it (:data:`LAYERS`; packages on one level do not import
  each other);
- the framework never imports the plugin (``headrace_spark``): plugins are found through entry
  points;
- the plugin and the bench import headrace through its public faces only (the names a plugin
  author has too), type-only imports included; the bench imports the plugin's public faces
  only;
- no import cycles, counting the ``TYPE_CHECKING`` imports too, apart from those in
  :data:`KNOWN_CYCLES`, each of which is to be removed. A cycle that grows, or a new one, fails.

It also checks that the examples and the docs import from the public faces only (see "Public
and internal" in docs/architecture.md).
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {
    "headrace": ROOT / "framework" / "headrace",
    "headrace_spark": ROOT / "plugins",
    "headrace_bench": ROOT / "bench",
}

#: The level of each part of headrace (a sub-package or a top-level module, by its first name
#: under ``headrace``): each may import the parts on lower levels only. From the layer table
#: of docs/architecture.md section 2.
LAYERS: dict[str, int] = {
    "_version": 0,
    "errors": 0,
    "_run_registry": 0,  # the run registry shared by pipeline/ and shutdown.py
    "_trio": 0,  # generic trio helpers (event hub, either, BodyError) for every layer
    "_validators": 0,  # the attrs validators the options classes of every layer share
    "protocol": 1,
    "localserver": 1,
    "nats": 2,
    "actors": 2,  # beside nats: neither imports the other
    "jetstream": 3,
    "commits": 4,
    "checkpoints": 4,  # on jetstream, beside commits
    "state": 4,  # keyed state, windows and their snapshots: on jetstream, beside commits
    "pipeline": 5,  # the sink contract (pipeline/sink.py) is here: sinks/ is above
    "sinks": 6,
    "shutdown": 7,  # runs pipelines
    "cli": 8,
    "testing": 8,  # headrace.testing and its pytest plugin: runs pipelines, like cli
    "__main__": 9,
    "": 9,  # headrace/__init__.py, the front door, re-exports every layer
}

#: Import cycles allowed for now, as sets of modules, each with why it exists and a note that
#: it is to be removed; a listed cycle may shrink, but not grow, and no other may appear. Empty
#: since issue 12, which broke the last two (pipeline/ with shutdown.py, cli/run.py with
#: cli/workers.py): add nothing here without a plan to remove it.
KNOWN_CYCLES: list[frozenset[str]] = []


def module_files() -> Iterator[tuple[str, Path]]:
    for top, base in SOURCES.items():
        root = base if top == "headrace" else base / top
        for path in sorted(root.rglob("*.py")):
            parts = [top, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


MODULES: dict[str, Path] = dict(module_files())


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(module: str, path: Path, *, typing_only: bool = False) -> set[str]:
    """The modules of headrace or the plugin that ``module`` imports when it runs, and with
    ``typing_only`` also those it imports under ``if TYPE_CHECKING:``."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not typing_only:
                for other in child.orelse:
                    visit_one(other)
            else:
                visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
        else:
            visit(node)

    visit(ast.parse(path.read_text(), str(path)))
    return {name for name in found if name.split(".")[0] in SOURCES and name != module}


#: The imports that run: what the layer rules are about.
GRAPH: dict[str, set[str]] = {m: imports_of(m, p) for m, p in MODULES.items()}
#: Every import, those for type checkers included: a cycle here is two modules that must be
#: read together even when it never bites at run time, so the cycle rule uses this graph.
TYPED_GRAPH: dict[str, set[str]] = {
    m: imports_of(m, p, typing_only=True) for m, p in MODULES.items()
}


def part(module: str) -> str:
    """``headrace.jetstream.kv`` -> ``jetstream``; ``headrace`` -> ``""``."""
    names = module.split(".")
    return names[1] if len(names) > 1 else ""


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next((t for t in targets if t in graph), None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_the_graph_is_read():
    """The walk sees imports at the top, inside functions, and not under TYPE_CHECKING."""
    assert "headrace.jetstream.context" in GRAPH["headrace.commits.coordinator"]
    assert "headrace.pipeline.graph" in GRAPH["headrace.shutdown"]  # inside run_until_signal
    assert "headrace.pipeline.runtime" not in GRAPH["headrace.shutdown"]  # TYPE_CHECKING only
    assert "headrace.pipeline.runtime" in TYPED_GRAPH["headrace.shutdown"]  # but counted here
    assert "headrace.jetstream" in GRAPH["headrace"]  # the front door
    assert len(GRAPH) > 100


def test_every_part_has_a_layer():
    unknown = {part(m) for m in MODULES if m.startswith("headrace.")} - LAYERS.keys()
    assert not unknown, f"add these to LAYERS (and to docs/architecture.md section 2): {unknown}"


def test_lower_layers_do_not_import_higher_ones():
    wrong = [
        f"{module} imports {target}"
        for module, targets in sorted(GRAPH.items())
        if module.split(".")[0] == "headrace"
        for target in sorted(targets)
        if target.split(".")[0] == "headrace"
        and part(module) != part(target)
        and LAYERS[part(target)] >= LAYERS[part(module)]
    ]
    assert not wrong, "imports against the layers (docs/architecture.md section 2):\n" + "\n".join(
        wrong
    )


def test_the_framework_never_imports_the_plugin():
    wrong = [
        f"{module} imports {target}"
        for module, targets in sorted(GRAPH.items())
        if module.split(".")[0] == "headrace"
        for target in sorted(targets)
        if target.split(".")[0] == "headrace_spark"
    ]
    assert not wrong, "\n".join(wrong)


def test_no_new_import_cycle():
    """Type-only imports count: issue 12 removed the cycles they made inside nats/,
    jetstream/ and pipeline/ (narrow protocols and the API client apart from the factory)."""
    new = [c for c in cycles(TYPED_GRAPH) if not any(c <= known for known in KNOWN_CYCLES)]
    assert not new, "import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in new)


def test_subscriptions_name_the_api_client_not_the_factory():
    """The modules that run a subscription need only the JetStream API requests
    (``jetstream/api.py``); naming ``JetStream`` (``context.py``, which makes them) was the
    8-module cycle issue 12 removed."""
    running = ["consume", "lifecycle", "ordered", "pull_consumer", "pull_subscription", "push"]
    wrong = [
        m
        for m in [*running, "subscribe"]
        if "headrace.jetstream.context" in TYPED_GRAPH[f"headrace.jetstream.{m}"]
    ]
    assert not wrong, f"import the API client (jetstream/api.py) instead: {wrong}"


def test_a_cycle_is_found():
    """The cycle check can fail: a graph with a cycle through three modules gives it back."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]


# -- the examples and the docs use the public faces -----------------------------------------

#: Where public names are: the front door, the sub-packages' __init__, the top-level modules
#: below, and the plugin's package. Everything else is internal.
PUBLIC_MODULES = {"headrace.errors", "headrace.shutdown", "headrace.localserver"}


def is_public_face(module: str) -> bool:
    """The front door, a sub-package's ``__init__`` (one level down), or a listed module; for
    the plugin, its package and its sub-packages' ``__init__``."""
    names = module.split(".")
    if names[0] == "headrace_spark":
        return len(names) == 1 or (
            len(names) == 2 and (ROOT / "plugins" / Path(*names) / "__init__.py").exists()
        )
    return module in PUBLIC_MODULES or (
        len(names) <= 2 and (ROOT / "framework" / Path(*names) / "__init__.py").exists()
    )


def user_code() -> Iterator[tuple[str, str]]:
    for path in sorted((ROOT / "examples").glob("*.py")):
        yield path.name, path.read_text()
    for path in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        blocks = re.findall(r"```python\n(.*?)```", path.read_text(), re.S)
        for number, block in enumerate(blocks):
            yield f"{path.name} (python block {number + 1})", block


def imported_names(source: str) -> Iterator[tuple[str, str]]:
    """(module, name) for each ``from headrace... import name`` and ``import headrace...``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a fragment in the docs: read its import lines only
        lines = [line for line in source.splitlines() if re.match(r"(from|import) ", line)]
        tree = ast.parse("\n".join(lines))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                yield node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ""


def not_public(source: str, *, own: str | None = None) -> list[str]:
    """What ``source`` imports from headrace or the plugin past their public faces (and names
    a face does not list in ``__all__``); imports of the package ``own`` are its own affair."""
    wrong = []
    for module, name in imported_names(source):
        top = module.split(".")[0]
        if top not in {"headrace", "headrace_spark"} or top == own:
            continue
        if not is_public_face(module):
            wrong.append(f"{module} is internal" + (f" ({name})" if name else ""))
        elif name:
            exported = getattr(importlib.import_module(module), "__all__", None)
            if exported is not None and name not in exported:
                wrong.append(f"{name} is not in {module}.__all__")
    return wrong


@pytest.mark.parametrize(("where", "source"), list(user_code()), ids=lambda v: v[:40])
def test_examples_and_docs_import_public_names_only(where: str, source: str):
    wrong = not_public(source)
    assert not wrong, f"{where}: " + "; ".join(wrong)


@pytest.mark.parametrize("package", ["headrace_spark", "headrace_bench"])
def test_the_plugin_and_the_bench_import_public_faces_only(package: str):
    """A plugin needs nothing a plugin author outside this repository lacks: what the Spark
    plugin (the model plugin) and the benchmarks take from headrace is on its public faces, and
    the benchmarks measure the plugin through its faces too. ``TYPE_CHECKING`` imports count:
    an annotation naming an internal class is a reach past the face as well."""
    wrong = [
        f"{module}: {problem}"
        for module, path in sorted(MODULES.items())
        if module.split(".")[0] == package
        for problem in not_public(path.read_text(), own=package)
    ]
    assert not wrong, "imports past the public faces:\n" + "\n".join(wrong)


def test_a_reach_past_the_face_is_found():
    """The check can fail: an internal module, and a name a face does not export, are found."""
    source = (
        "from headrace.jetstream.codec import decode\n"
        "from headrace.pipeline import NoSuchName\n"
        "from headrace.pipeline import Batch\n"
    )
    assert not_public(source) == [
        "headrace.jetstream.codec is internal (decode)",
        "NoSuchName is not in headrace.pipeline.__all__",
    ]


def test_no_internal_module_re_exports_a_name():
    """``from x import name as name`` (the explicit re-export idiom) belongs in a package's
    ``__init__``, a public face; in an internal module it is a shim for a name that moved,
    and nothing has been released that would need one."""
    wrong = []
    for module, path in sorted(MODULES.items()):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                wrong += [f"{module}: {a.name}" for a in node.names if a.asname == a.name]
    assert not wrong, "re-exports outside a package's __init__:\n" + "\n".join(wrong)
