"""``JetStream(nc, trace=ClientTrace(...))``: a hook around every API request (issue 24, as
nats.go's WithClientTrace), for logging and OpenTelemetry. Real nats-server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from headrace.jetstream import ConsumerConfig, JetStream, StreamConfig, StreamNotFound
from headrace.jetstream.trace import ClientTrace
from headrace.nats import connect
from headrace.protocol.events import Msg


async def test_every_api_request_and_its_answer_are_traced(nats_server: Any) -> None:
    sent: list[tuple[str, Any]] = []
    received: list[tuple[str, Any]] = []

    def on_sent(subject: str, payload: bytes) -> None:
        sent.append((subject, json.loads(payload) if payload else None))

    def on_received(subject: str, msg: Msg) -> None:
        received.append((subject, json.loads(msg.data)))

    async with connect(nats_server.url) as nc:
        js = JetStream(nc, trace=ClientTrace(request_sent=on_sent, response_received=on_received))
        await js.add_stream(StreamConfig(name="T", subjects=["t.>"]))
        await js.publish("t.a", b"x")  # message traffic: not traced
        await js.create_consumer("T", ConsumerConfig(durable_name="C"))
        with pytest.raises(StreamNotFound):
            await js.stream_info("NOPE")
    assert [s for s, _ in sent] == [
        "$JS.API.STREAM.CREATE.T",
        "$JS.API.CONSUMER.CREATE.T.C",
        "$JS.API.STREAM.INFO.NOPE",
    ]
    assert sent[0][1]["name"] == "T" and sent[1][1]["config"]["durable_name"] == "C"
    assert [s for s, _ in received] == [s for s, _ in sent]
    assert received[0][1]["config"]["name"] == "T"
    assert received[2][1]["error"]["err_code"] == 10059  # errors are traced too


async def test_a_hook_that_fails_fails_the_request(nats_server: Any) -> None:
    def broken(subject: str, payload: bytes) -> None:
        raise RuntimeError("the exporter is down")

    async with connect(nats_server.url) as nc:
        js = JetStream(nc, trace=ClientTrace(request_sent=broken))
        with pytest.raises(RuntimeError, match="exporter"):
            await js.account_info()
