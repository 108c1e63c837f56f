"""Bad input and hostile conditions: clear errors, and nothing committed by mistake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ingest
from streamlake.operations.audit import audit_offsets
from streamlake.delta.table import open_table, table_exists
from streamlake.errors import DataLossError, InvalidOptionError, KafkaUnavailableError, UnknownTopicError
from streamlake.pipeline.driver import describe_failure
from streamlake.kafka.source import FORMAT


@pytest.mark.parametrize("kwargs, error, words", [
    ({"topic": "no-such-topic"}, UnknownTopicError, "no-such-topic do not exist"),
    ({"starting_offsets": '{"t": {"0": }'}, InvalidOptionError, "startingOffsets is not valid JSON"),
    ({"starting_offsets": "beginning"}, InvalidOptionError, "must be 'earliest', 'latest' or JSON"),
    ({"kafka": {"bootstrap.servers": "127.0.0.1:9", "default.api.timeout.ms": "1500"}},
     KafkaUnavailableError, r"Kafka at 127.0.0.1:9 did not answer .* within 1.5s"),
    ({"kafka": {"group.id": "mine"}}, InvalidOptionError, "managed by the source"),
])
def test_bad_options_fail_clearly_and_commit_nothing(spark, produce, topic_name, lake, kwargs, error, words):
    produce(topic_name, 30, partitions=1)
    topic = kwargs.pop("topic", topic_name)
    with pytest.raises(error, match=words):
        ingest(spark, lake, topic, **kwargs)
    assert not table_exists(lake["table"]), "a failed start must not create or commit to the table"


def test_bad_option_inside_a_spark_query_reaches_the_user(spark, produce, topic_name, tmp_path):
    produce(topic_name, 10, partitions=1)
    df = (spark.readStream.format(FORMAT).option("subscribe", topic_name)
          .option("maxOffsetPerTrigger", "10").load())  # typo: Offset, not Offsets
    with pytest.raises(Exception) as info:
        df.writeStream.format("console").option("checkpointLocation", str(tmp_path / "ck")).start().awaitTermination(30)
    message = describe_failure(info.value)
    assert message.startswith("InvalidOptionError: unknown option(s) maxoffsetpertrigger"), message


def test_offsets_kafka_no_longer_holds_fail_with_data_loss(spark, broker, produce, topic_name, lake, tmp_path):
    from confluent_kafka.admin import AdminClient

    produce(topic_name, 600, partitions=3, seed=1)
    ingest(spark, lake, topic_name)
    version = open_table(lake["table"]).version()
    # The topic is deleted and recreated: the offsets the table and checkpoint hold are gone.
    admin = AdminClient({"bootstrap.servers": broker})
    admin.delete_topics([topic_name])[topic_name].result(10)
    produce(topic_name, 60, partitions=3, seed=2)

    with pytest.raises(Exception) as resumed:  # same checkpoint: the running source detects it
        ingest(spark, lake, topic_name)
    assert describe_failure(resumed.value).startswith("DataLossError: Kafka no longer holds offsets"), \
        describe_failure(resumed.value)
    assert "deleted and recreated" in str(resumed.value)

    with pytest.raises(DataLossError, match="past the end of the partition"):  # new checkpoint: start-up detects it
        ingest(spark, {**lake, "checkpoint": str(tmp_path / "fresh")}, topic_name)
    assert open_table(lake["table"]).version() == version, "nothing may be committed"


def test_commit_race_is_lost_cleanly_and_replanned(spark, produce, topic_name, lake):
    """Another writer commits the same offsets between our plan and our commit."""
    from streamlake.pipeline import bronze
    from streamlake.delta import sink as sink_module
    from streamlake.delta.txn import offset_transactions
    from streamlake.kafka.offsets import TopicPartition as TP
    from deltalake.transaction import CommitProperties

    produce(topic_name, 900, partitions=3, seed=9)
    raced = {"done": False, "attempts": []}
    real_prepare = bronze.to_bronze

    def prepare_and_race(df, batch_id, batch_time_ms):
        raced["attempts"].append(batch_id)
        if not raced["done"]:
            raced["done"] = True
            # The rival writes the first 100 offsets of partition 0 (txn only: the
            # audit then shows the sink did not write them again).
            table = open_table(lake["table"])
            table.create_write_transaction([], "append", bronze.BRONZE.schema, partition_by=["ingest_date"],
                                           commit_properties=CommitProperties(app_transactions=offset_transactions(
                                               {TP(topic_name, 0): 100}, {TP(topic_name, 0): 0})))
        return real_prepare(df, batch_id, batch_time_ms)

    original = sink_module.DeltaKafkaSink.__init__

    def patched_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.prepare = prepare_and_race

    sink_module.DeltaKafkaSink.__init__ = patched_init
    try:
        ingest(spark, lake, topic_name)
    finally:
        sink_module.DeltaKafkaSink.__init__ = original
    assert raced["attempts"][:2] == [0, 0], "the losing attempt must be re-planned"
    report = audit_offsets(lake["table"], [topic_name])
    p0 = next(p for p in report.partitions if p.partition == 0)
    # The rival claimed [0, 100) without writing rows: exactly those are missing, nothing is doubled.
    assert p0.missing == 100 and p0.duplicated == 0 and p0.examples["missing"][0] == 0
    assert all(p.exactly_once for p in report.partitions if p.partition != 0)


def test_audit_catches_duplicates_and_cli_exits_nonzero(spark, produce, topic_name, lake):
    from deltalake.transaction import AddAction

    produce(topic_name, 300, partitions=2, seed=6)
    ingest(spark, lake, topic_name)
    cli = [str(Path(sys.executable).parent / "streamlake"), "audit", "--topic", topic_name, "--table", lake["table"]]
    clean = subprocess.run(cli, capture_output=True, text=True, env=os.environ)
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["exactly_once"] is True

    # Commit one data file a second time under another name: its rows are now duplicated.
    table = open_table(lake["table"])
    actions = table.get_add_actions(flatten=True)
    path, part = actions.column("path")[0].as_py(), actions.column("partition.ingest_date")[0].as_py()
    root = Path(lake["table"])
    copy = path.replace(".parquet", "-copy.parquet")
    (root / copy).write_bytes((root / path).read_bytes())
    from streamlake.pipeline.bronze import BRONZE
    table.create_write_transaction(
        [AddAction(copy, (root / copy).stat().st_size, {"ingest_date": str(part)}, 0, True, "")],
        "append", BRONZE.schema, partition_by=["ingest_date"])

    dirty = subprocess.run(cli, capture_output=True, text=True, env=os.environ)
    assert dirty.returncode == 3, dirty.stderr
    summary = json.loads(dirty.stdout)
    assert summary["exactly_once"] is False and summary["duplicated"] > 0
    assert summary["missing"] == summary["extra"] == summary["mismatched"] == 0
    assert "VIOLATED" in dirty.stderr
