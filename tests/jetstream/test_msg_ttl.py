"""Per-message TTL (ADR-43) on JetStream publish and the bulk publisher, against a real
nats-server, with nats-py as the independent peer that reads the stored header.

Expiry is waited for on the server's own event: a stream with ``subject_delete_marker_ttl``
places a ``Nats-Marker-Reason: MaxAge`` marker when it removes a subject's last message for its
age, and an ordered consumer delivers it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import trio
from headrace.jetstream import (
    InvalidMessageTTL,
    JetStream,
    JetStreamAPIError,
    MessageNotFound,
    MessageTTLDisabled,
    StreamConfig,
    publish_acked,
)
from headrace.jetstream.msg_ttl import duration_seconds, ttl_header
from headrace.nats import connect

TIMEOUT = 10


# -- the header value -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ttl", "header"),
    [
        (1, "1"),
        (90, "90"),
        (2.0, "2"),
        (1.5, "1500ms"),
        (dt.timedelta(minutes=1, seconds=30), "90"),
        (dt.timedelta(milliseconds=2500), "2500ms"),
        ("never", "never"),
        ("1h30m", "1h30m"),
        ("1.5s", "1.5s"),
        ("1000ms", "1000ms"),
        ("45", "45"),
    ],
)
def test_ttl_header_forms(ttl: Any, header: str) -> None:
    assert ttl_header(ttl) == header


@pytest.mark.parametrize(
    "ttl",
    [0, 0.5, -1, float("nan"), float("inf"), "0", "999ms", "1.5", "-1s", "abc", "1d", "", True],
)
def test_ttl_header_refuses(ttl: Any) -> None:
    with pytest.raises(InvalidMessageTTL) as caught:
        ttl_header(ttl)
    assert caught.value.err_code == 10165
    assert isinstance(caught.value, ValueError)


def test_duration_seconds() -> None:
    assert duration_seconds("1h30m") == 5400
    assert duration_seconds("1m0s") == 60  # the form the server writes in its markers
    assert duration_seconds("2.5s") == 2.5
    assert duration_seconds("250ms") == 0.25


# -- publish --------------------------------------------------------------------------------------


async def _ttl_stream(js: JetStream, name: str, **config: Any) -> None:
    await js.add_stream(
        StreamConfig(
            name=name,
            subjects=[f"{name.lower()}.>"],
            allow_msg_ttl=True,
            subject_delete_marker_ttl=60,
            **config,
        )
    )


@pytest.mark.slow  # 2.3 s or more of timers: the full suite runs it
async def test_publish_ttl_expires_the_message(nats_server, natspy):
    """A message published with ``ttl`` carries ``Nats-TTL`` (nats-py reads it stored) and is
    removed once it runs out; one with ``never`` outlives the stream's ``max_age``."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        # One message per subject: otherwise the server raises a shorter TTL to the stream's
        # subject_delete_marker_ttl (ADR-43).
        await _ttl_stream(js, "T", max_age=1.0, max_msgs_per_subject=1)
        forever = await js.publish("t.keep", b"k", ttl="never")
        async with js.subscribe("t.gone", stream="T", ordered=True) as sub:
            gone = await js.publish("t.gone", b"g", ttl=dt.timedelta(seconds=1))
            with trio.fail_after(TIMEOUT):
                first = await anext(sub)
                marker = await anext(sub)
        assert first.metadata.stream_seq == gone.seq
        assert first.headers is not None and first.headers.get("Nats-TTL") == "1"
        assert marker.headers is not None
        assert marker.headers.get("Nats-Marker-Reason") == "MaxAge"
        with pytest.raises(MessageNotFound):
            await js.get_msg("T", gone.seq)
        # A message without ttl, newer than the "never" one, removed by max_age (1 s): the
        # stream's age limit has passed over the "never" message, which is still there.
        async with js.subscribe("t.aged", stream="T", ordered=True) as sub:
            aged = await js.publish("t.aged", b"a")
            with trio.fail_after(TIMEOUT):
                assert (await anext(sub)).metadata.stream_seq == aged.seq
                marker = await anext(sub)
        assert marker.headers is not None
        assert marker.headers.get("Nats-Marker-Reason") == "MaxAge"
        with pytest.raises(MessageNotFound):
            await js.get_msg("T", aged.seq)
        kept = await js.get_msg("T", forever.seq)
        assert kept.data == b"k"

        nc_py = await natspy.connect(nats_server.url)

        async def read() -> Any:
            msg = await nc_py.jetstream().get_msg("T", forever.seq)
            return msg.headers

        assert (await natspy.call(read)) == {"Nats-TTL": "never"}


async def test_publish_ttl_refused_by_stream_without_msg_ttl(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="PLAIN", subjects=["plain.>"]))
        with pytest.raises(MessageTTLDisabled) as caught:
            await js.publish("plain.a", b"x", ttl=5)
        assert caught.value.err_code == 10166
        assert (await js.stream_info("PLAIN")).state.messages == 0
        # Without ttl the same publish is stored.
        await js.publish("plain.a", b"x")
        assert (await js.stream_info("PLAIN")).state.messages == 1


async def test_publish_bad_ttl_refused_before_sending(core_server):
    """No JetStream here: a publish that went out would end in NoStreamForSubject, so the
    InvalidMessageTTL proves nothing was sent."""
    async with connect(core_server.url) as nc:
        js = JetStream(nc, timeout=1)
        with pytest.raises(InvalidMessageTTL, match="under one second"):
            await js.publish("x.y", b"", ttl=0.5)
        with pytest.raises(InvalidMessageTTL, match="duration"):
            await js.publish("x.y", b"", ttl="1.5")


async def test_server_refuses_what_the_client_refuses(nats_server):
    """The client's rule is the server's: a header sent raw with the values ttl_header refuses
    is refused by the server with the same err_code."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _ttl_stream(js, "RAW")
        for bad in ("0", "1.5", "999ms", "-1s"):
            with pytest.raises(InvalidMessageTTL) as caught:
                await js.publish("raw.a", b"", headers={"Nats-TTL": bad})
            assert caught.value.err_code == 10165, bad
        for good in ("1", "1.5s", "1h30m", "never", ttl_header(2.5)):
            await js.publish("raw.a", b"", headers={"Nats-TTL": good})


# -- bulk -----------------------------------------------------------------------------------------


async def test_bulk_publish_with_ttl(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _ttl_stream(js, "BULK")
        await js.add_stream(StreamConfig(name="NOTTL", subjects=["nottl.>"]))
        msgs = [(f"bulk.{i}", b"v", {"X-I": str(i)} if i % 2 else None) for i in range(20)]
        result = await publish_acked(nc, msgs, window=5, ttl="1h")
        assert (result.sent, result.refused) == (20, 0)
        for seq in (1, 2, 20):
            stored = await js.get_msg("BULK", seq)
            assert stored.headers is not None and stored.headers.get("Nats-TTL") == "1h"
        assert (await js.get_msg("BULK", 2)).headers.get("X-I") == "1"  # type: ignore[union-attr]

        refused = await publish_acked(nc, [("nottl.a", b"v", None)] * 3, ttl=60)
        assert (refused.sent, refused.refused) == (3, 3)
        assert (await js.stream_info("NOTTL")).state.messages == 0

        with pytest.raises(InvalidMessageTTL):
            await publish_acked(nc, [("bulk.x", b"v", None)], ttl=0)
        assert (await js.stream_info("BULK")).state.messages == 20


async def test_stream_msg_ttl_cannot_be_turned_off(nats_server):
    """ADR-43: allow_msg_ttl may be turned on by an update, never off (10052)."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        info = await js.add_stream(StreamConfig(name="ON", subjects=["on.>"]))
        config = info.config
        config.allow_msg_ttl = True
        assert (await js.update_stream(config)).config.allow_msg_ttl is True
        config.allow_msg_ttl = False
        with pytest.raises(JetStreamAPIError) as caught:
            await js.update_stream(config)
        assert caught.value.err_code == 10052
