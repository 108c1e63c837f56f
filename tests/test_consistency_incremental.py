"""Incremental consistency checks: verified ranges, the Delta log since a proof, Kafka's
retention, bounded memory (issue 10).

All parts are real: tables written by the bronze ingest (Spark, the Delta sink),
the local Kafka broker (its log start moved by DeleteRecords, as retention moves
it), delta-rs for the foreign commits (a duplicate, a compaction, a delete, a
restore).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake.transaction import AddAction, CommitProperties
from helpers import ingest
from streamlake.delta.table import open_table
from streamlake.delta.txn import committed_offsets, first_offsets, offset_transactions
from streamlake.errors import DataLossError
from streamlake.kafka.offsets import TopicPartition
from streamlake.operations import audit as audit_mod
from streamlake.operations.audit import audit_offsets
from streamlake.operations.consistency import check_consistency, recent_checks
from streamlake.operations.ledger import ProofIndex
from streamlake.pipeline.bronze import BRONZE


def job_for(lake, topic):
    """What a check needs of a job: its name, table, topics and Kafka options."""
    return SimpleNamespace(name=f"job-{topic}", table=lake["table"], topics=[topic], source_topics=[topic], kafka={})


def committed(lake, topic, partitions=3):
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    return committed_offsets(open_table(lake["table"]), tps)


def counts(report):
    return {k: v for k, v in report.totals().items() if k not in ("kafka_records", "table_rows")}


class ReadSpy(audit_mod.KafkaLog):
    """The real Kafka access, recording the ranges the audit asks for."""

    ranges: list = []

    def read(self, rng):
        ReadSpy.ranges.append(rng)
        return super().read(rng)


def test_second_check_audits_only_the_new_offsets(spark, produce, topic_name, lake, monkeypatch):
    produce(topic_name, 600, partitions=3, seed=21)
    ingest(spark, lake, topic_name)
    job = job_for(lake, topic_name)
    first = check_consistency(job, "first")
    assert first.passed and first.mode == "full", first.summary
    assert "no earlier proof" in first.summary
    proven = committed(lake, topic_name)
    proof = ProofIndex(open_table(lake["table"]).metadata().id).latest(10**9)
    assert {tp: r.next for tp, r in proof.ranges.items()} == proven and proof.version == first.report.delta_version

    produce(topic_name, 300, partitions=3, seed=22)
    ingest(spark, lake, topic_name)
    ReadSpy.ranges = []
    monkeypatch.setattr(audit_mod, "KafkaLog", ReadSpy)
    second = check_consistency(job, "second")
    assert second.passed, second.summary
    assert second.mode == "incremental" and second.proof_version == first.report.delta_version
    totals, read = second.report.totals(), second.report.read_totals()
    assert totals["table_rows"] == totals["kafka_records"] == 900, second.summary
    assert read == {"kafka_records_read": 300, "table_rows_read": 300}, second.summary
    assert ReadSpy.ranges and all(r.start >= proven[TopicPartition(r.topic, r.partition)] for r in ReadSpy.ranges)
    assert "EXACTLY ONCE: 900 rows" in second.summary and "1 ingest" in second.summary
    row = next(r for r in recent_checks(10, job.name) if r["check_id"] == second.check_id)
    assert (row["mode"], row["proof_version"], row["kafka_records_read"]) == \
        ("incremental", first.report.delta_version, 300)


def _foreign_commit(table_path: str, rel: str, partition_values: dict, stats: str = "") -> None:
    """Commit a data file as an unknown writer would: an add action, no StreamLake metadata."""
    root = Path(table_path)
    open_table(table_path).create_write_transaction(
        [AddAction(rel, (root / rel).stat().st_size, partition_values, 0, True, stats)],
        "append", BRONZE.schema, partition_by=["ingest_date"])


def test_rows_added_again_into_a_proven_range_are_caught(spark, produce, topic_name, lake, monkeypatch):
    produce(topic_name, 450, partitions=3, seed=23)
    ingest(spark, lake, topic_name)
    job = job_for(lake, topic_name)
    assert check_consistency(job, "proof").passed

    # A foreign commit adds a copy of a proven data file: every row of it is a duplicate.
    table = open_table(lake["table"])
    actions = pa.table(table.get_add_actions(flatten=True))
    path = actions.column("path")[0].as_py()
    part = str(actions.column("partition.ingest_date")[0].as_py())
    copy = path.replace(".parquet", "-copy.parquet")
    root = Path(lake["table"])
    (root / copy).write_bytes((root / path).read_bytes())
    _foreign_commit(lake["table"], copy, {"ingest_date": part})
    copied = pq.read_table(root / copy)

    result = check_consistency(job, "after-copy")
    assert not result.passed and result.mode == "incremental", result.summary
    assert counts(result.report) == {"missing": 0, "duplicated": copied.num_rows, "extra": 0, "mismatched": 0}
    assert result.report.read_totals()["kafka_records_read"] == 0, "nothing new in Kafka to read"
    assert counts(audit_offsets(lake["table"], [topic_name])) == counts(result.report)

    # Another one: a changed copy of a proven row, and a row past the committed range.
    p0 = TopicPartition(topic_name, 0)
    nxt = committed(lake, topic_name)[p0]
    original = copied.slice(0, 1).to_pylist()[0]
    rows = [{**original, "partition": 0, "offset": 3, "value": b"tampered"},
            {**original, "partition": 0, "offset": nxt + 5}]
    rel = f"ingest_date={part}/foreign-{topic_name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=BRONZE.file_schema), root / rel)
    _foreign_commit(lake["table"], rel, {"ingest_date": part})

    result = check_consistency(job, "after-foreign-rows")
    assert not result.passed and result.mode == "incremental", result.summary
    # (if the copied file holds offset 3 of partition 0, the tampered row is its third copy: still one more)
    expected = {"missing": 0, "duplicated": copied.num_rows + 1, "extra": 1, "mismatched": 1}
    assert counts(result.report) == expected, result.summary
    ledger_free = audit_offsets(lake["table"], [topic_name])
    assert counts(ledger_free) == expected
    by_tp = {p.tp: p for p in result.report.partitions}
    assert by_tp[p0].examples["mismatched"] == [3] and by_tp[p0].examples["extra"] == [nxt + 5]

    # --full is the ledger-free audit: same counts, examples and ranges, every row read.
    full = check_consistency(job, "full", full=True)
    assert full.mode == "full" and not full.passed
    assert full.report.totals() == ledger_free.totals()
    strip = ("mode", "kafka_records_read", "table_rows_read", "notes")
    assert [{k: v for k, v in vars(p).items() if k not in strip} for p in full.report.partitions] == \
        [{k: v for k, v in vars(p).items() if k not in strip} for p in ledger_free.partitions]
    assert full.report.read_totals()["kafka_records_read"] == ledger_free.totals()["kafka_records"]

    # In chunks of a few offsets (one Kafka read per partition, many table scans): the same.
    monkeypatch.setattr(audit_mod, "CHUNK_OFFSETS", 37)
    chunked = audit_offsets(lake["table"], [topic_name])
    assert [vars(p) for p in chunked.partitions] == [vars(p) for p in ledger_free.partitions]


def _restore(table_path: str, version: int, topic: str, partitions: int = 3, platform: bool = True) -> int:
    """Restore as the platform does: delta-rs restore, the version's offsets as txn, and
    the restore's commit info (``platform=False``: a plain delta-rs restore)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    old = open_table(table_path, version)
    custom = {"streamlake": {"operation": "restore", "savepoint": "test", "toVersion": version}} if platform else None
    properties = CommitProperties(
        app_transactions=offset_transactions(committed_offsets(old, tps), first_offsets(old, tps)),
        custom_metadata=custom)
    open_table(table_path).restore(version, commit_properties=properties)
    return open_table(table_path).version()


def test_restore_to_a_proven_version_inherits_its_proof(spark, produce, topic_name, lake):
    job = job_for(lake, topic_name)
    produce(topic_name, 300, partitions=3, seed=24)
    ingest(spark, lake, topic_name)
    proven = check_consistency(job, "savepoint")
    assert proven.passed
    v1, offsets_v1 = proven.report.delta_version, committed(lake, topic_name)
    produce(topic_name, 300, partitions=3, seed=25)
    ingest(spark, lake, topic_name)
    v2 = open_table(lake["table"]).version()
    assert check_consistency(job, "ingest").passed

    _restore(lake["table"], v1, topic_name)
    restored = check_consistency(job, "restore", expected_offsets=offsets_v1)
    assert restored.passed and restored.offsets_match, restored.summary
    assert restored.mode == "incremental" and "inherits that proof" in restored.summary
    assert restored.report.read_totals() == {"kafka_records_read": 0, "table_rows_read": 0}, restored.summary
    assert restored.report.totals()["table_rows"] == 300

    # A plain delta-rs restore (no StreamLake restore info) to the newer version: treated
    # like any other writer's commit: its files are audited, nothing is taken on trust.
    _restore(lake["table"], v2, topic_name, platform=False)
    plain = check_consistency(job, "plain-restore")
    assert plain.passed and plain.mode == "incremental", plain.summary
    assert plain.report.read_totals()["table_rows_read"] == 300 == plain.report.read_totals()["kafka_records_read"]
    assert plain.report.totals()["table_rows"] == 600


def test_compaction_and_delete_fall_back_to_a_full_audit_of_what_they_touched(spark, produce, topic_name, lake):
    job = job_for(lake, topic_name)
    produce(topic_name, 600, partitions=3, seed=26)
    ingest(spark, lake, topic_name, max_offsets_per_trigger=200)
    assert check_consistency(job, "proof").passed

    open_table(lake["table"]).optimize.compact()
    compacted = check_consistency(job, "after-compaction")
    assert compacted.passed, compacted.summary
    assert {p.mode for p in compacted.report.partitions} == {"full"}
    assert "audited in full: commit" in compacted.summary and "OPTIMIZE" in compacted.summary
    assert compacted.report.read_totals()["kafka_records_read"] == 600

    open_table(lake["table"]).delete(f"\"partition\" = 1 AND \"offset\" = 5 AND topic = '{topic_name}'")
    deleted = check_consistency(job, "after-delete")
    assert not deleted.passed, deleted.summary
    assert counts(deleted.report) == {"missing": 1, "duplicated": 0, "extra": 0, "mismatched": 0}
    p1 = next(p for p in deleted.report.partitions if p.partition == 1)
    assert p1.mode == "full" and p1.examples == {"missing": [5]} and "DELETE" in " ".join(p1.notes)


def delete_records(broker: str, tp: TopicPartition, before: int) -> None:
    """Kafka's DeleteRecords: the partition's log start moves to ``before``, as retention moves it."""
    from confluent_kafka import TopicPartition as KafkaTopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker})
    [future] = admin.delete_records([KafkaTopicPartition(tp.topic, tp.partition, before)]).values()
    assert future.result(30).low_watermark == before


def test_past_retention_proven_ranges_pass_and_unproven_gaps_fail(spark, broker, produce, topic_name, lake):
    job = job_for(lake, topic_name)
    p0 = TopicPartition(topic_name, 0)
    produce(topic_name, 400, partitions=2, seed=27)
    ingest(spark, lake, topic_name)
    proof = check_consistency(job, "proof")
    assert proof.passed
    proven_next = committed(lake, topic_name, 2)[p0]
    produce(topic_name, 200, partitions=2, seed=28)
    ingest(spark, lake, topic_name)

    delete_records(broker, p0, proven_next - 50)
    today = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    incremental = check_consistency(job, "past-retention")
    assert incremental.passed and incremental.mode == "incremental", incremental.summary
    assert f"offsets [0, {proven_next - 50}) proven at version {proof.report.delta_version} on {today}" \
           in incremental.summary
    assert f"Kafka no longer holds them (log start {proven_next - 50})" in incremental.summary

    full = check_consistency(job, "past-retention-full", full=True)
    assert full.passed and full.mode == "full", full.summary
    assert f"compared with the table at version {incremental.report.delta_version}" in full.summary
    assert full.report.totals()["table_rows"] == full.report.totals()["kafka_records"] == 600
    with pytest.raises(DataLossError, match="no longer in Kafka"):
        audit_offsets(lake["table"], [topic_name])  # the ledger-free audit cannot prove it

    # New records, then Kafka loses part of them before any check proved them.
    newest = ProofIndex(open_table(lake["table"]).metadata().id).latest(10**9).ranges[p0].next
    assert newest == committed(lake, topic_name, 2)[p0]
    produce(topic_name, 200, partitions=2, seed=29)
    ingest(spark, lake, topic_name)
    lost = min(30, (committed(lake, topic_name, 2)[p0] - newest) // 2)
    assert lost > 0
    delete_records(broker, p0, newest + lost)
    gap = check_consistency(job, "unproven-gap")
    assert not gap.passed and gap.mode == "incremental", gap.summary
    p = next(x for x in gap.report.partitions if x.tp == p0)
    assert p.unverified == lost and not p.exactly_once
    assert f"offsets [{newest}, {newest + lost}) are no longer in Kafka (log start {newest + lost}) and no check " \
           "proved them: they cannot be verified" in gap.summary
    assert all(x.exactly_once for x in gap.report.partitions if x.tp != p0)
    gap_full = check_consistency(job, "unproven-gap-full", full=True)
    assert not gap_full.passed and next(x for x in gap_full.report.partitions if x.tp == p0).unverified == lost


def test_results_table_of_an_older_version_is_migrated(broker, tmp_path, monkeypatch, produce, topic_name):
    """A ``consistency_checks`` table written before incremental checks gets the new
    columns on the next check; its old rows read them as null."""
    from deltalake import write_deltalake
    from streamlake.operations.consistency import RESULTS
    from streamlake.delta.records import platform_table_path

    monkeypatch.setenv("STREAMLAKE_HOME", str(tmp_path / "home"))
    first_version = RESULTS.schema.names.index("context") + 1  # the columns before incremental checks
    old_schema = pa.schema(list(RESULTS.schema)[:first_version])
    old_row = {f.name: None for f in old_schema} | {"check_id": "chk-old", "job": "j", "verdict": "PASS",
                                                      "checked_at": dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)}
    write_deltalake(platform_table_path("consistency_checks"), pa.Table.from_pylist([old_row], schema=old_schema))

    produce(topic_name, 30, partitions=1, seed=30)
    from deltalake import DeltaTable

    table = str(tmp_path / "empty-bronze")
    DeltaTable.create(table, BRONZE.schema, partition_by=["ingest_date"])
    result = check_consistency(SimpleNamespace(name="j", table=table, topics=[topic_name],
                                                      source_topics=[topic_name], kafka={}), "migrate")
    assert result.passed, result.summary
    rows = {r["check_id"]: r for r in recent_checks(10, "j")}
    assert rows["chk-old"]["mode"] is None and rows["chk-old"]["verdict"] == "PASS"
    assert rows[result.check_id]["mode"] == "full" and rows[result.check_id]["duration_s"] is not None


def test_memory_of_the_comparison_does_not_grow_with_rows(tmp_path):
    """A generous guard only (bench/check_bench.py measures it): the chunked Arrow
    comparison of 10x the rows peaks at about the same memory."""
    script = textwrap.dedent("""
        import json, sys
        import numpy as np
        from streamlake.operations.audit import PartitionAudit, Rows, compare_rows, DIGEST_SIZE

        rows, chunk = int(sys.argv[1]), 100_000
        audit = PartitionAudit("t", 0, 0, rows)
        rng = np.random.default_rng(1)
        for lo in range(0, rows, chunk):
            offs = np.arange(lo, min(rows, lo + chunk), dtype=np.int64)
            digests = rng.integers(0, 256, (len(offs), DIGEST_SIZE), dtype=np.uint8)
            table = Rows(offs[::-1].copy(), digests[::-1].copy())  # unsorted, as files come
            compare_rows(audit, Rows(offs, digests), table)
        assert audit.exactly_once and audit.table_rows == rows
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent (pytest) across exec
        peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
        print(json.dumps({"peak_kb": peak}))
    """)
    peaks = []
    for rows in (200_000, 2_000_000):
        done = subprocess.run([sys.executable, "-c", script, str(rows)], capture_output=True, text=True,
                              env=os.environ, timeout=120)
        assert done.returncode == 0, done.stderr
        peaks.append(json.loads(done.stdout.strip().splitlines()[-1])["peak_kb"] / 1024)
    assert peaks[1] < peaks[0] + 40, f"peak RSS {peaks[0]:.0f} MB for 200k rows, {peaks[1]:.0f} MB for 2M rows"
    print(f"peak RSS {peaks[0]:.0f} MB for 200k rows, {peaks[1]:.0f} MB for 2M rows")
