"""Spark sessions for the sink, and the job tags that let a pipeline interrupt Spark.

Where the session comes from, in order: the user's own ``SparkSession``; a Spark Connect
``sc://`` URL; otherwise a classic session on ``master`` (``local[*]`` by default, or a
``spark://``, ``yarn``... URL). A classic session is process-wide in PySpark: if this process
already runs one, ``getOrCreate`` returns it and settings that only apply at start (memory, the
catalog) are ignored, so the first sink, or the application, decides them.

The embedded defaults start fast and keep quiet: no web UI, no console progress bars, errors-only
logging (``log4j2.properties`` next to this module), as many shuffle partitions as cores, and
UTC as the session time zone so timestamps read back as they were written, and Arrow batches
turned into rows inside Spark's tasks rather than in the driver (see
``ARROW_LOCAL_RELATION_THRESHOLD``; a session you bring keeps its own setting). Spark's Python
workers (a ``transform``'s UDFs) run this interpreter, ``sys.executable``, not the first
``python3`` on PATH, which may lack pyarrow or even pyspark (``spark.pyspark.python`` and
``spark.pyspark.driver.python``, unless ``conf``, ``PYSPARK_PYTHON`` or ``PYSPARK_DRIVER_PYTHON``
names another). ``hive=True`` adds a Hive catalog whose metastore (embedded Derby) lives in the
warehouse directory, so tables survive the session.

Spark calls block, so the sink makes them in a worker thread; to stop them it tags each batch's
jobs (:class:`JobTags`) and cancels the tag from another thread. Classic sessions use the
SparkContext's job tags with interrupt-on-cancel (the task threads are interrupted, Python
workers killed); Spark Connect sessions use the session's operation tags.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headrace_spark.errors import SparkSessionError

QUIET_LOG4J = Path(__file__).with_name("log4j2.properties")

#: The interpreter of Spark's Python workers (a UDF's) and of the driver, and the environment
#: variables that name them otherwise.
WORKER_PYTHON = "spark.pyspark.python"
PYTHON_SETTINGS = {
    WORKER_PYTHON: "PYSPARK_PYTHON",
    "spark.pyspark.driver.python": "PYSPARK_DRIVER_PYTHON",
}

#: Below this size ``createDataFrame(table)`` keeps a table's rows in the driver's query plan;
#: the embedded sessions set it to 0 so every batch streams from Arrow into the write task.
ARROW_LOCAL_RELATION_THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (not a classic, JVM-backed one)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def embedded_conf(
    *, hive: bool = False, warehouse: str | os.PathLike[str] | None = None, quiet: bool = True
) -> dict[str, str]:
    """The settings of a session the sink starts itself."""
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(max(2, os.cpu_count() or 2)),
        "spark.sql.session.timeZone": "UTC",
        # A batch's Arrow data under this many bytes (48 MiB by default) becomes a plan node
        # holding every row in the driver: each optimizer rule walks the rows and the task
        # carries them, Java-serialized. Measured on 100k rows of the default columns: 1.3
        # CPU-s of the JVM per batch that way, 0.65 with the batches converted in the task.
        ARROW_LOCAL_RELATION_THRESHOLD: "0",
    }
    # Spark's Python workers (UDFs) run this interpreter, not whatever `python3` is on PATH
    # (maybe one without pyarrow, or pyspark): unless the environment names one.
    for key, variable in PYTHON_SETTINGS.items():
        if sys.executable and not os.environ.get(variable):
            conf[key] = sys.executable
    java: list[str] = []
    if quiet:
        java.append(f"-Dlog4j2.configurationFile={QUIET_LOG4J.as_uri()}")
    if warehouse is not None:
        where = Path(warehouse).expanduser().resolve()
        conf["spark.sql.warehouse.dir"] = where.as_uri()
        if hive:
            conf["spark.sql.catalogImplementation"] = "hive"
            metastore = where / "metastore_db"
            conf["spark.hadoop.javax.jdo.option.ConnectionURL"] = (
                f"jdbc:derby:;databaseName={metastore};create=true"
            )
            java.append(f"-Dderby.system.home={where}")
            java.append(f"-Dderby.stream.error.file={where / 'derby.log'}")
    elif hive:
        raise SparkSessionError("hive=True needs a warehouse directory (warehouse=...)")
    if java:
        conf["spark.driver.extraJavaOptions"] = " ".join(java)
    return conf


def start_session(
    master: str = "local[*]",
    *,
    app_name: str = "headrace",
    conf: Mapping[str, str] | None = None,
    hive: bool = False,
    warehouse: str | os.PathLike[str] | None = None,
    quiet: bool = True,
) -> Any:
    """A SparkSession on ``master`` (an ``sc://`` URL for Spark Connect), with the embedded
    defaults under ``conf``; :class:`SparkSessionError` when none can be made."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise SparkSessionError(
            "the Spark sink needs pyspark: pip install 'headrace[spark]'"
        ) from exc
    settings = embedded_conf(hive=hive, warehouse=warehouse, quiet=quiet)
    settings.update(conf or {})
    if master.startswith("sc://"):
        missing = [m for m in ("grpc", "pandas", "google.protobuf") if not _importable(m)]
        if missing:
            raise SparkSessionError(
                f"Spark Connect ({master}) needs its client libraries ({', '.join(missing)} "
                "missing): pip install 'pyspark[connect]'"
            )
        builder = SparkSession.builder.remote(master).appName(app_name)
        # A Connect server has its own static settings; only runtime ones can be set here.
        for key in ("spark.sql.session.timeZone", "spark.sql.shuffle.partitions"):
            builder = builder.config(key, settings[key])
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
    else:
        if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
            raise SparkSessionError(
                "Spark needs a Java 17+ runtime and there is no 'java' on PATH nor JAVA_HOME "
                "(Debian/Ubuntu: apt install openjdk-17-jre-headless)"
            )
        builder = SparkSession.builder.master(master).appName(app_name)
        for key, value in settings.items():
            builder = builder.config(key, value)
        if hive:
            builder = builder.enableHiveSupport()
    fresh = not master.startswith("sc://") and _no_context_yet()
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        raise SparkSessionError(
            f"cannot start a Spark session on {master}: {first_line(exc)}"
        ) from exc
    if fresh and settings.get(WORKER_PYTHON):
        # PySpark starts its workers with the context's ``pythonExec``, which it takes from
        # PYSPARK_PYTHON alone: the setting reaches the JVM but no worker. Only a context
        # started here: one the application made keeps its own.
        spark.sparkContext.pythonExec = settings[WORKER_PYTHON]
    if quiet and not is_connect(spark):
        spark.sparkContext.setLogLevel("ERROR")
    return spark


def _no_context_yet() -> bool:
    """Whether this process runs no SparkContext yet (``getOrCreate`` will start one)."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context is None


class JobTags:
    """Tags a thread's Spark jobs and cancels them by tag from any thread."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.connect = is_connect(spark)

    def start(self, tag: str) -> None:
        """Tag the jobs this thread starts from now on."""
        if self.connect:
            self.spark.addTag(tag)
        else:
            sc = self.spark.sparkContext
            sc.setInterruptOnCancel(True)
            sc.addJobTag(tag)

    def end(self, tag: str) -> None:
        if self.connect:
            self.spark.removeTag(tag)
        else:
            self.spark.sparkContext.removeJobTag(tag)

    def cancel(self, tag: str) -> None:
        """Cancel every running job with ``tag`` (from another thread)."""
        if self.connect:
            self.spark.interruptTag(tag)
        else:
            self.spark.sparkContext.cancelJobsWithTag(tag)


def empty_frame(spark: Any, schema: Any) -> Any:
    """An empty DataFrame with the columns of the Arrow ``schema``, typed as
    ``spark.createDataFrame`` types a batch of that schema. Spark Connect cannot make one from
    an empty Arrow table (it infers the schema from the rows: CANNOT_INFER_EMPTY_SCHEMA), so
    there it gets the schema converted."""
    if not is_connect(spark):
        return spark.createDataFrame(schema.empty_table())
    from pyspark.sql.pandas.types import from_arrow_schema

    ntz = str(spark.conf.get("spark.sql.timestampType", "TIMESTAMP_LTZ")).upper()
    struct = from_arrow_schema(schema, prefer_timestamp_ntz=ntz == "TIMESTAMP_NTZ")
    return spark.createDataFrame([], schema=struct)


def first_line(exc: BaseException) -> str:
    """The useful part of a Spark error: its first line (Py4J adds the JVM stack below)."""
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("An error occurred while calling"):
            return line.removeprefix(": ")
    return type(exc).__name__


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
