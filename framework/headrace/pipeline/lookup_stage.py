"""The stage of a ``lookup`` node: each batch's keys read from KV at once (lookup.py says
what a lookup does)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from headrace.jetstream.kv import KeyValue, check_key, key_value
from headrace.jetstream.transient import retry_transient
from headrace.pipeline.lookup import LookupMissing, LookupSpec
from headrace.pipeline.record import Record
from headrace.pipeline.stages import Stage

if TYPE_CHECKING:
    from headrace.jetstream.context import JetStream
    from headrace.pipeline.ack_tracker import AckTracker
    from headrace.pipeline.nodes import Node


class LookupStage(Stage):
    """Runs one ``lookup`` node (see the module docs)."""

    def __init__(self, node: Node, tracker: AckTracker, js: JetStream) -> None:
        super().__init__(f"lookup:{node.name}", node, tracker)
        spec = node.lookup_spec
        assert spec is not None
        self.spec: LookupSpec = spec
        self.js = js
        self.kv: KeyValue | None = None

    async def run(self) -> None:
        spec = self.spec
        self.kv = await retry_transient(lambda: key_value(self.js, spec.bucket))
        while (item := await self.next_batch()) is not None:
            out = await self._enrich(item)
            if out:
                await self.forward(out)

    async def _enrich(self, batch: list[Record]) -> list[Record]:
        spec = self.spec
        kv = self.kv
        assert kv is not None
        keyed: list[tuple[Record, str]] = []
        for record in batch:
            try:
                keyed.append((record, check_key(spec.key(record.value))))
            except Exception as exc:
                self.tracker.failed([record], exc, self.name, self.node.name)
        found = await retry_transient(lambda: kv.get_many([k for _, k in keyed]))
        out: list[Record] = []
        dropped: list[Record] = []
        decode = spec.decode
        for record, key in keyed:
            entry = found.get(key)
            if entry is None and spec.missing != "keep":
                if spec.missing == "drop":
                    dropped.append(record)
                else:
                    problem = LookupMissing(f"bucket {spec.bucket!r} has no value for {key!r}")
                    self.tracker.failed([record], problem, self.name, self.node.name)
                continue
            try:
                value = None if entry is None else (decode(entry.value) if decode else entry.value)
                joined = spec.into(record.value, value)
            except Exception as exc:
                self.tracker.failed([record], exc, self.name, self.node.name)
                continue
            # A new record, not the value set in place: a fan-out may hand this one to others.
            out.append(Record(joined, record.delivery))
        if dropped:
            self.tracker.release(dropped)
        return out
