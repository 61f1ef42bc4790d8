"""Stream and consumer management through the JetStream API against a real nats-server: the
calls, paging, stream lookup, the typed errors with the server's codes, account info, domains
and what happens when JetStream is off. nats-py checks what headrace created."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from headrace.errors import InvalidSubjectError
from headrace.jetstream import (
    AckPolicy,
    ConsumerAlreadyExists,
    ConsumerConfig,
    ConsumerDoesNotExist,
    ConsumerInfo,
    ConsumerNameConflict,
    ConsumerNotFound,
    DeliverPolicy,
    DiscardPolicy,
    InvalidNameError,
    JetStream,
    JetStreamAPIError,
    JetStreamNotEnabled,
    JetStreamUnavailable,
    RetentionPolicy,
    StorageType,
    StreamAlreadyExists,
    StreamConfig,
    StreamConsumerLimits,
    StreamInfo,
    StreamLookupError,
    StreamNotFound,
    StreamSubjectsOverlap,
    SubscribeError,
    WrongLastSequence,
)
from headrace.nats import connect

MEM = StorageType.MEMORY


def _recent(value: dt.datetime | None) -> bool:
    return value is not None and abs(dt.datetime.now(dt.UTC) - value) < dt.timedelta(minutes=5)


# -- streams ----------------------------------------------------------------------------------


async def test_stream_add_info_update_delete(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        info = await js.add_stream(
            StreamConfig(
                name="ORDERS",
                subjects=["orders.*"],
                storage=MEM,
                max_msgs=100,
                max_age=3600,
                discard=DiscardPolicy.NEW,
                description="first",
            )
        )
        assert isinstance(info, StreamInfo)
        cfg = info.config
        assert (cfg.name, cfg.subjects, cfg.storage) == ("ORDERS", ["orders.*"], MEM)
        assert (cfg.max_msgs, cfg.max_age, cfg.discard) == (100, 3600.0, DiscardPolicy.NEW)
        assert cfg.retention is RetentionPolicy.LIMITS  # the server's default, decoded
        assert cfg.duplicate_window == 120.0  # server default of 2 minutes, in seconds
        assert (info.state.messages, info.state.last_seq) == (0, 0)
        assert _recent(info.created)

        # Adding the same configuration again is idempotent.
        again = await js.add_stream(
            StreamConfig(
                name="ORDERS",
                subjects=["orders.*"],
                storage=MEM,
                max_msgs=100,
                max_age=3600,
                discard=DiscardPolicy.NEW,
                description="first",
            )
        )
        assert again.created == info.created

        await js.publish("orders.1", b"a")
        fetched = await js.stream_info("ORDERS")
        assert fetched.config == cfg
        assert (fetched.state.messages, fetched.state.last_seq) == (1, 1)
        assert _recent(fetched.state.last_ts)

        # Update from what was read: change two fields, keep the rest.
        cfg.subjects = ["orders.*", "returns.*"]
        cfg.description = "second"
        updated = await js.update_stream(cfg)
        assert updated.config.subjects == ["orders.*", "returns.*"]
        assert updated.config.description == "second"
        assert updated.config.max_msgs == 100
        assert updated.state.messages == 1
        await js.publish("returns.1", b"b")
        assert (await js.stream_info("ORDERS")).state.messages == 2

        await js.delete_stream("ORDERS")
        with pytest.raises(StreamNotFound) as exc:
            await js.stream_info("ORDERS")
        assert (exc.value.code, exc.value.err_code) == (404, 10059)
        with pytest.raises(StreamNotFound):
            await js.delete_stream("ORDERS")
        with pytest.raises(StreamNotFound):
            await js.update_stream(StreamConfig(name="ORDERS", subjects=["orders.*"]))


async def test_unknown_config_fields_survive_an_update(nats_server):
    """An update built from a read configuration sends every field back (``consumer_limits``
    here, which travelled in ``extra`` before it was typed), or the server would reset it.
    Keys no model declares are kept the same way (test_codec)."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        created = await js.add_stream(
            StreamConfig(
                name="LIM",
                subjects=["lim.>"],
                storage=MEM,
                consumer_limits=StreamConsumerLimits(max_ack_pending=50),
            )
        )
        assert created.config.consumer_limits == StreamConsumerLimits(max_ack_pending=50)
        cfg = (await js.stream_info("LIM")).config
        cfg.description = "touched"
        updated = await js.update_stream(cfg)
        assert updated.config.description == "touched"
        assert updated.config.consumer_limits == StreamConsumerLimits(max_ack_pending=50)
        # The limit is in force: a consumer gets it as its default.
        ci = await js.create_consumer("LIM", ConsumerConfig(durable_name="c"))
        assert ci.config.max_ack_pending == 50


async def test_stream_errors(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.>"], storage=MEM))
        with pytest.raises(StreamAlreadyExists) as exists:
            await js.add_stream(StreamConfig(name="S", subjects=["s.>", "t"], storage=MEM))
        assert (exists.value.code, exists.value.err_code) == (400, 10058)
        with pytest.raises(StreamSubjectsOverlap) as overlap:
            await js.add_stream(StreamConfig(name="S2", subjects=["s.x"], storage=MEM))
        assert overlap.value.err_code == 10065
        assert isinstance(overlap.value, JetStreamAPIError)
        # The failed calls changed nothing.
        assert await js.stream_names() == ["S"]
        assert (await js.stream_info("S")).config.subjects == ["s.>"]


async def test_purge(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="P", subjects=["p.*"], storage=MEM))
        for subject in ["p.a", "p.b", "p.a", "p.b", "p.a", "p.c", "p.c", "p.c", "p.c", "p.c"]:
            await js.publish(subject, b"x")

        assert await js.purge_stream("P", subject="p.a") == 3
        state = (await js.stream_info("P", subjects_filter=">")).state
        assert state.messages == 7
        assert state.subjects == {"p.b": 2, "p.c": 5}

        # seq: remove everything below sequence 6 (p.b at 2 and 4).
        assert await js.purge_stream("P", seq=6) == 2
        state = (await js.stream_info("P")).state
        assert (state.messages, state.first_seq) == (5, 6)

        # keep: all but the newest 2.
        assert await js.purge_stream("P", keep=2) == 3
        state = (await js.stream_info("P")).state
        assert (state.messages, state.first_seq, state.last_seq) == (2, 9, 10)

        # subject and keep together.
        await js.publish("p.d", b"1")
        await js.publish("p.d", b"2")
        assert await js.purge_stream("P", subject="p.d", keep=1) == 1
        assert (await js.get_msg("P", last_by_subject="p.d")).data == b"2"

        assert await js.purge_stream("P") == 3
        state = (await js.stream_info("P")).state
        assert (state.messages, state.first_seq, state.last_seq) == (0, 13, 12)
        assert await js.purge_stream("P") == 0

        with pytest.raises(ValueError, match="seq or keep"):
            await js.purge_stream("P", seq=1, keep=1)
        with pytest.raises(StreamNotFound):
            await js.purge_stream("NOPE")


async def test_list_names_and_lookup(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        assert await js.stream_names() == []
        assert [s async for s in js.streams()] == []
        for name, subjects in [("A", ["a.*"]), ("B", ["b.*"]), ("C", ["c.only", "c.other"])]:
            await js.add_stream(StreamConfig(name=name, subjects=subjects, storage=MEM))

        assert sorted(await js.stream_names()) == ["A", "B", "C"]
        infos = [s async for s in js.streams()]
        assert sorted((i.config.name, tuple(i.config.subjects or ())) for i in infos) == [
            ("A", ("a.*",)),
            ("B", ("b.*",)),
            ("C", ("c.only", "c.other")),
        ]
        assert all(isinstance(i, StreamInfo) and _recent(i.created) for i in infos)

        # Filtered by a subject: the streams whose subjects overlap it.
        assert await js.stream_names(subject="a.1") == ["A"]
        assert sorted(await js.stream_names(subject="*.x")) == ["A", "B"]
        assert sorted(await js.stream_names(subject=">")) == ["A", "B", "C"]
        assert await js.stream_names(subject="c.other") == ["C"]
        assert await js.stream_names(subject="zzz") == []
        assert [i.config.name async for i in js.streams(subject="b.>")] == ["B"]

        assert await js.find_stream("a.1") == "A"
        assert await js.find_stream("c.*") == "C"
        with pytest.raises(StreamLookupError, match="no stream") as none:
            await js.find_stream("zzz")
        assert isinstance(none.value, SubscribeError)
        with pytest.raises(StreamLookupError, match="several") as several:
            await js.find_stream("*.x")
        assert "A, B" in str(several.value)
        with pytest.raises(StreamLookupError, match="A, B, C"):
            await js.find_stream(">")
        # An invalid subject is refused, not looked up (issue 24: "no stream captures").
        for invalid in ("FOO.>.123", "a..b", "", "a b"):
            with pytest.raises(InvalidSubjectError):
                await js.find_stream(invalid)


async def test_listing_pages_through_everything(nats_server):
    """STREAM.LIST pages 256 at a time, CONSUMER.LIST too: 300 of each need two pages."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        names = {f"S{i:03d}" for i in range(300)}
        for name in names:
            await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.*"], storage=MEM))
        assert sorted(await js.stream_names()) == sorted(names)
        infos = [s.config.name async for s in js.streams()]
        assert len(infos) == 300
        assert set(infos) == names

        consumers = {f"c{i:03d}" for i in range(300)}
        for name in consumers:
            await js.create_consumer("S000", ConsumerConfig(durable_name=name, mem_storage=True))
        assert sorted(await js.consumer_names("S000")) == sorted(consumers)
        listed = [c async for c in js.consumers("S000")]
        assert len(listed) == 300
        assert {c.name for c in listed} == consumers
        assert {c.stream_name for c in listed} == {"S000"}


# -- consumers --------------------------------------------------------------------------------


async def test_consumer_lifecycle(nats_server, natspy):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.*"], storage=MEM))
        for subject in ["s.a", "s.b", "s.a"]:
            await js.publish(subject, b"x")

        config = ConsumerConfig(
            durable_name="worker",
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=12.5,
            max_deliver=4,
            filter_subject="s.a",
            description="one",
        )
        created = await js.create_consumer("S", config)
        assert isinstance(created, ConsumerInfo)
        assert (created.stream_name, created.name) == ("S", "worker")
        assert created.config.ack_wait == 12.5
        assert created.config.deliver_policy is DeliverPolicy.ALL  # server default
        assert created.num_pending == 2  # only s.a messages
        assert _recent(created.created)

        # Creating the same configuration again succeeds; a different one does not.
        assert (await js.create_consumer("S", config)).created == created.created
        with pytest.raises(ConsumerAlreadyExists) as exists:
            await js.create_consumer(
                "S", ConsumerConfig(durable_name="worker", ack_wait=1, filter_subject="s.a")
            )
        assert (exists.value.code, exists.value.err_code) == (400, 10148)

        # nats-py sees what headrace created.
        await natspy.connect(nats_server.url)
        py_info = await natspy.call(natspy.nc.jetstream().consumer_info, "S", "worker")
        assert py_info.config.ack_wait == 12.5
        assert py_info.config.max_deliver == 4
        assert py_info.config.filter_subject == "s.a"
        assert py_info.num_pending == 2

        # Update: description and ack_wait change, everything else stays.
        config.description = "two"
        config.ack_wait = 20
        updated = await js.update_consumer("S", config)
        assert (updated.config.description, updated.config.ack_wait) == ("two", 20.0)
        assert updated.config.max_deliver == 4
        info = await js.consumer_info("S", "worker")
        assert info.config == updated.config

        # create_or_update: updates an existing consumer, creates a missing one.
        config.description = "three"
        assert (await js.create_or_update_consumer("S", config)).config.description == "three"
        other = await js.create_or_update_consumer(
            "S", ConsumerConfig(name="other", filter_subject="s.b", inactive_threshold=60)
        )
        assert other.name == "other"
        assert other.config.durable_name is None
        assert other.config.inactive_threshold == 60.0
        assert other.num_pending == 1

        # An ephemeral consumer gets a server-made name.
        ephemeral = await js.create_consumer("S", ConsumerConfig(ack_policy=AckPolicy.NONE))
        assert ephemeral.name
        assert ephemeral.config.ack_policy is AckPolicy.NONE
        assert ephemeral.num_pending == 3

        assert sorted(await js.consumer_names("S")) == sorted(["worker", "other", ephemeral.name])
        listed = {c.name: c async for c in js.consumers("S")}
        assert listed["worker"].config.description == "three"
        assert listed["other"].config.filter_subject == "s.b"
        assert (await js.stream_info("S")).state.consumer_count == 3

        await js.delete_consumer("S", "worker")
        with pytest.raises(ConsumerNotFound) as missing:
            await js.consumer_info("S", "worker")
        assert (missing.value.code, missing.value.err_code) == (404, 10014)
        with pytest.raises(ConsumerNotFound):
            await js.delete_consumer("S", "worker")
        assert sorted(await js.consumer_names("S")) == sorted(["other", ephemeral.name])


async def test_consumer_errors(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.*"], storage=MEM))

        with pytest.raises(ConsumerDoesNotExist) as dne:
            await js.update_consumer("S", ConsumerConfig(durable_name="ghost"))
        assert (dne.value.code, dne.value.err_code) == (400, 10149)
        assert isinstance(dne.value, ConsumerNotFound)
        assert await js.consumer_names("S") == []  # the update did not create it

        with pytest.raises(ValueError, match="needs its name"):
            await js.update_consumer("S", ConsumerConfig(ack_wait=5))

        with pytest.raises(StreamNotFound) as no_stream:
            await js.create_consumer("NOPE", ConsumerConfig(durable_name="c"))
        assert no_stream.value.err_code == 10059
        with pytest.raises(StreamNotFound):
            await js.consumer_info("NOPE", "c")
        with pytest.raises(StreamNotFound):
            await js.consumer_names("NOPE")

        # A deliver policy cannot be changed by an update: the server refuses it.
        await js.create_consumer(
            "S", ConsumerConfig(durable_name="d", deliver_policy=DeliverPolicy.NEW)
        )
        with pytest.raises(JetStreamAPIError) as refused:
            await js.update_consumer(
                "S", ConsumerConfig(durable_name="d", deliver_policy=DeliverPolicy.ALL)
            )
        assert refused.value.err_code == 10012  # "deliver policy can not be updated"
        assert (await js.consumer_info("S", "d")).config.deliver_policy is DeliverPolicy.NEW


#: Names that cannot be a token of an API subject (or a directory on the server).
BAD_NAMES = ("a.b", "a*", "a>", "a b", "", "a/b", "a\\b", "a\tb", "a\x00b", "a\x85b")


def _name_calls() -> list[tuple[str, str, Callable[[JetStream, str], Awaitable[Any]]]]:
    """(call, the argument that carries the bad name, how to make the call)."""

    async def listed(js: JetStream, bad: str) -> None:
        _ = [c async for c in js.consumers(bad)]

    async def sub(js: JetStream, **kwargs: Any) -> None:
        async with js.subscribe(**kwargs):
            pass

    async def pull_sub(js: JetStream, **kwargs: Any) -> None:
        async with js.pull_subscribe(**kwargs):
            pass

    cfg = ConsumerConfig(durable_name="X")
    return [
        ("stream_info", "name", lambda js, bad: js.stream_info(bad)),
        ("delete_stream", "name", lambda js, bad: js.delete_stream(bad)),
        ("purge_stream", "name", lambda js, bad: js.purge_stream(bad)),
        ("get_msg", "stream", lambda js, bad: js.get_msg(bad, 1)),
        ("direct_get", "stream", lambda js, bad: js.direct_get(bad, 1)),
        ("delete_msg", "stream", lambda js, bad: js.delete_msg(bad, 1)),
        ("consumers", "stream", listed),
        ("consumer_names", "stream", lambda js, bad: js.consumer_names(bad)),
        ("consumer_info", "stream", lambda js, bad: js.consumer_info(bad, "C")),
        ("consumer_info", "name", lambda js, bad: js.consumer_info("S", bad)),
        ("delete_consumer", "stream", lambda js, bad: js.delete_consumer(bad, "C")),
        ("delete_consumer", "name", lambda js, bad: js.delete_consumer("S", bad)),
        ("pull_consumer", "stream", lambda js, bad: js.pull_consumer(bad, "C")),
        ("pull_consumer", "name", lambda js, bad: js.pull_consumer("S", bad)),
        ("create_consumer", "stream", lambda js, bad: js.create_consumer(bad, cfg)),
        ("update_consumer", "stream", lambda js, bad: js.update_consumer(bad, cfg)),
        ("create_or_update", "stream", lambda js, bad: js.create_or_update_consumer(bad, cfg)),
        ("subscribe", "stream", lambda js, bad: sub(js, stream=bad)),
        ("subscribe", "durable", lambda js, bad: sub(js, subject="s.a", durable=bad)),
        ("subscribe", "bind", lambda js, bad: sub(js, subject="s.a", bind=bad)),
        # A queue group without a durable names the durable (ADR-15).
        ("subscribe", "queue", lambda js, bad: sub(js, subject="s.a", queue=bad)),
        ("subscribe ordered", "stream", lambda js, bad: sub(js, stream=bad, ordered=True)),
        ("pull_subscribe", "stream", lambda js, bad: pull_sub(js, stream=bad)),
        ("pull_subscribe", "durable", lambda js, b: pull_sub(js, subject="s.a", durable=b)),
        ("pull_subscribe", "bind", lambda js, bad: pull_sub(js, subject="s.a", bind=bad)),
    ]


async def test_bad_names_are_refused_before_anything_is_sent(nats_server):
    """A stream or consumer name goes into the API subject. One with a '.', a wildcard or
    whitespace, or an empty one, addressed another subject (or none) and the call waited out
    the API timeout; now every call refuses it at once, naming the argument, and sends
    nothing. (JetStream's timeout is 5 s here; each call gets half a second.)"""
    for bad in BAD_NAMES:  # the configs refuse the same names, with the same error
        with pytest.raises(InvalidNameError, match="argument 'name'"):
            StreamConfig(name=bad)
        with pytest.raises(InvalidNameError, match="argument 'durable_name'"):
            ConsumerConfig(durable_name=bad)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.*"], storage=MEM))
        await js.create_consumer("S", ConsumerConfig(durable_name="C"))
        await nc.flush()
        wrong: list[str] = []
        for call, argument, make in _name_calls():
            for bad in BAD_NAMES:
                sent = nc.stats.out_msgs
                outcome = "timed out"
                with trio.move_on_after(0.5):
                    try:
                        await make(js, bad)
                        outcome = "no error"
                    except InvalidNameError as exc:
                        outcome = "ok" if exc.argument == argument else f"named {exc.argument!r}"
                    except Exception as exc:
                        outcome = repr(exc)
                if outcome == "ok" and nc.stats.out_msgs != sent:
                    outcome = "raised, but sent a request first"
                if outcome != "ok":
                    wrong.append(f"{call}({argument}={bad!r}): {outcome}")
        assert not wrong, "\n".join(wrong)
        assert await js.consumer_names("S") == ["C"]


async def _refused_at_once(nc: Any, call: Awaitable[Any], error: type[Exception]) -> str:
    """The message of the ``error`` that ``call`` raised, checking that it raised at once and
    sent nothing."""
    sent = nc.stats.out_msgs
    with trio.fail_after(0.5), pytest.raises(error) as caught:
        await call
    assert nc.stats.out_msgs == sent, "the call sent a request before refusing"
    return str(caught.value)


async def _subscribed(js: JetStream, pull: bool, *args: Any, **kwargs: Any) -> None:
    subscribe = js.pull_subscribe if pull else js.subscribe
    async with subscribe(*args, **kwargs):
        pass


async def test_two_names_for_one_consumer_are_refused(nats_server):
    """``ConsumerConfig(name="a", durable_name="b")`` created ``b`` without a word about
    ``a``, and a subscribe call whose ``durable=`` or ``bind=`` contradicted the config's
    name looked one up and created the other. Each is refused before anything is sent, the
    error naming both."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.*"], storage=MEM))
        await nc.flush()
        both = ConsumerConfig(name="a", durable_name="b")
        for call in (
            js.create_consumer("S", both),
            js.update_consumer("S", both),
            js.create_or_update_consumer("S", both),
        ):
            message = await _refused_at_once(nc, call, ConsumerNameConflict)
            assert "config.name='a'" in message and "config.durable_name='b'" in message
        for pull in (True, False):
            for kwargs in (
                {"durable": "b", "config": ConsumerConfig(durable_name="a")},
                {"durable": "b", "config": ConsumerConfig(name="a")},
                {"bind": "b", "config": ConsumerConfig(durable_name="a")},
                {"bind": "b", "config": ConsumerConfig(name="a")},
                {"bind": "b", "durable": "a"},
                {"config": both},
            ):
                call = _subscribed(js, pull, "s.a", **kwargs)
                message = await _refused_at_once(nc, call, ConsumerNameConflict)
                assert "'a'" in message and "'b'" in message, message
        assert await js.consumer_names("S") == []


async def test_a_durable_argument_agreeing_with_the_config_name_makes_a_durable(nats_server):
    """``pull_subscribe(durable="p", config=ConsumerConfig(name="p"))`` asked for a durable but
    made a consumer with a name only, which the server removes once it is inactive."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.*"], storage=MEM))
        async with js.pull_subscribe("s.a", durable="p", config=ConsumerConfig(name="p")) as sub:
            assert sub.consumer.cached_info is not None
            assert sub.consumer.cached_info.config.durable_name == "p"
        assert (await js.consumer_info("S", "p")).config.durable_name == "p"


async def test_a_config_filter_contradicting_the_subject_is_refused(nats_server):
    """The library filters the consumer on the subscribed subject (ADR-15). A config filter
    for another subject made a consumer on that subject and handed its messages to the
    subscription to this one, and the same call a second time refused its own consumer. It is
    refused up front, naming both; a filter equal to the subject is fine, twice."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.*"], storage=MEM))
        await nc.flush()
        for pull in (True, False):
            for config in (
                ConsumerConfig(filter_subject="s.other"),
                ConsumerConfig(filter_subjects=["s.other"]),
                ConsumerConfig(filter_subjects=["s.a", "s.other"]),
            ):
                for durable in ("p", None):
                    call = _subscribed(js, pull, "s.a", durable=durable, config=config)
                    message = await _refused_at_once(nc, call, SubscribeError)
                    assert "'s.a'" in message and "s.other" in message, message
        call = js.subscribe("s.a", ordered=True, config=ConsumerConfig(filter_subject="s.other"))
        message = await _refused_at_once(nc, _entered(call), SubscribeError)
        assert "'s.a'" in message and "s.other" in message, message
        assert await js.consumer_names("S") == []

        await js.publish("s.other", b"not for s.a")
        await js.publish("s.a", b"for s.a")
        same = (ConsumerConfig(filter_subject="s.a"), ConsumerConfig(filter_subjects=["s.a"]))
        for config in same:
            async with js.pull_subscribe("s.a", durable="p", config=config) as sub:
                assert sub.created
                (msg,) = await sub.fetch(1, expires=5)
                assert (msg.subject, msg.data) == ("s.a", b"for s.a")
            async with js.pull_subscribe("s.a", durable="p", config=config) as sub:
                assert not sub.created  # bound to the consumer the first call made
            await js.delete_consumer("S", "p")


async def _entered(manager: Any) -> None:
    async with manager:
        pass


async def test_natspy_made_consumer_reads_back(nats_server, natspy):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s.*"], storage=MEM))
        await natspy.connect(nats_server.url)
        from nats.js.api import AckPolicy as PyAckPolicy
        from nats.js.api import ConsumerConfig as PyConsumerConfig

        py_cfg = PyConsumerConfig(
            durable_name="py",
            ack_policy=PyAckPolicy.EXPLICIT,
            max_ack_pending=3,
            filter_subject="s.a",
            backoff=[0.5, 4],
            max_deliver=3,
        )
        await natspy.call(natspy.nc.jetstream().add_consumer, "S", py_cfg)
        info = await js.consumer_info("S", "py")
        cfg = info.config
        assert (cfg.durable_name, cfg.ack_policy) == ("py", AckPolicy.EXPLICIT)
        assert (cfg.max_ack_pending, cfg.filter_subject, cfg.max_deliver) == (3, "s.a", 3)
        assert cfg.backoff == [0.5, 4.0]
        assert cfg.ack_wait == 0.5  # the server takes the first backoff step as ack wait
        # Read, then written back unchanged: the server sees no change.
        assert (await js.update_consumer("S", cfg)).config == cfg


# -- publish errors that are about streams ----------------------------------------------------


async def test_wrong_last_sequence_error(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="S", subjects=["s"], storage=MEM))
        await js.publish("s", b"1")
        with pytest.raises(WrongLastSequence) as wrong:
            await js.publish("s", b"2", expected_last_seq=5)
        assert (wrong.value.code, wrong.value.err_code) == (400, 10071)
        assert "1" in wrong.value.description
        assert (await js.stream_info("S")).state.messages == 1


# -- account, domains, JetStream off ----------------------------------------------------------


async def test_account_info(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        empty = await js.account_info()
        assert (empty.streams, empty.consumers, empty.memory, empty.storage) == (0, 0, 0, 0)
        assert empty.domain is None
        assert empty.limits.max_streams == -1
        await js.add_stream(StreamConfig(name="M", subjects=["m"], storage=MEM))
        await js.add_stream(StreamConfig(name="F", subjects=["f"], storage=StorageType.FILE))
        await js.create_consumer("M", ConsumerConfig(durable_name="c"))
        await js.publish("m", b"x" * 1000)
        await js.publish("f", b"y" * 1000)
        info = await js.account_info()
        assert (info.streams, info.consumers) == (2, 1)
        assert info.memory >= 1000
        assert info.storage >= 1000


def _domain_config(store: object) -> str:
    return f"jetstream {{\n  domain: hub\n  store_dir: {json.dumps(str(store))}\n}}"


async def test_domain(nats_server_factory, tmp_path):
    server = nats_server_factory(jetstream=False, extra_config=_domain_config(tmp_path))
    async with connect(server.url) as nc:
        hub = JetStream(nc, domain="hub")
        assert hub.prefix == "$JS.hub.API"
        assert hub.api_subject("INFO") == "$JS.hub.API.INFO"
        assert (await hub.account_info()).domain == "hub"

        await hub.add_stream(StreamConfig(name="D", subjects=["d.>"], storage=MEM))
        ack = await hub.publish("d.1", b"x")
        assert (ack.stream, ack.seq, ack.domain) == ("D", 1, "hub")

        # On the server itself the domain-less prefix reaches the same JetStream.
        local = JetStream(nc)
        assert (await local.account_info()).domain == "hub"
        assert await local.stream_names() == ["D"]
        # So does an explicit API prefix (a trailing dot is dropped).
        prefixed = JetStream(nc, api_prefix="$JS.hub.API.")
        assert prefixed.prefix == "$JS.hub.API"
        assert (await prefixed.stream_info("D")).state.messages == 1

        # Another domain answers nothing.
        with pytest.raises(JetStreamUnavailable):
            await JetStream(nc, domain="spoke").account_info()
        with pytest.raises(JetStreamUnavailable, match="domain"):
            await JetStream(nc, domain="spoke").stream_names()


async def test_context_arguments(core_server):
    async with connect(core_server.url) as nc:
        with pytest.raises(ValueError, match="not both"):
            JetStream(nc, domain="hub", api_prefix="$JS.hub.API")
        with pytest.raises(InvalidSubjectError):
            JetStream(nc, domain="has space")
        with pytest.raises(InvalidSubjectError):
            JetStream(nc, domain="")
        # As domain="" is: it was the default prefix, silently (issue 24).
        with pytest.raises(InvalidSubjectError, match="JetStream API prefix must not be empty"):
            JetStream(nc, api_prefix="")
        with pytest.raises(InvalidSubjectError):
            JetStream(nc, api_prefix="$JS.*.API")
        assert JetStream(nc).prefix == "$JS.API"
        assert "$JS.API" in repr(JetStream(nc))


async def test_jetstream_off(core_server):
    async with connect(core_server.url) as nc:
        js = JetStream(nc, timeout=2)
        with trio.fail_after(5):
            with pytest.raises(JetStreamUnavailable):
                await js.account_info()
            with pytest.raises(JetStreamUnavailable):
                await js.add_stream(StreamConfig(name="S", subjects=["s"]))
            with pytest.raises(JetStreamUnavailable):
                await js.stream_names()


async def test_account_without_jetstream(nats_server_factory):
    server = nats_server_factory(
        extra_config=(
            "accounts {\n"
            "  JS: { jetstream: enabled, users: [{user: a, password: a}] }\n"
            "  PLAIN: { users: [{user: b, password: b}] }\n"
            "}"
        )
    )
    async with connect(server.url, user="b", password="b") as nc:
        with pytest.raises(JetStreamNotEnabled) as off:
            await JetStream(nc).account_info()
        assert (off.value.code, off.value.err_code) == (503, 10039)
    async with connect(server.url, user="a", password="a") as nc:
        assert (await JetStream(nc).account_info()).streams == 0


@pytest.mark.slow
async def test_stream_info_pages_through_every_subject(nats_server):
    """Issue 24: one STREAM.INFO answer holds 100,000 subjects; with 110,000 the rest was
    dropped without a sign. Every page is read."""
    from headrace.jetstream.bulk_publish import publish_acked

    n = 110_000
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="MANY", subjects=["m.>"], storage=MEM))
        loaded = await publish_acked(nc, ((f"m.{i}", b"", None) for i in range(n)))
        assert loaded.refused == 0
        with trio.fail_after(60):
            info = await js.stream_info("MANY", subjects_filter="m.>")
        assert info.state.subjects is not None and len(info.state.subjects) == n
        assert set(info.state.subjects.values()) == {1}
        assert info.state.num_subjects == n
        # A narrower filter pages too, and is exact.
        narrow = await js.stream_info("MANY", subjects_filter="m.10*")
        assert narrow.state.subjects == {}  # (no such subject: m.10* is one token)
        assert (await js.stream_info("MANY")).state.subjects is None


async def test_stream_info_deleted_details(nats_server):
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="D", subjects=["d.>"], storage=MEM))
        for i in range(6):
            await js.publish(f"d.{i}", b"x")
        for seq in (2, 4):
            await js.delete_msg("D", seq)
        state = (await js.stream_info("D", deleted_details=True)).state
        assert state.deleted == [2, 4] and state.num_deleted == 2
        assert (await js.stream_info("D")).state.deleted is None
        with pytest.raises(InvalidSubjectError):
            await js.stream_info("D", subjects_filter="d.>.x")
