"""Topics written the way a real-time producer writes them: one record per record batch, while the job runs.

Bulk-produced test data (a few large record batches) hides how a live topic
looks to Kafka: tens of thousands of tiny record batches, still growing while
they are read. (Issue 6 found on the running demo that Tansu, the embedded
broker until 2026-12-06, starved readers of such topics; Apache Kafka does not,
and these tests keep the platform honest on them.) They use the
``live_producer`` fixture (librdkafka ``linger.ms=0``, ``batch.num.messages=1``,
in a background thread) and real Spark, the local Kafka broker and Delta on disk.
"""

from __future__ import annotations

import time
import uuid

import pytest
from helpers import assert_exactly_once
from streamlake.delta.table import open_table, table_exists
from streamlake.delta.txn import committed_offsets
from streamlake.kafka.client import KafkaMetadataClient, client_config
from streamlake.kafka.offsets import OffsetRange
from streamlake.kafka.offsets import TopicPartition as TP
from streamlake.kafka.reader import read_range
from streamlake.pipeline.ingest import IngestConfig, batch_progress, start_ingest

LIVE_RECORDS = 60_000
LIVE_PARTITIONS = 3
LIVE_RATE = 2_000  # records/s: 30 s of production, read by the job while it is written
INGEST_LIMIT_S = 180


def _committed(table: str, tps: list[TP]) -> int:
    return sum(committed_offsets(open_table(table), tps).values()) if table_exists(table) else 0


def test_60k_records_written_one_per_batch_while_the_job_runs_land_exactly_once_within_3_minutes(
        spark, broker, live_producer, topic_name, lake):
    from streamlake.kafka.producer import ensure_topic

    ensure_topic(client_config(), topic_name, LIVE_PARTITIONS)  # the job subscribes before any record exists
    tps = [TP(topic_name, p) for p in range(LIVE_PARTITIONS)]
    run = start_ingest(spark, IngestConfig(table=lake["table"], checkpoint=lake["checkpoint"], topics=(topic_name,),
                                           processing_time_s=1.0, max_offsets_per_trigger=20_000))
    producer = live_producer(topic_name, partitions=LIVE_PARTITIONS, count=LIVE_RECORDS, rate=LIVE_RATE, seed=6)
    started = time.monotonic()
    deadline = started + INGEST_LIMIT_S
    committed = 0
    samples: list[tuple[float, int, int]] = []  # (seconds, delivered, committed)
    try:
        while time.monotonic() < deadline:
            assert run.query.exception() is None, run.query.exception()
            committed = _committed(lake["table"], tps)
            samples.append((round(time.monotonic() - started, 1), producer.delivered, committed))
            if not producer.running and committed >= LIVE_RECORDS:
                break
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        batches = [batch_progress(p, run.sink) for p in run.query.recentProgress if p["numInputRows"]]
    finally:
        run.query.stop()
        producer.stop(check=False)

    print(f"\nproducer: {producer.delivered:,} one-record batches delivered in {producer.seconds:.1f} s; "
          f"job: {committed:,} committed {elapsed:.1f} s after the producer started")
    for b in batches:
        print(f"  batch {b['batchId']}: {b['numInputRows']:,} rows in {b['durationMs']:,} ms, "
              f"lag after it {sum(b['lag'].values()):,}")
    print("  (seconds, delivered, committed):", samples[::max(1, len(samples) // 15)] + samples[-1:])
    assert committed == LIVE_RECORDS, (
        f"only {committed:,} of {LIVE_RECORDS:,} live-written records were ingested within {INGEST_LIMIT_S} s "
        f"({producer.delivered:,} delivered: a broker kept busy by starving fetches slows the producer too)")
    assert producer.delivered == LIVE_RECORDS
    assert elapsed <= INGEST_LIMIT_S
    assert len(batches) >= 3, "the job read the topic while it was being written, in several micro-batches"
    assert max(b["numInputRows"] for b in batches) <= 20_000
    assert_exactly_once(lake, topic_name, expected_rows=LIVE_RECORDS)


# The two reader tests share one topic: 2 partitions written one record per batch, as fast as
# the producer can, still written while they run (producing it is most of their time).
SHARED_PARTITIONS = 2
SHARED_BATCHES_PER_PARTITION = 40_000


@pytest.fixture(scope="module")
def live_topic(broker):
    """A running LiveProducer (unbounded, one record per batch) of a topic of SHARED_PARTITIONS
    partitions; stopped at the module's end (or by a test that needs the final ends)."""
    from conftest import LiveProducer

    producer = LiveProducer(broker, f"t-{uuid.uuid4().hex[:10]}", SHARED_PARTITIONS).start()
    yield producer
    producer.stop(check=False)


def test_reading_the_middle_of_a_partition_of_40k_one_record_batches_is_fast(live_topic):
    """[15,000, 25,000) of a partition of 40,000 one-record batches (and more: the producer is
    still writing to it), read by the platform's reader with its default fetch wait: every
    offset once, in order, at least 1,000 records a second, a bound against a collapse (on Tansu
    a 10 ms wait read none in 3 s; on Apache Kafka 4.1 this read 18,700-53,000 a second, 2026-12-06)."""
    producer, topic_name = live_topic, live_topic.topic
    producer.wait_delivered(SHARED_PARTITIONS * SHARED_BATCHES_PER_PARTITION, timeout_s=180)
    conf = client_config()
    rng = OffsetRange(topic_name, 0, 15_000, 25_000)
    expected = list(range(rng.start, rng.end))
    started = time.monotonic()
    offsets = []
    for batch in read_range(conf, rng, poll_timeout_ms=30_000, fail_on_data_loss=True):
        offsets.extend(batch.column("offset").to_pylist())
    seconds = time.monotonic() - started
    rate = len(offsets) / seconds
    print(f"\n[{rng.start}, {rng.end}) of 40,000 one-record batches: read {len(offsets):,} in {seconds:.2f} s "
          f"({rate:,.0f}/s)")
    assert offsets == expected
    assert rate >= 1_000, f"{rate:,.0f} records/s"


def test_end_probes_on_a_live_topic_answer_quickly_with_real_positions(live_topic):
    """KafkaMetadataClient.latest (one ListOffsets) while a producer writes one record per batch
    as fast as it can: every call returns within two seconds with a real end: at least what was
    delivered before the call, at most what was sent when it returned, never moving back, and
    following the topic as it grows; once the producer stopped, exactly what was delivered."""
    producer, topic_name, partitions = live_topic, live_topic.topic, SHARED_PARTITIONS
    assert producer.running, "the shared producer still writes"
    producer.wait_delivered(partitions * SHARED_BATCHES_PER_PARTITION)  # one-record batches, and growing
    tps = [TP(topic_name, p) for p in range(partitions)]
    calls: list[tuple[float, dict]] = []
    with KafkaMetadataClient(client_config()) as kafka:
        previous = {tp: 0 for tp in tps}
        for _ in range(8):
            time.sleep(0.2)  # the topic grows between calls
            delivered_before = list(producer.delivered_per_partition)
            started = time.monotonic()
            ends = kafka.latest(tps)
            seconds = time.monotonic() - started
            sent_after = list(producer.sent_per_partition)
            calls.append((round(seconds, 2), ends))
            for tp in tps:
                assert delivered_before[tp.partition] <= ends[tp] <= sent_after[tp.partition], (tp, ends, calls)
                assert ends[tp] >= previous[tp], "an end never moves back"
            assert seconds < 2.0, f"end probe took {seconds:.2f} s on a live topic: {calls}"
            previous = ends
        assert producer.running
        assert all(calls[-1][1][tp] > calls[0][1][tp] for tp in tps), f"probed while the topic grew: {calls}"
        producer.stop()
        settled = kafka.latest(tps)
    print(f"\n{producer.delivered:,} records produced in {producer.seconds:.1f} s; calls (s, ends): {calls}")
    assert settled == {tp: producer.delivered_per_partition[tp.partition] for tp in tps}, \
        "once the producer stopped, the probe finds the exact end"
