"""Helpers of the Spark tests: what a Spark sink left in its output directory (visible data files,
hidden ones, ledger entries) and what Spark reads back from it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The sink's control directory under an output (ledger, staging): not data.
CONTROL = "_headrace"


def data_files(out: Path) -> list[str]:
    """Visible data files under ``out`` (what a reader lists), relative to it."""
    return sorted(
        p.relative_to(out).as_posix()
        for p in out.rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(out).parts)
    )


def hidden_files(out: Path) -> list[str]:
    """Files outside the control directory that readers skip (hidden, pending): every file
    there that is not a visible data file."""
    visible = set(data_files(out))
    return sorted(
        p.relative_to(out).as_posix()
        for p in out.rglob("*")
        if p.is_file()
        and p.relative_to(out).parts[0] != CONTROL
        and p.relative_to(out).as_posix() not in visible
    )


def ledger_entries(out: Path) -> list[str]:
    """The names in the commit ledger's directory; it must exist (the sink's ``open`` makes
    it), so a test cannot pass on an output that was never opened."""
    return sorted(p.name for p in (out / CONTROL / "ledger").iterdir())


def read_rows(spark: Any, path: Path | str) -> list[dict[str, Any]]:
    """Every row of the parquet data under ``path`` as dicts (Spark's own reader, so what a
    user of the output would see)."""
    return [row.asDict(recursive=True) for row in spark.read.parquet(str(path)).collect()]


def stream_seqs(spark: Any, path: Path | str) -> list[int]:
    """The ``stream_seq`` column of the output, sorted, duplicates kept."""
    df = spark.read.parquet(str(path))
    return sorted(r[0] for r in df.select("stream_seq").collect())


def all_acked(n: int) -> Callable[[Any], bool]:
    """A ``wait_consumer`` predicate: the first ``n`` messages acked, none pending."""
    return lambda info: info.ack_floor.stream_seq == n and info.num_ack_pending == 0


def manifest(out: Path) -> dict[str, Any]:
    """The manifest of an output shared by workers (``_headrace/output.json``)."""
    import json

    return dict(json.loads((out / CONTROL / "output.json").read_bytes()))


def staged(out: Path) -> list[str]:
    """The attempts staged in a shared output (empty once everything is committed and
    published, and dead attempts swept)."""
    staging = out / CONTROL / "staging"
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


async def commit_state(natspy: Any, out: Path) -> dict[str, Any]:
    """A shared output's commit state as nats-py (the independent peer) reads it from the KV
    bucket its manifest names: the JSON object."""
    import json

    found = manifest(out)

    async def go() -> Any:
        kv = await natspy.nc.jetstream().key_value(found["bucket"])
        return (await kv.get(found["id"])).value

    return dict(json.loads(await natspy.call(go)))
