"""One inbox subscription for every batched Direct Get of a JetStream context.

A batched Direct Get (ADR-31) is answered with several messages, so the connection's request
multiplexer, which hands a request its first reply, does not fit. A subscription per request
would, but every SUB and UNSUB changes the server's interest graph (measured on one server: a
batch of one cost 190 us with its own subscription, 161-167 us through this, 118-158 us for a
plain Direct Get). So, as the request multiplexer does, one wildcard subscription
``<inbox>.<id>.*`` takes every reply, and the last token finds the request waiting for it. Its
reader is fed in the connection's reader task (the subscription's handler), so nothing is
buffered and nothing can be dropped on this side.
"""

from __future__ import annotations

import itertools

import trio

from headrace.jetstream.direct_batch import DirectBatch, DirectBatchReader
from headrace.nats.inbox import new_inbox
from headrace.nats.subscription import Subscription
from headrace.protocol.events import Msg


class WaitingBatch:
    """A batched Direct Get waiting for its answer: ``done`` is set once ``result`` (the
    batch, or the error its replies carried) is there."""

    __slots__ = ("done", "reader", "result")

    def __init__(self, reader: DirectBatchReader) -> None:
        self.reader = reader
        self.done = trio.Event()
        self.result: DirectBatch | Exception | None = None


class DirectBatchMux:
    """Matches the replies arriving on the shared inbox to the batches waiting for them."""

    def __init__(self, inbox_prefix: str) -> None:
        self.prefix = f"{new_inbox(inbox_prefix)}."
        self.sub: Subscription | None = None
        self._waiting: dict[str, WaitingBatch] = {}
        self._tokens = (f"{i:x}" for i in itertools.count(1))

    @property
    def subject(self) -> str:
        """The wildcard subject to subscribe to."""
        return self.prefix + "*"

    def register(self, reader: DirectBatchReader) -> tuple[str, WaitingBatch]:
        """A reply subject for a new request, and what it will be answered in."""
        token = next(self._tokens)
        waiting = WaitingBatch(reader)
        self._waiting[token] = waiting
        return self.prefix + token, waiting

    def unregister(self, reply: str) -> None:
        """Forget a request (answered, failed or given up): late replies are dropped."""
        self._waiting.pop(reply[len(self.prefix) :], None)

    def on_batch(self, batch: list[Msg]) -> None:
        """Called by the connection's reader with replies; never blocks."""
        n = len(self.prefix)
        for msg in batch:
            token = msg.subject[n:]
            waiting = self._waiting.get(token)
            if waiting is None:
                continue
            try:
                result = waiting.reader.feed(msg)
            except Exception as exc:  # the answer's own error: for the waiting request
                waiting.result = exc
            else:
                if result is None:
                    continue
                waiting.result = result
            del self._waiting[token]
            waiting.done.set()
