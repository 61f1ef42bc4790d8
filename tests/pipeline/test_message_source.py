"""The source port (``headrace.pipeline.message_source``): a source stage speaks only to a
:class:`MessageSource`, and each kind of source gives it one, against a real server."""

from __future__ import annotations

import pytest
from headrace.jetstream import ConsumeBuffer, PushSubscription
from headrace.pipeline import BatchPolicy
from headrace.pipeline.message_source import MessageSource
from headrace.sinks import MemorySink
from headrace.testing import TestMessage, run_pipeline

from tests.pipeline.pipe_support import FAST, add_stream, connect, fast_pipeline, publish, source

SMALL = BatchPolicy(max_messages=10, max_age=0.05)


@pytest.fixture
async def peer(nats_server, natspy):
    await natspy.connect(nats_server.url)
    await add_stream(natspy)
    return natspy


@pytest.mark.parametrize(("pull", "kind"), [(True, ConsumeBuffer), (False, PushSubscription)])
async def test_each_source_kind_gives_the_stage_a_message_source(nats_server, peer, pull, kind):
    await publish(peer, 5)
    sink = MemorySink()
    pipe = fast_pipeline()
    pipe.source(source(pull=pull)).sink(sink, batch=SMALL)
    async with connect(nats_server.url, **FAST) as nc, pipe.running(nc) as run:
        await sink.wait_for(5)
        (stage,) = run.sources
        assert isinstance(stage.messages, kind)
        assert isinstance(stage.messages, MessageSource)
        # The tracker's +WPI scan reaches the source through the same object.
        assert run.tracker.keep_alives[stage.node.name] == stage.messages.keep_alive
    assert sink.keys == [("S", seq) for seq in range(1, 6)]


async def test_the_test_harness_source_is_a_message_source():
    """The in-memory consumer of ``headrace.testing`` is a source like the others."""
    pipe = fast_pipeline()
    pipe.source(source(filter_subjects=["s.>"])).sink(MemorySink(), batch=SMALL)
    msgs = [TestMessage("s.1", b"1"), TestMessage("s.2", b"2")]
    async with run_pipeline(pipe, msgs, streams={"S": ["s.>"]}) as test:
        await test.settled()
        (stage,) = test.run.sources
        assert isinstance(stage.messages, MessageSource)
        assert stage.messages.keep_alive(float("inf")) == 0
