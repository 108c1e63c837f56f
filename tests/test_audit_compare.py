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


def _oracle(kafka, table):
    """The audit's comparison as it was before Arrow (one Python object per row): the reference."""
    from collections import Counter

    counts = Counter(off for off, _ in table)
    missing = sorted(set(kafka) - set(counts))
    duplicated = sorted(off for off, n in counts.items() if n > 1)
    extra = sorted(off for off in counts if off not in kafka)
    mismatched = sorted({off for off, digest in table if off in kafka and kafka[off] != digest})
    examples = {name: offs[:5] for name, offs in (("missing", missing), ("duplicated", duplicated),
                                                  ("extra", extra), ("mismatched", mismatched)) if offs}
    return (len(missing), sum(counts[o] - 1 for o in duplicated), sum(counts[o] for o in extra), len(mismatched),
            examples)


def test_chunked_arrow_comparison_equals_the_row_by_row_one():
    """Random partitions (markers, losses, copies, changed rows, strays), compared in one
    piece and in offset chunks of random size: the counts and examples of the old
    row-by-row comparison."""
    import random

    import numpy as np
    from streamlake.operations.audit import DIGEST_SIZE, Rows, compare_rows

    def rows(pairs):
        if not pairs:
            return Rows.empty()
        return Rows(np.array([o for o, _ in pairs], np.int64),
                    np.frombuffer(b"".join(d for _, d in pairs), np.uint8).reshape(-1, DIGEST_SIZE))

    rnd = random.Random(7)
    for _ in range(200):
        n = rnd.randint(0, 60)
        kafka = {o: record_digest(b"k", bytes([o % 251])) for o in range(n) if rnd.random() > 0.1}
        table = []
        for off, digest in kafka.items():
            if rnd.random() < 0.1:
                continue  # missing
            for _ in range(rnd.choice([1, 1, 1, 2, 3])):  # duplicated
                table.append((off, digest if rnd.random() > 0.1 else record_digest(b"k", b"changed")))
        table += [(rnd.randint(-5, n + 5), record_digest(None, b"stray")) for _ in range(rnd.randint(0, 3))]
        rnd.shuffle(table)
        expected = _oracle(kafka, table)
        whole = PartitionAudit("t", 0, 0, n)
        _compare(whole, kafka, table)
        assert (whole.missing, whole.duplicated, whole.extra, whole.mismatched, whole.examples) == expected
        chunked = PartitionAudit("t", 0, 0, n)
        edges = sorted({-10, n + 10, *(rnd.randint(-5, n + 5) for _ in range(rnd.randint(0, 4)))})
        for lo, hi in zip(edges, edges[1:]):
            compare_rows(chunked, rows(sorted((o, d) for o, d in kafka.items() if lo <= o < hi)),
                         rows([(o, d) for o, d in table if lo <= o < hi]))
        assert (chunked.missing, chunked.duplicated, chunked.extra, chunked.mismatched,
                chunked.examples) == expected
        assert chunked.kafka_records == len(kafka) and chunked.table_rows == len(table)
