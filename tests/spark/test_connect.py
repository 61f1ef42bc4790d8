"""The Spark sink on Spark Connect (``sc://``): a real Connect server from the jars PySpark
ships (``SparkConnectServer``, started with PySpark's own ``spark-submit``), and a client in a
process of its own (connect_child.py): PySpark will not make a Connect session where a classic
one runs, as in the test process, and marks the whole process as Connect once it made one.

Needs the Connect client libraries (``pyspark[connect]``: grpcio, pandas, protobuf, ...), which
the ``dev`` extra installs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from headrace_spark import SparkSessionError
from headrace_spark import session as spark_session

from tests.spark.spark_procs import run_child


@pytest.mark.spark
@pytest.mark.slow
async def test_sink_writes_and_compacts_through_spark_connect(
    connect_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    done = await run_child("connect_child.py", "write", connect_url, str(out), cwd=tmp_path)
    (result,) = done.events("done")
    assert result["connect"] is True, done.transcript()
    # The sink's runtime settings reach the server's session.
    assert result["timezone"] == "UTC"
    assert result["sink"] == {
        "batches_committed": 2,
        "rows_written": 8,
        "duplicates_skipped": 2,
    }, done.transcript()
    rows = result["rows"]
    assert [r["stream_seq"] for r in rows] == list(range(1, 9))
    for r in rows:
        n = r["stream_seq"]
        assert r["stream"] == "ORDERS" and r["subject"] == "orders.new"
        assert r["data"] == f'{{"n": {n}}}'
        assert r["num_delivered"] == (1 if n <= 5 else 2)
        assert r["timestamp"].startswith("2023-11-14T22:13:20.123456")
    files = result["files"]
    assert len(files) == 2 and files[0].startswith("part-ORDERS-1-5.")
    assert files[1].startswith("part-ORDERS-6-8."), files
    # Compaction rewrites through Connect too: one file, the same rows.
    assert result["compaction"] == [1, 2, 1], done.transcript()
    (compacted,) = result["compacted_files"]
    assert compacted.startswith("part-compact.") and compacted.endswith(".parquet")
    assert result["compacted_rows"] == rows
    assert sorted(p.name for p in out.glob("part-*.parquet")) == [compacted]


@pytest.mark.spark
@pytest.mark.slow
async def test_cancelled_batch_interrupts_its_connect_job(connect_url: str, tmp_path: Path) -> None:
    """A batch whose job hangs (a UDF sleeping 10 minutes on the server) is cancelled: the
    pipeline side returns at once, the job is interrupted by its tag on the server (the sink
    closes within seconds), nothing is committed or left behind, and the batch written again
    is there once."""
    out = tmp_path / "out"
    marker = tmp_path / "udf-started"
    done = await run_child(
        "connect_child.py", "cancel", connect_url, str(out), str(marker), cwd=tmp_path
    )
    (result,) = done.events("done")
    transcript = done.transcript()
    assert result["cancelled"] is True, transcript
    assert result["cancelled_after"] < 60, transcript
    # close() waits for the abandoned write (up to 30 s); the interrupt ends it long before.
    assert result["closed_after"] < 20, transcript
    assert result["data"] == [] and result["staging"] == [] and result["ledger"] == []
    assert result["sink"] == {"batches_committed": 1, "rows_written": 3, "duplicates_skipped": 0}
    assert [r["stream_seq"] for r in result["rows"]] == [1, 2, 3]


@pytest.mark.spark
def test_connect_without_its_client_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where grpc (or pandas, protobuf) is missing, an ``sc://`` session fails with the
    install hint, before PySpark is asked for anything."""
    real = spark_session._importable
    monkeypatch.setattr(spark_session, "_importable", lambda m: m != "grpc" and real(m))
    with pytest.raises(SparkSessionError) as caught:
        spark_session.start_session("sc://127.0.0.1:15002")
    message = str(caught.value)
    assert "Spark Connect (sc://127.0.0.1:15002) needs its client libraries (grpc missing)" in (
        message
    )
    assert "pip install 'pyspark[connect]'" in message
