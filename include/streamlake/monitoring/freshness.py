"""End-to-end freshness: how far a pipeline's gold is behind Kafka, in seconds.

Gold's freshness is the age of the oldest Kafka record that some gold table does not yet
reflect (0 when every gold table holds everything Kafka holds). Which records those are
follows the positions each stage commits with its data (Delta ``txn``), never a clock of
the job's own, so the figure is right after any crash: the slowest gold table's silver
version, the bronze version silver had consumed at that version, and the Kafka offsets
bronze had committed at that one. A pipeline without aggregates is measured at silver.

Its age is read from Kafka: the timestamp of the first record at or after that offset
(retention may have deleted it: then the oldest record Kafka still holds).
"""

from __future__ import annotations

import time
from typing import Mapping

#: Records read to find the first one of a range (transaction markers take offsets too).
FIRST_RECORD_WINDOW = 16
KAFKA_TIMEOUT_MS = 5_000


def gold_bronze_snapshot(job):
    """Bronze at the version whose records every gold table reflects (silver's when the
    pipeline has no aggregates): its committed offsets are where gold's unread records
    start. None: gold reflects nothing yet. Raises FileNotFoundError if a table is missing."""
    from streamlake.delta.table import open_table
    from streamlake.operations.pipeline_checks import consumed_version

    tables = job.tables()
    bronze_path = tables["bronze"]
    open_table(bronze_path)  # FileNotFoundError before anything else: a pipeline that never ran
    gold = [name for name in tables if name.startswith("gold/")]
    if gold:
        versions = [consumed_version(open_table(tables[name]), "silver") for name in gold]
        if any(v is None for v in versions):
            return None
        silver = open_table(tables["silver"], version=min(versions))
    else:
        silver = open_table(tables["silver"])
    bronze_version = consumed_version(silver, "bronze")
    return None if bronze_version is None else open_table(bronze_path, version=bronze_version)


def first_record_timestamp_s(conf: Mapping[str, str], tp, start: int, end: int) -> float | None:
    """The timestamp (epoch seconds) of the first record Kafka holds in ``[start, end)`` of
    ``tp`` (None: none there), read with the reader the Kafka source uses."""
    from streamlake.kafka.offsets import OffsetRange
    from streamlake.kafka.reader import read_range

    rng = OffsetRange(tp.topic, tp.partition, start, min(end, start + FIRST_RECORD_WINDOW))
    first = None
    # the whole (small) range is read: a read left early gives up the reader's cached consumer
    for batch in read_range(dict(conf), rng, poll_timeout_ms=KAFKA_TIMEOUT_MS, fail_on_data_loss=False):
        if first is None and batch.num_rows:
            first = batch.column("timestamp")[0].as_py().timestamp()
    return first


def oldest_unread_ages(kafka, conf: Mapping[str, str], tps: list, positions: Mapping, now: float) -> dict:
    """Per partition, the age in seconds of the oldest record at or after ``positions[tp]``
    (a partition without a position counts from Kafka's log start; 0.0: nothing there).
    ``kafka`` is an open :class:`streamlake.kafka.client.KafkaMetadataClient`."""
    ends = kafka.latest(tps)
    nexts = dict(positions)
    missing = [tp for tp in tps if tp not in nexts]
    nexts.update(kafka.earliest(missing) if missing else {})
    lagging = [tp for tp in tps if tp in ends and tp in nexts and ends[tp] > nexts[tp]]
    starts = kafka.earliest(lagging) if lagging else {}  # retention may have deleted the next one
    ages = {tp: 0.0 for tp in tps if tp in ends and tp not in lagging}
    for tp in lagging:
        ts = first_record_timestamp_s(conf, tp, max(nexts[tp], starts.get(tp, nexts[tp])), ends[tp])
        ages[tp] = 0.0 if ts is None else max(0.0, now - ts)
    return ages


def gold_freshness_s(job, now: float | None = None, timeout_ms: int = KAFKA_TIMEOUT_MS) -> float:
    """How many seconds gold is behind Kafka: the age of the oldest record some gold table
    lacks (0.0: gold holds everything Kafka holds). Raises FileNotFoundError if the
    pipeline's tables do not exist yet, KafkaUnavailableError if its cluster does not answer
    within ``timeout_ms``."""
    from streamlake.delta.txn import committed_offsets
    from streamlake.kafka.client import API_TIMEOUT_PROPERTY, KafkaMetadataClient, client_config

    snapshot = gold_bronze_snapshot(job)
    conf = client_config({f"kafka.{k}": v for k, v in (job.kafka or {}).items()})
    conf[API_TIMEOUT_PROPERTY] = str(min(int(conf.get(API_TIMEOUT_PROPERTY, timeout_ms)), timeout_ms))
    with KafkaMetadataClient(conf) as kafka:
        tps = kafka.partitions(topics=sorted(set(job.source_topics)))
        positions = committed_offsets(snapshot, tps) if snapshot is not None else {}
        ages = oldest_unread_ages(kafka, conf, tps, positions, time.time() if now is None else now)
    return max(ages.values(), default=0.0)
