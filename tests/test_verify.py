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

    # the second run as the ingest DAG proves it: the checks (verify), then the quality task
    produce(job.source_topics[0], 200, seed=62, out_of_order_seconds=3, definition=job.definition)
    run_once(spark, job)
    validations = len(read_results())
    proof = verify_job(spark, job, "ingest", quality=False)
    assert "quality" not in proof and len(read_results()) == validations, "the checks alone validate nothing"
    accounting = next(c for c in recent_checks(50, job.name) if c["kind"] == "pipeline-accounting")
    details = json.loads(accounting["context"])["details"]
    assert details["since_version"] is not None, "the second accounting covers only the new bronze versions"
    assert details["bronze_rows"] == 200
    checks = len(recent_checks(50, job.name))
    second = verify_job(spark, job, "ingest", checks=False)
    assert second["checks"] == [] and len(recent_checks(50, job.name)) == checks, "quality alone checks nothing"
    silver = next(q for q in second["quality"] if q["table"] == "silver")
    assert silver["versions"][0] is not None, "quality validates only what the run added"
    from deltalake import DeltaTable

    since, through = silver["versions"]
    added = (DeltaTable(job.table_path("silver"), version=through).to_pyarrow_table().num_rows
             - DeltaTable(job.table_path("silver"), version=since).to_pyarrow_table().num_rows)
    assert silver["rows"] == added > 0, silver  # silver only grows by appends
    with pytest.raises(ValueError):
        verify_job(spark, job, "ingest", checks=False, quality=False)


def test_gold_is_checked_again_only_for_the_silver_rows_it_consumed(spark, produce, job):
    """Silver rows gold has not consumed yet cannot have changed gold: a verify while gold
    lags silver (a job stopped between its stages) checks no gold table; once gold consumes
    them, the next verify checks the event times of exactly those rows."""
    from streamlake.pipeline.driver import run_stages

    def checks(summary, kind):
        return [c for c in summary["checks"] if c["kind"] == kind]

    run_once(spark, job)
    assert len(checks(verify_job(spark, job, "ingest", quality=False), "gold")) == 2
    produce(job.source_topics[0], 100, seed=65, out_of_order_seconds=3, definition=job.definition)
    bronze_and_silver = job.pipeline_config().build_stages()[:2]
    run_stages(spark, bronze_and_silver, job.control, available_now=True, report=lambda _l: None, poll_s=0.2)
    lagging = verify_job(spark, job, "ingest", quality=False)
    assert checks(lagging, "gold") == [], "gold consumed nothing new: nothing in it can have changed"
    assert checks(lagging, "pipeline-accounting")[0]["passed"]
    run_once(spark, job)  # gold consumes the 100 events
    caught_up = checks(verify_job(spark, job, "ingest", quality=False), "gold")
    assert len(caught_up) == 2 and all(c["passed"] for c in caught_up), caught_up
    assert all("check of event time [" in c["summary"] for c in caught_up), caught_up


def _write(version):
    return {"version": version, "operation": "WRITE"}


def _restore(version, to, operation="RESTORE"):
    return {"version": version, "operation": operation, "streamlake": {"operation": "restore", "toVersion": to}}


@pytest.mark.parametrize("log, since, through, held", [
    ([_write(1), _write(2), _write(3), _write(4)], 2, 4, [3, 4]),
    ([_write(1), _write(2), _write(3), _restore(4, 2), _write(5)], 2, 5, [5]),  # back to the accounted version
    ([_write(1), _write(2), _write(3), _restore(4, 2), _write(5)], 1, 5, [2, 5]),  # silver had consumed 1
    ([_write(1), _write(2), _write(3), _write(4), _write(5), _restore(6, 2), _write(7), _restore(8, 4)], 2, 8,
     [3, 4]),  # to a version a first restore had rolled back: its snapshot, not the latest appends
    ([_write(1), _write(2), _restore(3, 2, "WRITE"), _write(4)], 1, 4, [2, 4]),  # a restore to the same version
    ([_write(1), _write(2), _write(3), _restore(4, 1), _write(5)], 2, 5, None),  # before the accounted version
    ([_write(1), _write(2), {"version": 3, "operation": "OPTIMIZE"}], 1, 3, None),  # a rewrite
    ([_write(1), _write(2), {"version": 3, "operation": "RESTORE"}], 1, 3, None),  # a restore not a savepoint's
])
def test_the_appends_a_bronze_snapshot_holds_are_read_from_its_log(monkeypatch, log, since, through, held):
    """Which bronze commits' rows the accounting reads after ``since``: appends, less what a
    savepoint's restore rolled back; None (account for everything) where the log does not
    say. The Delta log is a stand-in here (its history entries); the test above runs it on
    real tables."""
    from streamlake.operations import pipeline_checks

    class Log:
        def version(self):
            return max(c["version"] for c in log)

        def history(self, limit):
            return sorted(log, key=lambda c: -c["version"])[:limit]

    monkeypatch.setattr(pipeline_checks, "open_table", lambda _path: Log())
    assert pipeline_checks._appended_since("bronze", since, through) == held


def test_the_accounting_stays_incremental_across_a_restore_and_sees_what_it_rolled_back(spark, produce, job):
    """After a savepoint's restore the pipeline accounting reads only the appends bronze
    still holds (the records read again from the savepoint's offsets, and the new ones),
    not all of bronze; a silver row of a commit the restore rolled back, left behind, is
    caught as extra. The counts are the records this test produced."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable, write_deltalake

    from streamlake.operations.pipeline_checks import account_for_bronze
    from streamlake.operations.savepoints import create_savepoint, restore_savepoint

    tables, definition, topic = job.tables(), job.definition, job.source_topics[0]
    run_once(spark, job)
    first = account_for_bronze(spark, tables, definition)
    assert first.passed and first.bronze_rows == 400, first.summary()
    savepoint = create_savepoint(job)
    produce(topic, 200, seed=63, definition=definition)
    run_once(spark, job)
    later = account_for_bronze(spark, tables, definition, first.bronze_version)
    assert later.passed and later.bronze_rows == 200, later.summary()
    restore_savepoint(savepoint.id)
    restored = account_for_bronze(spark, tables, definition, later.bronze_version)  # as verify_restored
    assert restored.passed and restored.bronze_version == first.bronze_version, restored.summary()

    produce(topic, 150, seed=64, definition=definition)
    run_once(spark, job)
    resumed = account_for_bronze(spark, tables, definition, restored.bronze_version)
    assert resumed.passed, resumed.summary()
    assert resumed.since_version == first.bronze_version, "incremental across the restore"
    assert resumed.bronze_rows == 200 + 150, resumed.summary()

    silver = DeltaTable(tables["silver"]).to_pyarrow_table()
    # a row from before the savepoint, as if the rolled-back commit had written it
    stale = silver.filter(pc.field("bronze_version") <= first.bronze_version).slice(0, 1)
    column = stale.schema.get_field_index("bronze_version")
    stale = stale.set_column(column, stale.schema.field(column),
                             pa.array([later.bronze_version], stale.schema.field(column).type))
    write_deltalake(tables["silver"], stale, mode="append")
    broken = account_for_bronze(spark, tables, definition, restored.bronze_version)
    assert not broken.passed and broken.extra == 1, broken.summary()


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
    # the quality task on its own (the ingest DAG's, after the proof) fails on the same rows,
    # naming the critical expectation, and records no check
    from streamlake.quality.validate import QualityError

    checks = len(recent_checks(50, job.name))
    with pytest.raises(QualityError, match=r"gold/revenue_5m.*FAIL") as err:
        verify_job(spark, job, "manual", checks=False)
    assert any(r.table == "gold/revenue_5m" and r.critical_failures for r in err.value.reports)
    assert len(recent_checks(50, job.name)) == checks


def test_gold_is_checked_at_one_snapshot_whatever_is_committed_meanwhile(spark, job):
    """The next run's job may commit to gold while a proof reads it (two runs of the ingest DAG
    at a time): the gold check compares one snapshot of gold with the silver version that
    snapshot consumed. A commit after the snapshot (here: every window made wrong) is not that
    check's: it passes at the snapshot, and fails on the table as it is now."""
    from deltalake import DeltaTable

    from streamlake.operations.pipeline_checks import check_gold

    run_once(spark, job)
    aggregate = next(a for a in job.definition.aggregates if a.gold_table == "gold/revenue_5m")
    path = job.table_path(aggregate.gold_table)
    snapshot = DeltaTable(path).version()
    DeltaTable(path).update({"orders": "orders + 1"})
    at_snapshot = check_gold(spark, job.tables(), job.definition, aggregate, gold_version=snapshot)
    assert at_snapshot.passed and at_snapshot.windows_checked > 0, at_snapshot.summary()
    now = check_gold(spark, job.tables(), job.definition, aggregate)
    assert not now.passed and now.mismatched == at_snapshot.windows_checked, now.summary()


def test_a_check_that_cannot_run_is_raised_after_the_checks_before_it_are_recorded(spark, job):
    """The checks run side by side and are recorded in order (audit, accounting, gold per
    aggregate): a gold table that is gone raises its error, and the audit and accounting
    that ran beside it are still recorded, passing."""
    import shutil

    run_once(spark, job)
    last = job.definition.aggregates[-1]
    shutil.rmtree(job.table_path(last.gold_table))
    with pytest.raises(FileNotFoundError, match=last.gold_table):
        verify_job(spark, job, "gold-gone", quality=False)
    recorded = [r for r in recent_checks(50, job.name) if r["operation"] == "gold-gone"]
    recorded_tables = sorted((r["kind"], r["table_path"].rsplit("/lake/", 1)[-1]) for r in recorded)
    assert recorded_tables == sorted([("kafka-audit", "bronze"), ("pipeline-accounting", "silver"),
                                      *[("gold", a.gold_table) for a in job.definition.aggregates[:-1]]])
    assert all(r["verdict"] == "PASS" for r in recorded), recorded


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
