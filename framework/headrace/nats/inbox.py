"""Unique inbox subjects, and the request multiplexer that shares one inbox subscription.

Every request gets a reply subject ``<prefix>.<mux id>.<token>``; one wildcard subscription on
``<prefix>.<mux id>.*`` receives every reply, and the token finds the waiting request. One SUB
for all requests instead of one per request keeps the server's interest graph small and makes a
request cost one PUB.
"""

from __future__ import annotations

import itertools
import secrets
import string

import trio

from headrace.errors import NoRespondersError, RequestTimeout
from headrace.protocol.events import Msg

_ALPHABET = string.ascii_letters + string.digits


def unique_token(length: int = 22) -> str:
    """A random token of base-62 characters (about 131 bits for the default length)."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))


def new_inbox(prefix: str = "_INBOX") -> str:
    """A subject nobody else uses, for a one-off reply."""
    return f"{prefix}.{unique_token()}"


class _Pending:
    __slots__ = ("event", "msg", "subject")

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.event = trio.Event()
        self.msg: Msg | BaseException | None = None


class RequestMux:
    """Matches replies arriving on the shared inbox to the requests waiting for them."""

    def __init__(self, prefix: str) -> None:
        self.prefix = f"{new_inbox(prefix)}."
        #: The sid of the shared inbox subscription, once made.
        self.sid = -1
        self._pending: dict[str, _Pending] = {}
        self._tokens = (f"{i:x}" for i in itertools.count(1))

    @property
    def subject(self) -> str:
        """The wildcard subject to subscribe to."""
        return self.prefix + "*"

    def register(self, subject: str) -> tuple[str, _Pending]:
        token = next(self._tokens)
        slot = _Pending(subject)
        self._pending[token] = slot
        return self.prefix + token, slot

    def unregister(self, reply: str) -> None:
        self._pending.pop(reply[len(self.prefix) :], None)

    def on_batch(self, batch: list[Msg]) -> None:
        """Called by the reader with replies; the first reply of a request wins."""
        n = len(self.prefix)
        for msg in batch:
            slot = self._pending.pop(msg.subject[n:], None)
            if slot is not None:
                slot.msg = msg
                slot.event.set()

    def fail_reply(self, error: BaseException, reply: str) -> None:
        """Fail the request whose reply subject is ``reply`` (the server refused it)."""
        slot = (
            self._pending.pop(reply[len(self.prefix) :], None)
            if reply.startswith(self.prefix)
            else None
        )
        if slot is not None:
            slot.msg = error
            slot.event.set()

    def fail(self, error: BaseException, subject: str | None = None) -> None:
        """Fail waiting requests (all, or those published to ``subject``)."""
        for token, slot in list(self._pending.items()):
            if subject is None or slot.subject == subject:
                del self._pending[token]
                slot.msg = error
                slot.event.set()


class PendingRequest:
    """A request already queued (``Connection.request_soon``): :meth:`reply` waits for its
    answer, :meth:`abandon` gives it up. Sent at once, awaited later, it lets a task have two
    requests in flight without a second task (a task's start, and joining it, cost a turn of
    the event loop each)."""

    __slots__ = ("_deadline", "_mux", "_reply", "_slot", "_subject")

    def __init__(self, mux: RequestMux, subject: str, timeout: float) -> None:
        self._mux = mux
        self._subject = subject
        self._reply, self._slot = mux.register(subject)
        self._deadline = trio.current_time() + timeout

    @property
    def reply_subject(self) -> str:
        return self._reply

    async def reply(self) -> Msg:
        """The first reply: :class:`~headrace.errors.NoRespondersError` when nobody listens,
        :class:`~headrace.errors.RequestTimeout` once the request's timeout (counted from
        when it was queued) has passed."""
        try:
            if self._slot.event.is_set():
                # Already here (the usual case when another request was awaited meanwhile):
                # taken without a turn of the event loop.
                return answer(self._slot, self._subject)
            with trio.move_on_at(self._deadline):
                await self._slot.event.wait()
                return answer(self._slot, self._subject)
            raise RequestTimeout(f"no reply to the request on {self._subject!r} in time")
        finally:
            self._mux.unregister(self._reply)

    def abandon(self) -> None:
        """Not waited for after all: a reply that comes is dropped (idempotent)."""
        self._mux.unregister(self._reply)


def answer(slot: _Pending, subject: str) -> Msg:
    """What a request whose slot is set gets: its reply, or the error it failed with."""
    result = slot.msg
    if isinstance(result, BaseException):
        raise result
    assert result is not None
    if result.status == 503 and not result.data:
        raise NoRespondersError(subject)
    return result
