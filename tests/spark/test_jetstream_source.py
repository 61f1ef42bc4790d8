"""The ``jetstream`` format as a Spark source, on real nats-servers: what nats-py (the independent
peer) published is what ``spark.read`` / ``spark.readStream`` give, row for row (subject, data,
headers, stream, sequence, store time); the offsets options, the subject filters and the
partitioning; streaming queries resumed from their checkpoints read each message once; lost
data, a recreated stream and bad options fail with errors that say so; secrets never show."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import headrace_spark
import pytest

from tests.servers import NatsServer, token_auth, user_password_auth
from tests.spark.jetstream_support import (
    QUERY_TIMEOUT,
    add_stream,
    connect_peer,
    delete_stream,
    error_text,
    publish,
    publish_many,
    raw_publish,
    stream_state,
)

pytestmark = pytest.mark.spark


@pytest.fixture
def js_spark(spark: Any) -> Any:
    """The session with the ``jetstream`` format registered."""
    headrace_spark.register(spark)
    return spark


def reader(spark: Any, url: str, stream: str, **options: str) -> Any:
    """A batch read of ``stream`` (a DataFrame)."""
    return (
        spark.read.format("jetstream")
        .option("servers", url)
        .option("stream", stream)
        .options(**options)
        .load()
    )


def stream_reader(spark: Any, url: str, stream: str, **options: str) -> Any:
    return (
        spark.readStream.format("jetstream")
        .option("servers", url)
        .option("stream", stream)
        .options(**options)
    )


def seqs(df: Any) -> list[int]:
    """The ``seq`` column, sorted, duplicates kept."""
    return sorted(r["seq"] for r in df.select("seq").collect())


def run_available_now(df: Any, out: Path, checkpoint: Path) -> Any:
    """Run ``df`` into parquet at ``out`` with Trigger.AvailableNow until it ends; the query."""
    query = (
        df.writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    try:
        assert query.awaitTermination(QUERY_TIMEOUT), "the query did not end"
    finally:
        query.stop()
    return query


def parquet_seqs(spark: Any, out: Path) -> list[int]:
    return sorted(r["seq"] for r in spark.read.parquet(str(out)).select("seq").collect())


def data_rows(progress: list[Any]) -> list[int]:
    """numInputRows of each micro-batch that read something."""
    return [p["numInputRows"] for p in progress if p["numInputRows"]]


# -- a batch read ---------------------------------------------------------------------------------


def test_a_batch_read_gives_what_was_published(
    js_spark: Any, nats_server: NatsServer, natspy: Any
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "ORDERS", ["orders.>"])
    before = time.time()
    expected: dict[int, dict[str, Any]] = {}
    for i in range(12):
        subject = f"orders.{'eu' if i % 2 else 'us'}.{i}"
        data = bytes([i, 0, 255, 10, 13]) + b"payload-%d" % i
        headers = {"X-Index": str(i), "Content-Type": "application/octet-stream"} if i % 3 else None
        seq = publish(natspy, subject, data, headers)
        expected[seq] = {
            "subject": subject,
            "data": data,
            "headers": None if headers is None else {k: [v] for k, v in headers.items()},
        }
    # A header given more than once (nats-py cannot send that: a raw publish does), and a user's
    # own Nats-Msg-Id, which is the message's own header and stays.
    ack = raw_publish(
        nats_server.url,
        "orders.multi",
        [("X-Tag", "red"), ("X-Tag", "green"), ("X-Tag", "blue"), ("Nats-Msg-Id", "m-1")],
        b"multi",
    )
    expected[ack["seq"]] = {
        "subject": "orders.multi",
        "data": b"multi",
        "headers": {"X-Tag": ["red", "green", "blue"], "Nats-Msg-Id": ["m-1"]},
    }
    seq = publish(natspy, "orders.empty", b"")
    expected[seq] = {"subject": "orders.empty", "data": b"", "headers": None}
    after = time.time()

    df = reader(js_spark, nats_server.url, "ORDERS")
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("subject", "string"),
        ("data", "binary"),
        ("headers", "map<string,array<string>>"),
        ("stream", "string"),
        ("seq", "bigint"),
        ("timestamp", "timestamp"),
    ]
    rows = df.selectExpr("*", "unix_micros(timestamp) AS micros").collect()
    assert sorted(r["seq"] for r in rows) == list(range(1, 15))  # each once
    got = {r["seq"]: r for r in rows}
    for seq, want in expected.items():
        row = got[seq]
        assert row["subject"] == want["subject"], seq
        assert bytes(row["data"]) == want["data"], seq
        assert row["headers"] == want["headers"], seq
        assert row["stream"] == "ORDERS"
        # Stored by this machine's server between the first publish and the last ack.
        assert before - 1 <= row["micros"] / 1e6 <= after + 1, (seq, before, after)
    # The server's own Direct Get headers (Nats-Stream, Nats-Sequence, ...) are not the user's.
    for row in rows:
        names = set(row["headers"] or {})
        assert not names & {
            "Nats-Stream",
            "Nats-Subject",
            "Nats-Sequence",
            "Nats-Time-Stamp",
            "Nats-Num-Pending",
            "Nats-Last-Sequence",
        }, row
    times = [got[s]["micros"] for s in sorted(got)]
    assert times == sorted(times)  # stored in sequence order


def test_subject_filters_read_only_their_messages(
    js_spark: Any, nats_server: NatsServer, natspy: Any
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "F", ["f.>"])
    subjects = ["f.a", "f.b", "f.c", "f.a.deep"]
    published = publish_many(natspy, [(subjects[i % 4], b"%d" % i) for i in range(40)])
    on = {s: [q for i, q in enumerate(published) if subjects[i % 4] == s] for s in subjects}

    one = reader(js_spark, nats_server.url, "F", subjects="f.a").collect()
    assert sorted(r["seq"] for r in one) == on["f.a"]
    assert {r["subject"] for r in one} == {"f.a"}

    two = reader(js_spark, nats_server.url, "F", subjects="f.a, f.c").collect()
    assert sorted(r["seq"] for r in two) == sorted(on["f.a"] + on["f.c"])
    for r in two:
        assert bytes(r["data"]) == b"%d" % published.index(r["seq"])

    wild = reader(js_spark, nats_server.url, "F", subjects="f.a.>,f.b", numPartitions="3")
    assert seqs(wild) == sorted(on["f.a.deep"] + on["f.b"])


def test_starting_and_ending_offsets(js_spark: Any, nats_server: NatsServer, natspy: Any) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "OFF", ["off.>"])
    publish_many(natspy, [("off.x", b"%d" % i) for i in range(1, 6)])
    # Between the fifth message's PubAck and the sixth publish: 6 is the first stored at or
    # after it, 5 the last before it.
    middle = dt.datetime.now(dt.UTC).isoformat()
    publish_many(natspy, [("off.x", b"%d" % i) for i in range(6, 11)])
    url = nats_server.url

    def read(**options: str) -> list[int]:
        return seqs(reader(js_spark, url, "OFF", **options))

    assert read() == list(range(1, 11))  # a batch read: earliest to latest
    assert read(startingOffsets="earliest") == list(range(1, 11))
    assert read(startingOffsets="latest") == []
    assert read(startingOffsets="4") == list(range(4, 11))
    assert read(startingOffsets="10") == [10]
    assert read(startingOffsets="11") == []
    assert read(startingOffsets=middle) == list(range(6, 11))
    assert read(endingOffsets="7") == list(range(1, 8))  # a sequence: included
    assert read(endingOffsets="latest") == list(range(1, 11))
    assert read(endingOffsets=middle) == list(range(1, 6))  # a time: excluded
    assert read(startingOffsets="3", endingOffsets="7") == list(range(3, 8))
    assert read(startingOffsets="3", endingOffsets="99") == list(range(3, 11))
    assert read(startingOffsets=middle, endingOffsets="8") == [6, 7, 8]
    past = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    assert read(startingOffsets=past) == []
    long_ago = "2000-01-01T00:00:00Z"
    assert read(startingOffsets=long_ago) == list(range(1, 11))
    assert read(endingOffsets=long_ago) == []


def test_the_number_of_partitions_does_not_change_the_rows(
    js_spark: Any, nats_server: NatsServer, natspy: Any
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "P", ["p.>"])
    publish_many(natspy, [(f"p.{i % 3}", b"row-%d" % i) for i in range(25)])
    results = {}
    for parts in ("1", "3"):
        df = reader(js_spark, nats_server.url, "P", numPartitions=parts, fetchBatch="4")
        assert df.rdd.getNumPartitions() == int(parts)
        results[parts] = sorted(
            (r["seq"], r["subject"], bytes(r["data"])) for r in df.drop("timestamp").collect()
        )
    assert results["1"] == results["3"]
    assert [s for s, _, _ in results["1"]] == list(range(1, 26))
    # partitionBytes cuts by the stream's average message size (each ~40 bytes stored).
    small = reader(js_spark, nats_server.url, "P", partitionBytes="200")
    assert small.rdd.getNumPartitions() > 1
    assert seqs(small) == list(range(1, 26))


# -- streaming ------------------------------------------------------------------------------------


def test_max_messages_per_trigger_caps_each_micro_batch(
    js_spark: Any, nats_server: NatsServer, natspy: Any, tmp_path: Path
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "CAP", ["cap.>"])
    publish_many(natspy, [("cap.x", b"%d" % i) for i in range(25)])
    df = stream_reader(
        js_spark, nats_server.url, "CAP", startingOffsets="earliest", maxMessagesPerTrigger="10"
    ).load()
    query = run_available_now(df, tmp_path / "out", tmp_path / "checkpoint")
    assert data_rows(query.recentProgress) == [10, 10, 5]
    assert parquet_seqs(js_spark, tmp_path / "out") == list(range(1, 26))


@pytest.mark.slow
def test_a_query_resumed_from_its_checkpoint_reads_only_new_messages(
    js_spark: Any, nats_server: NatsServer, natspy: Any, tmp_path: Path
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "RES", ["res.>"])
    publish_many(natspy, [(f"res.{i % 2}", b"first-%d" % i) for i in range(30)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run() -> Any:
        df = stream_reader(
            js_spark, nats_server.url, "RES", startingOffsets="earliest", maxMessagesPerTrigger="12"
        ).load()
        return run_available_now(df, out, checkpoint)

    first = run()
    assert data_rows(first.recentProgress) == [12, 12, 6]
    assert parquet_seqs(js_spark, out) == list(range(1, 31))

    publish_many(natspy, [(f"res.{i % 2}", b"second-%d" % i) for i in range(20)])
    second = run()
    assert data_rows(second.recentProgress) == [12, 8]
    rows = js_spark.read.parquet(str(out)).collect()
    assert sorted(r["seq"] for r in rows) == list(range(1, 51))  # none missing, none twice
    by_seq = {r["seq"]: bytes(r["data"]) for r in rows}
    assert by_seq[30] == b"first-29" and by_seq[31] == b"second-0" and by_seq[50] == b"second-19"

    third = run()  # nothing new: nothing read
    assert data_rows(third.recentProgress) == []
    assert parquet_seqs(js_spark, out) == list(range(1, 51))


def test_a_streaming_read_starts_where_asked(
    js_spark: Any, nats_server: NatsServer, natspy: Any, tmp_path: Path
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "ST", ["st.>"])
    publish_many(natspy, [("st.a" if i % 2 else "st.b", b"%d" % i) for i in range(10)])

    def run(name: str, **options: str) -> list[int]:
        df = stream_reader(js_spark, nats_server.url, "ST", **options).load()
        run_available_now(df, tmp_path / name, tmp_path / f"{name}-checkpoint")
        if not (tmp_path / name).exists():
            return []
        return parquet_seqs(js_spark, tmp_path / name)

    assert run("from4", startingOffsets="4", subjects="st.a") == [4, 6, 8, 10]
    assert run("latest") == []  # a stream read starts after what is stored by default
    publish_many(natspy, [("st.c", b"%d" % i) for i in range(10, 13)])
    assert run("latest") == [11, 12, 13]  # what came after its first run


# -- data lost, a stream recreated ----------------------------------------------------------------


@pytest.mark.slow
def test_messages_removed_before_they_were_read_fail_the_query_or_are_skipped(
    js_spark: Any, nats_server: NatsServer, natspy: Any, tmp_path: Path
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "LOSSY", ["lossy.>"], max_msgs=10)
    publish_many(natspy, [("lossy.x", b"%d" % i) for i in range(1, 6)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run(**options: str) -> Any:
        df = stream_reader(
            js_spark, nats_server.url, "LOSSY", startingOffsets="earliest", **options
        ).load()
        return run_available_now(df, out, checkpoint)

    run()  # the query's offset: sequence 5
    assert parquet_seqs(js_spark, out) == [1, 2, 3, 4, 5]
    publish_many(natspy, [("lossy.x", b"%d" % i) for i in range(6, 26)])
    state = stream_state(natspy, "LOSSY")
    assert (state.first_seq, state.last_seq) == (16, 25)  # 6-15 went unread

    with pytest.raises(Exception) as failed:
        run()
    text = error_text(failed.value)
    assert "stream 'LOSSY': sequences 6-15 (10 messages) were removed" in text
    assert "failOnDataLoss=false" in text
    assert parquet_seqs(js_spark, out) == [1, 2, 3, 4, 5]  # nothing written

    skipped = run(failOnDataLoss="false")
    assert data_rows(skipped.recentProgress) == [10]
    assert parquet_seqs(js_spark, out) == [1, 2, 3, 4, 5, *range(16, 26)]

    # A batch read from a sequence that is gone: the same rule.
    with pytest.raises(Exception) as failed:
        reader(js_spark, nats_server.url, "LOSSY", startingOffsets="3").collect()
    assert "stream 'LOSSY': sequences 3-15 (13 messages) were removed" in error_text(failed.value)
    rest = reader(
        js_spark, nats_server.url, "LOSSY", startingOffsets="3", failOnDataLoss="false"
    ).collect()
    assert sorted(r["seq"] for r in rest) == list(range(16, 26))
    # earliest is the first message still stored: nothing lost.
    assert seqs(reader(js_spark, nats_server.url, "LOSSY")) == list(range(16, 26))


@pytest.mark.slow
def test_a_stream_deleted_and_created_again_fails_the_restarted_query(
    js_spark: Any, nats_server: NatsServer, natspy: Any, tmp_path: Path
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "AGAIN", ["again.>"])
    publish_many(natspy, [("again.x", b"old-%d" % i) for i in range(8)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run() -> Any:
        df = stream_reader(js_spark, nats_server.url, "AGAIN", startingOffsets="earliest").load()
        return run_available_now(df, out, checkpoint)

    run()
    assert parquet_seqs(js_spark, out) == list(range(1, 9))
    delete_stream(natspy, "AGAIN")
    add_stream(natspy, "AGAIN", ["again.>"])
    publish_many(natspy, [("again.x", b"new-%d" % i) for i in range(12)])

    with pytest.raises(Exception) as failed:
        run()
    text = error_text(failed.value)
    assert "SourceStreamRecreated" in text
    assert "stream 'AGAIN' was deleted and created again" in text
    assert "new checkpoint location" in text
    assert parquet_seqs(js_spark, out) == list(range(1, 9))  # nothing of the new stream

    # A new checkpoint reads the new stream.
    df = stream_reader(js_spark, nats_server.url, "AGAIN", startingOffsets="earliest").load()
    run_available_now(df, tmp_path / "out2", tmp_path / "checkpoint2")
    rows = js_spark.read.parquet(str(tmp_path / "out2")).collect()
    assert sorted((r["seq"], bytes(r["data"])) for r in rows) == [
        (i + 1, b"new-%d" % i) for i in range(12)
    ]


# -- options --------------------------------------------------------------------------------------


def batch_error(spark: Any, **options: str) -> str:
    with pytest.raises(Exception) as failed:
        spark.read.format("jetstream").options(**options).load().collect()
    return error_text(failed.value)


def stream_error(spark: Any, tmp_path: Path, **options: str) -> str:
    with pytest.raises(Exception) as failed:
        df = spark.readStream.format("jetstream").options(**options).load()
        run_available_now(df, tmp_path / "never", tmp_path / "never-checkpoint")
    return error_text(failed.value)


def test_bad_options_fail_with_the_option_named(
    js_spark: Any, nats_server: NatsServer, natspy: Any, tmp_path: Path
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "OPT", ["opt.>"])
    url = nats_server.url
    text = batch_error(js_spark, stream="OPT")
    assert "JetStreamOptionError: jetstream option 'servers': is required" in text
    assert "jetstream option 'stream': is required" in batch_error(js_spark, servers=url)
    text = batch_error(js_spark, servers=url, stream="OPT", maxMessagesPerTriger="10")
    assert "jetstream option 'maxmessagespertriger': unknown option" in text
    text = batch_error(js_spark, servers=url, stream="OPT", startingOffsets="yesterday")
    assert "jetstream option 'startingOffsets': must be earliest, latest, a stream " in text
    assert "'yesterday'" in text
    text = batch_error(js_spark, servers=url, stream="OPT", startingOffsets="2026-01-01T10:00")
    assert "jetstream option 'startingOffsets': the time '2026-01-01T10:00' needs a zone" in text
    text = batch_error(js_spark, servers=url, stream="OPT", endingOffsets="earliest")
    assert "jetstream option 'endingOffsets': cannot be earliest" in text
    text = batch_error(js_spark, servers=url, stream="OPT", numPartitions="0")
    assert "jetstream option 'numPartitions': must be at least 1, not 0" in text
    text = batch_error(js_spark, servers=url, stream="OPT", maxMessagesPerTrigger="5")
    assert "jetstream option 'maxMessagesPerTrigger': is for streaming reads" in text
    text = batch_error(js_spark, servers=url, stream="OPT", subjects="opt.a,opt.*")
    assert "jetstream option 'subjects': 'opt.a' and 'opt.*' overlap" in text
    text = batch_error(js_spark, servers=url, stream="OPT", readMethod="fast")
    assert "jetstream option 'readMethod': must be auto, direct or consumer, not 'fast'" in text
    text = batch_error(js_spark, servers=url, stream="NOPE")
    assert "stream 'NOPE' does not exist on nats://" in text

    text = stream_error(js_spark, tmp_path, servers=url, stream="OPT", endingOffsets="5")
    assert (
        "JetStreamOptionError: jetstream option 'endingOffsets': is for batch reads (spark.read)"
        in text
    )
    text = stream_error(js_spark, tmp_path, stream="OPT")
    assert "jetstream option 'servers': is required" in text

    with pytest.raises(Exception) as failed:
        js_spark.read.format("jetstream").schema("subject string").option("servers", url).option(
            "stream", "OPT"
        ).load().collect()
    assert "the jetstream source's schema is fixed" in error_text(failed.value)


def full_rows(df: Any) -> list[tuple[Any, ...]]:
    """Every column of every row, sorted by sequence (data as bytes, headers sorted)."""
    return sorted(
        (
            r["seq"],
            r["subject"],
            bytes(r["data"]),
            sorted((r["headers"] or {}).items()),
            r["stream"],
            r["timestamp"],
        )
        for r in df.collect()
    )


def test_both_read_methods_give_the_same_rows(
    js_spark: Any, nats_server: NatsServer, natspy: Any
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "BOTH", ["both.>"])
    for i in range(30):
        headers = {"X-Index": str(i)} if i % 4 else None
        publish(natspy, f"both.{'abc'[i % 3]}", b"%d" % i, headers)
    raw_publish(nats_server.url, "both.a", [("X-Tag", "one"), ("X-Tag", "two")], b"multi")
    url = nats_server.url
    for options in (
        {},
        {"subjects": "both.a,both.c", "numPartitions": "2"},
        {"startingOffsets": "5", "endingOffsets": "29", "fetchBatch": "7"},
        {"subjects": "both.b", "startingOffsets": "20"},
    ):
        direct = full_rows(reader(js_spark, url, "BOTH", readMethod="direct", **options))
        consumer = full_rows(reader(js_spark, url, "BOTH", readMethod="consumer", **options))
        assert direct == consumer, options
        assert direct, options
    everything = full_rows(reader(js_spark, url, "BOTH", readMethod="consumer"))
    assert [r[0] for r in everything] == list(range(1, 32))
    assert everything[-1][3] == [("X-Tag", ["one", "two"])]
    assert everything[1][3] == [("X-Index", ["1"])]
    assert everything[0][3] == []  # no headers: NULL
    # The consumers were deleted after their reads.
    assert natspy.run(natspy.nc.jetstream().stream_info("BOTH")).state.consumer_count == 0


def test_a_stream_without_direct_get_is_read_with_a_consumer(
    js_spark: Any, nats_server: NatsServer, natspy: Any, tmp_path: Path
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "NODIRECT", ["nd.>"], allow_direct=False)
    publish_many(natspy, [(f"nd.{i % 2}", b"%d" % i) for i in range(10)])
    rows = reader(js_spark, nats_server.url, "NODIRECT").collect()  # readMethod auto
    assert sorted((r["seq"], bytes(r["data"])) for r in rows) == [
        (i + 1, b"%d" % i) for i in range(10)
    ]
    assert seqs(reader(js_spark, nats_server.url, "NODIRECT", subjects="nd.1")) == [2, 4, 6, 8, 10]
    df = stream_reader(
        js_spark, nats_server.url, "NODIRECT", startingOffsets="earliest", maxMessagesPerTrigger="4"
    ).load()
    query = run_available_now(df, tmp_path / "out", tmp_path / "checkpoint")
    assert data_rows(query.recentProgress) == [4, 4, 2]
    assert parquet_seqs(js_spark, tmp_path / "out") == list(range(1, 11))

    with pytest.raises(Exception) as failed:
        reader(js_spark, nats_server.url, "NODIRECT", readMethod="direct").collect()
    assert "stream 'NODIRECT' does not allow Direct Get (allow_direct is off)" in error_text(
        failed.value
    )
    assert stream_state(natspy, "NODIRECT").consumer_count == 0


# -- secrets --------------------------------------------------------------------------------------


def explained(df: Any, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    df.explain(True)
    return capsys.readouterr().out


def test_a_password_never_shows_in_plans_or_errors(
    js_spark: Any,
    nats_server_factory: Any,
    natspy: Any,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    auth = user_password_auth("reader", "s3cret-Pa55word-xyz")
    server = nats_server_factory(auth=auth.config)
    connect_peer(natspy, server.url, user=auth.user, password=auth.password)
    add_stream(natspy, "CREDS", ["creds.>"])
    publish_many(natspy, [("creds.x", b"%d" % i) for i in range(5)])
    options = {"user": auth.user, "password": auth.password}

    df = reader(js_spark, server.url, "CREDS", **options)
    assert seqs(df) == [1, 2, 3, 4, 5]
    assert auth.password not in explained(df, capsys)

    # A streaming query's plan prints the options (Spark hides the password's value) and its
    # progress.
    sdf = stream_reader(js_spark, server.url, "CREDS", startingOffsets="earliest", **options)
    plan = explained(sdf.load(), capsys)
    assert "password=*********(redacted)" in plan
    assert auth.password not in plan
    query = run_available_now(sdf.load(), tmp_path / "out", tmp_path / "checkpoint")
    assert data_rows(query.recentProgress) == [5]
    assert auth.password not in str(query.recentProgress)

    # An error of a read with the password: a stream that is not there.
    text = batch_error(js_spark, servers=server.url, stream="MISSING", **options)
    assert "stream 'MISSING' does not exist on nats://" in text
    assert auth.password not in text

    # A wrong password: a clear error, neither password in it.
    wrong = "wr0ng-Pa55word-abc"
    text = batch_error(js_spark, servers=server.url, stream="CREDS", user="reader", password=wrong)
    assert "AuthorizationError: Authorization Violation" in text
    assert wrong not in text and auth.password not in text
    # In the URL (which docs/spark-streaming.md advises against: Spark prints a streaming
    # plan's servers option as it is): headrace's own error still does not carry it.
    wrong_url = server.url.replace("nats://", f"nats://reader:{wrong}@")
    text = batch_error(js_spark, servers=wrong_url, stream="CREDS")
    assert "AuthorizationError: Authorization Violation" in text
    assert wrong not in text


def test_a_token_never_shows_in_plans_or_errors(
    js_spark: Any, nats_server_factory: Any, natspy: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    auth = token_auth("t0ken-Va1ue-9876543210")
    server = nats_server_factory(auth=auth.config)
    connect_peer(natspy, server.url, token=auth.token)
    add_stream(natspy, "TOK", ["tok.>"])
    publish_many(natspy, [("tok.x", b"%d" % i) for i in range(3)])

    df = reader(js_spark, server.url, "TOK", token=auth.token)
    assert seqs(df) == [1, 2, 3]
    assert auth.token not in explained(df, capsys)
    plan = explained(stream_reader(js_spark, server.url, "TOK", token=auth.token).load(), capsys)
    assert "token=*********(redacted)" in plan and auth.token not in plan
    text = batch_error(js_spark, servers=server.url, stream="GONE", token=auth.token)
    assert "stream 'GONE' does not exist on nats://" in text and auth.token not in text
    wrong = "wr0ng-t0ken-0123456789"
    text = batch_error(js_spark, servers=server.url, stream="TOK", token=wrong)
    assert "AuthorizationError: Authorization Violation" in text
    assert wrong not in text and auth.token not in text
