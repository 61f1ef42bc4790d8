"""The sink contract read from a sink (``headrace.pipeline.sink``): which members are called, and
the refusals of a sink that breaks it, without a server."""

from __future__ import annotations

from typing import Any

import pytest
from headrace.pipeline import (
    Batch,
    JetStreamSource,
    Pipeline,
    PipelineError,
    RecordsRejected,
    Sink,
    SinkError,
    SinkRunner,
    SinkUnavailable,
    failure_kind,
)
from headrace.pipeline.sink import OPTIONAL_MEMBERS, sink_members, sink_name


class AsyncOnly(Sink):
    """Defines write_batch and close, async; bind, open and maintain stay Sink's defaults."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def write_batch(self, batch: Batch) -> None:
        self.calls.append("write_batch")

    async def close(self) -> None:
        self.calls.append("close")


class Duck:
    """No base class: a sink is any object with write_batch."""

    name = "duck"

    def write_batch(self, batch: Any) -> None:
        pass

    def open(self) -> None:
        pass


def test_the_base_class_defaults_are_not_members() -> None:
    members = sink_members(AsyncOnly())
    assert members.bind is None and members.open is None and members.maintain is None
    assert members.close is not None and members.write_batch is not None


def test_a_sink_without_the_base_class_has_the_members_it_defines() -> None:
    members = sink_members(Duck())
    assert members.open is not None
    assert members.bind is None and members.close is None and members.maintain is None


def test_every_optional_member_is_declared_on_the_base_class() -> None:
    for member in OPTIONAL_MEMBERS:
        assert callable(getattr(Sink, member)) and getattr(Sink, member).__doc__


async def test_an_async_sink_on_the_base_class_starts_no_thread() -> None:
    """Sink's sync defaults are never called: a call would start the sink's thread."""
    sink = AsyncOnly()
    runner = SinkRunner(sink, "async")
    await runner.bind(None)  # type: ignore[arg-type]  # not called: AsyncOnly has no bind
    await runner.open()
    await runner.maintain()
    await runner.write_batch(Batch([], "async"))
    await runner.close()
    assert sink.calls == ["write_batch", "close"]
    assert runner.thread is None


def test_a_sink_without_write_batch_is_refused() -> None:
    with pytest.raises(TypeError, match=r"sink 'x' .* has no write_batch\(batch\) method"):
        sink_members(object(), "x")

    class Empty(Sink):
        """Subclasses the base and forgets write_batch: refused too, not failed batch by
        batch (Sink.write_batch raises, which would split, then dead-letter every message)."""

    with pytest.raises(TypeError, match="has no write_batch"):
        sink_members(Empty(), "empty")
    pipe = Pipeline("p")
    pipe.source(JetStreamSource(stream="S", durable="d")).sink(Empty(), name="empty")
    with pytest.raises(PipelineError, match=r"sink 'empty' .*has no write_batch"):
        pipe.validate()


def test_a_member_that_is_not_callable_is_refused() -> None:
    class Odd:
        open = 3

        def write_batch(self, batch: Any) -> None:
            pass

    with pytest.raises(TypeError, match="open is 3, not a method"):
        sink_members(Odd(), "odd")
    pipe = Pipeline("p")
    pipe.source(JetStreamSource(stream="S", durable="d")).sink(Odd(), name="odd")
    with pytest.raises(PipelineError, match=r"sink 'odd' .*: open is 3, not a method"):
        pipe.validate()


def test_the_name_a_sink_goes_by() -> None:
    assert sink_name(Duck()) == "duck"
    assert sink_name(AsyncOnly()) == "asynconly"


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (SinkUnavailable("down"), True),
        (RuntimeError("?"), None),
        (SinkError("plain"), None),
        (None, None),
    ],
)
def test_failure_kind_reads_transient(error: BaseException | None, kind: bool | None) -> None:
    assert failure_kind(error) is kind


def test_failure_kind_ignores_a_transient_that_is_not_a_bool() -> None:
    error = RuntimeError("odd")
    error.transient = "yes"  # type: ignore[attr-defined]
    assert failure_kind(error) is None
    error.transient = False  # type: ignore[attr-defined]
    assert failure_kind(error) is False


def test_records_rejected_needs_a_record() -> None:
    with pytest.raises(ValueError, match="at least one rejected record"):
        RecordsRejected([])
