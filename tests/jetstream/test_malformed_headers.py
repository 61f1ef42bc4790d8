"""Stored messages whose header block is malformed, read by every kind of consumer (issue 11).

The server stores a header block as its publisher sent it, so a stream can hold blocks no
client library would write; ``raw_hpub`` puts them there over a plain socket. Each must reach
the application like any other message: its readable headers kept, acked like the rest, and
what could not be read reported once as a :class:`MalformedHeaderWarning`.
"""

from __future__ import annotations

import warnings

import pytest
import trio
from headrace.errors import MalformedHeaderWarning
from headrace.jetstream import JetStream, JsMsg, StorageType, StreamConfig
from headrace.nats import connect
from headrace.protocol import Headers

from tests.raw_publish import raw_hpub

#: (header block, the headers that can be read from it). The first is well formed. (A status
#: on the version line, even a malformed one, is not stored: the server drops it.)
BLOCKS = [
    (b"NATS/1.0\r\nA: 1\r\n\r\n", {"A": "1"}),
    (b"NATS/1.0\r\n\xff\xfe: x\r\nA: 1\r\n\r\n", {"A": "1"}),  # a non-UTF-8 name
    (b"NATS/1.0\r\nno colon\r\nA: 1\r\n\r\n", {"A": "1"}),
    (b"XATS/1.0\r\nA: 1\r\n\r\n", {"A": "1"}),  # not a NATS/1.0 block
    (b"NATS/1.0\r\nA: 1\r\n", {"A": "1"}),  # no blank line at the end
    (b"X", {}),
]
MALFORMED = len(BLOCKS) - 1


async def _take_all(js: JetStream, how: str) -> list[JsMsg]:
    """Every message of stream S, by ``how``, each acked; the consumer's state is checked."""
    taken: list[JsMsg] = []
    if how == "push":
        async with js.subscribe("m.>", durable="D") as sub:
            while len(taken) < len(BLOCKS):
                taken.append(await sub.next_msg(timeout=5))
            for msg in taken[:-1]:
                await msg.ack()
            await taken[-1].ack_sync(timeout=5)
            info = await js.consumer_info("S", "D")
    else:
        async with js.pull_subscribe("m.>", durable="P") as sub:
            if how == "fetch":
                while len(taken) < len(BLOCKS):
                    taken += await sub.fetch(len(BLOCKS) - len(taken), expires=2)
            else:
                async with sub.consume(max_messages=3, expires=2) as messages:
                    async for msg in messages:
                        taken.append(msg)
                        if len(taken) == len(BLOCKS):
                            break
            for msg in taken[:-1]:
                await msg.ack()
            await taken[-1].ack_sync(timeout=5)
            info = await js.consumer_info("S", "P")
    assert (info.ack_floor.stream_seq, info.num_ack_pending, info.num_pending) == (
        len(BLOCKS),
        0,
        0,
    )
    return taken


@pytest.mark.parametrize("how", ["consume", "fetch", "push"])
async def test_malformed_header_blocks_are_consumed_like_any_other(nats_server, how):
    """A block with an unreadable line made ``headers`` raise, and one that is not a NATS/1.0
    block at all dropped the connection (the consumer then got it again, and again). Every
    message is taken and acked in order; each malformed one is reported once, whether the
    consumer read its status first (the consume buffer reads every message's) or not."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["m.>"], storage=StorageType.MEMORY))
        for i, (block, _) in enumerate(BLOCKS):
            ack = await raw_hpub(nats_server.port, f"m.{i}", block, b"%d" % i)
            assert ack is not None and ack.get("seq") == i + 1, ack
        with trio.fail_after(15), pytest.warns(MalformedHeaderWarning) as warned:
            taken = await _take_all(js, how)
            got = [(msg.subject, msg.data, msg.headers) for msg in taken]
        assert got == [
            (f"m.{i}", b"%d" % i, Headers(headers)) for i, (_, headers) in enumerate(BLOCKS)
        ]
        assert sum(w.category is MalformedHeaderWarning for w in warned) == MALFORMED
        assert {str(w.message).split("'")[1] for w in warned} == {
            f"m.{i}" for i in range(1, len(BLOCKS))
        }
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert [msg.msg.status for msg in taken] == [None] * len(BLOCKS)
        assert nc.stats.reconnects == 0
