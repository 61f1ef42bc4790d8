"""A pipeline whose publishes the server refuses stops with an error naming the subject.

The user may lack permission to publish the acks (``$JS.ACK``) or the dead letters. The server
drops such a publish and only says ``-ERR Permissions Violation``: before issue 11 the stats
counted the acks, every message came back after ack_wait for ever, poison messages were naked
again and again, and ``headrace run`` drained and exited 0. nats-py (as an unrestricted user)
is the independent peer that reads the consumer's state.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from headrace.errors import PermissionViolation
from headrace.jetstream import AckRefused, DeletePolicy
from headrace.pipeline import BatchPolicy, DeadLetterRefused
from headrace.sinks import MemorySink

from tests.pipeline.pipe_support import (
    FAST,
    add_stream,
    connect,
    consumer_info,
    fast_pipeline,
    publish,
    source,
)
from tests.servers import permissions_auth

ADMIN_PASSWORD = "admin-secret"


async def restricted_server(factory: Any, natspy: Any, publish: list[str]) -> tuple[Any, Any]:
    """A server with a ``worker`` who may publish only to ``publish`` (and an admin, as whom
    the peer connects and creates the streams); the server and the worker's credentials."""
    auth = permissions_auth(
        "worker", publish=publish, subscribe=[">"], admin_password=ADMIN_PASSWORD
    )
    server = factory(auth=auth.config)
    await natspy.connect(server.url, user="admin", password=ADMIN_PASSWORD)
    await add_stream(natspy)
    return server, {"user": auth.user, "password": auth.password}


@pytest.mark.parametrize("pull", [True, False])
async def test_refused_acks_stop_the_pipeline_with_ack_refused(nats_server_factory, natspy, pull):
    server, worker = await restricted_server(nats_server_factory, natspy, ["$JS.API.>", "_INBOX.>"])
    await publish(natspy, 10)
    sink = MemorySink()
    pipe = fast_pipeline()
    # (NEVER: a push durable the pipeline created would be deleted, and its state with it.)
    spec = source(pull=pull, delete_policy=DeletePolicy.NEVER)
    pipe.source(spec).sink(sink, batch=BatchPolicy(max_messages=5, max_age=0.05))
    async with connect(server.url, **FAST, **worker) as nc:
        with trio.fail_after(10), pytest.raises(AckRefused) as caught:
            async with pipe.running(nc):
                await trio.sleep_forever()
    error = caught.value
    assert (error.stream, error.consumer) == ("S", "C")
    assert error.subject.startswith("$JS.ACK.S.C.") and error.subject in str(error)
    assert isinstance(error.__cause__, PermissionViolation)
    info = await consumer_info(natspy)
    assert info.ack_floor.stream_seq == 0  # nothing was acked: all of it comes back


async def test_a_refused_dead_letter_stops_the_pipeline_and_terminates_nothing(
    nats_server_factory, natspy
):
    server, worker = await restricted_server(
        nats_server_factory, natspy, ["$JS.API.>", "$JS.ACK.>", "_INBOX.>"]
    )
    await add_stream(natspy, "DLQ", ["dlq.>"])
    await publish(natspy, 1)

    class Refuses(MemorySink):
        async def write_batch(self, batch: Any) -> None:
            error = ValueError("a value the sink cannot write")
            error.transient = False  # type: ignore[attr-defined]
            raise error

    pipe = fast_pipeline(max_deliveries=1, dead_letter="dlq.p", nak_delay_max=30)
    pipe.source(source()).sink(Refuses(), batch=BatchPolicy(max_messages=1, max_age=0.05))
    async with connect(server.url, **FAST, **worker) as nc:
        with trio.fail_after(10), pytest.raises(DeadLetterRefused) as caught:
            async with pipe.running(nc) as run:
                await trio.sleep_forever()
    assert caught.value.subject == "dlq.p" and "'dlq.p'" in str(caught.value)
    notes = getattr(caught.value, "__notes__", [])
    assert any("'publish-guard'" in note for note in notes), notes
    assert run.stats.terms == 0 and run.stats.dead_lettered == 0
    info = await consumer_info(natspy)
    assert info.ack_floor.stream_seq == 0  # naked, not terminated: the server still has it
