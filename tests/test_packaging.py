"""The Spark plugin and the benchmarks are distributions of their own: ``python -m build`` makes
a wheel of each, carrying its modules, its data files and the entry points through which
headrace finds it (the sink and the ``demo`` command; the ``bench`` command).

Each is built from a copy of its directory, so that the build leaves nothing in the working
tree (setuptools writes ``build/`` and ``*.egg-info`` next to the sources). The build backend is
installed from the package index into an isolated environment, as ``python -m build`` does.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def _build_wheel(source: Path, tmp_path: Path) -> zipfile.ZipFile:
    copy = tmp_path / "src"
    shutil.copytree(
        source, copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    )
    out = tmp_path / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(copy)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}")]
    return wheel.read(path).decode()


def test_the_spark_plugin_builds_as_its_own_distribution(tmp_path: Path) -> None:
    wheel = _build_wheel(REPO / "plugins" / "headrace_spark", tmp_path)
    names = set(wheel.namelist())
    for module in ("__init__", "sink", "cli", "demo", "session"):
        assert f"headrace_spark/{module}.py" in names
    assert {"headrace_spark/py.typed", "headrace_spark/log4j2.properties"} <= names
    assert not any(n.startswith("headrace/") for n in names)  # the framework is not in it
    assert "headrace_spark/pyproject.toml" not in names
    metadata = _dist_info(wheel, "METADATA")
    assert "Name: headrace-spark" in metadata
    for requirement in ("headrace", "pyspark>=4.0", "pyarrow>=15"):
        assert f"Requires-Dist: {requirement}\n" in metadata
    entry_points = _dist_info(wheel, "entry_points.txt")
    assert "[headrace.sinks]\nspark = headrace_spark:SparkSink" in entry_points
    assert "[headrace.commands]\ndemo = headrace_spark.cli:add_parser" in entry_points


def test_the_benchmarks_build_as_their_own_distribution(tmp_path: Path) -> None:
    wheel = _build_wheel(REPO / "bench", tmp_path)
    names = set(wheel.namelist())
    for module in ("cli", "core", "consume", "pipeline", "e2e", "scale", "scale_worker"):
        assert f"headrace_bench/{module}.py" in names
    assert not any(n.startswith(("headrace/", "headrace_spark/")) for n in names)
    assert "Name: headrace-bench" in _dist_info(wheel, "METADATA")
    entry_points = _dist_info(wheel, "entry_points.txt")
    assert "[headrace.commands]\nbench = headrace_bench.cli:add_parser" in entry_points
