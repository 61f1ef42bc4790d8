"""What a failed Spark write means: whose fault it is, in the words of whoever failed.

A Spark error is a JVM stack trace wrapped around whatever failed first. Two cases matter to a
pipeline, which retries an outage and sets bad records aside (headrace.pipeline.sink_retry):

- **a Python worker failed**: the first line of Spark's error is only "An exception was thrown
  from the Python worker:"; the worker's own error is the last line of the Python traceback
  inside the message (``ValueError: bad thing``), or, when the worker could not even start,
  what it printed ("Error from python worker: ..."). :func:`python_failure` finds it, and says
  whether it was raised by the function Spark ran on the batch's rows (a UDF of ``transform``:
  the records are at fault) or by the worker's environment (it could not start, or could not
  import a module: every batch would fail alike, so the records are not at fault);
- **the connection to Spark is lost** (the driver's JVM or a Spark Connect server gone):
  :func:`connection_lost`, an outage.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

_TRACEBACK = "Traceback (most recent call last):"
_NO_START = "Error from python worker:"
_CRASHED = "Python worker exited unexpectedly"
#: A frame of a Python traceback: ``  File "/path/x.py", line 3, in f``.
_FRAME = re.compile(r'^\s+File "([^"]*)", line \d+')
#: Frames of Spark's own code (its worker, its serializers), not of the function it ran.
_SPARK_FRAME = re.compile(r"[/\\](pyspark|py4j)[/\\.]")
#: Exceptions of a worker that cannot import what it needs: the environment, not the rows.
_ENVIRONMENT = re.compile(r"^[\w.]*(ImportError|ModuleNotFoundError)\b")


@attrs.frozen(slots=True)
class PythonFailure:
    """The error of a Spark Python worker."""

    #: The worker's own words: its exception (``ValueError: bad thing``), or what it printed
    #: when it could not start.
    message: str
    #: Raised by the function Spark ran (the records' fault), not by the worker's environment.
    in_function: bool


def python_failure(exc: BaseException) -> PythonFailure | None:
    """The Python worker's error inside Spark's ``exc`` (pyspark's ``PythonException``, or a
    ``Py4JJavaError`` whose Java message holds one), or None if no Python worker failed."""
    text = str(exc)
    at = text.rfind(_TRACEBACK)
    if at >= 0:
        return _from_traceback(text[at + len(_TRACEBACK) :].splitlines())
    at = text.find(_NO_START)
    if at >= 0:
        lines = [line.strip() for line in text[at + len(_NO_START) :].splitlines()]
        said = next((line for line in lines if line), "")
        if said.startswith("PYTHONPATH was:"):
            said = ""
        return PythonFailure(f"could not start: {said or 'it said nothing'}", False)
    if _CRASHED in text:
        return PythonFailure("it exited unexpectedly (crashed, or was killed)", False)
    return None


def _from_traceback(lines: list[str]) -> PythonFailure:
    user_frame = False
    for line in lines:
        if not line.strip():
            continue
        frame = _FRAME.match(line)
        if frame is not None:
            user_frame = user_frame or not _SPARK_FRAME.search(frame.group(1))
            continue
        if line[0].isspace():  # the source line of a frame, or its ^^^^ marks
            continue
        message = line.strip()
        environment = _ENVIRONMENT.match(message) is not None
        return PythonFailure(message, user_frame and not environment)
    return PythonFailure("an exception without a message", user_frame)


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection to Spark is gone (its JVM, or a Connect server):
    Py4J's network error, a refused or reset socket, gRPC's UNAVAILABLE."""
    if isinstance(exc, ConnectionError) or type(exc).__name__ == "Py4JNetworkError":
        return True
    status: Any = None
    for name in ("getGrpcStatusCode", "code"):  # pyspark's Connect errors; grpc.RpcError
        method = getattr(exc, name, None)
        if callable(method):
            try:
                status = method()
            except Exception:  # not the method we look for
                continue
            break
    return getattr(status, "name", None) == "UNAVAILABLE"
