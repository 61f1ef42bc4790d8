"""``--json-logs``: everything the process writes to standard error is a JSON object per line.

The reporters write their events as JSON already. The rest is what Python itself, libraries and
the pipeline's code write there, which would break a log shipper that parses each line:

- an uncaught exception (``sys.excepthook``), in a thread too (``threading.excepthook``), and
  an exception Python could not raise (``sys.unraisablehook``): an ``error`` event with the
  error in one line and its ``traceback``;
- a warning (``warnings.showwarning``): a ``warning`` event;
- a log record of the ``logging`` module (py4j and Spark's Python side log through it): handlers
  that write to standard error get a JSON formatter, and records no handler takes (Python's
  ``lastResort``) too: a ``log`` event;
- anything else written to ``sys.stderr`` (a ``print(..., file=sys.stderr)``, argparse's usage):
  ``sys.stderr`` is replaced by a writer that passes JSON objects through and wraps every other
  line as a ``stderr`` event;
- the line that says why the command ended (``headrace run: ...``, :func:`say`): an
  ``exit_reason`` event with the ``message`` and the ``exit_code``.

What is written to descriptor 2 below Python (a JVM's own log4j output, a crash of the
interpreter) is out of reach.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

_active: JsonLogs | None = None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_line(event: str, pipeline: str | None, fields: dict[str, Any]) -> str:
    """One event as a JSON line: ``{"ts", "event", "pipeline", ...fields}``."""
    obj = {"ts": _now(), "event": event, "pipeline": pipeline, **fields}
    return json.dumps(obj, default=str, separators=(",", ":")) + "\n"


def _one_line(exc: BaseException | None, kind: type[BaseException] | None = None) -> str:
    name = (kind or type(exc)).__name__
    text = " ".join(str(exc).split()) if exc is not None else ""
    return f"{name}: {text}" if text else name


def _leaf(exc: BaseException) -> BaseException:
    """The error inside the groups trio wraps it in (the first one, Cancelled ones last)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = [e for e in exc.exceptions if type(e).__name__ != "Cancelled"]
        exc = (inner or list(exc.exceptions))[0]
    return exc


def _traceback(kind: Any, value: BaseException | None, tb: TracebackType | None) -> str:
    return "".join(traceback.format_exception(kind, value, tb)).rstrip("\n")


def warning_events(emit: Callable[..., None]) -> Callable[..., None]:
    """A ``warnings.showwarning`` that gives each warning to ``emit`` as the fields of a
    ``warning`` event: ``category``, ``message``, ``where``."""

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        emit(category=category.__name__, message=str(message), where=f"{filename}:{lineno}")

    return show


class _Formatter(logging.Formatter):
    """A log record as a ``log`` event."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and record.exc_info[0] is not None:
            fields["traceback"] = _traceback(*record.exc_info)
        return json_line("log", current_pipeline(), fields).rstrip("\n")


class _LineWriter:
    """Stands in for ``sys.stderr``: JSON object lines pass, any other line becomes a ``stderr``
    event. Whole lines only (a partial line waits for its end, or :meth:`flush_partial`)."""

    def __init__(self, logs: JsonLogs) -> None:
        self._logs = logs
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            self._logs.line(line)
        return len(text)

    def flush_partial(self) -> None:
        with self._lock:
            rest, self._pending = self._pending, ""
        if rest:
            self._logs.line(rest)

    def flush(self) -> None:
        self._logs.out.flush()

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._logs.out.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._logs.out, "encoding", "utf-8")

    @property
    def errors(self) -> str | None:
        return getattr(self._logs.out, "errors", None)

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        # The rest of a text stream's attributes (``buffer``, ``name``, ...) are the real one's:
        # code that uses them keeps working (raw bytes written to ``buffer`` are not wrapped).
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._logs.out, name)


class JsonLogs:
    """The hooks of ``--json-logs``, writing to ``out`` (the real standard error)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.pipeline: str | None = None
        self._lock = threading.Lock()
        self._undo: list[Callable[[], None]] = []
        self._formatter = _Formatter()
        self._writer = _LineWriter(self)

    # -- writing ----------------------------------------------------------------------------

    def event(self, event: str, **fields: Any) -> None:
        self._write(json_line(event, self.pipeline, fields))

    def line(self, text: str) -> None:
        """A line someone wrote to ``sys.stderr``."""
        text = text.rstrip("\r")
        if not text:
            return
        if text.startswith("{"):
            try:
                if isinstance(json.loads(text), dict):
                    self._write(text + "\n")
                    return
            except ValueError:
                pass
        self.event("stderr", line=text)

    def _write(self, text: str) -> None:
        with self._lock:
            try:
                self.out.write(text)
                self.out.flush()
            except (OSError, ValueError):
                pass  # nobody reads any more

    # -- the hooks --------------------------------------------------------------------------

    def _excepthook(
        self, kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        leaf = _leaf(value)
        self.event(
            "error",
            error=_one_line(leaf, None if leaf is not value else kind),
            fatal=True,
            uncaught=True,
            traceback=_traceback(kind, value, tb),
        )

    def _thread_excepthook(self, args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        self.event(
            "error",
            error=_one_line(args.exc_value, args.exc_type),
            fatal=False,
            thread=args.thread.name if args.thread is not None else None,
            traceback=_traceback(args.exc_type, args.exc_value, args.exc_traceback),
        )

    def _unraisablehook(self, unraisable: Any) -> None:
        value = unraisable.exc_value
        fields: dict[str, Any] = {
            "error": _one_line(value, unraisable.exc_type),
            "fatal": False,
            "unraisable": unraisable.err_msg or "Exception ignored",
        }
        if unraisable.object is not None:
            try:
                fields["object"] = repr(unraisable.object)
            except Exception:
                fields["object"] = f"<{type(unraisable.object).__name__}>"
        fields["traceback"] = _traceback(unraisable.exc_type, value, unraisable.exc_traceback)
        self.event("error", **fields)

    def adopt_logging(self) -> None:
        """Make the ``logging`` handlers that write to standard error write JSON (again after
        code that may have added some ran: a TARGET's ``logging.basicConfig``)."""
        streams = (self.out, self._writer, sys.__stderr__)
        loggers = [logging.getLogger()]
        loggers += [
            logger
            for logger in logging.Logger.manager.loggerDict.values()
            if isinstance(logger, logging.Logger)
        ]
        for logger in loggers:
            for handler in logger.handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream in streams:
                    handler.setFormatter(self._formatter)
                    if handler.stream is not self.out:
                        handler.setStream(self.out)

    def install(self) -> None:
        """Put the hooks in place (until :meth:`uninstall`)."""
        global _active
        saved_except, saved_thread = sys.excepthook, threading.excepthook
        saved_unraisable, saved_show = sys.unraisablehook, warnings.showwarning
        saved_stderr, saved_resort = sys.stderr, logging.lastResort
        sys.excepthook = self._excepthook
        threading.excepthook = self._thread_excepthook
        sys.unraisablehook = self._unraisablehook
        warnings.showwarning = warning_events(lambda **fields: self.event("warning", **fields))
        resort = logging.StreamHandler(self.out)
        resort.setLevel(logging.WARNING)
        resort.setFormatter(self._formatter)
        logging.lastResort = resort
        sys.stderr = self._writer
        self.adopt_logging()
        _active = self

        def undo() -> None:
            global _active
            self._writer.flush_partial()
            sys.excepthook, threading.excepthook = saved_except, saved_thread
            sys.unraisablehook, warnings.showwarning = saved_unraisable, saved_show
            sys.stderr, logging.lastResort = saved_stderr, saved_resort
            _active = None

        self._undo.append(undo)

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()


def active() -> JsonLogs | None:
    """The installed ``--json-logs`` hooks, if any."""
    return _active


def current_pipeline() -> str | None:
    return _active.pipeline if _active is not None else None


def stderr() -> TextIO:
    """The real standard error: where the reporters write (their lines are JSON already)."""
    return _active.out if _active is not None else sys.stderr


def say(command: str, message: str, *, exit_code: int) -> None:
    """The line that says why ``command`` ends: ``command: message`` on standard error, or an
    ``exit_reason`` event with ``--json-logs``."""
    logs = _active
    if logs is not None:
        logs.event("exit_reason", message=message, exit_code=exit_code)
        return
    print(f"{command}: {message}", file=sys.stderr, flush=True)
