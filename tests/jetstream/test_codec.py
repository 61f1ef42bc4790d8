"""The JSON mapping of the JetStream models (codec.py): durations, RFC 3339 times, enums, nested
models, ``extra`` round trips, omitted ``None`` fields and DecodeError on wrong shapes.

Pure unit tests: no server. The wire forms written out literally here are the ones nats-server
sends and accepts (nanosecond integers, Go's RFC 3339 with up to nine fractional digits).
"""

from __future__ import annotations

import datetime as dt
import json
import string
from typing import Any

import pytest
from headrace.jetstream import (
    AccountInfo,
    AckPolicy,
    Compression,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    DiscardPolicy,
    PriorityPolicy,
    PubAck,
    ReplayPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamInfo,
    StreamState,
)
from headrace.jetstream.codec import (
    DecodeError,
    format_time,
    from_json,
    ns_to_seconds,
    parse_time,
    seconds_to_ns,
    to_json,
)
from headrace.jetstream.stream_config import Placement, RePublish, StreamSource
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PROPERTY = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: The fast set keeps to a few hundred examples; the slow copies run the profile's count.
FAST = settings(PROPERTY, max_examples=200)

UTC = dt.UTC


def wire(obj: Any) -> Any:
    """``to_json`` through a real JSON text, as it goes over the wire."""
    return json.loads(json.dumps(to_json(obj)))


# -- durations --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "ns"),
    [
        (0, 0),
        (1, 1_000_000_000),
        (1.5, 1_500_000_000),
        (30.0, 30_000_000_000),
        (0.000_000_001, 1),
        (0.25, 250_000_000),
        (86_400 * 365, 31_536_000_000_000_000),
    ],
)
def test_duration_units(seconds: float, ns: int) -> None:
    assert seconds_to_ns(seconds) == ns
    assert isinstance(seconds_to_ns(seconds), int)
    assert ns_to_seconds(ns) == pytest.approx(seconds, abs=1e-12)


def test_durations_on_the_wire_are_nanoseconds() -> None:
    cfg = ConsumerConfig(ack_wait=30, idle_heartbeat=0.5, inactive_threshold=0.001)
    assert to_json(cfg) == {
        "ack_wait": 30_000_000_000,
        "idle_heartbeat": 500_000_000,
        "inactive_threshold": 1_000_000,
    }
    back = from_json(ConsumerConfig, {"ack_wait": 30_000_000_000, "max_expires": 1})
    assert back.ack_wait == 30.0
    assert back.max_expires == 1e-9
    sc = from_json(StreamConfig, {"name": "S", "max_age": 0, "duplicate_window": 120_000_000_000})
    assert sc.max_age == 0.0
    assert sc.duplicate_window == 120.0
    assert to_json(sc) == {"name": "S", "max_age": 0, "duplicate_window": 120_000_000_000}


def test_backoff_list_round_trip() -> None:
    cfg = ConsumerConfig(durable_name="d", max_deliver=5, backoff=[0.5, 1, 2.5, 60])
    out = to_json(cfg)
    assert out["backoff"] == [500_000_000, 1_000_000_000, 2_500_000_000, 60_000_000_000]
    back = from_json(ConsumerConfig, wire(cfg))
    assert back.backoff == [0.5, 1.0, 2.5, 60.0]
    assert back == cfg


@FAST
@given(st.integers(min_value=0, max_value=10**15))
def test_nanoseconds_survive_seconds(ns: int) -> None:
    """Up to 10^15 ns (11.5 days) every nanosecond count survives the trip through seconds."""
    assert seconds_to_ns(ns_to_seconds(ns)) == ns


@FAST
@given(st.integers(min_value=0, max_value=100 * 366 * 86_400))
def test_whole_seconds_survive_nanoseconds(seconds: int) -> None:
    """Whole seconds (up to a century) are exact both ways."""
    ns = seconds_to_ns(seconds)
    assert ns == seconds * 1_000_000_000
    assert ns_to_seconds(ns) == seconds


# -- times ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "micro"),
    [
        ("2024-02-29T12:34:56Z", 0),
        ("2024-02-29T12:34:56.1Z", 100_000),
        ("2024-02-29T12:34:56.12Z", 120_000),
        ("2024-02-29T12:34:56.123Z", 123_000),
        ("2024-02-29T12:34:56.1234Z", 123_400),
        ("2024-02-29T12:34:56.12345Z", 123_450),
        ("2024-02-29T12:34:56.123456Z", 123_456),
        ("2024-02-29T12:34:56.1234567Z", 123_456),
        ("2024-02-29T12:34:56.12345678Z", 123_456),
        ("2024-02-29T12:34:56.123456789Z", 123_456),
        ("2024-02-29T12:34:56.999999999Z", 999_999),
        ("2024-02-29T12:34:56.000000001Z", 0),
    ],
)
def test_parse_time_fraction_digits(text: str, micro: int) -> None:
    """0 to 9 fractional digits; beyond microseconds they are truncated, never rounded up."""
    value = parse_time(text)
    assert value == dt.datetime(2024, 2, 29, 12, 34, 56, micro, tzinfo=UTC)
    assert value.utcoffset() == dt.timedelta(0)


@pytest.mark.parametrize(
    ("text", "expected_utc"),
    [
        ("2024-01-01T02:30:00+02:30", dt.datetime(2024, 1, 1, 0, 0, tzinfo=UTC)),
        ("2024-01-01T00:00:00.5-05:00", dt.datetime(2024, 1, 1, 5, 0, 0, 500_000, tzinfo=UTC)),
        ("2023-12-31T23:00:00+00:00", dt.datetime(2023, 12, 31, 23, 0, tzinfo=UTC)),
        ("2024-03-10T01:02:03.123456789+14:00", dt.datetime(2024, 3, 9, 11, 2, 3, 123456, UTC)),
    ],
)
def test_parse_time_offsets(text: str, expected_utc: dt.datetime) -> None:
    value = parse_time(text)
    assert value.tzinfo is not None
    assert value == expected_utc
    assert value.astimezone(UTC) == expected_utc
    # Formatting gives the same instant back, in UTC with a Z.
    out = format_time(value)
    assert out.endswith("Z")
    assert parse_time(out) == expected_utc


@pytest.mark.parametrize(
    "text",
    [
        "",
        "2024-02-29",
        "2024-02-29T12:34:56",  # no zone
        "2024-02-29 12:34:56Z",  # space instead of T
        "2024-02-29T12:34:56.Z",  # dot without digits
        "2024-02-29T12:34:56.1234567890Z",  # ten fractional digits
        "2024-02-29T12:34:56+0200",  # offset without a colon
        "2024-02-29T12:34Z",  # no seconds
        "24-02-29T12:34:56Z",
        "2024-02-29T12:34:56Z ",
        "2024-02-29t12:34:56z",
    ],
)
def test_parse_time_rejects(text: str) -> None:
    with pytest.raises(DecodeError):
        parse_time(text)
    with pytest.raises(DecodeError):
        from_json(StreamState, {"first_ts": text})


@pytest.mark.parametrize("text", ["2024-13-01T00:00:00Z", "2023-02-29T00:00:00Z"])
def test_impossible_dates_are_decode_errors_in_models(text: str) -> None:
    """Right shape, impossible value (month 13, 29 February of a common year)."""
    with pytest.raises(DecodeError):
        from_json(StreamState, {"first_ts": text})


def test_format_time() -> None:
    assert (
        format_time(dt.datetime(2024, 5, 6, 7, 8, 9, 123, tzinfo=UTC))
        == "2024-05-06T07:08:09.000123Z"
    )
    plus2 = dt.timezone(dt.timedelta(hours=2))
    assert format_time(dt.datetime(2024, 1, 1, 1, 0, tzinfo=plus2)) == "2023-12-31T23:00:00.000000Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        format_time(dt.datetime(2024, 1, 1))  # naive on purpose


_offsets = st.integers(min_value=-(23 * 60 + 59), max_value=23 * 60 + 59).map(
    lambda minutes: dt.timezone(dt.timedelta(minutes=minutes))
)
aware_datetimes = st.datetimes(
    min_value=dt.datetime(1000, 1, 2),
    max_value=dt.datetime(9999, 12, 30),
    timezones=st.one_of(st.just(UTC), _offsets),
)


@FAST
@given(aware_datetimes)
def test_time_round_trip(value: dt.datetime) -> None:
    assert parse_time(format_time(value)) == value


@FAST
@given(
    aware_datetimes.map(lambda v: v.astimezone(UTC)),
    st.integers(min_value=0, max_value=999),
    st.integers(min_value=0, max_value=9),
)
def test_parse_go_times(value: dt.datetime, extra_ns: int, drop: int) -> None:
    """Go writes 0-9 fractional digits (trailing zeros dropped); all parse to the microsecond."""
    frac = f"{value.microsecond:06d}{extra_ns:03d}"[: 9 - drop].rstrip("0")
    text = value.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"
    expected = value.replace(microsecond=int(frac.ljust(6, "0")[:6]) if frac else 0)
    assert parse_time(text) == expected


def test_go_zero_time_round_trip() -> None:
    state = from_json(StreamState, {"first_ts": "0001-01-01T00:00:00Z", "messages": 0})
    assert state.first_ts == dt.datetime(1, 1, 1, tzinfo=UTC)
    assert to_json(state)["first_ts"].startswith("0001-01-01T00:00:00")
    assert from_json(StreamState, to_json(state)) == state


# -- enums ------------------------------------------------------------------------------------

ENUMS = [
    RetentionPolicy,
    StorageType,
    DiscardPolicy,
    Compression,
    AckPolicy,
    DeliverPolicy,
    ReplayPolicy,
]


def test_enum_wire_values() -> None:
    sc = StreamConfig(
        name="S",
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.MEMORY,
        discard=DiscardPolicy.NEW,
        compression=Compression.S2,
    )
    assert to_json(sc) == {
        "name": "S",
        "retention": "workqueue",
        "storage": "memory",
        "discard": "new",
        "compression": "s2",
    }
    cc = from_json(
        ConsumerConfig,
        {"ack_policy": "all", "deliver_policy": "last_per_subject", "replay_policy": "original"},
    )
    assert cc.ack_policy is AckPolicy.ALL
    assert cc.deliver_policy is DeliverPolicy.LAST_PER_SUBJECT
    assert cc.replay_policy is ReplayPolicy.ORIGINAL


@pytest.mark.parametrize("enum_cls", ENUMS, ids=lambda e: e.__name__)
def test_every_enum_member_round_trips(enum_cls: Any) -> None:
    field = {
        RetentionPolicy: "retention",
        StorageType: "storage",
        DiscardPolicy: "discard",
        Compression: "compression",
        AckPolicy: "ack_policy",
        DeliverPolicy: "deliver_policy",
        ReplayPolicy: "replay_policy",
    }[enum_cls]
    model = StreamConfig if field in {"retention", "storage", "discard", "compression"} else None
    for member in enum_cls:
        if model is StreamConfig:
            obj: Any = StreamConfig(name="S", **{field: member})
        elif member is AckPolicy.FLOW_CONTROL:
            # (What the policy needs: test_flow_control_ack.py.)
            obj = ConsumerConfig(
                ack_policy=member,
                deliver_subject="d",
                flow_control=True,
                idle_heartbeat=1.0,
                max_ack_pending=10,
            )
        else:
            obj = ConsumerConfig(**{field: member})
        out = wire(obj)
        assert out[field] == member.value
        assert isinstance(out[field], str)
        back = from_json(type(obj), out)
        assert getattr(back, field) is member


def test_unknown_enum_value_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="ack_policy"):
        from_json(ConsumerConfig, {"ack_policy": "sometimes"})
    with pytest.raises(DecodeError, match="storage"):
        from_json(StreamConfig, {"name": "S", "storage": "tape"})


# -- nested models ----------------------------------------------------------------------------


def test_stream_config_nested_round_trip() -> None:
    start = dt.datetime(2024, 6, 1, 12, 0, 0, 250_000, tzinfo=UTC)
    cfg = StreamConfig(
        name="AGG",
        description="aggregate",
        subjects=["agg.>"],
        retention=RetentionPolicy.LIMITS,
        max_age=3600,
        storage=StorageType.FILE,
        num_replicas=3,
        placement=Placement(cluster="east", tags=["ssd", "az:1"]),
        sources=[
            StreamSource(name="ORDERS", opt_start_seq=10, filter_subject="orders.eu.>"),
            StreamSource(name="RETURNS", opt_start_time=start),
        ],
        republish=RePublish(src=">", dest="repub.>", headers_only=True),
        metadata={"owner": "team-a"},
        deny_delete=False,
    )
    out = to_json(cfg)
    assert out == {
        "name": "AGG",
        "description": "aggregate",
        "subjects": ["agg.>"],
        "retention": "limits",
        "max_age": 3_600_000_000_000,
        "storage": "file",
        "num_replicas": 3,
        "placement": {"cluster": "east", "tags": ["ssd", "az:1"]},
        "sources": [
            {"name": "ORDERS", "opt_start_seq": 10, "filter_subject": "orders.eu.>"},
            {"name": "RETURNS", "opt_start_time": "2024-06-01T12:00:00.250000Z"},
        ],
        "republish": {"src": ">", "dest": "repub.>", "headers_only": True},
        "metadata": {"owner": "team-a"},
        "deny_delete": False,
    }
    back = from_json(StreamConfig, json.loads(json.dumps(out)))
    assert back == cfg
    assert isinstance(back.placement, Placement)
    assert back.sources is not None
    assert all(isinstance(s, StreamSource) for s in back.sources)
    assert back.sources[1].opt_start_time == start


def test_mirror_round_trip() -> None:
    cfg = StreamConfig(name="M", mirror=StreamSource(name="ORIGIN", opt_start_seq=5))
    assert to_json(cfg) == {"name": "M", "mirror": {"name": "ORIGIN", "opt_start_seq": 5}}
    assert from_json(StreamConfig, wire(cfg)) == cfg


def test_consumer_info_from_server_shape() -> None:
    """A ConsumerInfo as nats-server 2.10+ writes it, nested sequences and times included."""
    raw = {
        "type": "io.nats.jetstream.api.v1.consumer_info_response",
        "stream_name": "S",
        "name": "d",
        "created": "2024-06-01T10:00:00.123456789Z",
        "config": {
            "durable_name": "d",
            "name": "d",
            "deliver_policy": "all",
            "ack_policy": "explicit",
            "ack_wait": 30_000_000_000,
            "max_deliver": -1,
            "backoff": [1_000_000_000, 5_000_000_000],
            "replay_policy": "instant",
            "max_waiting": 512,
            "max_ack_pending": 1000,
            "num_replicas": 0,
            "priority_policy": "none",
            "future_setting": 1,
        },
        "delivered": {"consumer_seq": 7, "stream_seq": 9, "last_active": "2024-06-01T10:01:00Z"},
        "ack_floor": {"consumer_seq": 5, "stream_seq": 6},
        "num_ack_pending": 2,
        "num_redelivered": 1,
        "num_waiting": 0,
        "num_pending": 11,
        "ts": "2024-06-01T10:02:00.5+00:00",
    }
    info = from_json(ConsumerInfo, raw)
    assert info.config.ack_wait == 30.0
    assert info.config.backoff == [1.0, 5.0]
    assert info.config.ack_policy is AckPolicy.EXPLICIT
    assert info.config.priority_policy is PriorityPolicy.NONE  # ADR-42, 2.11+
    assert info.config.extra == {"future_setting": 1}
    assert info.extra == {"type": "io.nats.jetstream.api.v1.consumer_info_response"}
    assert info.delivered.stream_seq == 9
    assert info.delivered.last_active == dt.datetime(2024, 6, 1, 10, 1, tzinfo=UTC)
    assert info.ack_floor.last_active is None
    assert info.created == dt.datetime(2024, 6, 1, 10, 0, 0, 123456, tzinfo=UTC)
    assert info.ts == dt.datetime(2024, 6, 1, 10, 2, 0, 500_000, tzinfo=UTC)
    assert (info.num_ack_pending, info.num_redelivered, info.num_pending) == (2, 1, 11)
    assert info.push_bound is False


def test_pub_ack_and_account_info() -> None:
    ack = from_json(PubAck, {"stream": "S", "seq": 3, "duplicate": True, "domain": "hub"})
    assert (ack.stream, ack.seq, ack.duplicate, ack.domain) == ("S", 3, True, "hub")
    plain = from_json(PubAck, {"stream": "S", "seq": 4})
    assert (plain.duplicate, plain.domain) == (False, None)
    acct = from_json(
        AccountInfo,
        {"memory": 5, "storage": 6, "streams": 1, "limits": {"max_streams": 10}, "api": {}},
    )
    assert (acct.memory, acct.storage, acct.streams, acct.consumers) == (5, 6, 1, 0)
    assert acct.limits.max_streams == 10
    assert acct.limits.max_consumers == -1
    assert acct.extra == {"api": {}}


# -- extra ------------------------------------------------------------------------------------


def test_extra_preserved_at_every_level() -> None:
    raw = {
        "name": "S",
        "subjects": ["s.>"],
        "consumer_limits": {"max_ack_pending": 10, "future_limit": 1},
        "future_setting": True,
        "placement": {"cluster": "c1", "future_placement": "n2"},
        "sources": [{"name": "A", "subject_transforms": [{"src": "a.>", "dest": "b.>", "f": 2}]}],
    }
    cfg = from_json(StreamConfig, raw)
    assert cfg.extra == {"future_setting": True}
    assert cfg.consumer_limits is not None and cfg.consumer_limits.extra == {"future_limit": 1}
    assert cfg.placement is not None and cfg.placement.extra == {"future_placement": "n2"}
    assert cfg.sources is not None and cfg.sources[0].subject_transforms is not None
    assert cfg.sources[0].subject_transforms[0].extra == {"f": 2}
    # An update built from what was read sends every unknown field back, untouched.
    cfg.description = "changed"
    out = to_json(cfg)
    assert out == {**raw, "description": "changed"}


def test_declared_fields_win_over_extra() -> None:
    cfg = StreamConfig(name="S", max_msgs=10, extra={"max_msgs": 99, "other": 1})
    assert to_json(cfg) == {"name": "S", "max_msgs": 10, "other": 1}


def test_extra_does_not_take_part_in_equality() -> None:
    assert StreamConfig(name="S", extra={"a": 1}) == StreamConfig(name="S")


# -- None fields omitted ----------------------------------------------------------------------


def test_none_fields_omitted_false_and_zero_kept() -> None:
    assert to_json(ConsumerConfig()) == {}
    assert to_json(StreamConfig(name="S")) == {"name": "S"}
    assert to_json(
        ConsumerConfig(flow_control=False, max_deliver=0, filter_subjects=[], description="")
    ) == {"flow_control": False, "max_deliver": 0, "filter_subjects": [], "description": ""}
    assert to_json(StreamConfig(name="S", placement=Placement())) == {"name": "S", "placement": {}}


def test_json_null_reads_as_unset() -> None:
    cfg = from_json(StreamConfig, {"name": "S", "subjects": None, "max_age": None, "mirror": None})
    assert (cfg.subjects, cfg.max_age, cfg.mirror) == (None, None, None)
    assert cfg.extra == {}
    assert to_json(cfg) == {"name": "S"}
    # A defaulted (non-optional) field keeps its default when the server sends null.
    assert from_json(StreamState, {"messages": None}).messages == 0


# -- DecodeError on wrong shapes --------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "data"),
    [
        (StreamConfig, ["name", "S"]),
        (StreamConfig, "S"),
        (StreamConfig, None),
        (ConsumerConfig, 5),
        (StreamConfig, {}),  # name is required
        (StreamConfig, {"subjects": ["x"]}),
        (StreamConfig, {"name": "a.b"}),  # validator: dots are not allowed in a stream name
        (StreamConfig, {"name": ""}),
        (ConsumerConfig, {"durable_name": "has space"}),
        (StreamConfig, {"name": "S", "placement": "east"}),
        (StreamConfig, {"name": "S", "sources": [{"name": "A"}, "B"]}),
        (StreamConfig, {"name": "S", "max_age": "one hour"}),
        (StreamConfig, {"name": "S", "max_age": {"ns": 1}}),
        (StreamConfig, {"name": "S", "max_age": [1]}),
        (ConsumerConfig, {"backoff": 5}),
        (ConsumerConfig, {"backoff": [1, "x"]}),
        (ConsumerConfig, {"opt_start_time": 1_700_000_000}),
        (ConsumerConfig, {"opt_start_time": "yesterday"}),
        (StreamInfo, {"config": "S"}),
        (StreamInfo, {"config": {"name": "S"}, "created": "2024-01-01"}),
        (ConsumerInfo, {"stream_name": "S", "name": "c", "config": {}, "delivered": 3}),
    ],
)
def test_decode_error_on_wrong_shapes(cls: Any, data: Any) -> None:
    with pytest.raises(DecodeError):
        from_json(cls, data)


@pytest.mark.parametrize(
    "data",
    [
        {"name": "S", "sources": {"name": "A"}},
        {"name": "S", "placement": [{"cluster": "c"}]},
        {"name": "S", "mirror": [{"name": "A"}]},
        {"name": "S", "state": []},
    ],
    ids=["object-for-list", "list-for-placement", "list-for-mirror", "list-for-state"],
)
def test_decode_error_on_list_object_confusion(data: dict[str, Any]) -> None:
    with pytest.raises(DecodeError):
        if "state" in data:
            from_json(StreamInfo, {"config": {"name": data["name"]}, "state": data["state"]})
        else:
            from_json(StreamConfig, data)


# -- property: ConsumerConfig round trip ------------------------------------------------------

_token = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1, max_size=12)
_subject = st.lists(st.one_of(_token, st.just("*")), min_size=1, max_size=4).map(".".join)
_ns_seconds = st.integers(min_value=0, max_value=10**15).map(ns_to_seconds)
_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**53), 2**53), st.text(max_size=8)
)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def _opt(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


consumer_configs = st.builds(
    ConsumerConfig,
    name=_opt(_token),
    durable_name=_opt(_token),
    description=_opt(st.text(max_size=20)),
    deliver_policy=_opt(st.sampled_from(DeliverPolicy)),
    opt_start_seq=_opt(st.integers(min_value=0, max_value=2**63 - 1)),
    opt_start_time=_opt(aware_datetimes),
    # (flow_control has requirements of its own: test_flow_control_ack.py.)
    ack_policy=_opt(st.sampled_from([p for p in AckPolicy if p is not AckPolicy.FLOW_CONTROL])),
    ack_wait=_opt(_ns_seconds),
    max_deliver=_opt(st.integers(min_value=-1, max_value=10**6)),
    backoff=_opt(st.lists(_ns_seconds, max_size=5)),
    filter_subject=_opt(_subject),
    filter_subjects=_opt(st.lists(_subject, max_size=3)),
    replay_policy=_opt(st.sampled_from(ReplayPolicy)),
    rate_limit_bps=_opt(st.integers(min_value=0, max_value=2**63 - 1)),
    sample_freq=_opt(st.sampled_from(["100%", "50%", "1"])),
    max_waiting=_opt(st.integers(min_value=0, max_value=10**6)),
    max_ack_pending=_opt(st.integers(min_value=-1, max_value=10**6)),
    flow_control=_opt(st.booleans()),
    idle_heartbeat=_opt(_ns_seconds),
    headers_only=_opt(st.booleans()),
    max_batch=_opt(st.integers(min_value=0, max_value=10**6)),
    max_expires=_opt(_ns_seconds),
    max_bytes=_opt(st.integers(min_value=0, max_value=2**62)),
    deliver_subject=_opt(_subject.filter(lambda s: "*" not in s)),
    deliver_group=_opt(_token),
    inactive_threshold=_opt(_ns_seconds),
    num_replicas=_opt(st.integers(min_value=0, max_value=5)),
    mem_storage=_opt(st.booleans()),
    metadata=_opt(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)),
    extra=st.dictionaries(st.text(max_size=10).map(lambda k: "x_" + k), _json_values, max_size=3),
)


@FAST
@given(consumer_configs)
def test_consumer_config_round_trip(cfg: ConsumerConfig) -> None:
    check_consumer_config_round_trip(cfg)


@pytest.mark.slow
@PROPERTY
@given(consumer_configs)
def test_consumer_config_round_trip_many(cfg: ConsumerConfig) -> None:
    check_consumer_config_round_trip(cfg)


def check_consumer_config_round_trip(cfg: ConsumerConfig) -> None:
    out = to_json(cfg)
    text = json.dumps(out)
    back = from_json(ConsumerConfig, json.loads(text))
    assert back == cfg
    assert back.extra == cfg.extra  # not part of ==, so checked on its own
    assert to_json(back) == out
    # Unset fields never reach the wire; set ones always do.
    assert set(out) == set(cfg.set_fields()) | set(cfg.extra)
