"""A griffe extension for the reference site (mkdocs.yml): the Sphinx conventions of headrace's
docstrings, rendered by mkdocstrings.

- Cross-reference roles become links. The docstrings are prose that names other objects the
  Sphinx way, ``:class:`~headrace.errors.ProtocolError``` or ``:meth:`close```, which Markdown
  would print as they are. Each role becomes the name in code, linked to the object's entry in
  the reference when the reference has one. The link is an *optional* autoref: a role naming
  a private helper (``:class:`TrackedRun```) stays plain code instead of failing the strict
  build, while a broken Markdown link in a guide still fails it.
- ``#:`` comments document the attribute below them (Sphinx autodoc's convention, used for
  the fields of the attrs classes); griffe reads only a string after the assignment, so an
  attribute without one gets the comment as its docstring.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|attr|exc|mod|data|obj):`(?P<tilde>~?)(?P<target>[^`]+)`")


def _identifier(obj: griffe.Object, target: str) -> str:
    """The full path that ``target`` names from inside ``obj``'s scope (its module's imports
    included), or ``target`` itself when it is already a full path or cannot be resolved."""
    head, _, rest = target.partition(".")
    try:
        resolved = obj.resolve(head)
    except (griffe.NameResolutionError, KeyError, ValueError):
        return target
    return f"{resolved}.{rest}" if rest else resolved


def _rewrite(obj: griffe.Object, text: str) -> str:
    def link(match: re.Match[str]) -> str:
        target = match["target"].removesuffix("()")
        shown = target.rsplit(".", 1)[-1] if match["tilde"] else target
        identifier = html.escape(_identifier(obj, target), quote=True)
        return (
            f'<autoref identifier="{identifier}" optional>'
            f"<code>{html.escape(shown)}</code></autoref>"
        )

    return ROLE.sub(link, text)


def _comment_above(obj: griffe.Object) -> str | None:
    """The ``#:`` comment lines right above ``obj``'s first line, as text, or None."""
    lines = obj.module.lines
    if not lines or obj.lineno is None:
        return None
    found: list[str] = []
    index = obj.lineno - 2  # the line above, 0-based
    while index >= 0 and lines[index].lstrip().startswith("#:"):
        found.append(lines[index].lstrip()[2:].strip())
        index -= 1
    return " ".join(reversed(found)) or None


class SphinxRoles(griffe.Extension):
    """Rewrites the roles in every docstring of a package once it is loaded (names resolve
    then, through the modules' imports)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._walk(pkg, set())

    def _walk(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is None and obj.is_attribute:
            comment = _comment_above(obj)
            if comment is not None:
                obj.docstring = griffe.Docstring(comment, lineno=obj.lineno, parent=obj)
        if obj.docstring is not None:
            obj.docstring.value = _rewrite(obj, obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, seen)  # type: ignore[arg-type]
