"""Bronze ingest end to end on real Spark (local), the local Kafka broker and Delta on disk."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition as KTP

from helpers import assert_exactly_once, delta_log_entries, ingest, progress
from streamlake.pipeline.bronze import read_bronze
from streamlake.spark.checkpoint import QueryCheckpoint
from streamlake.delta.table import open_table
from streamlake.delta.txn import committed_offsets, first_offsets, last_batch_id
from streamlake.kafka.client import KafkaMetadataClient, client_config
from streamlake.kafka.offsets import TopicPartition as TP


def test_several_micro_batches_land_exactly_once(spark, produce, topic_name, lake):
    produce(topic_name, 6000, partitions=3, seed=7)
    summary = ingest(spark, lake, topic_name, max_offsets_per_trigger=1500)

    batches = progress(lake)
    assert summary["rows"] == 6000 and len(batches) >= 4
    assert all(b["numInputRows"] <= 1500 for b in batches), "maxOffsetsPerTrigger must hold (available-now)"
    report = assert_exactly_once(lake, topic_name, expected_rows=6000)
    assert len(report.partitions) == 3

    # One Delta commit per micro-batch, carrying the end offset of every partition as txn actions.
    commits = delta_log_entries(lake["table"])[1:]
    assert len(commits) == len(batches)
    table = open_table(lake["table"])
    tps = [TP(topic_name, p) for p in range(3)]
    with KafkaMetadataClient(client_config()) as kafka:
        assert committed_offsets(table, tps) == kafka.latest(tps)
    assert first_offsets(table, tps) == {tp: 0 for tp in tps}
    last = commits[-1]
    txns = {a["txn"]["appId"]: a["txn"]["version"] for a in last if "txn" in a}
    query_id = QueryCheckpoint(lake["checkpoint"]).query_id()
    assert txns[f"streamlake:query:{query_id}"] == batches[-1]["batchId"] == last_batch_id(table, query_id)


def test_bronze_table_reads_back_as_a_dataframe(spark, produce, topic_name, lake):
    produce(topic_name, 500, partitions=2, seed=3)
    ingest(spark, lake, topic_name)
    df = read_bronze(spark, lake["table"])
    types = dict(df.dtypes)
    assert types["key"] == "binary" and types["value"] == "binary" and types["offset"] == "bigint"
    assert types["partition"] == "int" and types["timestamp"] == "timestamp"
    assert types["ingest_time"] == "timestamp" and types["batch_id"] == "bigint" and types["ingest_date"] == "date"
    assert types["headers"].startswith("array<struct<key:string,value:binary>>")
    assert df.count() == 500
    assert df.select("topic", "partition", "offset").distinct().count() == 500
    row = df.where("offset = 0").orderBy("partition").first()
    assert row.key.decode().startswith("sensor-") and b'"event_id"' in row.value
    assert str(row.ingest_date) == row.ingest_time.date().isoformat()
    # Time travel: version 0 is the empty table.
    assert read_bronze(spark, lake["table"], version=0).count() == 0


def test_end_offsets_are_exact_on_batched_partitions_and_stop_at_an_open_transaction(broker, produce, topic_name):
    """latest() is one ListOffsets: on partitions of many-record batches (linger.ms=20) it is the
    high watermark, the records' count; with a transaction open it is the last stable offset under
    read_committed (the platform's default) and the high watermark under read_uncommitted."""
    from confluent_kafka import Producer

    produce(topic_name, 3000, partitions=3, seed=1)
    tps = [TP(topic_name, p) for p in range(3)]
    raw = Consumer({"bootstrap.servers": broker, "group.id": "raw", "isolation.level": "read_uncommitted"})
    high = {tp: raw.get_watermark_offsets(KTP(tp.topic, tp.partition), timeout=5)[1] for tp in tps}
    with KafkaMetadataClient(client_config()) as kafka:
        latest = kafka.latest(tps)
    assert sum(latest.values()) == 3000 and latest == high

    producer = Producer({"bootstrap.servers": broker, "transactional.id": f"open-{topic_name}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for _ in range(5):
        producer.produce(topic_name, b"in an open transaction", partition=0)
    producer.flush(30)
    tp0 = KTP(topic_name, 0)
    try:
        assert raw.get_watermark_offsets(tp0, timeout=5)[1] == high[tps[0]] + 5
        with KafkaMetadataClient(client_config()) as kafka:
            assert kafka.latest(tps) == latest, "read_committed: the open transaction's records are not readable yet"
        with KafkaMetadataClient(client_config({"kafka.isolation.level": "read_uncommitted"})) as kafka:
            assert kafka.latest(tps)[tps[0]] == high[tps[0]] + 5
    finally:
        producer.abort_transaction(30)
        raw.close()
    # The coordinator writes the abort marker after abort_transaction() returned: then the five
    # aborted records and the marker are behind the last stable offset.
    deadline = time.monotonic() + 30
    with KafkaMetadataClient(client_config()) as kafka:
        while (end := kafka.latest(tps)[tps[0]]) == high[tps[0]] and time.monotonic() < deadline:
            time.sleep(0.05)
    assert end == high[tps[0]] + 6, "the abort marker takes an offset"


def test_transaction_markers_are_skipped_and_audit_stays_exact(spark, broker, topic_name, lake):
    from confluent_kafka import Producer
    from streamlake.kafka.producer import ensure_topic

    ensure_topic(client_config(), topic_name, 2)
    producer = Producer({"bootstrap.servers": broker, "transactional.id": f"tx-{topic_name}"})
    producer.init_transactions(10)
    for txn in range(6):
        producer.begin_transaction()
        for i in range(50):
            producer.produce(topic_name, key=b"k%d" % i, value=b"txn %d record %d" % (txn, i), partition=i % 2)
        producer.commit_transaction(10)
    ingest(spark, lake, topic_name, max_offsets_per_trigger=120)
    report = assert_exactly_once(lake, topic_name, expected_rows=300)
    # Commit markers occupy offsets: the committed ranges are longer than the record counts.
    assert all(p.next_offset - p.first_offset > p.kafka_records for p in report.partitions)


def test_processing_time_trigger_honours_the_read_limit(spark, produce, topic_name, lake):
    from streamlake.pipeline.ingest import IngestConfig, start_ingest

    produce(topic_name, 2400, partitions=3, seed=5)
    run = start_ingest(spark, IngestConfig(table=lake["table"], checkpoint=lake["checkpoint"], topics=(topic_name,),
                                           processing_time_s=0.2, max_offsets_per_trigger=400))
    tps = [TP(topic_name, p) for p in range(3)]
    deadline = time.monotonic() + 120
    sizes: list[int] = []
    try:
        while time.monotonic() < deadline:
            assert run.query.exception() is None
            # Progress is published after the sink returns: wait for the table and the report.
            sizes = [p["numInputRows"] for p in run.query.recentProgress if p["numInputRows"]]
            if sum(sizes) == 2400 and sum(committed_offsets(open_table(lake["table"]), tps).values()) == 2400:
                break
            time.sleep(0.5)
    finally:
        run.query.stop()
    assert sum(sizes) == 2400 and len(sizes) >= 6 and max(sizes) <= 400, sizes
    assert_exactly_once(lake, topic_name, expected_rows=2400)


def test_lost_checkpoint_resumes_from_the_tables_offsets(spark, produce, topic_name, lake, tmp_path):
    import shutil

    produce(topic_name, 1500, partitions=3, seed=11)
    ingest(spark, lake, topic_name, max_offsets_per_trigger=1000)
    shutil.rmtree(lake["checkpoint"])
    produce(topic_name, 900, partitions=3, seed=12)
    summary = ingest(spark, lake, topic_name)  # new checkpoint, startingOffsets=earliest
    assert summary["rows"] == 900, "only the new records: the table's offsets win over startingOffsets"
    assert_exactly_once(lake, topic_name, expected_rows=2400)


def test_min_partitions_splits_ranges_across_tasks(spark, produce, topic_name, lake):
    produce(topic_name, 1200, partitions=2, seed=2)
    ingest(spark, lake, topic_name, min_partitions=6)
    adds = [a for a in delta_log_entries(lake["table"])[1] if "add" in a]
    assert len(adds) >= 6, "each split is a task writing its own file"
    assert_exactly_once(lake, topic_name, expected_rows=1200)


def test_explicit_starting_offsets_define_the_audited_range(spark, produce, topic_name, lake):
    produce(topic_name, 900, partitions=3, seed=4)
    start = '{"%s": {"0": 100, "1": -2, "2": -1}}' % topic_name
    ingest(spark, lake, topic_name, starting_offsets=start)
    report = assert_exactly_once(lake, topic_name)
    firsts = {p.partition: p.first_offset for p in report.partitions}
    assert firsts[0] == 100 and firsts[1] == 0 and firsts[2] == report.partitions[2].next_offset


def test_starting_timestamp_starts_at_the_first_record_at_or_after_it(spark, produce, topic_name, lake, tmp_path):
    from streamlake.errors import InvalidOptionError

    produce(topic_name, 300, partitions=2, seed=8)
    time.sleep(1.2)
    middle = int(time.time() * 1000)
    time.sleep(0.3)
    produce(topic_name, 200, partitions=2, seed=9)
    summary = ingest(spark, lake, topic_name, starting_timestamp=middle)
    assert summary["rows"] == 200
    report = assert_exactly_once(lake, topic_name, expected_rows=200)
    assert sum(p.first_offset for p in report.partitions) == 300

    future = int(time.time() * 1000) + 3_600_000  # after every record: no start offset exists
    with pytest.raises(InvalidOptionError, match="no record at or after startingTimestamp"):
        ingest(spark, {"table": str(tmp_path / "t2"), "checkpoint": str(tmp_path / "c2")}, topic_name,
               starting_timestamp=future)
