"""The ``jetstream`` format as a Spark sink, on real nats-servers: every row becomes one stored
message (subject, payload and headers as given, read back message by message with nats-py, the
independent peer), with a ``Nats-Msg-Id`` that makes a rerun store nothing twice (a batch write
with its ``msgIdPrefix``, a streaming micro-batch run again from its checkpoint); a schema the
sink cannot write and a subject no stream captures fail with errors that say so."""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import headrace_spark
import pytest

from tests.servers import NatsServer
from tests.spark.jetstream_support import (
    QUERY_TIMEOUT,
    add_stream,
    connect_peer,
    error_text,
    publish,
    raw_publish,
    stored_messages,
)

pytestmark = pytest.mark.spark

MSG_ID = "Nats-Msg-Id"


@pytest.fixture
def js_spark(spark: Any) -> Any:
    """The session with the ``jetstream`` format registered."""
    headrace_spark.register(spark)
    return spark


def write(df: Any, url: str, **options: str) -> None:
    df.write.format("jetstream").mode("append").option("servers", url).options(**options).save()


def write_error(df: Any, url: str, **options: str) -> str:
    with pytest.raises(Exception) as failed:
        write(df, url, **options)
    return error_text(failed.value)


def msg_id(stored: Any) -> str:
    (value,) = stored.header(MSG_ID)
    return str(value)


def test_rows_with_a_subject_column_are_each_stored_once(
    js_spark: Any, nats_server: NatsServer, natspy: Any
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "OUT", ["out.>"])
    rows = [(f"out.{'abc'[i % 3]}", f"row-{i} é✓") for i in range(40)]
    df = js_spark.createDataFrame(rows, "subject string, data string").repartition(3)
    assert df.rdd.getNumPartitions() == 3
    write(df, nats_server.url)

    stored = stored_messages(natspy, "OUT")
    assert len(stored) == 40
    assert Counter((m.subject, m.data) for m in stored) == Counter((s, d.encode()) for s, d in rows)
    ids = [msg_id(m) for m in stored]
    assert len(set(ids)) == 40
    # <prefix>:<partition>:<row>, the prefix made once for the write.
    parsed = [re.fullmatch(r"([0-9a-f]{32}):(\d+):(\d+)", i) for i in ids]
    assert all(parsed), ids
    assert len({m.group(1) for m in parsed if m}) == 1
    assert {int(m.group(2)) for m in parsed if m} == {0, 1, 2}
    for m in stored:
        assert [name for name, _ in m.headers] == [MSG_ID]  # nothing else added


def test_the_subject_option_binary_data_and_headers(
    js_spark: Any, nats_server: NatsServer, natspy: Any
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "H", ["h.>"])
    url = nats_server.url

    # Binary data, one subject for every row, headers map<string,string>.
    one = js_spark.createDataFrame(
        [
            (bytes([0, 1, 255]), {"X-A": "1", "X-B": "b"}),
            (b"", None),
            (None, {"X-Null": None, "X-C": "c"}),
        ],
        "data binary, headers map<string,string>",
    ).coalesce(1)
    write(one, url, subject="h.one", msgIdPrefix="one")
    # String data, headers with several values per name.
    many = js_spark.createDataFrame(
        [("h.many.1", "first", {"X-Tag": ["red", "green"], "X-One": ["1"]})],
        "subject string, data string, headers map<string,array<string>>",
    )
    write(many, url, msgIdPrefix="many", stream="H")

    stored = stored_messages(natspy, "H")
    assert [(m.seq, m.subject, m.data) for m in stored] == [
        (1, "h.one", bytes([0, 1, 255])),
        (2, "h.one", b""),
        (3, "h.one", b""),  # a null data: an empty payload
        (4, "h.many.1", b"first"),
    ]
    first, second, third, fourth = stored
    assert sorted(first.headers) == [("Nats-Msg-Id", "one:0:0"), ("X-A", "1"), ("X-B", "b")]
    assert second.headers == (("Nats-Msg-Id", "one:0:1"),)
    assert sorted(third.headers) == [("Nats-Msg-Id", "one:0:2"), ("X-C", "c")]  # null: left out
    assert fourth.header("X-Tag") == ["red", "green"]
    assert fourth.header("X-One") == ["1"]
    assert fourth.header("Nats-Expected-Stream") == ["H"]  # the stream option
    assert re.fullmatch(r"many:\d+:0", msg_id(fourth))

    # The stream option names the stream the messages must land in: another is refused.
    add_stream(natspy, "OTHER", ["other.>"])
    text = write_error(many, url, stream="OTHER")
    assert "PublishFailed: the stream refused a message: " in text
    assert "expected stream does not match" in text
    assert len(stored_messages(natspy, "H")) == 4 and not stored_messages(natspy, "OTHER")


def test_a_batch_write_run_again_with_its_prefix_stores_nothing_twice(
    js_spark: Any, nats_server: NatsServer, natspy: Any
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "DUP", ["dup.>"])
    url = nats_server.url
    df = js_spark.createDataFrame(
        [(f"dup.{i % 2}", f"{i}") for i in range(30)], "subject string, data string"
    ).repartition(2)
    write(df, url, msgIdPrefix="job-7")
    write(df, url, msgIdPrefix="job-7")  # the same job run again: the same ids
    stored = stored_messages(natspy, "DUP")
    assert len(stored) == 30
    assert sorted(int(m.data) for m in stored) == list(range(30))
    assert all(re.fullmatch(r"job-7:[01]:\d+", msg_id(m)) for m in stored)

    # Without a prefix, each write is a new one: stored again.
    write(df, url)
    assert len(stored_messages(natspy, "DUP")) == 60

    # msgIdColumn: rows identified by a value of theirs, whatever partition and order they come
    # in; the id column is not published.
    keyed = js_spark.createDataFrame(
        [(f"dup.k{i}", f"k{i}", f"key-{i}") for i in range(10)],
        "subject string, data string, id string",
    )
    write(keyed.coalesce(1), url, msgIdPrefix="keyed", msgIdColumn="id")
    write(keyed.repartition(3).orderBy("data"), url, msgIdPrefix="keyed", msgIdColumn="id")
    keyed_stored = [m for m in stored_messages(natspy, "DUP") if m.subject.startswith("dup.k")]
    assert sorted(msg_id(m) for m in keyed_stored) == sorted(f"keyed:key-{i}" for i in range(10))
    assert all(name in (MSG_ID,) for m in keyed_stored for name, _ in m.headers)


def test_rows_the_sink_cannot_write_are_refused_before_anything_is_published(
    js_spark: Any, nats_server: NatsServer, natspy: Any
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "BAD", ["bad.>"])
    url = nats_server.url

    def df(schema: str, row: tuple[Any, ...]) -> Any:
        return js_spark.createDataFrame([row], schema)

    text = write_error(df("subject string, data string, extra int", ("bad.x", "d", 1)), url)
    assert "jetstream option 'columns': the jetstream sink writes subject, data and headers" in text
    assert "the rows also have extra" in text
    text = write_error(df("subject string, payload string", ("bad.x", "d")), url)
    assert "the rows also have payload" in text
    text = write_error(df("subject string", ("bad.x",)), url)
    assert "jetstream option 'columns': the rows need a data column (binary or string)" in text
    text = write_error(df("subject string, data string", ("bad.x", "d")), url, subject="bad.y")
    assert "jetstream option 'subject': is set and the rows have a subject column too" in text
    text = write_error(df("data string", ("d",)), url)
    assert "jetstream option 'subject': the rows have no subject column" in text
    text = write_error(df("subject string, data int", ("bad.x", 1)), url)
    assert "data must be binary or string, not int" in text
    text = write_error(
        df("subject string, data string, headers map<string,int>", ("bad.x", "d", {"a": 1})), url
    )
    assert "headers must be map<string,string> or map<string,array<string>>" in text
    text = write_error(df("subject string, data string", ("bad.x", "d")), url, msgIdColumn="nope")
    assert "jetstream option 'msgIdColumn': names no column of the rows" in text
    text = write_error(df("subject string, data string", ("bad.x", "d")), url, msgIdPrefix="a:b")
    assert "jetstream option 'msgIdPrefix': may hold no spaces or ':'" in text
    text = write_error(df("subject string, data string", ("bad.x", "d")), url, maxInFlihgt="4")
    assert "jetstream option 'maxinflihgt': unknown option of the jetstream sink" in text
    text = write_error(df("subject string, data string", ("bad.x", "d")), "")
    assert "jetstream option 'servers': is required" in text
    with pytest.raises(Exception) as failed:
        df("subject string, data string", ("bad.x", "d")).write.format("jetstream").mode(
            "overwrite"
        ).option("servers", url).save()
    assert "use mode('append'), not overwrite" in error_text(failed.value)
    assert stored_messages(natspy, "BAD") == []


def test_a_subject_no_stream_captures_fails_the_write(
    js_spark: Any, nats_server: NatsServer, natspy: Any
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "SOME", ["some.>"])
    df = js_spark.createDataFrame(
        [("some.x", "1"), ("nowhere.x", "2")], "subject string, data string"
    ).coalesce(1)
    text = write_error(df, nats_server.url)
    assert "PublishFailed: the stream refused a message: " in text
    assert "no stream captures subject 'nowhere.x'" in text
    # A null subject fails too.
    nulls = js_spark.createDataFrame([(None, "1")], "subject string, data string")
    assert "a row has a null subject: every row needs one" in write_error(nulls, nats_server.url)


# -- streaming ------------------------------------------------------------------------------------


def stream_copy(spark: Any, url: str, checkpoint: Path, **source_options: str) -> Any:
    """Run (AvailableNow) a query copying stream SRC into DST, subjects ``src.*`` to ``dst.*``;
    the query once it ended."""
    from pyspark.sql import functions as F

    df = (
        spark.readStream.format("jetstream")
        .option("servers", url)
        .option("stream", "SRC")
        .option("startingOffsets", "earliest")
        .options(**source_options)
        .load()
        .select(F.regexp_replace("subject", "^src", "dst").alias("subject"), "data", "headers")
    )
    query = (
        df.writeStream.format("jetstream")
        .option("servers", url)
        .option("stream", "DST")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(QUERY_TIMEOUT), "the query did not end"
    finally:
        query.stop()
    return query


def forget_commit(checkpoint: Path, batch: int) -> None:
    """Remove the record that micro-batch ``batch`` was done (and its checksum file), as when
    the driver dies between publishing a batch and committing it."""
    (checkpoint / "commits" / str(batch)).unlink()
    (checkpoint / "commits" / f".{batch}.crc").unlink(missing_ok=True)


def batches(query: Any) -> list[tuple[int, int]]:
    """(batch id, rows) of each micro-batch that read something."""
    return [(p["batchId"], p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]


@pytest.mark.slow
def test_a_streaming_write_stores_each_row_once_across_reruns(
    js_spark: Any, nats_server: NatsServer, natspy: Any, tmp_path: Path
) -> None:
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "SRC", ["src.>"])
    add_stream(natspy, "DST", ["dst.>"])
    for i in range(25):
        publish(natspy, f"src.{i % 3}", b"m-%d" % i, {"X-Index": str(i)} if i % 2 else None)
    raw_publish(nats_server.url, "src.multi", [("X-Tag", "a"), ("X-Tag", "b")], b"m-25")
    url, checkpoint = nats_server.url, tmp_path / "checkpoint"

    def expected(n: int) -> Counter[tuple[str, bytes]]:
        src = stored_messages(natspy, "SRC")[:n]
        return Counter((m.subject.replace("src", "dst", 1), m.data) for m in src)

    first = stream_copy(js_spark, url, checkpoint, maxMessagesPerTrigger="10")
    assert batches(first) == [(0, 10), (1, 10), (2, 6)]
    dst = stored_messages(natspy, "DST")
    assert Counter((m.subject, m.data) for m in dst) == expected(26)
    ids = [msg_id(m) for m in dst]
    assert len(set(ids)) == 26
    query_id = str(first.id)
    assert all(re.fullmatch(rf"{query_id}:[012]:\d+:\d+", i) for i in ids), ids
    by_data = {m.data: m for m in dst}
    assert by_data[b"m-1"].header("X-Index") == ["1"]
    assert by_data[b"m-2"].header("X-Index") == []
    assert by_data[b"m-25"].header("X-Tag") == ["a", "b"]

    # The same query again: nothing new to read, nothing published.
    again = stream_copy(js_spark, url, checkpoint, maxMessagesPerTrigger="10")
    assert batches(again) == []
    assert len(stored_messages(natspy, "DST")) == 26

    # The driver "died" after batch 2 published and before Spark recorded it done: the batch
    # runs again on restart, with the same ids, and the stream drops every repeat.
    forget_commit(checkpoint, 2)
    rerun = stream_copy(js_spark, url, checkpoint, maxMessagesPerTrigger="10")
    assert batches(rerun) == [(2, 6)]
    assert [msg_id(m) for m in stored_messages(natspy, "DST")] == ids

    # New messages: only they are copied.
    for i in range(26, 33):
        publish(natspy, "src.new", b"m-%d" % i)
    more = stream_copy(js_spark, url, checkpoint, maxMessagesPerTrigger="10")
    assert batches(more) == [(3, 7)]
    dst = stored_messages(natspy, "DST")
    assert Counter((m.subject, m.data) for m in dst) == expected(33)
    assert len({msg_id(m) for m in dst}) == 33

    # A copy of the checkpoint is the same query: it stores nothing twice either.
    shutil.copytree(checkpoint, tmp_path / "copy")
    forget_commit(tmp_path / "copy", 3)
    stream_copy(js_spark, url, tmp_path / "copy", maxMessagesPerTrigger="10")
    assert len(stored_messages(natspy, "DST")) == 33


@pytest.mark.slow
def test_a_micro_batch_run_again_is_cut_into_the_same_partitions(
    js_spark: Any, nats_server: NatsServer, natspy: Any, tmp_path: Path
) -> None:
    """The ids of a streaming write name the partition and the row: a micro-batch run again
    must be read in the same partitions, even when the stream's messages grew bigger since
    (``partitionBytes`` cuts by the stream's average message size)."""
    connect_peer(natspy, nats_server.url)
    add_stream(natspy, "SRC", ["src.>"])
    add_stream(natspy, "DST", ["dst.>"])
    for i in range(20):
        publish(natspy, "src.small", b"s-%d" % i)
    url, checkpoint = nats_server.url, tmp_path / "checkpoint"
    first = stream_copy(js_spark, url, checkpoint, partitionBytes="600")
    assert batches(first) == [(0, 20)]
    ids = sorted(msg_id(m) for m in stored_messages(natspy, "DST"))
    assert len({i.split(":")[2] for i in ids}) > 1  # read by more than one task

    forget_commit(checkpoint, 0)
    for _ in range(5):
        publish(natspy, "src.big", b"B" * 20_000)
    rerun = stream_copy(js_spark, url, checkpoint, partitionBytes="600")
    assert batches(rerun)[0] == (0, 20)
    dst = stored_messages(natspy, "DST")
    assert sorted(msg_id(m) for m in dst[:20]) == ids
    assert Counter(m.data for m in dst) == Counter(
        [b"s-%d" % i for i in range(20)] + [b"B" * 20_000] * 5
    )
