"""Every stream and consumer config field of nats-server 2.15 is typed, checked and round-trips.

Three things are shown. A real server accepts a config with every field set and answers the
same values back, read by headrace and, as raw JSON, by nats-py (the independent peer); the
fields also act (a subject transform renames what is stored, consumer limits fill a consumer's
defaults). The JSON mapping is lossless for any config, unknown future keys included
(property-based). Bad values are refused when the config is built, naming the field.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from headrace.jetstream import (
    AckPolicy,
    Compression,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    ExternalStream,
    InvalidConfigValue,
    JetStream,
    JetStreamAPIError,
    PersistMode,
    Placement,
    ReplayPolicy,
    RePublish,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamConsumerLimits,
    StreamSource,
    SubjectTransformConfig,
)
from headrace.jetstream.codec import DecodeError, from_json, to_json
from headrace.nats import connect
from hypothesis import given
from hypothesis import strategies as st

TIMEOUT = 10


def _set_fields(config: Any) -> dict[str, Any]:
    """The fields ``config`` sets (not ``None``), ``extra`` aside."""
    return {
        f.name: getattr(config, f.name)
        for f in attrs.fields(type(config))
        if f.name != "extra" and getattr(config, f.name) is not None
    }


def _assert_echoed(sent: Any, answered: Any, raw: dict[str, Any] | None = None) -> None:
    """Every field ``sent`` sets is answered with the same value, in the model and (if given)
    in the raw JSON; metadata keeps the user's keys and gains the server's ``_nats.*`` ones."""
    wire = to_json(sent)
    for name, value in _set_fields(sent).items():
        if name == "metadata":
            assert answered.metadata.items() >= value.items()
            assert answered.metadata["_nats.req.level"].isdigit()
            continue
        assert getattr(answered, name) == value, name
    for key, value in wire.items() if raw is not None else ():
        if key != "metadata":
            assert raw[key] == value, key


async def _raw_info(natspy: Any, subject: str) -> dict[str, Any]:
    """An API answer as nats-py receives it: JSON headrace did not decode."""

    async def go() -> Any:
        return await natspy.nc.request(subject, b"", timeout=5)

    reply = await natspy.call(go)
    answer: dict[str, Any] = json.loads(reply.data)
    return answer


# -- a real server --------------------------------------------------------------------------------


def _full_stream() -> StreamConfig:
    return StreamConfig(
        name="S",
        description="every field",
        subjects=["s.>"],
        retention=RetentionPolicy.LIMITS,
        max_consumers=10,
        max_msgs=1000,
        max_bytes=1 << 20,
        max_age=3600.0,
        max_msgs_per_subject=100,
        max_msg_size=4096,
        discard=DiscardPolicy.NEW,
        discard_new_per_subject=True,
        storage=StorageType.FILE,
        num_replicas=1,
        duplicate_window=60.0,
        allow_direct=True,
        allow_rollup_hdrs=True,
        deny_delete=True,
        deny_purge=False,
        subject_transform=SubjectTransformConfig(src="s.>", dest="st.>"),
        republish=RePublish(src="st.>", dest="rp.>", headers_only=True),
        compression=Compression.S2,
        first_seq=10,
        allow_msg_ttl=True,
        subject_delete_marker_ttl=60.0,
        allow_atomic=True,
        consumer_limits=StreamConsumerLimits(inactive_threshold=30.0, max_ack_pending=100),
        metadata={"team": "ingest"},
    )


async def test_stream_fields_round_trip_through_the_server(nats_server, natspy):
    """A stream with every field set, one with async persistence and transformed sources (one
    external), a counter stream, a scheduling one and a mirror with transforms: each is
    answered with the values sent, by headrace and in nats-py's raw JSON. The transform and
    republish act."""
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(StreamConfig(name="O", subjects=["o.>"]))
        configs = [
            _full_stream(),
            StreamConfig(
                name="Q",
                subjects=["q.>"],
                storage=StorageType.FILE,
                persist_mode=PersistMode.ASYNC,
                sources=[
                    StreamSource(
                        name="O",
                        subject_transforms=[
                            SubjectTransformConfig(src="o.*", dest="from.o.{{wildcard(1)}}")
                        ],
                    ),
                    StreamSource(
                        name="Remote",
                        external=ExternalStream(api="$JS.hub.API", deliver="deliver.hub"),
                    ),
                ],
            ),
            StreamConfig(name="CNT", subjects=["cnt.>"], allow_msg_counter=True),
            StreamConfig(
                name="SCH", subjects=["sch.>"], allow_msg_schedules=True, allow_rollup_hdrs=True
            ),
            StreamConfig(
                name="M",
                mirror=StreamSource(
                    name="O", subject_transforms=[SubjectTransformConfig(src="o.>", dest="m.>")]
                ),
            ),
        ]
        for config in configs:
            created = await js.add_stream(config)
            _assert_echoed(config, created.config)
            info = await js.stream_info(config.name)
            raw = await _raw_info(natspy, f"$JS.API.STREAM.INFO.{config.name}")
            _assert_echoed(config, info.config, raw["config"])
            assert not info.config.extra, info.config.extra  # nothing left untyped

        # The transform stores s.a as st.a; republish sends it on rp.a, headers only.
        sub = await nc.subscribe("rp.>")
        await nc.flush()
        ack = await js.publish("s.a", b"payload")
        republished = await sub.next_msg(timeout=TIMEOUT)
        stored = await js.get_msg("S", ack.seq)
        assert stored.subject == "st.a"
        assert republished.subject == "rp.a"
        assert republished.data == b""
        assert republished.headers is not None
        assert republished.headers.get("Nats-Sequence") == str(ack.seq)


async def test_server_metadata_keys_on_update(nats_server):
    """The config read back carries the server's ``_nats.*`` keys; updated with them (and a
    changed user key), the server takes the user's change and recomputes its own keys."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        info = await js.add_stream(_full_stream())
        server_keys = {k: v for k, v in info.config.metadata.items() if k.startswith("_nats.")}
        assert set(server_keys) >= {"_nats.req.level", "_nats.ver", "_nats.level"}
        changed = attrs.evolve(
            info.config,
            metadata={**info.config.metadata, "team": "egress", "_nats.req.level": "99"},
        )
        updated = await js.update_stream(changed)
        assert updated.config.metadata["team"] == "egress"
        assert updated.config.metadata["_nats.req.level"] == server_keys["_nats.req.level"]


async def test_server_refuses_preferred_in_placement(nats_server):
    """What ``StreamConfig`` refuses of ``Placement.preferred``, the server refuses too (sent
    here through ``extra``, which is not checked)."""
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        config = StreamConfig(name="P", placement=Placement(extra={"preferred": "n1"}))
        with pytest.raises(JetStreamAPIError) as refused:
            await js.add_stream(config)
        assert refused.value.err_code == 10052
        assert "preferred" in refused.value.description


def _full_consumer() -> ConsumerConfig:
    return ConsumerConfig(
        durable_name="C",
        description="every field",
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=10,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=1.0,  # with a backoff, the server makes ack_wait its first step
        max_deliver=5,
        backoff=[1.0, 2.0],
        filter_subjects=["st.a", "st.b"],
        replay_policy=ReplayPolicy.INSTANT,
        sample_freq="50%",
        max_waiting=10,
        max_ack_pending=50,
        headers_only=True,
        max_batch=10,
        max_expires=30.0,
        max_bytes=1024,
        inactive_threshold=20.0,
        num_replicas=1,
        mem_storage=True,
        metadata={"owner": "reports"},
    )


async def test_consumer_fields_round_trip_and_limits_apply(nats_server, natspy):
    """A pull consumer with every field set is answered with the values sent; the stream's
    ``consumer_limits`` fill a consumer's unset ``max_ack_pending`` and refuse a higher one."""
    await natspy.connect(nats_server.url)
    async with connect(nats_server.url) as nc:
        js = JetStream(nc)
        await js.add_stream(_full_stream())
        config = _full_consumer()
        created = await js.create_consumer("S", config)
        _assert_echoed(config, created.config)
        raw = await _raw_info(natspy, "$JS.API.CONSUMER.INFO.S.C")
        _assert_echoed(config, (await js.consumer_info("S", "C")).config, raw["config"])

        defaulted = await js.create_consumer("S", ConsumerConfig(durable_name="D"))
        assert defaulted.config.max_ack_pending == 100
        assert defaulted.config.inactive_threshold == 30.0
        with pytest.raises(JetStreamAPIError) as refused:
            await js.create_consumer("S", ConsumerConfig(durable_name="E", max_ack_pending=101))
        assert "max ack pending" in refused.value.description.lower()


# -- the JSON mapping -----------------------------------------------------------------------------

_subject = st.lists(st.text("abcxyz", min_size=1, max_size=4), min_size=1, max_size=3).map(".".join)
_seconds = st.integers(min_value=0, max_value=10**6).map(lambda ms: ms / 1000)
_metadata = st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)
_extra = st.dictionaries(st.sampled_from(["future_a", "future_b"]), st.integers(), max_size=2)
_transform = st.builds(SubjectTransformConfig, src=_subject, dest=_subject, extra=_extra)
_source = st.builds(
    StreamSource,
    name=st.sampled_from(["A", "B"]),
    subject_transforms=st.none() | st.lists(_transform, max_size=2),
    external=st.none() | st.builds(ExternalStream, api=_subject, deliver=st.none() | _subject),
    extra=_extra,
)
_streams = st.builds(
    StreamConfig,
    name=st.sampled_from(["S", "T"]),
    max_msgs=st.none() | st.integers(min_value=-1),
    max_age=st.none() | _seconds,
    num_replicas=st.none() | st.integers(0, 5),
    placement=st.none()
    | st.builds(
        Placement,
        cluster=st.none() | _subject,
        tags=st.none() | st.lists(_subject, max_size=2),
    ),
    sources=st.none() | st.lists(_source, max_size=2),
    mirror=st.none() | _source,
    subject_transform=st.none() | _transform,
    republish=st.none()
    | st.builds(RePublish, src=st.none() | _subject, dest=_subject, headers_only=st.booleans()),
    consumer_limits=st.none()
    | st.builds(
        StreamConsumerLimits,
        inactive_threshold=st.none() | _seconds,
        max_ack_pending=st.none() | st.integers(min_value=-1),
    ),
    persist_mode=st.none() | st.sampled_from(PersistMode),
    compression=st.none() | st.sampled_from(Compression),
    allow_msg_counter=st.none() | st.booleans(),
    allow_msg_schedules=st.none() | st.booleans(),
    allow_batched=st.none() | st.booleans(),
    metadata=st.none() | _metadata,
    extra=_extra,
)
_consumers = st.builds(
    ConsumerConfig,
    durable_name=st.none() | st.sampled_from(["C", "D"]),
    backoff=st.none() | st.lists(_seconds, max_size=3),
    sample_freq=st.none() | st.integers(0, 100).map(lambda n: f"{n}%"),
    max_ack_pending=st.none() | st.integers(min_value=-1),
    max_batch=st.none() | st.integers(min_value=0),
    max_expires=st.none() | _seconds,
    inactive_threshold=st.none() | _seconds,
    num_replicas=st.none() | st.integers(0, 5),
    mem_storage=st.none() | st.booleans(),
    headers_only=st.none() | st.booleans(),
    metadata=st.none() | _metadata,
    extra=_extra,
)


def _deep_extra(obj: Any) -> list[dict[str, Any]]:
    """Every ``extra`` in ``obj`` and the models it holds (``extra`` is not part of ``==``)."""
    found: list[dict[str, Any]] = [obj.extra]
    for field in attrs.fields(type(obj)):
        value = getattr(obj, field.name)
        for item in value if isinstance(value, list) else [value]:
            if attrs.has(type(item)):
                found.extend(_deep_extra(item))
    return found


@given(_streams)
def test_stream_config_json_round_trip(config: StreamConfig) -> None:
    """to_json then from_json gives the same config, unknown keys kept at every level, and the
    JSON survives a second trip unchanged (through text, as on the wire)."""
    wire = json.loads(json.dumps(to_json(config)))
    back = from_json(StreamConfig, wire)
    assert back == config
    assert _deep_extra(back) == _deep_extra(config)
    assert to_json(back) == wire


@given(_consumers)
def test_consumer_config_json_round_trip(config: ConsumerConfig) -> None:
    wire = json.loads(json.dumps(to_json(config)))
    back = from_json(ConsumerConfig, wire)
    assert back == config
    assert back.extra == config.extra
    assert to_json(back) == wire


def test_unknown_fields_stay_in_extra() -> None:
    """A key this version does not know stays in ``extra``, at the top and nested, and is sent
    back; a known one never lands there."""
    wire = {
        "name": "S",
        "persist_mode": "async",
        "consumer_limits": {"max_ack_pending": 5, "future_limit": 1},
        "future_field": {"x": 1},
    }
    config = from_json(StreamConfig, wire)
    assert config.persist_mode is PersistMode.ASYNC
    assert config.extra == {"future_field": {"x": 1}}
    assert config.consumer_limits == StreamConsumerLimits(max_ack_pending=5)
    assert config.consumer_limits is not None
    assert config.consumer_limits.extra == {"future_limit": 1}
    assert to_json(config) == wire


# -- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: StreamConfig(name="S", max_msgs=-2), "max_msgs"),
        (lambda: StreamConfig(name="S", max_bytes=1.5), "max_bytes"),
        (lambda: StreamConfig(name="S", max_consumers=True), "max_consumers"),
        (lambda: StreamConfig(name="S", num_replicas=6), "num_replicas"),
        (lambda: StreamConfig(name="S", max_age=-1.0), "max_age"),
        (lambda: StreamConfig(name="S", duplicate_window=float("inf")), "duplicate_window"),
        (lambda: StreamConfig(name="S", first_seq=-1), "first_seq"),
        (lambda: StreamConfig(name="S", metadata={"a": 1}), "metadata"),
        (lambda: StreamConfig(name="S", placement=Placement(preferred="n1")), "placement"),
        (lambda: StreamConfig(name="S", metadata=[("a", "b")]), "metadata"),
        (lambda: SubjectTransformConfig(src="a b", dest="c"), "src"),
        (lambda: SubjectTransformConfig(src="a.>.b", dest="c"), "src"),
        (lambda: SubjectTransformConfig(src="a", dest=""), "dest"),
        (lambda: RePublish(src="a", dest=" "), "dest"),
        (lambda: RePublish(src="a..b", dest="c"), "src"),
        (lambda: ExternalStream(api=""), "api"),
        (lambda: StreamConsumerLimits(inactive_threshold=-1.0), "inactive_threshold"),
        (lambda: StreamConsumerLimits(max_ack_pending=-5), "max_ack_pending"),
        (lambda: ConsumerConfig(backoff=[1.0, -1.0]), "backoff"),
        (lambda: ConsumerConfig(backoff=1.0), "backoff"),
        (lambda: ConsumerConfig(sample_freq="101%"), "sample_freq"),
        (lambda: ConsumerConfig(sample_freq="half"), "sample_freq"),
        (lambda: ConsumerConfig(max_ack_pending=-2), "max_ack_pending"),
        (lambda: ConsumerConfig(max_batch=-1), "max_batch"),
        (lambda: ConsumerConfig(ack_wait=float("nan")), "ack_wait"),
        (lambda: ConsumerConfig(num_replicas=-1), "num_replicas"),
        (lambda: ConsumerConfig(metadata={1: "a"}), "metadata"),
    ],
)
def test_bad_values_are_refused_naming_the_field(build: Any, field: str) -> None:
    with pytest.raises(InvalidConfigValue) as refused:
        build()
    assert refused.value.field == field
    assert isinstance(refused.value, ValueError)
    assert str(refused.value).startswith(f"{field}: ")


def test_server_values_are_accepted() -> None:
    """What a server answers for unset limits (-1, 0, empty metadata) is not refused."""
    config = from_json(
        StreamConfig,
        {
            "name": "S",
            "max_msgs": -1,
            "max_bytes": -1,
            "max_consumers": -1,
            "max_age": 0,
            "num_replicas": 1,
            "metadata": {},
            "consumer_limits": {},
            "first_seq": 0,
        },
    )
    assert config.max_msgs == -1
    assert config.consumer_limits == StreamConsumerLimits()


def test_bad_server_answer_is_a_decode_error() -> None:
    """A field the server cannot have sent (an unknown persist mode, a negative limit) is a
    DecodeError naming the model, not a half-built config."""
    with pytest.raises(DecodeError, match="persist_mode"):
        from_json(StreamConfig, {"name": "S", "persist_mode": "eventually"})
    with pytest.raises(DecodeError, match="max_msgs"):
        from_json(StreamConfig, {"name": "S", "max_msgs": -7})
