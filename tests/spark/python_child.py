"""Child of test_python_workers.py: SparkSinks with a ``transform`` UDF (run in Spark's
Python workers) on the session the first of them starts, in a process of its own, so that the
session's configuration is fresh. The test runs it with no PYSPARK_PYTHON and a ``python3`` on
PATH that is not a usable Python, as on a machine whose system Python lacks pyarrow.

    python_child.py OUT_DIR

Three writes of stream sequences 1 to 4, each into a directory of its own under OUT_DIR:

- ``adds``: the UDF adds one to each sequence;
- ``raises``: the UDF raises ValueError("bad thing") for sequence 2;
- ``no-python``: the UDF adds one, but the workers are pointed at the ``python3`` on PATH (what
  PySpark picks when nothing says otherwise).

stdout: JSON lines: ``{"event": "session", ...}``, then ``{"event": "write", "name": ...,
"rows": [...]}`` for a write that committed, or with ``"error"``, ``"message"``, ``"transient"``
and ``"python_error"`` for one that failed.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from headrace_spark import SparkSink

from tests.sinks.sink_support import batch, rec


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def add_one(seq):  # no hints: with them pyspark takes it for a pandas UDF
    return seq + 1


def bad_at_two(seq):
    if seq == 2:
        raise ValueError("bad thing")
    return seq + 1


def with_udf(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def transform(df: Any) -> Any:
        from pyspark.sql import functions as F

        return df.withColumn("plus", F.udf(fn, "long")("stream_seq"))

    return transform


async def write(name: str, out: Path, fn: Callable[[Any], Any], python: str | None) -> Any:
    """Write the batch through a new sink on the process's session; that session."""
    sink = SparkSink(out / name, master="local[1]", transform=with_udf(fn))
    await sink.open()
    if python is not None:
        sink.spark.sparkContext.pythonExec = python
    try:
        await sink.write_batch(batch(*(rec(n) for n in (1, 2, 3, 4))))
    except Exception as exc:
        say(
            "write",
            name=name,
            error=type(exc).__name__,
            message=str(exc),
            transient=getattr(exc, "transient", "absent"),
            python_error=getattr(exc, "python_error", None),
        )
    else:
        df = sink.spark.read.parquet(str(out / name))
        rows = sorted([r["stream_seq"], r["plus"]] for r in df.collect())
        say("write", name=name, rows=rows)
    finally:
        await sink.close()
    return sink.spark


async def main(out: str) -> None:
    root = Path(out)
    spark = await write("adds", root, add_one, None)
    say(
        "session",
        python_exec=spark.sparkContext.pythonExec,
        python=spark.conf.get("spark.pyspark.python", None),
        driver_python=spark.conf.get("spark.pyspark.driver.python", None),
        executable=sys.executable,
        path_python3=shutil.which("python3"),
    )
    await write("raises", root, bad_at_two, None)
    await write("no-python", root, add_one, shutil.which("python3"))


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
