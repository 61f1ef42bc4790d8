"""The documentation site (mkdocs.yml) builds with ``mkdocs build --strict``: a broken link in a
guide, a link to a page outside the site or a reference to a name the API does not have fails
the build, and so this test, which CI runs.

The API reference is generated from each package's ``__all__`` (mkdocstrings' ``public``
filter): the test checks that every exported name has its entry and that no other top-level
name of the package does, so that neither a new export nor a leaked private helper goes
unnoticed.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# One worker builds the site once for all the tests (a module fixture, ~5 s of CPU).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("docs_site")]

REPO = Path(__file__).resolve().parents[1]

# The package each reference page documents (docs/reference/<page>.md).
PAGES = {
    "headrace": "headrace",
    "nats": "headrace.nats",
    "jetstream": "headrace.jetstream",
    "pipeline": "headrace.pipeline",
    "sinks": "headrace.sinks",
    "actors": "headrace.actors",
    "checkpoints": "headrace.checkpoints",
    "commits": "headrace.commits",
    "errors": "headrace.errors",
    "shutdown": "headrace.shutdown",
    "localserver": "headrace.localserver",
    "testing": "headrace.testing",
    "headrace_spark": "headrace_spark",
}


def _public_names(module_name: str) -> tuple[set[str], bool]:
    """The names the reference must show, and whether that set is exact (``__all__``) or only
    a lower bound (a module without ``__all__``: what it defines without a leading ``_``)."""
    module = importlib.import_module(module_name)
    exported = getattr(module, "__all__", None)
    if exported is not None:
        return set(exported), True
    defined = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == module_name
    }
    return defined, False


def _mkdocs_build(out: Path, *config: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out), *config],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = _mkdocs_build(out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return out


@pytest.mark.parametrize(
    ("page", "complaint"),
    [
        ("See [home](index.md#home).", None),  # the control: the same site, no broken link
        ("See [the guide](missing.md).", "missing.md"),
        ("See [the source](../framework/headrace/errors.py).", "../framework/headrace/errors.py"),
        ("See [defaults](index.md#no-such-heading).", "no-such-heading"),
    ],
)
def test_a_broken_link_fails_the_build(tmp_path: Path, page: str, complaint: str | None) -> None:
    """The site's settings (inherited here by a one-page site) turn each kind of broken link
    into a failure, so that the build above would catch it in any guide."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(f"# Home\n\n{page}\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        f"INHERIT: {REPO / 'mkdocs.yml'}\ndocs_dir: {docs}\nnav:\n  - Home: index.md\n"
    )
    done = _mkdocs_build(tmp_path / "site", "--config-file", str(config))
    if complaint is None:
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        assert done.returncode != 0
        assert complaint in done.stderr


def test_every_page_of_the_nav_is_built(site: Path) -> None:
    for guide in sorted((REPO / "docs").glob("*.md")):
        page = "" if guide.stem == "index" else f"{guide.stem}/"
        assert (site / page / "index.html").is_file(), guide.name
    for page in PAGES:
        assert (site / "reference" / page / "index.html").is_file(), page


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_reference_shows_the_public_api_and_nothing_else(site: Path, page: str) -> None:
    module_name = PAGES[page]
    html = (site / "reference" / page / "index.html").read_text()
    prefix = re.escape(module_name) + r"\."
    # An entry is pkg.NAME, or pkg.NAME.NAME for a function exported under its module's name
    # (headrace_spark.compact), which the page documents from that module.
    shown = {
        name
        for name, again in re.findall(
            rf'<h2 id="{prefix}([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?"', html
        )
        if not again or again == name
    }
    expected, exact = _public_names(module_name)
    assert expected - shown == set(), f"{module_name}: exported but not in the reference"
    if exact:
        assert shown - expected == set(), f"{module_name}: in the reference but not exported"
    assert not any(name.startswith("_") and not name.endswith("__") for name in shown)


def test_sphinx_roles_in_docstrings_become_links(site: Path) -> None:
    # headrace.errors.InvalidHeaderError's docstring names :class:`MalformedHeaderWarning`.
    html = (site / "reference" / "errors" / "index.html").read_text()
    assert ":class:" not in html
    assert re.search(
        r'<a class="autorefs autorefs-internal"[^>]*href="#headrace\.errors\.'
        r'MalformedHeaderWarning"><code>MalformedHeaderWarning</code></a>',
        html,
    )


def test_attribute_comments_become_their_docs(site: Path) -> None:
    # headrace_spark.CompactionReport's fields are documented by `#:` comments above them.
    html = (site / "reference" / "headrace_spark" / "index.html").read_text()
    entry = html.split('id="headrace_spark.CompactionReport.directories"', 1)[1]
    first = re.search(r"<p>(.*?)</p>", entry)
    assert first is not None and first[1] == "Directories rewritten."
