"""A nursery for actors that serve a body of code, as async context managers need.

``async with open_actor_nursery() as nursery:`` starts actors next to the body; when the body
ends, the actors are cancelled. The body's own exception comes out as raised, not wrapped in
an ``ExceptionGroup`` (trio's strict groups would otherwise wrap it because it passed through
the nursery); failures of the actors themselves still propagate as trio reports them.

Clean-up that must run before the actors are cancelled (a final flush, an unsubscribe) goes in
the caller's own ``try/finally`` inside the block.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from headrace._trio import BodyError


@asynccontextmanager
async def open_actor_nursery() -> AsyncIterator[trio.Nursery]:
    body = BodyError()
    async with trio.open_nursery() as nursery:
        try:
            with body:
                yield nursery
        finally:
            nursery.cancel_scope.cancel()
    body.reraise()
