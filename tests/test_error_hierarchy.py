"""One exception hierarchy: every error headrace and its Spark plugin can raise derives from
``HeadraceError``, so an application catches the whole family with one ``except``.

The test imports every module of ``framework/headrace`` and ``plugins/headrace_spark`` and looks
at every exception class defined in it, so an error class added anywhere later is checked too.
Two kinds are exempt, by rule rather than by name:

- warnings, which must derive from ``HeadraceWarning`` instead;
- private classes (``_Name``): control-flow signals raised and caught inside their module
  (``_NothingToDo`` in the checkpoint workers, ``_ReconnectRequested`` in the connection). They
  never reach an application, and a broad ``except HeadraceError`` inside the library must not
  swallow them.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import headrace
import headrace_spark
import pytest
from headrace import HeadraceError, HeadraceWarning


def modules(package: ModuleType) -> Iterator[ModuleType]:
    """The package and every module under it (``__main__`` is not imported: it runs the CLI).
    Modules kept only as deprecated aliases warn when imported; that is not this test's matter."""
    yield package
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        if info.name.rsplit(".", 1)[-1] != "__main__":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                module = importlib.import_module(info.name)
            yield module


def defined_exceptions() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for package in (headrace, headrace_spark):
        for module in modules(package):
            for value in vars(module).values():
                if (
                    inspect.isclass(value)
                    and issubclass(value, BaseException)
                    and value.__module__ == module.__name__
                ):
                    found.append(value)
    return found


EXCEPTIONS = defined_exceptions()


def test_the_walk_finds_the_known_errors():
    """The walk itself works: it finds errors of the core, the layers and the plugin."""
    names = {cls.__qualname__ for cls in EXCEPTIONS}
    assert {"HeadraceError", "ActorFailed", "DecodeError", "SparkSinkError", "DemoError"} <= names
    assert len(EXCEPTIONS) > 80


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_error_is_a_headrace_error(cls: type[BaseException]):
    if cls.__name__.startswith("_"):
        return  # private control flow, see the module docs
    if issubclass(cls, Warning):
        assert issubclass(cls, HeadraceWarning), f"{cls!r} is a warning but no HeadraceWarning"
    else:
        assert issubclass(cls, HeadraceError), f"{cls!r} does not derive from HeadraceError"


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("InvalidSubjectError", ValueError),
        ("InvalidHeaderError", ValueError),
        ("NatsTimeoutError", TimeoutError),
        ("PipelineError", ValueError),
        ("UnknownSink", LookupError),
        ("UnserialisableValue", TypeError),
    ],
)
def test_builtin_bases_are_kept(name: str, builtin: type[BaseException]):
    """Joining the hierarchy keeps the other bases, so ``except ValueError`` still works."""
    (cls,) = {c for c in EXCEPTIONS if c.__name__ == name}
    assert issubclass(cls, HeadraceError) and issubclass(cls, builtin)


# -- the JetStream API errors: which class each server err_code gives ---------------------------

#: The class :func:`~headrace.jetstream.errors.api_error` gives for each err_code of the server,
#: as it was when the table was still a hand-kept tuple of classes (issue 25). The table is now
#: built from the classes' own ``err_codes``; this pins what it gives. A new API error class
#: adds its codes here, so that a code moving to another class is seen as the change it is.
API_ERROR_CLASSES: dict[int, str] = {
    10003: "BadRequest",
    10013: "ConsumerAlreadyExists",
    10014: "ConsumerNotFound",
    10037: "MessageNotFound",
    10039: "JetStreamNotEnabled",
    10058: "StreamAlreadyExists",
    10059: "StreamNotFound",
    10065: "StreamSubjectsOverlap",
    10070: "WrongLastMsgId",
    10071: "WrongLastSequence",
    10076: "JetStreamNotEnabled",
    10105: "ConsumerAlreadyExists",
    10148: "ConsumerAlreadyExists",
    10149: "ConsumerDoesNotExist",
    10159: "PriorityGroupConfigError",
    10160: "PriorityGroupNotFound",
    10161: "PriorityGroupConfigError",
    10162: "PriorityGroupConfigError",
    10164: "WrongLastSequence",
    10165: "InvalidMessageTTL",
    10166: "MessageTTLDisabled",
    10174: "AtomicPublishDisabled",
    10175: "AtomicBatchSequenceMissing",
    10176: "AtomicBatchIncomplete",
    10177: "AtomicUnsupportedHeader",
    10178: "PriorityGroupConfigError",
    10179: "InvalidBatchId",
    10186: "MessageSchedulesNotAllowed",
    10187: "MessageSchedulesNotAllowed",
    10188: "MessageSchedulesDisabled",
    10189: "InvalidSchedulePattern",
    10190: "InvalidScheduleTarget",
    10191: "InvalidScheduleTTL",
    10192: "InvalidScheduleRollup",
    10196: "PriorityGroupConfigError",
    10197: "PriorityGroupConfigError",
    10198: "AtomicPublishOnMirror",
    10199: "AtomicBatchTooLarge",
    10200: "InvalidBatchCommit",
    10201: "AtomicBatchDuplicateMessage",
    10203: "InvalidScheduleSource",
    10204: "InvalidConsumerReset",
    10210: "AtomicBatchTooManyInflight",
    10212: "InvalidScheduler",
    10223: "InvalidScheduleTimeZone",
}


def declared_err_codes() -> dict[int, type[BaseException]]:
    """err_code -> the class that declares it in its own body (inherited ones do not count:
    ``KeyTTLDisabled`` is a ``MessageTTLDisabled`` raised by KV, not the class of 10166)."""
    from headrace.jetstream import JetStreamAPIError

    found: dict[int, type[BaseException]] = {}
    for cls in EXCEPTIONS:
        if issubclass(cls, JetStreamAPIError):
            for code in vars(cls).get("err_codes", ()):
                assert code not in found, f"err_code {code}: {found[code]!r} and {cls!r}"
                found[code] = cls
    return found


@pytest.mark.parametrize("code", sorted(API_ERROR_CLASSES))
def test_each_err_code_gives_its_class(code: int):
    from headrace.jetstream.errors import api_error

    error = api_error({"code": 400, "err_code": code, "description": "refused"})
    assert type(error).__name__ == API_ERROR_CLASSES[code]
    assert (error.code, error.err_code, error.description) == (400, code, "refused")


def test_the_err_codes_are_the_classes_own():
    """Every err_code a class declares is in the table, for that class, and no other code is:
    the table follows from the classes."""
    assert {code: cls.__name__ for code, cls in declared_err_codes().items()} == (API_ERROR_CLASSES)


def test_an_unknown_err_code_is_the_base_class():
    from headrace.jetstream import JetStreamAPIError
    from headrace.jetstream.errors import api_error

    for error in (
        api_error({"code": 400, "err_code": 10052, "description": "no"}),
        api_error({"code": 500, "description": "no"}),
        api_error({"code": 400, "err_code": "10059", "description": "no"}),
        api_error("not an object"),
    ):
        assert type(error) is JetStreamAPIError


def test_err_codes_are_declared_where_api_error_sees_them():
    """The table is filled as ``headrace.jetstream.errors`` defines its classes; a class of
    another module declaring codes would join it only once that module is imported."""
    module = "headrace.jetstream.errors"
    elsewhere = {cls for cls in declared_err_codes().values() if cls.__module__ != module}
    assert not elsewhere, f"declare these in headrace/jetstream/errors.py: {elsewhere}"


def test_two_classes_cannot_declare_one_err_code():
    from headrace.jetstream import StreamNotFound

    with pytest.raises(TypeError, match="err_code 10059 of Twin is StreamNotFound's already"):

        class Twin(StreamNotFound):
            err_codes = (10059,)


@pytest.mark.parametrize("package", ["headrace.jetstream"])
def test_every_error_of_a_layer_is_exported(package: str):
    """An error an application may receive is one it can catch by name: every public error
    class of the package's modules is on its public face (``__all__``)."""
    face = importlib.import_module(package)
    missing = sorted(
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in EXCEPTIONS
        if cls.__module__.startswith(f"{package}.")
        and not cls.__name__.startswith("_")
        and not issubclass(cls, Warning)
        and cls.__name__ not in face.__all__
    )
    assert not missing, f"export these from {package}: {missing}"


# -- the docs name the classes with their codes ---------------------------------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs"

#: A class named with codes in prose: "`StreamNotFound` (10059)", "(10148/10013/10105)",
#: "(err_code 10204)", "`MessageSchedulesNotAllowed`, 10186/10187", ", the server's 10166".
PROSE_CODES = re.compile(
    r"`(\w+)`\s*(?:\((?:err_code\s+)?|,\s*(?:the server's\s+)?)(1\d{4}(?:\s*/\s*1\d{4})*)"
)
#: The header of a table of error classes and their codes.
TABLE_HEADER = re.compile(r"^\|\s*class\s*\|\s*err_code\s*\|", re.IGNORECASE)


def api_error_classes_by_name() -> dict[str, type[BaseException]]:
    from headrace.jetstream import JetStreamAPIError

    return {cls.__name__: cls for cls in EXCEPTIONS if issubclass(cls, JetStreamAPIError)}


def docs_tables() -> list[tuple[str, list[tuple[str, set[int]]]]]:
    """Each ``| class | err_code | ...`` table of the docs: where, and its rows (class name,
    the codes of its err_code cell)."""
    tables = []
    for path in sorted(DOCS.rglob("*.md")):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            if not TABLE_HEADER.match(line):
                continue
            rows = []
            for row in lines[number + 2 :]:
                if not row.startswith("|"):
                    break
                cells = [cell.strip() for cell in row.strip("|").split("|")]
                codes = {int(code) for code in re.findall(r"\b1\d{4}\b", cells[1])}
                rows.append((cells[0].strip("`"), codes))
            tables.append((f"{path.relative_to(DOCS)}:{number + 1}", rows))
    return tables


def test_the_docs_tables_are_found():
    """The check below can fail: it finds the tables (atomic batches, schedules)."""
    names = {name for _, rows in docs_tables() for name, _ in rows}
    assert {"AtomicPublishDisabled", "InvalidScheduleTimeZone"} <= names


@pytest.mark.parametrize(("where", "rows"), docs_tables(), ids=lambda v: str(v)[:40])
def test_a_docs_table_of_error_codes_follows_the_classes(
    where: str, rows: list[tuple[str, set[int]]]
):
    """Each row gives its class's codes, all of them; and the table has a row for every
    class with codes under the classes' nearest common base (every ``AtomicPublishError``,
    every ``MessageScheduleError``): a new error of that family is missing here until it
    has its row."""
    classes = api_error_classes_by_name()
    declared = declared_err_codes()
    wrong = [
        f"{name}: {sorted(codes)} in the docs, {sorted(classes[name].err_codes)} in the class"
        if name in classes
        else f"{name} is no JetStream API error class"
        for name, codes in rows
        if name not in classes or codes != set(classes[name].err_codes)
    ]
    assert not wrong, f"{where}: " + "; ".join(wrong)
    listed = [classes[name] for name, _ in rows]
    base = next(c for c in listed[0].__mro__ if all(issubclass(o, c) for o in listed))
    missing = sorted(
        {c.__name__ for c in declared.values() if issubclass(c, base)} - {n for n, _ in rows}
    )
    assert not missing, f"{where}: the table of {base.__name__} has no row for {missing}"


def test_the_docs_prose_names_each_class_with_its_codes():
    """Where a guide names a class with codes ("`StreamNotFound` (10059)"), they are its own
    (a subset: "`WrongLastSequence` (10071)" need not name 10164)."""
    classes = api_error_classes_by_name()
    wrong = []
    seen = 0
    for path in sorted(DOCS.rglob("*.md")):
        for match in PROSE_CODES.finditer(path.read_text()):
            name, codes = match.group(1), {int(c) for c in match.group(2).split("/")}
            if name not in classes:
                continue  # `allow_atomic` (10052): a field, not a class
            seen += 1
            if not codes <= set(classes[name].err_codes):
                wrong.append(f"{path.name}: {name} ({sorted(codes)})")
    assert seen > 10
    assert not wrong, "codes that are not the class's own: " + "; ".join(wrong)
