"""A new local S3 server (memory only) means the lake's checkpoints, savepoints and proofs
describe tables that are gone: `make run LAKE=s3` after `make stop` moves them aside instead
of failing every ingest. Real processes and directories, in a home of the test's own."""

from __future__ import annotations

import sys

import pytest

from streamlake import procs
from streamlake.platform.object_store import archive_for_new_lake


def _previous_run(home):
    for rel in ("data/sensors/bronze/_delta_log/00000000000000000000.json",
                "data/_platform/consistency_checks/part-0.parquet",
                "lakes/s3/sensors/_checkpoints/bronze/offsets/0",
                "savepoints/sp-20261122-090425-fc8801/manifest.json",
                "quality/validations/v.json", "backfills/bf-1.json",
                "jobs/sensors.json", "logs/kafka-1.log", "airflow/airflow.db", "kafka/cluster.json"):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(rel)


def test_state_of_the_previous_lake_moves_aside_whole_and_job_specs_and_kafka_stay(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMLAKE_HOME", str(tmp_path))
    _previous_run(tmp_path)

    archived = archive_for_new_lake()

    assert archived is not None and archived.parent == tmp_path / "archive"
    for rel in ("data/sensors/bronze/_delta_log/00000000000000000000.json",
                "data/_platform/consistency_checks/part-0.parquet",
                "lakes/s3/sensors/_checkpoints/bronze/offsets/0",
                "savepoints/sp-20261122-090425-fc8801/manifest.json", "quality/validations/v.json",
                "backfills/bf-1.json"):
        assert (archived / rel).read_text() == rel, rel  # moved, nothing deleted
        assert not (tmp_path / rel).exists(), rel
    for rel in ("jobs/sensors.json", "logs/kafka-1.log", "airflow/airflow.db", "kafka/cluster.json"):
        assert (tmp_path / rel).read_text() == rel, rel  # not the lake's: stays (Kafka keeps its topics)
    assert archive_for_new_lake() is None  # nothing left to move


def test_nothing_moves_under_a_running_airflow(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMLAKE_HOME", str(tmp_path))
    _previous_run(tmp_path)
    procs.start("airflow", [sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(RuntimeError, match="airflow still use"):
            archive_for_new_lake()
    finally:
        procs.stop("airflow")
    assert (tmp_path / "data/sensors/bronze/_delta_log/00000000000000000000.json").exists()
