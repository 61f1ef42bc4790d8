"""Asynchronous publish (``js.async_publisher()``) against a real nats-server: many messages in
flight, the pending bound, duplicates, refusals, timeouts, lost connections and cancellation,
with nats-py (the independent peer) reading back what the stream holds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import trio
import trio.testing
from headrace.errors import (
    ConnectionClosedError,
    ConnectionLostError,
    NoRespondersError,
    PermissionViolation,
    RequestTimeout,
)
from headrace.jetstream import (
    AsyncPublisher,
    AsyncPublisherClosed,
    AsyncPublishFailed,
    JetStream,
    MessageSchedule,
    NoStreamForSubject,
    PendingPubAck,
    PubAckLost,
    PubAckMissing,
    PubAckTimeout,
    PublishAbandoned,
    StorageType,
    StreamConfig,
    WrongLastSequence,
)
from headrace.nats import connect
from headrace.protocol import Headers

from tests.natspy_peer import once_placed_natspy
from tests.servers import permissions_auth
from tests.waiting import FAST, once_placed

MEM = StorageType.MEMORY


async def _stream(js: JetStream, name: str = "S", subjects: list[str] | None = None) -> None:
    await js.add_stream(StreamConfig(name=name, subjects=subjects or ["s.>"], storage=MEM))


Stored = list[tuple[int, str, bytes]]


async def _stored(natspy: Any, url: str, stream: str, subjects: str) -> Stored:
    """Every message of ``stream`` as nats-py reads it through a pull consumer of its own:
    (stream sequence, subject, data), in stream order."""
    from nats.js.api import AckPolicy, ConsumerConfig
    from nats.js.errors import ServiceUnavailableError

    nc_py = await natspy.connect(url)

    async def read() -> Stored:
        js = nc_py.jetstream()
        # On a fresh cluster the first requests may go unanswered for a moment: retried.
        info = await once_placed_natspy(lambda: js.stream_info(stream))
        total = info.state.messages
        config = ConsumerConfig(ack_policy=AckPolicy.NONE)
        sub = await once_placed_natspy(
            lambda: js.pull_subscribe(subjects, stream=stream, config=config)
        )
        out: Stored = []
        while len(out) < total:
            try:
                batch = await sub.fetch(min(5000, total - len(out)), timeout=5)
            except ServiceUnavailableError:
                # A fresh replicated consumer whose leader is not known yet everywhere.
                await asyncio.sleep(0.05)  # pacing the retries, not waiting for a condition
                continue
            for msg in batch:
                out.append((msg.metadata.sequence.stream, msg.subject, msg.data))
        await sub.unsubscribe()
        return out

    return await natspy.call(read)


def _tasks() -> set[trio.lowlevel.Task]:
    """Every task of this trio run."""
    found: set[trio.lowlevel.Task] = set()
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        if task is None:
            continue
        found.add(task)
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return found


# -- throughput shape: many in flight, bounded --------------------------------------------------


async def test_many_in_flight_stored_once_in_order(nats_server, natspy):
    """20,000 publishes with at most 1,000 PubAcks outstanding: every message stored exactly
    once, in publish order per subject, each PubAck naming its own stream sequence."""
    n, subjects = 20_000, ["s.a", "s.b", "s.c", "s.d"]
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        pendings: list[PendingPubAck] = []
        with trio.fail_after(30):
            async with js.async_publisher(max_pending=1000) as pub:
                for i in range(n):
                    pendings.append(await pub.publish(subjects[i % 4], b"%d" % i))
                # The bound holds; how near it comes depends on how fast the server answers
                # (a loaded full run peaked at 768: the acks kept up).
                assert 1 < pub.stats.peak_pending <= 1000
            # Leaving the block waited for every PubAck: all are in, none failed.
        stats = pub.stats
        assert (stats.sent, stats.acked, stats.failed, stats.pending) == (n, n, 0, 0)
        assert (stats.retried, stats.duplicates, stats.abandoned) == (0, 0, 0)
        assert all(p.done for p in pendings)
        acks = [await p.ack() for p in pendings]
        assert [a.seq for a in acks] == list(range(1, n + 1))
        assert {a.stream for a in acks} == {"S"}
        assert [p.index for p in pendings] == list(range(1, n + 1))
    stored = await _stored(natspy, nats_server.url, "S", "s.>")
    assert len(stored) == n
    assert [seq for seq, _, _ in stored] == list(range(1, n + 1))
    assert sorted(int(data) for _, _, data in stored) == list(range(n))  # each once
    for k, subject in enumerate(subjects):
        mine = [int(data) for _, subj, data in stored if subj == subject]
        assert mine == list(range(k, n, 4))  # in publish order


async def test_pending_bound_holds_across_tasks(nats_server):
    """Four tasks publish at once through one publisher with max_pending=8: the publisher
    never has more than 8 PubAcks outstanding (its own count, sampled after every publish,
    and its peak), and publish waits for room rather than failing."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        seen: list[int] = []
        with trio.fail_after(20):
            async with js.async_publisher(max_pending=8) as pub:

                async def producer(k: int) -> None:
                    for i in range(300):
                        await pub.publish(f"s.{k}", b"%d" % i)
                        seen.append(pub.pending)

                async with trio.open_nursery() as nursery:
                    for k in range(4):
                        nursery.start_soon(producer, k)
        assert max(seen) <= 8
        assert pub.stats.peak_pending == 8
        assert (pub.stats.sent, pub.stats.acked) == (1200, 1200)
        assert (await js.stream_info("S")).state.messages == 1200


async def test_pending_bytes_bound_holds(nats_server):
    """max_pending_bytes bounds the messages kept for retries as max_pending bounds their
    number; a message larger than the bound on its own goes out alone."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        seen: list[int] = []
        with trio.fail_after(10):
            async with js.async_publisher(max_pending_bytes=1000) as pub:
                for i in range(200):
                    await pub.publish("s.a", b"%099d" % i)  # 99 bytes each: 10 fit
                    seen.append(pub.stats.pending_bytes)
                big = await pub.publish("s.a", b"x" * 5000)
                assert pub.pending == 1
        assert max(seen) <= 1000 and pub.stats.peak_pending == 10
        assert (await big.ack()).seq == 201
        assert pub.stats.pending_bytes == 0


async def test_a_publishing_loop_is_cancellable(nats_server):
    """A loop that always has room still takes a checkpoint every 256 publishes, before
    sending: a cancellation stops it there, and what it had not sent stays unsent."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        with trio.fail_after(10):
            async with js.async_publisher() as pub:
                with trio.move_on_after(0) as scope:  # already past its deadline
                    for i in range(1000):
                        await pub.publish("s.a", b"%d" % i)
                assert scope.cancelled_caught
                assert pub.stats.sent == 255
        assert (await js.stream_info("S")).state.messages == 255


async def test_wait_all_waits_for_what_was_published(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        with trio.fail_after(10):
            async with js.async_publisher(max_pending=100) as pub:
                pendings = [await pub.publish("s.a", b"%d" % i) for i in range(50)]
                assert pub.pending > 0  # nothing has had a turn to answer yet
                await pub.wait_all()
                assert pub.pending == 0 and all(p.done for p in pendings)
                await pub.wait_all()  # nothing outstanding: at once
        assert (await pendings[-1].ack()).seq == 50


# -- what a PubAck says -----------------------------------------------------------------------


async def test_msg_id_duplicates_are_reported(nats_server, natspy):
    """A second publish with a msg_id already stored is answered as a duplicate (stored once),
    counted in the stats; the headers go out as given, with Nats-Msg-Id."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        with trio.fail_after(10):
            async with js.async_publisher() as pub:
                first = await pub.publish("s.a", b"1", msg_id="order-1", headers={"X-K": "v"})
                again = await pub.publish("s.a", b"1 again", msg_id="order-1")
                other = await pub.publish("s.a", b"2", msg_id="order-2")
                hdrs = Headers([("X-K", "w"), ("X-K", "w2")])
                fourth = await pub.publish("s.a", b"3", headers=hdrs)
                hdrs.set("X-K", "changed after the publish")
        assert ((await first.ack()).seq, (await first.ack()).duplicate) == (1, False)
        assert ((await again.ack()).seq, (await again.ack()).duplicate) == (1, True)
        assert ((await other.ack()).seq, (await other.ack()).duplicate) == (2, False)
        assert (await fourth.ack()).seq == 3
        assert (again.msg_id, fourth.msg_id) == ("order-1", None)
        assert (pub.stats.acked, pub.stats.duplicates, pub.stats.failed) == (4, 1, 0)
        stored = await js.get_msg("S", 1)
        assert stored.headers is not None
        assert (stored.headers["Nats-Msg-Id"], stored.headers["X-K"]) == ("order-1", "v")
        assert (await js.get_msg("S", 3)).headers == Headers([("X-K", "w"), ("X-K", "w2")])
    assert [data for _, _, data in await _stored(natspy, nats_server.url, "S", "s.>")] == [
        b"1",
        b"2",
        b"3",
    ]


async def test_refused_publish_on_its_awaitable_and_at_block_exit(nats_server, natspy):
    """A wrong expected last sequence is refused: the awaited one raises WrongLastSequence
    there; the one nobody awaited comes out at the end of the block, in AsyncPublishFailed,
    with what is needed to publish it again. The rest is stored."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        with trio.fail_after(10), pytest.raises(AsyncPublishFailed) as failed:
            async with js.async_publisher() as pub:
                await pub.publish("s.a", b"ok-1")
                awaited = await pub.publish("s.a", b"no-1", expected_last_seq=7)
                await pub.publish("s.a", b"ok-2")
                await pub.publish("s.b", b"no-2", expected_last_seq=99, headers={"X": "1"})
                with pytest.raises(WrongLastSequence) as refused:
                    await awaited.ack()
                assert refused.value.err_code == 10071
                with pytest.raises(WrongLastSequence):
                    await awaited.ack()  # the same answer, again
        (failure,) = failed.value.failures  # the awaited one was reported already
        assert (failure.index, failure.subject, failure.data) == (4, "s.b", b"no-2")
        assert isinstance(failure.error, WrongLastSequence)
        assert failure.headers == Headers({"X": "1", "Nats-Expected-Last-Sequence": "99"})
        assert failed.value.errors == [failure.error]
        assert "1 of 4 JetStream publishes failed (1 WrongLastSequence)" in str(failed.value)
        assert (pub.stats.sent, pub.stats.acked, pub.stats.failed) == (4, 2, 2)
    stored = await _stored(natspy, nats_server.url, "S", "s.>")
    assert [data for _, _, data in stored] == [b"ok-1", b"ok-2"]


async def test_no_stream_is_retried_then_a_typed_error(nats_server):
    """A subject no stream captures is answered "no responders": re-sent retry_attempts
    times, then NoStreamForSubject on its awaitable and at the block's end."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        with trio.fail_after(10), pytest.raises(AsyncPublishFailed) as failed:
            async with js.async_publisher(retry_attempts=2, retry_wait=0.05) as pub:
                lost = await pub.publish("nowhere.a", b"1")
                await pub.publish("nowhere.b", b"2")
                ok = await pub.publish("s.a", b"3")
                with pytest.raises(NoStreamForSubject) as no_stream:
                    await lost.ack()
                assert no_stream.value.subject == "nowhere.a"
                assert isinstance(no_stream.value.__cause__, NoRespondersError)
                assert (await ok.ack()).seq == 1
        (failure,) = failed.value.failures
        assert (failure.subject, type(failure.error)) == ("nowhere.b", NoStreamForSubject)
        assert (pub.stats.retried, pub.stats.failed, pub.stats.acked) == (4, 2, 1)


async def test_a_stream_created_during_the_retry_wait_stores_the_message(nats_server):
    """The retry is what "no responders" is for: the stream appears between the first send
    and the re-send, and the message is stored."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        with trio.fail_after(10):
            async with js.async_publisher(retry_attempts=1, retry_wait=1.0) as pub:
                pending = await pub.publish("late.a", b"1")
                await nc.flush()  # the 503 came before this PONG: the re-send is scheduled
                assert not pending.done
                await _stream(js, "LATE", ["late.>"])
                ack = await pending.ack()
        assert (ack.stream, ack.seq) == ("LATE", 1)
        assert (pub.stats.retried, pub.stats.acked) == (1, 1)


async def test_publish_denied_by_permissions_fails_at_once(nats_server_factory):
    """The server drops a publish the user may not make, and says so only with -ERR: the
    message fails with that PermissionViolation, not after the timeout."""
    auth = permissions_auth(
        publish=["allowed.>", "_INBOX.>", "$JS.API.>"], admin_password="admin-secret"
    )
    server = nats_server_factory(auth=auth.config)
    async with connect(server.url, user="admin", password="admin-secret") as admin:
        await _stream(JetStream(admin), "A", ["allowed.>", "denied.>"])
    async with connect(server.url, user=auth.user, password=auth.password) as nc:
        js = JetStream(nc)
        with trio.fail_after(3), pytest.raises(AsyncPublishFailed) as failed:
            async with js.async_publisher(timeout=30) as pub:
                ok = await pub.publish("allowed.x", b"1")
                denied = await pub.publish("denied.x", b"2")
                with pytest.raises(PermissionViolation):
                    await denied.ack()
                await pub.publish("denied.y", b"3")
                assert (await ok.ack()).seq == 1
        (failure,) = failed.value.failures
        assert (failure.subject, type(failure.error)) == ("denied.y", PermissionViolation)


# -- answers that do not come -------------------------------------------------------------------


async def test_timeout_when_the_server_stops_answering(nats_server):
    """A frozen server answers nothing: each message fails with PubAckTimeout (a
    RequestTimeout too) after the publisher's timeout, the block ends, nothing hangs. Once
    the server runs again it stores them: a missing PubAck means "may or may not"."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        try:
            with trio.fail_after(10), pytest.raises(AsyncPublishFailed) as failed:
                async with js.async_publisher(timeout=0.5) as pub:
                    assert (await (await pub.publish("s.a", b"0")).ack()).seq == 1
                    await trio.to_thread.run_sync(nats_server.freeze)
                    started = trio.current_time()
                    first = await pub.publish("s.a", b"1")
                    for i in range(2, 10):
                        await pub.publish("s.a", b"%d" % i)
                    with pytest.raises(PubAckTimeout) as timed_out:
                        await first.ack()
                    assert trio.current_time() - started >= 0.5
                    assert isinstance(timed_out.value, (RequestTimeout, PubAckMissing))
                    assert timed_out.value.subject == "s.a"
        finally:
            nats_server.thaw()
        assert [f.index for f in failed.value.failures] == list(range(3, 11))
        assert {type(f.error) for f in failed.value.failures} == {PubAckTimeout}
        assert (pub.stats.acked, pub.stats.failed, pub.stats.pending) == (1, 9, 0)
        # The stream stores what it read in order: the answer to one more publish comes
        # after the ten sent while frozen were stored (or refused).
        assert (await js.publish("s.a", b"sentinel")).seq == 11


async def test_server_stopped_midway_fails_outstanding_at_once(nats_server_factory):
    """The server stops with PubAcks outstanding: they cannot come any more, so they fail at
    once with PubAckLost (the connection error as the cause), not after the timeout. A
    message published while the client reconnects waits in the reconnect buffer and times out.
    Nothing hangs."""
    server = nats_server_factory()
    async with connect(server.url, **FAST) as nc:
        js = JetStream(nc)
        await _stream(js)
        with trio.fail_after(10), pytest.raises(AsyncPublishFailed) as failed:
            async with js.async_publisher(timeout=1.0) as pub:
                await (await pub.publish("s.a", b"0")).ack()
                await trio.to_thread.run_sync(server.freeze)  # so that none is answered
                pendings = [await pub.publish("s.a", b"%d" % i) for i in range(1, 100)]
                await trio.to_thread.run_sync(server.kill)
                started = trio.current_time()
                with pytest.raises(PubAckLost) as lost:
                    await pendings[0].ack()
                assert trio.current_time() - started < 1.0
                assert isinstance(lost.value.__cause__, ConnectionLostError)
                assert all(p.done for p in pendings)
                late = await pub.publish("s.a", b"late")
                with pytest.raises(PubAckTimeout):
                    await late.ack()
        assert [f.index for f in failed.value.failures] == list(range(3, 101))
        assert {type(f.error) for f in failed.value.failures} == {PubAckLost}
        stats = pub.stats
        assert (stats.sent, stats.acked, stats.failed, stats.pending) == (101, 1, 100, 0)


async def test_connection_closed_fails_outstanding_and_later_publishes(nats_server_factory):
    """Without reconnects, a lost server closes the connection: the outstanding message fails
    with PubAckLost, a later publish raises the connection's ConnectionClosedError, and the
    block ends without more to report."""
    server = nats_server_factory()
    async with connect(server.url, allow_reconnect=False) as nc:
        js = JetStream(nc)
        await _stream(js)
        with trio.fail_after(10):
            async with js.async_publisher() as pub:
                await trio.to_thread.run_sync(server.freeze)
                pending = await pub.publish("s.a", b"1")
                await trio.to_thread.run_sync(server.kill)
                with pytest.raises(PubAckLost):
                    await pending.ack()
                with pytest.raises(ConnectionClosedError):
                    await pub.publish("s.a", b"2")
        stats = pub.stats
        assert (stats.sent, stats.failed, stats.pending) == (1, 1, 0)


# -- ending the block -------------------------------------------------------------------------


async def test_wait_all_reports_each_failure_once(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        with trio.fail_after(10):
            async with js.async_publisher() as pub:
                refused = await pub.publish("s.a", b"1", expected_last_seq=5)
                with pytest.raises(AsyncPublishFailed) as failed:
                    await pub.wait_all()
                assert [f.index for f in failed.value.failures] == [1]
                await pub.publish("s.a", b"2")
                await pub.wait_all()  # reported already: not again
            # nor at the end of the block
        with pytest.raises(WrongLastSequence):
            await refused.ack()  # its own answer stays what it was


async def test_cancelled_block_leaves_nothing_behind(nats_server):
    """Cancelled while waiting for room: the block ends at once, its tasks are gone, the
    messages outstanding fail with PublishAbandoned (also for a task awaiting one of them
    outside the block), the one waiting for room was never sent, and the publisher refuses
    further publishes."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        before = _tasks()
        outcome: list[BaseException] = []

        async def await_ack(pending: PendingPubAck) -> None:
            try:
                await pending.ack()
            except PublishAbandoned as error:
                outcome.append(error)

        try:
            with trio.fail_after(10):
                async with trio.open_nursery() as outside:
                    with trio.CancelScope() as scope:
                        async with js.async_publisher(max_pending=5) as pub:
                            await (await pub.publish("s.a", b"0")).ack()
                            await trio.to_thread.run_sync(nats_server.freeze)
                            pendings = [await pub.publish("s.a", b"%d" % i) for i in range(1, 6)]
                            outside.start_soon(await_ack, pendings[0])

                            async def cancel_once_blocked() -> None:
                                await trio.testing.wait_all_tasks_blocked()
                                scope.cancel()

                            outside.start_soon(cancel_once_blocked)
                            await pub.publish("s.a", b"never sent")  # waits for room
                            raise AssertionError("publish returned without room")
                    assert scope.cancelled_caught
            assert _tasks() - before == set()
        finally:
            nats_server.thaw()
        assert len(outcome) == 1 and outcome[0].subject == "s.a"  # type: ignore[attr-defined]
        assert all(p.done for p in pendings)
        stats = pub.stats
        assert (stats.sent, stats.acked, stats.abandoned, stats.pending) == (6, 1, 5, 0)
        with pytest.raises(PublishAbandoned):
            await pendings[-1].ack()
        with pytest.raises(AsyncPublisherClosed):
            await pub.publish("s.a", b"after")
        # Its answer comes after what was sent before it is stored: the 5, not the 6th.
        assert (await js.publish("s.a", b"sentinel")).seq == 7


async def test_cancelled_while_the_block_waits_for_the_last_acks(nats_server):
    """The end of the block waits for the PubAcks outstanding; cancelled there, it abandons
    them and the Cancelled reaches its scope as such (no ExceptionGroup around it)."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        try:
            with trio.fail_after(5):
                with trio.move_on_after(0.3) as scope:
                    async with js.async_publisher(timeout=30) as pub:
                        await trio.to_thread.run_sync(nats_server.freeze)
                        pendings = [await pub.publish("s.a", b"%d" % i) for i in range(3)]
                assert scope.cancelled_caught
        finally:
            nats_server.thaw()
        assert (pub.stats.abandoned, pub.stats.pending) == (3, 0)
        for pending in pendings:
            with pytest.raises(PublishAbandoned):
                await pending.ack()


async def test_opening_on_a_closed_connection_raises_as_such(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
    with pytest.raises(ConnectionClosedError):
        async with js.async_publisher():
            raise AssertionError("opened on a closed connection")


async def test_body_error_passes_through_with_a_note(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await _stream(js)
        try:
            with pytest.raises(KeyError) as raised:
                async with js.async_publisher() as pub:
                    await trio.to_thread.run_sync(nats_server.freeze)
                    await pub.publish("s.a", b"1")
                    raise KeyError("the body's own")
        finally:
            nats_server.thaw()
        assert raised.value.args == ("the body's own",)
        assert any("1 PubAcks outstanding" in note for note in raised.value.__notes__)
        assert pub.stats.abandoned == 1


async def test_arguments_are_checked_before_anything_is_sent(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        for bad in ({"max_pending": 0}, {"timeout": 0}, {"retry_attempts": -1}):
            with pytest.raises(ValueError):
                async with js.async_publisher(**bad):
                    pass
        subs = len(nc.subscriptions)
        async with js.async_publisher() as pub:
            assert isinstance(pub, AsyncPublisher)
            assert (pub.timeout, pub.max_pending) == (js.timeout, 4000)
            with pytest.raises(ValueError):
                await pub.publish("s.*", b"wildcard")
            assert pub.stats.sent == 0 and pub.pending == 0
        assert len(nc.subscriptions) == subs  # the inbox subscription is gone


# -- a cluster ----------------------------------------------------------------------------------


@pytest.mark.slow
async def test_replicated_stream_on_a_cluster(nats_cluster, natspy):
    """An R3 stream; the publisher on one node, the stream's leader wherever it is: every
    message stored once on the replicated stream, as nats-py reads it from another node."""
    n = 3000
    async with connect(nats_cluster.urls[0]) as nc:
        js = JetStream(nc)
        await once_placed(
            lambda: js.add_stream(StreamConfig(name="R", subjects=["r.>"], num_replicas=3))
        )
        # A fresh stream's subjects reach every node in their own time: "no responders" is
        # retried, and the message ids keep every message once whatever is re-sent.
        with trio.fail_after(60):
            async with js.async_publisher(max_pending=500, retry_wait=0.2) as pub:
                for i in range(n):
                    await pub.publish(f"r.{i % 3}", b"%d" % i, msg_id=f"m{i}")
        assert (pub.stats.acked, pub.stats.failed) == (n, 0)
    stored = await _stored(natspy, nats_cluster.urls[2], "R", "r.>")
    assert sorted(int(data) for _, _, data in stored) == list(range(n))


async def test_the_publish_options_of_the_sync_publish(nats_server):
    """The asynchronous publish takes the options the synchronous one does, built by the same
    code: a condition on other subjects' last sequence, and a schedule."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        subjects = ["acct.>", "sched.>", "out.>"]
        await js.add_stream(StreamConfig(name="O", subjects=subjects, allow_msg_schedules=True))
        first = await js.publish("acct.1.a", b"1")
        with trio.fail_after(10):
            async with js.async_publisher() as pub:
                ok = await pub.publish(
                    "acct.1.b", b"2", expected_last_subject_seq=first.seq,
                    expected_last_subject_seq_subject="acct.1.>",
                )  # fmt: skip
                assert (await ok.ack()).seq == 2
                stale = await pub.publish(
                    "acct.1.c", b"3", expected_last_subject_seq=first.seq,
                    expected_last_subject_seq_subject="acct.1.>",
                )  # fmt: skip
                with pytest.raises(WrongLastSequence):
                    await stale.ack()
                every = MessageSchedule.every(60, target="out.tick")
                scheduled = await pub.publish("sched.tick", b"tick", schedule=every)
                await scheduled.ack()
        stored = await js.get_msg("O", last_by_subject="sched.tick")
        assert stored.headers is not None and stored.headers.get("Nats-Schedule") == every.pattern
