"""publish_acked: many publishes in flight, each confirmed, refusals counted (real server)."""

from __future__ import annotations

from typing import Any

import pytest
from headrace.jetstream import JetStream, StreamConfig, publish_acked
from headrace.nats import connect


async def test_every_message_stored_and_refusals_counted(nats_server: Any) -> None:
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="LOAD", subjects=["load.>"]))
        good = ((f"load.{i % 7}", b"%d" % i, {"N": str(i)}) for i in range(2500))
        result = await publish_acked(nc, good, window=100)
        assert (result.sent, result.refused) == (2500, 0)
        assert result.payload_bytes == sum(len(b"%d" % i) for i in range(2500))
        assert (await js.stream_info("LOAD")).state.messages == 2500
        last = await js.get_msg("LOAD", last_by_subject="load.1")
        assert last.headers is not None and last.headers["N"] == "2493"
        # No stream keeps "nowhere.>": each publish is answered by a 503, counted as refused.
        lost = await publish_acked(nc, [("nowhere.x", b"", None)] * 3, window=2)
        assert (lost.sent, lost.refused) == (3, 3)
        with pytest.raises(ValueError, match="window"):
            await publish_acked(nc, [], window=0)
