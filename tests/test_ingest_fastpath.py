"""Bronze's fast path (issue 11): the Kafka source's read tasks write the attempt's Parquet files.

Real Spark (local), the local Kafka broker and Delta on disk. The exactly-once
machinery around it (crash points, races, replays) is the same two-phase
commit and is covered by test_crash_recovery.py and test_failures.py, which
run the bronze job with this writer (the default).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from helpers import assert_exactly_once, delta_log_entries, ingest, progress
from streamlake.storage.data_files import (
    AttemptFileWriter,
    FileTarget,
    data_file_from_json,
    data_file_to_json,
    describe_file,
)
from streamlake.errors import InvalidOptionError
from streamlake.kafka.offsets import OffsetRange, TopicPartition
from streamlake.kafka.reader import KAFKA_ARROW_SCHEMA
from streamlake.kafka.source import FilesContext, KafkaSourceOptions, pack_ranges, warm_up
from streamlake.pipeline import bronze

KAFKA_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]


def _produce_with_headers(broker: str, topic: str, count: int, partitions: int = 3) -> None:
    from confluent_kafka import Producer

    from streamlake.kafka.client import client_config
    from streamlake.kafka.producer import ensure_topic

    ensure_topic(client_config(), topic, partitions)
    producer = Producer({"bootstrap.servers": broker, "linger.ms": 5})
    for i in range(count):
        headers = [("trace", b"t-%d" % i), ("empty", None)] if i % 3 == 0 else None
        producer.produce(topic, key=None if i % 7 == 0 else b"k%d" % (i % 11), value=b"v" * (i % 50) + b"%d" % i,
                         partition=i % partitions, headers=headers)
    assert producer.flush(30) == 0


def test_read_tasks_write_the_files_and_every_record_lands_once(spark, produce, topic_name, lake):
    produce(topic_name, 3000, partitions=3, seed=41)
    summary = ingest(spark, lake, topic_name, max_offsets_per_trigger=1000)

    batches = progress(lake)
    assert summary["rows"] == 3000 and len(batches) == 3
    # Spark's own numInputRows still counts Kafka records (one row per record written).
    assert [b["numInputRows"] for b in batches] == [1000, 1000, 1000]
    assert all(b["sinkMs"]["write"] >= 0 for b in batches)
    assert_exactly_once(lake, topic_name, expected_rows=3000)

    commits = delta_log_entries(lake["table"])[1:]
    assert len(commits) == 3
    for commit in commits:
        info = next(a["commitInfo"]["streamlake"] for a in commit if "commitInfo" in a)
        adds = [a["add"] for a in commit if "add" in a]
        assert adds
        for add in adds:
            # <partition>/attempt-<id>/part-...: the attempt directory of this commit, written by pyarrow.
            assert f"/attempt-{info['attempt']}/part-{topic_name}-" in add["path"], add["path"]
            path = Path(lake["table"]) / add["path"]
            assert pq.read_metadata(path).created_by.startswith("parquet-cpp-arrow")
            data = pq.read_table(path)
            assert data.column_names == bronze.BRONZE.file_schema.names
            stats = json.loads(add["stats"])
            offsets = data.column("offset").to_pylist()
            assert stats["numRecords"] == data.num_rows == len(offsets)
            assert stats["minValues"]["offset"] == min(offsets) and stats["maxValues"]["offset"] == max(offsets)
            assert stats["minValues"]["topic"] == stats["maxValues"]["topic"] == topic_name
            assert stats["minValues"]["partition"] == stats["maxValues"]["partition"]
            assert set(data.column("batch_id").to_pylist()) == {info["batchId"]}
            assert add["partitionValues"]["ingest_date"] == data.column("ingest_time")[0].as_py().date().isoformat()


def test_the_fast_path_writes_exactly_the_rows_spark_s_writer_writes(spark, broker, topic_name, tmp_path):
    _produce_with_headers(broker, topic_name, 900)
    lakes = {w: {"table": str(tmp_path / w / "bronze"), "checkpoint": str(tmp_path / w / "ck")}
             for w in ("source", "spark")}
    for writer, lake in lakes.items():
        ingest(spark, lake, topic_name, max_offsets_per_trigger=400, writer=writer)
        assert_exactly_once(lake, topic_name, expected_rows=900)
    frames = {w: bronze.read_bronze(spark, lake["table"]) for w, lake in lakes.items()}
    assert frames["source"].dtypes == frames["spark"].dtypes

    def rows(df):
        return sorted((tuple(r) for r in df.select(*KAFKA_COLUMNS, "batch_id").collect()), key=lambda r: r[2:5])

    fast, slow = rows(frames["source"]), rows(frames["spark"])
    assert fast == slow
    with_headers = [r for r in fast if r[7]]
    assert len(with_headers) == 300 and all(h["key"] == "trace" for r in with_headers for h in r[7][:1])
    assert any(r[0] is None for r in fast), "null keys survive"
    # ingest_time is the batch's time, one per batch, as with Spark's writer.
    per_batch = frames["source"].groupBy("batch_id").agg({"ingest_time": "count"}).count()
    assert per_batch == frames["source"].select("batch_id", "ingest_time").distinct().count()


def test_files_mode_needs_the_sink_and_says_so(spark, produce, topic_name, tmp_path):
    produce(topic_name, 50, partitions=1, seed=3)
    query = (spark.readStream.format("streamlake-kafka").option("subscribe", topic_name)
             .option("startingOffsets", "earliest").option("output", "files").load()
             .writeStream.option("checkpointLocation", str(tmp_path / "ck"))
             .foreachBatch(lambda df, _id: df.collect()).trigger(availableNow=True).start())
    with pytest.raises(Exception, match="runs only under the bronze sink"):
        query.awaitTermination(120)
    assert not list(Path(tmp_path).rglob("*.parquet")), "nothing written without an attempt to write into"


def test_the_public_source_keeps_spark_s_kafka_schema(spark, produce, topic_name):
    produce(topic_name, 10, partitions=1, seed=4)
    df = spark.readStream.format("streamlake-kafka").option("subscribe", topic_name).load()
    assert df.columns == KAFKA_COLUMNS
    files = spark.readStream.format("streamlake-kafka").option("subscribe", topic_name).option("output", "FILES").load()
    assert files.columns == ["file"]
    with pytest.raises(InvalidOptionError, match="output must be one of rows, files"):
        KafkaSourceOptions.parse({"subscribe": topic_name, "output": "parquet"})
    assert KafkaSourceOptions.parse({"subscribe": topic_name}).output == "rows"


def test_ranges_are_cut_into_evenly_loaded_tasks_of_distinct_partitions():
    ranges = [OffsetRange("t", p, 100 * p, 100 * p + n) for p, n in enumerate([21860, 17225, 12410, 14103, 18772, 5])]
    total = sum(r.size for r in ranges)
    for tasks in (1, 2, 3, 4, 6, 7, 12):
        groups = pack_ranges(ranges, tasks)
        assert len(groups) == tasks
        sizes = [sum(r.size for r in g) for g in groups]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == total
        for g in groups:
            assert len({(r.topic, r.partition) for r in g}) == len(g)
        # Together the pieces are exactly the ranges: contiguous, no overlap, no gap.
        pieces = sorted((r.partition, r.start, r.end) for g in groups for r in g)
        for rng in ranges:
            mine = [(s, e) for p, s, e in pieces if p == rng.partition]
            assert mine[0][0] == rng.start and mine[-1][1] == rng.end
            assert all(a[1] == b[0] for a, b in zip(mine, mine[1:]))
    assert pack_ranges(ranges, None) == [[r] for r in ranges]
    assert len(pack_ranges([OffsetRange("t", 0, 5, 8)], 6)) == 3, "never more tasks than offsets"


def test_files_context_tells_a_task_what_the_table_still_needs(tmp_path):
    target = FileTarget(str(tmp_path), "d=1/attempt-x", ("a",), {"batch_id": ("int64", 3)}, ("a",), {"d": "1"})
    context = FilesContext(target, {TopicPartition("t", 0): 150, TopicPartition("t", 1): -1})
    again = FilesContext.from_json(context.to_json())
    assert again == context
    assert again.first_offset(OffsetRange("t", 0, 100, 200)) == 150  # a racing writer committed [100, 150)
    assert again.first_offset(OffsetRange("t", 0, 100, 150)) is None  # all of it committed already
    assert again.first_offset(OffsetRange("t", 1, 7, 9)) == 7  # new partition: from the range's start
    assert again.first_offset(OffsetRange("t", 2, 0, 9)) is None  # not in the plan: already in the table


def test_task_written_files_describe_themselves_like_footers_do(tmp_path):
    import pyarrow as pa

    columns = tuple(KAFKA_ARROW_SCHEMA.names) + ("ingest_time", "batch_id")
    target = FileTarget(str(tmp_path), "ingest_date=2026-11-22/attempt-abc", columns,
                        bronze.file_constants(4, 1_795_000_000_123), bronze.STATS_COLUMNS,
                        {"ingest_date": "2026-11-22"})
    n = 5
    batch = pa.record_batch([
        pa.array([b"k"] * n), pa.array([b"v%d" % i for i in range(n)]), pa.array(["tp"] * n),
        pa.array([2] * n, pa.int32()), pa.array(range(40, 40 + n), pa.int64()),
        pa.array([1_795_000_000_000_000] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array([0] * n, pa.int32()), pa.nulls(n, KAFKA_ARROW_SCHEMA.field("headers").type),
    ], schema=KAFKA_ARROW_SCHEMA)
    writer = AttemptFileWriter(target, "part-x.parquet")
    writer.write(batch)
    writer.write(batch.slice(0, 2))
    described = writer.close()
    assert described.num_records == 7 and (described.topic, described.partition, described.min_offset) == ("tp", 2, 40)
    assert json.loads(described.stats) == json.loads(
        describe_file(str(tmp_path), described.path, bronze.STATS_COLUMNS).stats)
    assert data_file_from_json(data_file_to_json(described)) == described
    table = pq.read_table(tmp_path / described.path)
    assert table.column("batch_id").to_pylist() == [4] * 7
    assert set(table.column("ingest_time").to_pylist()) == {bronze.ingest_time(1_795_000_000_123)}
    assert AttemptFileWriter(target, "empty.parquet").close() is None
    assert not (tmp_path / target.directory / "empty.parquet").exists()


def test_warm_up_starts_the_python_workers_once_per_session(spark):
    first = warm_up(spark, force=True)
    assert first["tasks"] == spark.sparkContext.defaultParallelism and first["workers"] >= 1
    assert warm_up(spark) is None, "once per SparkContext"


def test_a_warm_up_begun_in_the_background_is_awaited_by_the_query_not_repeated(spark, monkeypatch):
    from streamlake.kafka import source

    monkeypatch.setattr(source, "_warmed", set())  # as in a job's new session
    monkeypatch.setattr(source, "_background", {})
    source.warm_up_in_background(spark)
    source.warm_up_in_background(spark)
    assert len(source._background) == 1, "one warm-up per SparkContext"
    awaited = warm_up(spark)
    assert awaited["tasks"] == spark.sparkContext.defaultParallelism and awaited["workers"] >= 1
    assert not source._background and warm_up(spark) is None

    def broken(*_args):
        raise RuntimeError("no executors")

    monkeypatch.setattr(source, "_warmed", set())
    monkeypatch.setattr(source, "_run_warm_up", broken)
    source.warm_up_in_background(spark)
    with pytest.raises(RuntimeError, match="no executors"):
        warm_up(spark)  # what the background warm-up raised fails the query's start, as before


def test_the_writer_flag_round_trips():
    import argparse

    from streamlake.pipeline.ingest import IngestConfig, add_ingest_arguments, config_from_args, config_to_args

    parser = argparse.ArgumentParser()
    add_ingest_arguments(parser)
    for writer in ("source", "spark"):
        cfg = IngestConfig(table="/t", checkpoint="/c", topics=("a",), writer=writer)
        assert config_from_args(parser.parse_args(config_to_args(cfg))) == cfg
    assert IngestConfig(table="/t", checkpoint="/c", topics=("a",)).source_options()["output"] == "files"
    assert "output" not in IngestConfig(table="/t", checkpoint="/c", topics=("a",), writer="spark").source_options()
    with pytest.raises(InvalidOptionError):
        IngestConfig(table="/t", checkpoint="/c", topics=("a",), writer="jvm")
