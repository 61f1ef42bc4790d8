"""Commands from other distributions (``headrace.commands`` entry points,
:mod:`headrace.cli.plugins`): found and run, loaded only when the command line may need them,
a broken one left out without taking the others down, and a missing one of headrace's own
repository named with what to install.

The third-party plugin here is a real distribution: its ``.dist-info`` and module are written
to a directory on the ``headrace`` process's PYTHONPATH, where importlib.metadata finds them
like any installed package.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from headrace.cli import plugins
from headrace.cli.main import build_parser

from tests.cli.cli_support import HEADRACE, clean_env

FRAMEWORK = Path(__file__).resolve().parents[2] / "framework" / "headrace"


def _install_plugin(site: Path) -> None:
    """A distribution ``thirdparty`` with one working command and one that cannot load."""
    info = site / "thirdparty-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[headrace.commands]\n"
        "hello = thirdparty_cmd:add_parser\n"
        "broken = thirdparty_missing:add_parser\n"
    )
    (site / "thirdparty_cmd.py").write_text(
        textwrap.dedent(
            """
            def add_parser(commands):
                parser = commands.add_parser("hello", help="say hello from a plugin")
                parser.add_argument("name")
                parser.set_defaults(func=lambda args: print(f"hello {args.name}") or 3)
            """
        )
    )


def _headrace(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HEADRACE, *args],
        env=clean_env(PYTHONPATH=str(site)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_third_party_command_runs(tmp_path: Path) -> None:
    _install_plugin(tmp_path)
    done = _headrace(tmp_path, "hello", "world")
    assert (done.returncode, done.stdout) == (3, "hello world\n"), done.stderr
    assert "broken" not in done.stderr  # not loaded: another command was asked for


def test_help_lists_every_plugin_command_and_names_a_broken_one(tmp_path: Path) -> None:
    _install_plugin(tmp_path)
    done = _headrace(tmp_path, "--help")
    assert done.returncode == 0, done.stderr
    for command in ("run", "hello", "demo", "bench"):
        assert f"    {command} " in done.stdout, done.stdout
    assert "left out the command 'broken' (thirdparty_missing:add_parser)" in done.stderr
    assert "ModuleNotFoundError" in done.stderr


#: Help lists every command, so it loads every plugin's command module, but no more.
HELP_LOADS = "['headrace_bench', 'headrace_spark', 'thirdparty_cmd']"


@pytest.mark.slow  # 2.3 s or more of timers: the full suite runs it
def test_builtin_commands_load_no_plugin(tmp_path: Path) -> None:
    _install_plugin(tmp_path)
    done = _headrace(tmp_path, "run", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # the broken plugin was not even loaded
    probe = (
        "import sys; from headrace.cli.main import build_parser; "
        "build_parser(sys.argv[1:]); "
        "print(sorted({m.split('.')[0] for m in sys.modules} "
        "& {'headrace_spark', 'headrace_bench', 'thirdparty_cmd', 'pyarrow'}))"
    )
    for argv, loaded in [
        (["run", "pipe.py:pipe"], "[]"),
        (["outputs", "show"], "[]"),
        (["bench", "core"], "['headrace_bench']"),
        # The demo command (and help, which lists it) loads the plugin's package but not
        # its sink's modules: pyarrow comes when the demo runs.
        (["demo"], "['headrace_spark']"),
        (["--help"], HELP_LOADS),
    ]:
        seen = subprocess.run(
            [sys.executable, "-c", probe, *argv],
            env=clean_env(PYTHONPATH=str(tmp_path)),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert seen.stdout.strip() == loaded, (argv, seen.stdout, seen.stderr)


def test_demo_and_bench_come_from_their_distributions() -> None:
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert commands["demo"].get_default("func").__module__ == "headrace_spark.cli"
    assert commands["bench"].get_default("func").__module__ == "headrace_bench.cli"


def test_a_missing_demo_names_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As if the Spark plugin were not installed: no entry points at all.
    monkeypatch.setattr(plugins, "entry_points", lambda group: [])
    args = build_parser(["demo", "--out", "x"]).parse_args(["demo", "--out", "x"])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err == "headrace demo: needs the Spark plugin: pip install 'headrace[spark]'\n"


def test_the_framework_never_imports_the_plugin_or_the_benchmarks() -> None:
    offenders = []
    for path in FRAMEWORK.rglob("*.py"):
        source = path.read_text()
        if "headrace_spark" in source:
            offenders.append(f"{path}: names headrace_spark")
        for node in ast.walk(ast.parse(source)):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [
                f"{path}:{node.lineno}: imports {name}"
                for name in names
                if name.split(".")[0] in ("headrace_spark", "headrace_bench")
            ]
    assert offenders == []


def test_the_spark_packages_names_are_the_same_whatever_is_imported_first() -> None:
    """The package loads its heavy names on first use; a name it shares with one of its modules
    (``compact``) must stay the function, even once that module was imported by path."""
    probe = (
        "import sys, headrace_spark.compact, headrace_spark.sink, headrace_spark as h; "
        "from headrace_spark import SparkSink, compact; "
        "assert callable(compact) and not isinstance(compact, type(sys)), compact; "
        "assert SparkSink is headrace_spark.sink.SparkSink; "
        "assert all(getattr(h, name) is not None for name in h.__all__)"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60, capture_output=True)
