"""``headrace sinks``: the sink plugins installed, and the options each one takes.

    headrace sinks [--json]

A sink plugin is an entry point of the group ``headrace.sinks`` (:mod:`headrace.sinks.registry`):
the name ``--sink NAME=PLUGIN`` and ``sink_options`` refer to. This lists each with the class
or factory it names, the distribution that registered it, the first line of its docstring and
its options (keyword parameters, with their defaults) as its signature gives them; for an
attrs class its fields do (a default made by a factory is shown as ``factory()``).

A plugin whose module fails to import is listed with the error instead of its options, and the
others still are; the exit status is then 1, so that an install check (CI) notices it.
"""

from __future__ import annotations

import argparse
import inspect
from importlib.metadata import EntryPoint
from typing import Any

import attrs

from headrace.cli.session import EXIT_FAILED, EXIT_OK, one_line, print_json
from headrace.sinks.registry import available_sinks


def add_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "sinks",
        help="list the installed sink plugins and their options",
        description=(
            "List the sink plugins (entry point group headrace.sinks): name, class, the "
            "distribution it comes from, and its options with their defaults. A plugin that "
            "fails to import is listed with its error; the exit status is then 1."
        ),
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per plugin and line")
    parser.set_defaults(func=command)


@attrs.frozen
class Option:
    """One option of a sink plugin: its keyword, default (``required`` when it has none),
    and annotation as written."""

    name: str
    default: str | None
    required: bool
    annotation: str | None
    kind: str = "keyword"


@attrs.frozen
class PluginInfo:
    name: str
    target: str
    distribution: str | None
    version: str | None
    summary: str | None = None
    options: tuple[Option, ...] = ()
    error: str | None = None


def describe_plugin(name: str, point: EntryPoint) -> PluginInfo:
    """What :func:`command` shows of one entry point; an import failure becomes ``error``."""
    dist = point.dist
    base = PluginInfo(
        name=name,
        target=point.value,
        distribution=dist.name if dist is not None else None,
        version=dist.version if dist is not None else None,
    )
    try:
        factory = point.load()
    except Exception as exc:  # a broken plugin is reported, not fatal to the listing
        return attrs.evolve(base, error=f"failed to import: {one_line(exc)}")
    doc = inspect.getdoc(factory) or ""
    summary = doc.strip().split("\n\n")[0].replace("\n", " ") or None
    try:
        options = tuple(_options(factory))
    except (TypeError, ValueError) as exc:
        return attrs.evolve(base, summary=summary, error=f"no signature: {one_line(exc)}")
    return attrs.evolve(base, summary=summary, options=options)


def _options(factory: Any) -> list[Option]:
    if isinstance(factory, type) and attrs.has(factory):
        return [_attrs_option(field) for field in attrs.fields(factory) if field.init]
    found = []
    for param in inspect.signature(factory).parameters.values():
        if param.kind is param.VAR_POSITIONAL:
            continue
        annotation = None
        if param.annotation is not param.empty:
            annotation = (
                param.annotation if isinstance(param.annotation, str) else repr(param.annotation)
            )
        if param.kind is param.VAR_KEYWORD:
            found.append(Option(param.name, None, False, annotation, kind="any keyword"))
            continue
        required = param.default is param.empty
        kind = "positional" if param.kind is param.POSITIONAL_ONLY else "keyword"
        default = None if required else repr(param.default)
        found.append(Option(param.name, default, required, annotation, kind=kind))
    return found


def _attrs_option(field: attrs.Attribute[Any]) -> Option:
    default = field.default
    annotation = (
        field.type if isinstance(field.type, str) or field.type is None else repr(field.type)
    )
    name = field.alias or field.name
    if default is attrs.NOTHING:
        return Option(name, None, True, annotation)
    factory = getattr(default, "factory", None)
    if isinstance(default, attrs.Factory) and factory is not None:  # type: ignore[arg-type]
        made = getattr(factory, "__name__", repr(factory))
        return Option(name, f"{made}()", False, annotation)
    return Option(name, repr(default), False, annotation)


def command(args: argparse.Namespace) -> int:
    plugins = [describe_plugin(name, point) for name, point in available_sinks().items()]
    if args.json:
        for plugin in plugins:
            print_json(attrs.asdict(plugin))
    else:
        for plugin in plugins:
            print("\n".join(_text(plugin)))
        if not plugins:
            print("no sink plugins installed (entry point group headrace.sinks)")
    return EXIT_FAILED if any(p.error for p in plugins) else EXIT_OK


def _text(plugin: PluginInfo) -> list[str]:
    origin = plugin.distribution or "unknown distribution"
    if plugin.version:
        origin += f" {plugin.version}"
    lines = [f"{plugin.name}  {plugin.target}  ({origin})"]
    if plugin.summary:
        lines.append(f"    {plugin.summary}")
    if plugin.error:
        lines.append(f"    ERROR: {plugin.error}")
    for option in plugin.options:
        if option.kind == "any keyword":
            shown = f"**{option.name}"
        elif option.required:
            shown = f"{option.name} (required)"
        else:
            shown = f"{option.name} = {option.default}"
        if option.annotation:
            shown += f"  : {option.annotation}"
        lines.append(f"    {shown}")
    return lines
