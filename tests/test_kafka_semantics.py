"""Exactly once across what only a real broker does: transactions, retention, compaction, a
recreated topic (Apache Kafka 4.1, KRaft, the session's broker).

Every test produces while the pipeline runs (a continuous ingest in the background, or
available-now runs between produce steps) and computes what bronze must hold itself: from
what the broker acknowledged to the test's producers, or from a consumer of the test's own.
The proofs are the platform's: the full audit (``audit_offsets``) and the consistency check
``streamlake check`` runs (``check_consistency``: incremental from the ledger's proofs).
Topics are per test; the session's broker is never restarted.
"""

from __future__ import annotations

import datetime as dt
import functools
import threading
import time
from types import SimpleNamespace

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KTP
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from helpers import ingest
from streamlake.delta.table import open_table
from streamlake.delta.txn import committed_offsets
from streamlake.errors import DataLossError
from streamlake.kafka.offsets import TopicPartition as TP
from streamlake.operations.audit import audit_offsets
from streamlake.operations.consistency import check_consistency
from streamlake.pipeline.driver import describe_failure
from streamlake.pipeline.ingest import request_stop

# -- the test's own view of Kafka ------------------------------------------------------------


def admin(broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker})


def create_topic(broker, topic: str, partitions: int, **config) -> None:
    """Create ``topic``; ``config`` as topic settings (``segment_ms=100``: ``segment.ms``)."""
    client = admin(broker)
    new = NewTopic(topic, partitions, 1, config={k.replace("_", "."): str(v) for k, v in config.items()})
    client.create_topics([new], request_timeout=30)[topic].result(30)


def watermarks(broker, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """(log start, high watermark) per partition, as the broker answers now."""
    consumer = Consumer({"bootstrap.servers": broker, "group.id": "semantics-watermarks"})
    try:
        return {p: consumer.get_watermark_offsets(KTP(topic, p), timeout=10) for p in range(partitions)}
    finally:
        consumer.close()


def read_kafka(broker, topic: str, partitions: int) -> dict[tuple[int, int], tuple[bytes | None, bytes | None]]:
    """Every record a read_committed consumer of the test's own gets, from each partition's log
    start to its end: {(partition, offset): (key, value)}."""
    consumer = Consumer({"bootstrap.servers": broker, "group.id": "semantics-reader", "enable.partition.eof": True,
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "error", "fetch.wait.max.ms": 10})
    ends = {p: hi for p, (_lo, hi) in watermarks(broker, topic, partitions).items()}
    consumer.assign([KTP(topic, p, -2) for p in range(partitions)])  # OFFSET_BEGINNING
    out: dict = {}
    done: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while len(done) < partitions:
            assert time.monotonic() < deadline, f"could not read {topic} to its end ({done} done)"
            for msg in consumer.consume(1000, timeout=0.05):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[msg.partition()]:
                        done.add(msg.partition())
                    continue
                out[(msg.partition(), msg.offset())] = (msg.key(), msg.value())
    finally:
        consumer.close()
    return out


class Acked:
    """What a producer of the test's own had acknowledged: (partition, offset) -> (key, value)."""

    def __init__(self):
        self.records: dict[tuple[int, int], tuple[bytes | None, bytes | None]] = {}
        self.errors: list[str] = []

    def callback(self, key, value, err, msg) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.records[(msg.partition(), msg.offset())] = (key, value)


def plain_producer(broker) -> Producer:
    """An idempotent producer sending every record as a record batch of its own."""
    return Producer({"bootstrap.servers": broker, "enable.idempotence": True, "acks": "all", "linger.ms": 0,
                     "batch.num.messages": 1})


_PRODUCERS: dict[tuple[str, str], Producer] = {}


def topic_producer(broker, topic: str) -> Producer:
    """The plain producer of ``topic`` (a new idempotent producer first waits for its producer
    id). One per topic: an idempotent producer's sequence numbers are its own business with a
    partition, and a topic deleted under it would have it bump its epoch for all of them."""
    if (broker, topic) not in _PRODUCERS:
        _PRODUCERS[(broker, topic)] = plain_producer(broker)
    return _PRODUCERS[(broker, topic)]


@pytest.fixture(autouse=True, scope="module")
def _producers_closed():
    """The topics' producers go with the module (not left to reconnect to a stopped broker)."""
    yield
    for producer in _PRODUCERS.values():
        producer.flush(10)
    _PRODUCERS.clear()


def produce_acked(broker, topic: str, records, acked: Acked | None = None, producer: Producer | None = None) -> Acked:
    """Produce ``records`` ((partition, key, value[, timestamp ms]) each), one at a time, and wait
    for every acknowledgement."""
    acked = acked or Acked()
    producer = producer or topic_producer(broker, topic)
    for partition, key, value, *ts in records:
        producer.produce(topic, key=key, value=value, partition=partition, timestamp=ts[0] if ts else 0,
                         on_delivery=functools.partial(acked.callback, key, value))
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not acked.errors, acked.errors
    return acked


def wait_for(what: str, condition, timeout_s: float = 60.0, every_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout_s:g} s")
        time.sleep(every_s)


# -- the table's side ------------------------------------------------------------------------


def bronze_rows(lake) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every bronze row, sorted."""
    table = open_table(lake["table"]).to_pyarrow_table(columns=["partition", "offset", "key", "value"])
    return sorted(zip(*(table.column(c).to_pylist() for c in ("partition", "offset", "key", "value"))))


def bronze_records(lake) -> dict[tuple[int, int], tuple[bytes | None, bytes | None]]:
    """Bronze rows as {(partition, offset): (key, value)}; fails if an offset is there twice."""
    rows = bronze_rows(lake)
    records = {(p, o): (k, v) for p, o, k, v in rows}
    assert len(records) == len(rows), "a (partition, offset) is in bronze more than once"
    return records


def committed(lake, topic: str, partitions: int) -> dict[int, int]:
    table = open_table(lake["table"])
    return {tp.partition: off for tp, off in committed_offsets(table, [TP(topic, p) for p in range(partitions)]).items()}


def job_for(lake, topic):
    """What a check needs of a job: its name, table, topics and Kafka options."""
    return SimpleNamespace(name=f"job-{topic}", table=lake["table"], topics=[topic], source_topics=[topic], kafka={})


class BackgroundIngest:
    """The bronze ingest with a processing-time trigger, running in a thread of the test while it
    produces; :meth:`stop` asks it to stop at a micro-batch boundary (as the CLI does)."""

    def __init__(self, spark, lake, topic, **kwargs):
        self.lake = lake
        self.summary: dict | None = None
        self.error: BaseException | None = None
        kwargs.setdefault("processing_time_s", 0.3)
        self._thread = threading.Thread(target=self._run, args=(spark, lake, topic), kwargs=kwargs, daemon=True,
                                        name=f"ingest-{topic}")
        self._thread.start()

    def _run(self, spark, lake, topic, **kwargs):
        try:
            self.summary = ingest(spark, lake, topic, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            self.error = exc

    def check(self) -> None:
        if self.error is not None:
            raise self.error
        assert self._thread.is_alive(), "the ingest ended by itself"

    def stop(self) -> dict:
        request_stop(self.lake["checkpoint"])
        self._thread.join(120)
        assert not self._thread.is_alive(), "the ingest did not stop"
        if self.error is not None:
            raise self.error
        return self.summary


def wait_ingested(lake, topic, partitions, ends: dict[int, int], background: BackgroundIngest | None = None,
                  timeout_s: float = 60.0) -> None:
    """Wait until bronze has committed every partition up to ``ends``."""
    def done():
        if background is not None:
            background.check()
        try:
            have = committed(lake, topic, partitions)
        except Exception:  # noqa: BLE001 - the table is not created yet
            return False
        return all(have.get(p, -1) >= end for p, end in ends.items())

    wait_for(f"bronze committing {ends}", done, timeout_s, every_s=0.2)


# -- 1. transactions ---------------------------------------------------------------------------


def test_transactions_committed_and_aborted_across_partitions_while_the_ingest_runs(
        spark, broker, topic_name, lake):
    partitions = 3
    create_topic(broker, topic_name, partitions)
    background = BackgroundIngest(spark, lake, topic_name, max_offsets_per_trigger=150)
    tx = Producer({"bootstrap.servers": broker, "transactional.id": f"tx-{topic_name}", "linger.ms": 0,
                   "batch.num.messages": 1})
    tx.init_transactions(30)
    plain = plain_producer(broker)
    plain_acked, tx_acked = Acked(), Acked()
    committed_records: dict = {}
    aborted_values: list[bytes] = []
    committed_txns = aborted_txns = 0
    try:
        for txn in range(12):
            abort = txn % 3 == 1
            tx.begin_transaction()
            pending = Acked()
            for i in range(30):
                # Every transaction spans every partition, records interleaved with plain ones.
                value = b"txn %d record %d%s" % (txn, i, b" (aborted)" if abort else b"")
                tx.produce(topic_name, key=b"t%d" % i, value=value, partition=i % partitions,
                           on_delivery=functools.partial(pending.callback, b"t%d" % i, value))
                plain_value = b"plain %d-%d" % (txn, i)
                plain.produce(topic_name, key=b"p%d" % i, value=plain_value, partition=(i + txn) % partitions,
                              on_delivery=functools.partial(plain_acked.callback, b"p%d" % i, plain_value))
                tx.poll(0)
                plain.poll(0)
                time.sleep(0.003)
            if abort:
                tx.flush(30)  # the aborted records are in the log (they take offsets), then aborted
                tx.abort_transaction(30)
                aborted_values += [v for _k, v in pending.records.values()]
                aborted_txns += 1
            else:
                tx.flush(30)
                tx.commit_transaction(30)
                committed_records.update(pending.records)
                committed_txns += 1
            tx_acked.records.update(pending.records)
        assert plain.flush(30) == 0 and not plain_acked.errors and not tx_acked.errors
        assert aborted_values, "aborted records were written to the log before their abort"
        expected = {**committed_records, **plain_acked.records}
        ends = {p: hi for p, (_lo, hi) in watermarks(broker, topic_name, partitions).items()}
        wait_ingested(lake, topic_name, partitions, ends, background)
    finally:
        summary = background.stop()

    assert summary["batches"] >= 3, f"the ingest read the topic while it was written: {summary}"
    held = bronze_records(lake)
    assert held == expected, (f"bronze {len(held)} records, expected {len(expected)}; missing "
                              f"{sorted(set(expected) - set(held))[:5]}, extra {sorted(set(held) - set(expected))[:5]}")
    assert not {v for _k, v in held.values()} & set(aborted_values), "aborted records reached bronze"
    assert read_kafka(broker, topic_name, partitions) == expected, "the test's own consumer reads the same"
    # Transaction markers and aborted records leave offsets without records: the committed
    # ranges are longer than what they hold, and the audit passes over those gaps.
    assert committed(lake, topic_name, partitions) == ends
    report = audit_offsets(lake["table"], [topic_name])
    assert report.exactly_once, report.summary()
    assert report.totals()["table_rows"] == report.totals()["kafka_records"] == len(expected)
    gaps = sum(p.next_offset - p.first_offset for p in report.partitions) - len(expected)
    assert gaps == len(aborted_values) + partitions * (committed_txns + aborted_txns), \
        "every offset without a record is an aborted record or a marker"
    result = check_consistency(job_for(lake, topic_name), "transactions")
    assert result.passed, result.summary


def test_an_open_transaction_holds_an_available_now_run_at_the_last_stable_offset(
        spark, broker, topic_name, lake):
    partitions = 2
    create_topic(broker, topic_name, partitions)
    plain = plain_producer(broker)
    before = produce_acked(broker, topic_name, [(i % partitions, b"a%d" % i, b"before %d" % i) for i in range(40)],
                           producer=plain)
    tx = Producer({"bootstrap.servers": broker, "transactional.id": f"tx-{topic_name}", "linger.ms": 0})
    tx.init_transactions(30)
    tx.begin_transaction()
    in_txn = Acked()
    for i in range(20):
        value = b"open txn %d" % i
        tx.produce(topic_name, key=b"x%d" % i, value=value, partition=i % partitions,
                   on_delivery=functools.partial(in_txn.callback, b"x%d" % i, value))
    assert tx.flush(30) == 0 and len(in_txn.records) == 20  # in the log, not committed
    after = produce_acked(broker, topic_name, [(i % partitions, b"b%d" % i, b"after %d" % i) for i in range(30)],
                          producer=plain)
    last_stable = {p: min(o for (q, o) in in_txn.records if q == p) for p in range(partitions)}

    first = ingest(spark, lake, topic_name)
    assert first["rows"] == 40, first
    assert committed(lake, topic_name, partitions) == last_stable, "the run stops at the last stable offset"
    assert bronze_records(lake) == before.records

    tx.commit_transaction(30)
    second = ingest(spark, lake, topic_name)
    assert second["rows"] == 50, second
    ends = {p: hi for p, (_lo, hi) in watermarks(broker, topic_name, partitions).items()}
    assert committed(lake, topic_name, partitions) == ends
    expected = {**before.records, **in_txn.records, **after.records}
    assert bronze_records(lake) == expected
    report = audit_offsets(lake["table"], [topic_name])
    assert report.exactly_once and report.totals()["table_rows"] == 90, report.summary()
    result = check_consistency(job_for(lake, topic_name), "open-transaction")
    assert result.passed, result.summary


# -- 2. retention ------------------------------------------------------------------------------


def delete_records(broker, topic: str, below: dict[int, int]) -> None:
    """DeleteRecords: Kafka drops every record of ``partition`` below ``below[partition]``."""
    client = admin(broker)
    futures = client.delete_records([KTP(topic, p, off) for p, off in below.items()], request_timeout=30)
    for future in futures.values():
        future.result(30)
    assert {p: lo for p, (lo, _hi) in watermarks(broker, topic, max(below) + 1).items() if p in below} == below


def records(partitions: int, count: int, label: str, timestamp_ms: int | None = None):
    """``count`` records spread round-robin over the partitions: (partition, key, value[, timestamp])."""
    out = []
    for i in range(count):
        record = (i % partitions, b"%s-%d" % (label.encode(), i), b"%s record %d" % (label.encode(), i))
        out.append(record + ((timestamp_ms + i,) if timestamp_ms is not None else ()))
    return out


def past_retention_notes(result, proof, starts: dict[int, int], topic: str) -> None:
    """The check's summary names, per partition, the proven range Kafka no longer holds."""
    day = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    for partition, start in starts.items():
        assert f"{topic}-{partition}: offsets [0, {start}) proven at version {proof.report.delta_version} on {day}" \
               in result.summary, result.summary
        assert f"Kafka no longer holds them (log start {start})" in result.summary, result.summary


def test_delete_records_below_a_proven_range_leaves_the_next_check_passing(spark, broker, topic_name, lake):
    partitions = 2
    create_topic(broker, topic_name, partitions)
    job = job_for(lake, topic_name)
    first = produce_acked(broker, topic_name, records(partitions, 300, "first"))
    ingest(spark, lake, topic_name)
    proof = check_consistency(job, "proof")
    assert proof.passed, proof.summary
    proven = committed(lake, topic_name, partitions)
    second = produce_acked(broker, topic_name, records(partitions, 200, "second"))
    ingest(spark, lake, topic_name)

    # Kafka drops records every one of which bronze holds and a check proved: inside the proven
    # range on partition 0, up to its end on partition 1.
    cut = {0: proven[0] - 50, 1: proven[1]}
    delete_records(broker, topic_name, cut)
    third = produce_acked(broker, topic_name, records(partitions, 100, "third"))
    ingest(spark, lake, topic_name)

    assert bronze_records(lake) == {**first.records, **second.records, **third.records}
    result = check_consistency(job, "after-delete-records")
    assert result.passed and result.mode == "incremental", result.summary
    past_retention_notes(result, proof, cut, topic_name)
    full = check_consistency(job, "after-delete-records-full", full=True)
    assert full.passed, full.summary
    assert full.report.totals()["table_rows"] == full.report.totals()["kafka_records"] == 600
    with pytest.raises(DataLossError, match="no longer in Kafka"):
        audit_offsets(lake["table"], [topic_name])  # Kafka alone can no longer prove them


def set_topic_config(broker, topic: str, **config) -> None:
    client = admin(broker)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(k.replace("_", "."), str(v), incremental_operation=AlterConfigOpType.SET)
        for k, v in config.items()])
    client.incremental_alter_configs([resource])[resource].result(30)


def test_retention_ms_below_a_proven_range_leaves_the_next_check_passing(spark, broker, topic_name, lake):
    partitions = 2
    # A segment holds records whose timestamps lie within segment.ms of its first: records two
    # hours old, in groups 5 s apart (of their timestamps), fill closed segments of their own.
    create_topic(broker, topic_name, partitions, segment_ms=1000)
    job = job_for(lake, topic_name)
    now = int(time.time() * 1000)
    old = Acked()
    for group in range(4):
        produce_acked(broker, topic_name, records(partitions, 50, f"old-{group}", now - 7_200_000 + group * 5000), old)
    ingest(spark, lake, topic_name)
    proof = check_consistency(job, "proof")
    assert proof.passed, proof.summary
    new = produce_acked(broker, topic_name, records(partitions, 100, "new", now))
    ingest(spark, lake, topic_name)

    # One hour of retention: the broker deletes the old segments at its next retention check.
    set_topic_config(broker, topic_name, retention_ms=3_600_000)
    first_new = {p: min(o for (q, o) in new.records if q == p) for p in range(partitions)}
    assert first_new == {p: 100 for p in range(partitions)}
    wait_for("retention deleting the old segments",
             lambda: {p: lo for p, (lo, _hi) in watermarks(broker, topic_name, partitions).items()} == first_new,
             timeout_s=30, every_s=0.25)
    newer = produce_acked(broker, topic_name, records(partitions, 60, "newer"))
    ingest(spark, lake, topic_name)

    assert bronze_records(lake) == {**old.records, **new.records, **newer.records}
    result = check_consistency(job, "after-retention")
    assert result.passed and result.mode == "incremental", result.summary
    past_retention_notes(result, proof, first_new, topic_name)
    assert result.report.totals()["table_rows"] == 360


def test_records_deleted_before_they_were_ingested_fail_the_next_run_and_leave_bronze_unchanged(
        spark, broker, topic_name, lake):
    partitions = 2
    create_topic(broker, topic_name, partitions)
    job = job_for(lake, topic_name)
    produce_acked(broker, topic_name, records(partitions, 200, "first"))
    ingest(spark, lake, topic_name)
    assert check_consistency(job, "proof").passed
    held = committed(lake, topic_name, partitions)
    produce_acked(broker, topic_name, records(partitions, 200, "second"))
    delete_records(broker, topic_name, {1: held[1] + 40})  # 40 records bronze never had
    version, rows = open_table(lake["table"]).version(), bronze_rows(lake)

    for mode in ({}, {"processing_time_s": 0.3}):  # the next available-now run, a continuous run
        with pytest.raises(Exception) as failure:
            ingest(spark, lake, topic_name, **mode)
        message = describe_failure(failure.value)
        assert message.startswith("DataLossError: "), message
        assert f"offsets [{held[1]}, {held[1] + 40})" in message and f"{topic_name}-1" in message, message
        assert open_table(lake["table"]).version() == version and bronze_rows(lake) == rows
    assert check_consistency(job, "after-failed-runs").passed


def test_fail_on_data_loss_false_skips_what_kafka_lost_says_so_and_the_check_passes(
        spark, broker, topic_name, lake):
    partitions = 2
    create_topic(broker, topic_name, partitions)
    job = job_for(lake, topic_name)
    first = produce_acked(broker, topic_name, records(partitions, 200, "first"))
    ingest(spark, lake, topic_name)
    assert check_consistency(job, "proof").passed
    held = committed(lake, topic_name, partitions)
    second = produce_acked(broker, topic_name, records(partitions, 200, "second"))
    lost = {1: (held[1], held[1] + 40)}
    delete_records(broker, topic_name, {1: lost[1][1]})

    # The next available-now run: the planner finds the loss before the batch, the read task
    # skips it, the commit records it.
    summary = ingest(spark, lake, topic_name, fail_on_data_loss=False)
    assert summary["rows"] == 160, summary
    said = f"skipped offsets Kafka no longer held (failOnDataLoss=false): {topic_name}-1 [{lost[1][0]}, {lost[1][1]})"
    assert any(said in line for line in summary["lines"]), summary["lines"]
    # The check passes: the part a check proved before Kafka dropped it, what the run skipped
    # (no row there), the rest compared with Kafka.
    after_first = check_consistency(job, "after-skip")
    assert after_first.passed and after_first.mode == "incremental", after_first.summary
    assert f"{topic_name}-1: offsets [{lost[1][0]}, {lost[1][1]}) skipped by the ingest commit of version" \
           in after_first.summary, after_first.summary

    # A continuous run, producing meanwhile: the read task meets the loss.
    held = committed(lake, topic_name, partitions)
    third = produce_acked(broker, topic_name, records(partitions, 100, "third"))
    lost[0] = (held[0], held[0] + 30)
    delete_records(broker, topic_name, {0: lost[0][1]})
    background = BackgroundIngest(spark, lake, topic_name, fail_on_data_loss=False)
    try:
        fourth = produce_acked(broker, topic_name, records(partitions, 100, "fourth"))
        ends = {p: hi for p, (_lo, hi) in watermarks(broker, topic_name, partitions).items()}
        wait_ingested(lake, topic_name, partitions, ends, background)
    finally:
        summary = background.stop()
    said = f"{topic_name}-0 [{lost[0][0]}, {lost[0][1]})"
    assert any(said in line for line in summary["lines"]), summary["lines"]

    gone = {(p, o) for p, (lo, hi) in lost.items() for o in range(lo, hi)}
    expected = {k: v for r in (first, second, third, fourth) for k, v in r.records.items() if k not in gone}
    assert bronze_records(lake) == expected
    # The same, incrementally and in full (which finds the skipped range in the Delta log).
    full = check_consistency(job, "after-second-skip-full", full=True, record=False)
    result = check_consistency(job, "after-second-skip")
    for check in (full, result):
        assert check.passed, check.summary
        assert f"{topic_name}-0: offsets [{lost[0][0]}, {lost[0][1]}) skipped by the ingest commit of version" \
               in check.summary, check.summary
    assert result.mode == "incremental"
    assert result.report.totals()["table_rows"] == len(expected)


# -- 3. compaction -----------------------------------------------------------------------------


def test_compacted_topic_ingest_and_audit_are_exact_over_the_gaps(spark, broker, topic_name, lake):
    partitions = 2
    # Compaction within seconds: a segment per 100 ms of record timestamps, every closed segment
    # cleanable at once.
    create_topic(broker, topic_name, partitions, cleanup_policy="compact", segment_ms=100,
                 min_cleanable_dirty_ratio=0.01, min_compaction_lag_ms=0)
    base = int(time.time() * 1000) - 1_800_000
    survivors: dict = {}
    written = 0
    for phase in range(3):
        # Each phase rewrites keys of its own ten times (a version 1 s of timestamps after the
        # last: a segment each); the last version of key 0 is a tombstone. Then a record of a key
        # of its own, later, closes the segment of the last versions, so all of them compact.
        acked = Acked()
        for version in range(10):
            ts = base + (phase * 20 + version) * 1000
            batch = [(p, b"phase%d-key%d" % (phase, k),
                      None if (version == 9 and k == 0) else b"phase %d key %d version %d" % (phase, k, version), ts + k)
                     for k in range(15) for p in range(partitions)]
            produce_acked(broker, topic_name, batch, acked)
        produce_acked(broker, topic_name, [(p, b"phase%d-end" % phase, b"end of phase %d" % phase,
                                            base + (phase * 20 + 12) * 1000) for p in range(partitions)], acked)
        written += len(acked.records)
        latest: dict = {}
        for (p, off), (key, value) in sorted(acked.records.items()):
            latest[(p, key)] = (off, value)
        survivors.update({(p, off): (key, value) for (p, key), (off, value) in latest.items()})
        wait_for(f"compaction of phase {phase}", lambda: read_kafka(broker, topic_name, partitions) == survivors,
                 timeout_s=45, every_s=0.25)
        ingest(spark, lake, topic_name)

    assert len(survivors) < written / 5, "compaction removed most offsets"
    assert bronze_records(lake) == survivors == read_kafka(broker, topic_name, partitions)
    report = audit_offsets(lake["table"], [topic_name])
    assert report.exactly_once and report.totals()["table_rows"] == len(survivors), report.summary()
    assert sum(p.next_offset - p.first_offset for p in report.partitions) == written
    result = check_consistency(job_for(lake, topic_name), "compacted")
    assert result.passed, result.summary


# -- 4. a recreated topic ----------------------------------------------------------------------


def recreate_topic(broker, topic: str, partitions: int) -> None:
    """Delete ``topic``, wait until the deletion completed, create it again."""
    client = admin(broker)
    client.delete_topics([topic], request_timeout=30)[topic].result(30)

    def created():
        try:
            create_topic(broker, topic, partitions)
            return True
        except Exception as exc:  # noqa: BLE001 - still being deleted: try again
            if "already exists" not in str(exc).lower() and "marked for deletion" not in str(exc).lower():
                raise
            return False

    wait_for(f"{topic} deleted and created again", created, timeout_s=30, every_s=0.25)


def test_a_recreated_topic_fails_the_running_job_and_the_next_run_and_leaves_bronze_unchanged(
        spark, broker, topic_name, lake):
    partitions = 2
    create_topic(broker, topic_name, partitions)
    job = job_for(lake, topic_name)
    produce_acked(broker, topic_name, records(partitions, 200, "first"))
    ingest(spark, lake, topic_name)
    assert check_consistency(job, "proof").passed
    background = BackgroundIngest(spark, lake, topic_name)
    produce_acked(broker, topic_name, records(partitions, 100, "second"))
    wait_ingested(lake, topic_name, partitions, {p: 150 for p in range(partitions)}, background)
    version, rows = open_table(lake["table"]).version(), bronze_rows(lake)

    # Deleted and created again under the running job, which then finds its offsets past the
    # new topic's end (or, in between, no topic at all).
    recreate_topic(broker, topic_name, partitions)
    produce_acked(broker, topic_name, records(partitions, 60, "recreated"), producer=plain_producer(broker))
    wait_for("the running job failing", lambda: background.error is not None or not background._thread.is_alive(),
             timeout_s=30)
    with pytest.raises(Exception) as failure:
        background.stop()
    message = describe_failure(failure.value)
    print("the running job:", message)
    assert message.startswith(("DataLossError: ", "UnknownTopicError: ")), message
    # Which one depends on when its trigger came: between deletion and creation (no topic),
    # after the creation (an empty or a new partition: offsets past its end).
    assert (f"{topic_name}-0: start offset 150 is past the end of the partition (" in message
            and "the topic was probably deleted and recreated" in message
            or f"topic(s) {topic_name} do not exist" in message), message
    assert open_table(lake["table"]).version() == version and bronze_rows(lake) == rows

    # The next run: the topic's id is not the one bronze's commits recorded.
    with pytest.raises(DataLossError) as failure:
        ingest(spark, lake, topic_name)
    assert f"topic {topic_name} was deleted and recreated" in str(failure.value)
    assert open_table(lake["table"]).version() == version and bronze_rows(lake) == rows


def test_a_recreated_topic_already_past_bronzes_offsets_fails_the_next_run(spark, broker, topic_name, lake):
    """Offsets alone cannot tell: the new topic holds more records than bronze had committed of
    the old one. Its topic id (Kafka gives a topic created again a new one) can."""
    partitions = 2
    create_topic(broker, topic_name, partitions)
    produce_acked(broker, topic_name, records(partitions, 100, "first"))
    ingest(spark, lake, topic_name)
    held = committed(lake, topic_name, partitions)
    version, rows = open_table(lake["table"]).version(), bronze_rows(lake)

    recreate_topic(broker, topic_name, partitions)
    produce_acked(broker, topic_name, records(partitions, 300, "recreated"), producer=plain_producer(broker))
    assert all(hi > held[p] for p, (_lo, hi) in watermarks(broker, topic_name, partitions).items())
    with pytest.raises(DataLossError, match=f"topic {topic_name} was deleted and recreated"):
        ingest(spark, lake, topic_name)
    assert open_table(lake["table"]).version() == version and bronze_rows(lake) == rows
