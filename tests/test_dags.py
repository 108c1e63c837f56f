"""DAG integrity: every DAG parses quickly, without errors, and documents itself."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = {"streaming_ingest", "savepoint", "restore", "rescale"}


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
