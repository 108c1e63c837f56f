"""Unit tests of the audit's comparison (the integration tests run it against Kafka)."""

from streamlake.operations.audit import PartitionAudit, _compare, record_digest


def _audit(kafka, table):
    audit = PartitionAudit("t", 0, 0, 10)
    _compare(audit, kafka, table)
    return audit


def test_digest_distinguishes_null_and_empty_and_boundaries():
    assert record_digest(None, b"x") != record_digest(b"", b"x")
    assert record_digest(b"ab", b"c") != record_digest(b"a", b"bc")


def test_clean_partition_with_skipped_offsets():
    kafka = {0: record_digest(b"k", b"a"), 1: record_digest(b"k", b"b"), 3: record_digest(b"k", b"c")}  # 2 = marker
    audit = _audit(kafka, [(o, d) for o, d in kafka.items()])
    assert audit.exactly_once and audit.kafka_records == 3 and audit.table_rows == 3


def test_each_violation_is_counted():
    d = {o: record_digest(b"k", bytes([o])) for o in range(5)}
    table = [(0, d[0]), (1, d[1]), (1, d[1]), (1, d[1]), (3, record_digest(b"k", b"other")), (7, d[0])]
    audit = _audit({o: d[o] for o in range(5)}, table)
    assert (audit.missing, audit.duplicated, audit.extra, audit.mismatched) == (2, 2, 1, 1)
    assert audit.examples == {"missing": [2, 4], "duplicated": [1], "extra": [7], "mismatched": [3]}
    assert not audit.exactly_once
