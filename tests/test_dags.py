"""DAG integrity: every DAG parses quickly, without errors, and documents itself."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = {"streaming_ingest", "savepoint", "restore", "rescale", "backfill_late_data"}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


def test_dags_import_without_errors_in_under_two_seconds(dagbag):
    assert not dagbag.import_errors, dagbag.import_errors
    assert set(dagbag.dag_ids) == EXPECTED
    for stat in dagbag.dagbag_stats:
        assert stat.duration.total_seconds() < 2, f"{stat.file} took {stat.duration}"


@pytest.mark.parametrize("dag_id", sorted(EXPECTED))
def test_dag_documents_itself(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    assert dag.doc_md and len(dag.doc_md) > 300, "doc_md explains what the DAG does"
    assert "streamlake" in dag.tags and len(dag.tags) >= 2
    assert dag.default_args.get("retries") is not None
    assert dag.params, "manual triggers are configured through params"
    for name in dag.params:
        param = dag.params.get_param(name)
        assert param.description and len(param.description) > 15, f"{dag_id}.{name} lacks a description"
    for task in dag.tasks:
        assert task.retries is not None


def test_continuous_supervisor_is_not_retried_by_airflow(dagbag):
    """Restarts are the restart strategy's; an Airflow retry would hide that it gave up."""
    assert dagbag.dags["streaming_ingest"].get_task("supervise_continuous").retries == 0


def test_restore_form_lists_existing_savepoints(tmp_path):
    """The restore DAG's savepoint_id param offers the savepoints on disk, newest first."""
    import importlib.util
    import json

    from streamlake import config

    root = config.savepoints_dir()
    for sp in ("sp-20260101-000000-aaaaaa", "sp-20260102-000000-bbbbbb"):
        (root / sp).mkdir(parents=True, exist_ok=True)
        (root / sp / "manifest.json").write_text(json.dumps({"id": sp}))
    try:
        spec = importlib.util.spec_from_file_location("restore_dag", ROOT / "dags" / "restore.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        param = module.dag.params.get_param("savepoint_id")
        offered = param.schema["enum"]
        assert offered == config.savepoint_ids(), "every savepoint on disk, newest first"
        assert offered.index("sp-20260102-000000-bbbbbb") < offered.index("sp-20260101-000000-aaaaaa")
        assert param.value == offered[0], "the newest is preselected"
    finally:
        for sp in ("sp-20260101-000000-aaaaaa", "sp-20260102-000000-bbbbbb"):
            (root / sp / "manifest.json").unlink()
            (root / sp).rmdir()


def test_backfill_dag_has_the_range_form_and_an_hourly_schedule_without_catch_up(dagbag):
    dag = dagbag.dags["backfill_late_data"]
    from airflow.timetables.interval import CronDataIntervalTimetable

    assert not dag.catchup and isinstance(dag.timetable, CronDataIntervalTimetable), "runs need data intervals"
    assert dag.timetable._expression == "0 * * * *"
    start, end = dag.params.get_param("start"), dag.params.get_param("end")
    assert start.schema["format"] == end.schema["format"] == "date-time", "the form shows date-time pickers"
    assert dag.params.get_param("all_pending").schema["type"] == "boolean"
    assert dag.params.get_param("dry_run").schema["type"] == "boolean"
    assert {t.task_id for t in dag.tasks} == {"resolve_range", "backfill", "report"}


def test_tables_are_assets_written_by_the_tasks_that_write_them(dagbag):
    """The Assets view shows what feeds what: Kafka -> the pipeline's tables -> backfills."""
    ingest = dagbag.dags["streaming_ingest"].get_task("ingest_available_now")
    names = {a.name.split(".")[-1] for a in ingest.outlets}
    assert names == {"bronze", "silver", "quarantine", "gold", "late_events"}
    assert any(a.uri.startswith("kafka://") for a in ingest.inlets)
    backfill = dagbag.dags["backfill_late_data"].get_task("backfill")
    assert {a.name.split(".")[-1] for a in backfill.outlets} == {"gold", "late_events"}


def test_backfill_range_follows_the_run_type():
    """Manual: the form (or all pending); scheduled/backfill runs: their data interval."""
    import datetime as dt

    from streamlake.orchestration.tasks import backfill_range

    a, b = dt.datetime(2026, 11, 22, 10, tzinfo=dt.timezone.utc), dt.datetime(2026, 11, 22, 11, tzinfo=dt.timezone.utc)
    form = {"all_pending": False, "start": "2026-11-22T08:00:00+00:00", "end": "2026-11-22T09:00:00+00:00",
            "dry_run": True}
    manual = backfill_range(form, "manual", a, b, "manual__2026-11-22T10:00:00+00:00")
    assert (manual["start"], manual["end"], manual["dry_run"]) == (form["start"], form["end"], True)
    everything = backfill_range({**form, "all_pending": True}, "manual", a, b, "manual__x")
    assert everything["start"] is None and everything["end"] is None
    scheduled = backfill_range(form, "scheduled", a, b, "scheduled__2026-11-22T10:00:00+00:00")
    assert (scheduled["start"], scheduled["end"], scheduled["dry_run"]) == (a.isoformat(), b.isoformat(), False)
    backfill = backfill_range(form, "backfill", a, b, "backfill__2026-11-22T10:00:00+00:00")
    assert backfill["start"] == a.isoformat() and backfill["run_id"].startswith("bf-backfill")
