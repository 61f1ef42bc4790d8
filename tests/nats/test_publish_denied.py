"""A publish the server refuses for permissions reaches whoever asked to hear of it.

The server answers a refused publish only with ``-ERR 'Permissions Violation for Publish to
"<subject>"'``; the message is dropped and the connection stays up. Publishers that wait for
nothing (acks, dead letters) learn of it through ``nc.on_publish_denied(prefix, callback)``.
"""

from __future__ import annotations

import trio
from headrace.errors import PermissionViolation
from headrace.nats import ServerErrorEvent, Status, connect

from tests.servers import permissions_auth
from tests.waiting import next_event


async def test_a_refused_publish_is_told_to_the_callbacks_of_its_prefix(nats_server_factory):
    auth = permissions_auth()  # may publish to allowed.> and _INBOX.> only
    server = nats_server_factory(jetstream=False, auth=auth.config)
    async with connect(server.url, user=auth.user, password=auth.password) as nc:
        denied: list[PermissionViolation] = []
        others: list[PermissionViolation] = []
        told = trio.Event()

        def on_denied(violation: PermissionViolation) -> None:
            denied.append(violation)
            told.set()

        stop = nc.on_publish_denied("denied.", on_denied)
        nc.on_publish_denied("elsewhere.", others.append)
        with nc.events() as events:
            await nc.publish("allowed.x", b"fine")
            await nc.publish("denied.x", b"refused")
            with trio.fail_after(5):
                await told.wait()
            event = await next_event(events, ServerErrorEvent, timeout=5)
        (violation,) = denied
        assert (violation.operation, violation.subject) == ("publish", "denied.x")
        assert event.error.subject == "denied.x"  # the same news for event watchers
        assert others == []
        # Not terminal: the connection stays up, and a removed callback hears no more.
        stop()
        await nc.publish("denied.y", b"refused too")
        await nc.flush()  # the server sends the -ERR before the PONG
        assert len(denied) == 1
        assert nc.status is Status.CONNECTED
