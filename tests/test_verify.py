"""The proof after an operation (streamlake.operations.verify): checks and data quality,
recorded, incremental, and failing loudly on bad data. Real Spark, broker, Delta, GX; the
orders example (two aggregates: one check per gold table)."""

from __future__ import annotations

import json

import pytest

from conftest import SPARK_CONNECT_PORT
from helpers import example
from streamlake.operations.consistency import ConsistencyError, recent_checks
from streamlake.operations.jobs import JobSpec, save_job
from streamlake.operations.verify import verify_job
from streamlake.pipeline.definition import load_definition
from streamlake.pipeline.driver import run_stages


def run_once(spark, job: JobSpec) -> None:
    cfg = job.pipeline_config()
    run_stages(spark, cfg.build_stages(), job.control, available_now=True, report=lambda _l: None, poll_s=0.2)


@pytest.fixture
def job(produce, topic_name, tmp_path):
    definition = example("orders", tmp_path, topic_name, lateness="5s")
    spec = save_job(JobSpec(name=f"verify_{topic_name}", root=str(tmp_path / "lake"), definition_file=str(definition)))
    produce(topic_name, 400, seed=61, out_of_order_seconds=3, malformed_fraction=0.05, duplicate_fraction=0.05,
            definition=load_definition(definition))
    return spec


def test_verify_records_every_check_and_quality_then_only_what_changed(spark, produce, job):
    from streamlake.quality.results import read_results

    run_once(spark, job)
    summary = verify_job(spark, job, "ingest", context={"dag_id": "test"})
    kinds = [c["kind"] for c in summary["checks"]]
    assert sorted(kinds) == ["gold", "gold", "kafka-audit", "pipeline-accounting"], kinds
    assert all(c["passed"] for c in summary["checks"]), summary["checks"]
    tables = set(job.definition.table_names())
    assert {q["table"] for q in summary["quality"]} == tables
    assert all(q["status"] in ("PASS", "WARN") for q in summary["quality"]), summary["quality"]
    recorded = {r["kind"] for r in recent_checks(50, job.name)}
    assert recorded == {"kafka-audit", "pipeline-accounting", "gold"}
    assert {r["table_name"] for r in read_results()} >= tables

    produce(job.source_topics[0], 200, seed=62, out_of_order_seconds=3, definition=job.definition)
    run_once(spark, job)
    second = verify_job(spark, job, "ingest")
    accounting = next(c for c in recent_checks(50, job.name) if c["kind"] == "pipeline-accounting")
    details = json.loads(accounting["context"])["details"]
    assert details["since_version"] is not None, "the second accounting covers only the new bronze versions"
    assert details["bronze_rows"] == 200
    silver = next(q for q in second["quality"] if q["table"] == "silver")
    assert silver["versions"][0] is not None, "quality validates only what the run added"


def test_verify_fails_with_the_failed_check_named_when_gold_is_wrong(spark, job):
    from deltalake import DeltaTable

    run_once(spark, job)
    gold = DeltaTable(job.table_path("gold/revenue_5m"))
    gold.update({"orders": "orders + 1"})  # every window of one gold table is wrong
    with pytest.raises(ConsistencyError, match="gold/revenue_5m check .*VIOLATED"):
        verify_job(spark, job, "manual", quality=False)
    failed = [r for r in recent_checks(20, job.name) if r["verdict"] == "FAIL"]
    assert [r["kind"] for r in failed] == ["gold"] and "mismatched" in failed[0]["summary"]
    assert failed[0]["table_path"].endswith("gold/revenue_5m")


def test_check_runs_on_a_spark_connect_server_and_finds_what_verify_finds(spark, produce, job, broker):
    """`streamlake check --remote`: a thin client of a Spark Connect server (no JVM of its own;
    here the test session's, Spark's SparkConnectPlugin) that records the same checks; a wrong
    gold table fails there too. That `streamlake check` finds the server `make run` started by
    itself is shown on the running platform (test_live_platform.py)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from deltalake import DeltaTable

    cli = str(Path(sys.executable).parent / "streamlake")
    env = {**os.environ, "STREAMLAKE_KAFKA_BOOTSTRAP": broker}
    server = f"sc://127.0.0.1:{SPARK_CONNECT_PORT}"
    run_once(spark, job)
    done = subprocess.run([cli, "check", "--job", job.name, "--operation", "on-connect", "--remote", server],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"check:{job.name} on the Spark Connect server {server}" in done.stderr
    recorded = [r for r in recent_checks(50, job.name) if r["operation"] == "on-connect"]
    assert sorted(r["kind"] for r in recorded) == ["gold", "gold", "kafka-audit", "pipeline-accounting"]
    assert all(r["verdict"] == "PASS" for r in recorded), recorded

    # More data, then every gold row wrong: the (incremental) check covers the new data's windows.
    produce(job.source_topics[0], 100, seed=63, definition=job.definition)
    run_once(spark, job)
    DeltaTable(job.table_path("gold/activity")).update({"orders": "orders + 1"})
    failed = subprocess.run([cli, "check", "--job", job.name, "--operation", "on-connect-2", "--remote", server],
                            env=env, capture_output=True, text=True, timeout=300)
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert "gold/activity check" in failed.stderr + failed.stdout and "VIOLATED" in failed.stderr + failed.stdout
