"""The source port: what a source stage takes JetStream messages from.

A source stage speaks to one object only, a :class:`MessageSource`: a pull consumer's
:class:`~headrace.jetstream.ConsumeBuffer` or a :class:`~headrace.jetstream.PushSubscription`
(and any test double with the same four members). The JetStream layer does not import this
module: its classes have the members, and a type checker compares them with the protocol
(``tests/pipeline/test_message_source.py`` does at run time as well), so the layers' arrows
keep pointing down.

The four members are what the pipeline's guarantees need of a source and nothing more:
batches bounded by the room the ack tracker gives (``next_batch``), when the ack wait of the
batch just taken started (``taken_since``: it may have waited in a buffer), keeping alive what
still waits there (``keep_alive``: the tracker's +WPI scan calls it), and a drain that lets
what was delivered be read to the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from headrace.jetstream.message import JsMsg


@runtime_checkable
class MessageSource(Protocol):
    """Where a source stage takes its messages from (see the module docs)."""

    async def next_batch(self, max_msgs: int | None = None) -> list[JsMsg]:
        """Up to ``max_msgs`` messages, waiting for at least one; raises
        :class:`~headrace.errors.SubscriptionClosedError` once drained and read to the end."""
        ...

    @property
    def taken_since(self) -> float | None:
        """When the ack wait of the oldest message of the last batch taken started
        (``trio.current_time()`` units), if earlier than the moment it was taken: the tracker
        schedules its +WPI from then. None: from the moment it was taken."""
        ...

    def keep_alive(self, arrived_before: float) -> int:
        """Send +WPI for the messages still waiting here that arrived before
        ``arrived_before``; how many were sent."""
        ...

    async def drain(self) -> None:
        """Stop taking new deliveries; what was delivered can still be read."""
        ...
