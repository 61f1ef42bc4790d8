"""The ``jetstream`` format's options, offsets and partition arithmetic, without Spark: fast
checks of what the driver refuses before any work is planned, and of what a ``repr`` shows."""

from __future__ import annotations

import datetime as dt

import pytest
from headrace_spark import JetStreamOptionError
from headrace_spark.datasource.offsets import StreamOffset, partition_count, split_range
from headrace_spark.datasource.options import (
    AtSequence,
    AtTime,
    ConnectionSpec,
    Earliest,
    Latest,
    SinkSpec,
    SourceSpec,
    parse_position,
    subjects_overlap,
)

SEED = "SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBU"


def source(streaming: bool = False, **options: str) -> SourceSpec:
    return SourceSpec.from_options(
        {"servers": "nats://127.0.0.1:4222", "stream": "S", **options}, streaming=streaming
    )


def test_defaults_follow_kafka_s_source() -> None:
    assert isinstance(source().starting, Earliest)
    assert isinstance(source(streaming=True).starting, Latest)
    assert source().fail_on_data_loss is True
    assert source().read_method == "auto"


def test_positions() -> None:
    assert parse_position("x", "earliest") == Earliest()
    assert parse_position("x", " LATEST ") == Latest()
    assert parse_position("x", "42") == AtSequence(42)
    assert parse_position("x", "2026-11-27T10:00:00Z") == AtTime(
        dt.datetime(2026, 11, 27, 10, tzinfo=dt.UTC)
    )
    with pytest.raises(JetStreamOptionError, match="needs a zone"):
        parse_position("startingOffsets", "2026-11-27T10:00:00")
    with pytest.raises(JetStreamOptionError, match="starts at 1"):
        parse_position("startingOffsets", "0")


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"maxMessagesPerTriger": "5"}, "'maxmessagespertriger': unknown option"),
        ({"subjects": "a.>,a.b"}, "'a.>' and 'a.b' overlap"),
        ({"subjects": "a b"}, "subjects"),
        ({"numPartitions": "-1"}, "must be at least 1"),
        ({"failOnDataLoss": "maybe"}, "must be true or false"),
        ({"readMethod": "fast"}, "must be auto, direct or consumer"),
        ({"maxMessagesPerTrigger": "5"}, "'maxMessagesPerTrigger': is for streaming reads"),
        ({"nkey": SEED}, "inline seed goes in nkeySecret"),
        ({"nkey": "/a/file", "nkeySecret": SEED}, "not both"),
        ({"password": "p"}, "needs user too"),
        ({"domain": "d", "apiPrefix": "$JS.x.API"}, "domain or apiPrefix"),
    ],
)
def test_bad_options_are_refused_by_name(options: dict[str, str], complaint: str) -> None:
    with pytest.raises(JetStreamOptionError, match=complaint.replace(".", r"\.")):
        source(**options)


def test_no_secret_in_a_repr() -> None:
    spec = ConnectionSpec.from_options(
        {
            "servers": "nats://alice:s3cret-pw@127.0.0.1:4222",
            "user": "alice",
            "password": "pw-9911",
            "token": "tok-4242",
            "nkeySecret": SEED,
        }
    )
    shown = repr(spec) + repr(source(servers="nats://bob:hidden-pw@h:4222", token="tok-4242"))
    for secret in ("s3cret-pw", "pw-9911", "tok-4242", SEED, "hidden-pw"):
        assert secret not in shown
    assert "alice" in shown  # a user name is not a secret
    assert spec.where == "nats://***@127.0.0.1:4222"


def test_sink_options() -> None:
    spec = SinkSpec.from_options({"servers": "nats://h:4222", "subject": "out.x"})
    assert (spec.max_in_flight, spec.msg_id_prefix, spec.subject) == (512, None, "out.x")
    with pytest.raises(JetStreamOptionError, match="no spaces or ':'"):
        SinkSpec.from_options({"servers": "nats://h:4222", "msgIdPrefix": "a:b"})
    with pytest.raises(JetStreamOptionError, match="unknown option"):
        SinkSpec.from_options({"servers": "nats://h:4222", "startingOffsets": "earliest"})


@pytest.mark.parametrize(
    ("one", "other", "overlap"),
    [
        ("a.>", "a.b", True),
        ("a.*", "*.b", True),
        (">", "x", True),
        ("a.b", "a.c", False),
        ("a.*", "a.b.c", False),
        ("a.>", "a", False),
        ("a.*.c", "a.b.*", True),
    ],
)
def test_subject_overlap(one: str, other: str, overlap: bool) -> None:
    assert subjects_overlap(one, other) is overlap
    assert subjects_overlap(other, one) is overlap


def test_ranges_cover_every_sequence_once() -> None:
    for first, last, parts in [(1, 10, 3), (5, 5, 4), (1, 300_000, 4), (7, 9, 10)]:
        ranges = split_range(first, last, parts)
        covered = [s for a, b in ranges for s in range(a, b + 1)]
        assert covered == list(range(first, last + 1))
        assert len(ranges) == min(parts, last - first + 1)
    assert split_range(10, 9, 3) == []
    assert partition_count(1000, 100.0, num_partitions=None, partition_bytes=64 * 1024) == 2
    assert partition_count(1000, 100.0, num_partitions=7, partition_bytes=1) == 7


def test_offsets_round_trip_and_refuse_garbage() -> None:
    offset = StreamOffset("S", "2026-11-27T10:00:00Z", 41, 3)
    assert StreamOffset.from_dict(offset.to_dict()) == offset
    old = {"v": 1, "stream": "S", "created": "x", "seq": 5}  # no parts: written before them
    assert StreamOffset.from_dict(old).parts is None
    with pytest.raises(Exception, match="not a jetstream offset"):
        StreamOffset.from_dict({"seq": "many"})
    with pytest.raises(Exception, match="version 2"):
        StreamOffset.from_dict({**old, "v": 2})
