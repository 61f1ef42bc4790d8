"""Records and the deliveries they come from.

A :class:`Delivery` is one JetStream message in flight through a pipeline. It is acked only once
every record derived from it has been committed by every sink it went to: ``pending`` counts
those outstanding records (a map keeps the count, a filter that drops takes one off, a flat_map
to n records adds n-1, a fan-out to k sinks adds k-1). The ack tracker owns the transitions.

A :class:`Record` is what operators and sinks see: a value (the payload bytes at the source, then
whatever the operators make of it) and the delivery it came from, whose metadata every record
carries so that sinks can be idempotent: stream, stream sequence, consumer, delivery count,
subject, headers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import datetime as dt

    from headrace.jetstream.message import JsMsg
    from headrace.protocol.headers import Headers


class Delivery:
    """One JetStream message in flight; see the module docs."""

    # (__weakref__: a weak reference tells that a settled delivery is freed at once.)
    __slots__ = (
        "__weakref__",
        "done",
        "failed",
        "group",
        "msg",
        "pending",
        "received",
        "source",
        "wpi_at",
    )

    def __init__(self, msg: JsMsg, received: float, source: str, group: Any = None) -> None:
        #: The arrival group it belongs to (the ack tracker's bookkeeping), if any. The group
        #: lets go of its deliveries once all are settled, so this reference makes no cycle
        #: that would wait for a full garbage collection (docs/pipelines.md, memory).
        self.group = group
        self.msg = msg
        self.pending = 1
        #: Set when a sink or an operator failed on a record of it: it will not be acked.
        self.failed = False
        #: Set once acked, naked or terminated: nothing more is sent for it.
        self.done = False
        self.received = received
        #: When the next +WPI is due (the ack tracker keeps slow commits from redelivery).
        self.wpi_at = 0.0
        self.source = source

    def __repr__(self) -> str:
        return f"<Delivery {self.msg.subject!r} pending={self.pending}>"


class ResultOwner(Protocol):
    """Who is told that a result it emitted has settled (a stateful stage)."""

    def result_settled(self, seq: int, *, committed: bool) -> None: ...


class ResultDelivery(Delivery):
    """A stateful operator's output (a window's result, a stateful map's output): not a
    message of any consumer. Its ``msg`` is a stand-in whose metadata names the operator's
    results (``stream``: ``<pipeline>.<operator>``, ``stream_seq``: the result's number, as
    the operator's snapshot recorded it), so sinks deduplicate results as they do messages.
    It belongs to no arrival group (``group`` None) and is acked by nobody: when its records
    settle, the tracker tells ``owner``, which forgets the result at its next snapshot."""

    __slots__ = ("owner", "result_seq")

    def __init__(self, msg: JsMsg, received: float, source: str, owner: ResultOwner, seq: int):
        super().__init__(msg, received, source)
        self.owner = owner
        self.result_seq = seq


class Record:
    """A value on its way through the pipeline, and where it came from."""

    __slots__ = ("delivery", "value")

    def __init__(self, value: Any, delivery: Delivery) -> None:
        self.value = value
        self.delivery = delivery

    def __repr__(self) -> str:
        meta = self.delivery.msg.metadata
        return f"Record({self.value!r}, {meta.stream}#{meta.stream_seq})"

    def derive(self, value: Any) -> Record:
        """A new record from the same delivery (the caller accounts for it in ``pending``)."""
        return Record(value, self.delivery)

    # -- where it came from ---------------------------------------------------------------

    @property
    def stream(self) -> str:
        return self.delivery.msg.metadata.stream

    @property
    def stream_seq(self) -> int:
        return self.delivery.msg.metadata.stream_seq

    @property
    def consumer(self) -> str:
        return self.delivery.msg.metadata.consumer

    @property
    def num_delivered(self) -> int:
        return self.delivery.msg.metadata.num_delivered

    @property
    def timestamp(self) -> dt.datetime:
        return self.delivery.msg.metadata.timestamp

    @property
    def subject(self) -> str:
        return self.delivery.msg.subject

    @property
    def headers(self) -> Headers | None:
        return self.delivery.msg.headers

    @property
    def data(self) -> bytes:
        """The original payload, whatever the operators made of ``value``."""
        return self.delivery.msg.data
