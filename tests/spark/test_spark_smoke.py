"""The shared session works and the sink's quiet defaults are in force."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.spark


def test_session_is_utc_and_local(spark: Any) -> None:
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.sparkContext.master == "local[2]"
    assert spark.range(10).count() == 10
