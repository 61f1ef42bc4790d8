"""examples/spark_windowed_counts.py, run against a real server on the session's Spark: a
windowed count over event time with a watermark, read from JetStream, checked against the
counts computed from what was published; a second run on the same checkpoint reads only the
late clicks and drops them."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.util
import sys
from pathlib import Path
from typing import Any

import headrace_spark
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_windowed_counts.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("spark_windowed_counts", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_windowed_counts_over_event_time_with_a_watermark(
    spark: Any, nats_server: Any, tmp_path: Path
) -> None:
    example = load_example()
    headrace_spark.register(spark)
    url = nats_server.url
    on_time = example.clicks(10, 60)
    closing = {"user": "ada", "at": (example.START + dt.timedelta(minutes=13)).isoformat()}
    _publish(example, url, [*on_time, closing], True)

    first = example.run_counts(spark, url, str(tmp_path / "ck"), str(tmp_path / "out"))
    assert first["rows"] == len(on_time) + 1
    want = example.expected_counts(on_time)
    assert example.read_counts(spark, str(tmp_path / "out")) == want

    late = {"user": "grace", "at": (example.START + dt.timedelta(minutes=3)).isoformat()}
    _publish(example, url, [late] * 10, False)
    second = example.run_counts(spark, url, str(tmp_path / "ck"), str(tmp_path / "out"))
    assert second["rows"] == 10  # only what came after the first run
    assert second["dropped_late"] >= 1
    assert example.read_counts(spark, str(tmp_path / "out")) == want  # nothing counted twice


def _publish(example: Any, url: str, events: list[dict[str, Any]], create: bool) -> None:
    """With nats-py, the independent peer (the example's own publisher)."""
    asyncio.run(example.publish(url, events, create=create))
