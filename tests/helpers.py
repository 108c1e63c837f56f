"""Helpers shared by the integration tests."""

from __future__ import annotations

import json
from pathlib import Path

from streamlake.operations.audit import audit_offsets
from streamlake.pipeline.ingest import IngestConfig, progress_file, run_ingest


def ingest(spark, lake, topic, **kwargs) -> dict:
    """Run the bronze ingest in the test session's Spark (available-now unless told)."""
    cfg = IngestConfig(table=lake["table"], checkpoint=lake["checkpoint"], topics=(topic,), **kwargs)
    lines: list[str] = []
    summary = run_ingest(spark, cfg, report=lines.append, poll_s=0.2)
    summary["lines"] = lines
    return summary


def progress(lake) -> list[dict]:
    path = progress_file(lake["checkpoint"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_exactly_once(lake, topic, expected_rows: int | None = None):
    report = audit_offsets(lake["table"], [topic])
    assert report.exactly_once, report.summary()
    if expected_rows is not None:
        assert report.totals()["table_rows"] == expected_rows, report.summary()
    return report


def delta_log_entries(table: str) -> list[list[dict]]:
    """Actions of every commit file, in version order."""
    log = Path(table) / "_delta_log"
    return [[json.loads(line) for line in f.read_text().splitlines()] for f in sorted(log.glob("*.json"))]


def interrupted_checkpoint_write(folder, batch=0):
    """What a process killed inside Spark's checkpoint write leaves: the entry's temp file
    and its checksum, never renamed into place (names as found after such a kill)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f".{batch}.0c6c30bc-6f33-4085-8810-f7bab4997059.tmp"
    (folder / name).write_text("v1\n{}\n{}")
    (folder / f".{name}.crc").write_bytes(b"crc")
    return {name, f".{name}.crc"}


EXAMPLES = Path(__file__).resolve().parents[1] / "pipelines"


def example(name: str, tmp_path: Path, topic: str, *, lateness: str | None = None, keep_aggregates=None) -> Path:
    """A copy of the example definition ``name`` (pipelines/<name>.yaml) reading ``topic``,
    written under ``tmp_path``, optionally with every aggregate's allowed lateness set to
    ``lateness`` (late events sooner) and only the first ``keep_aggregates`` aggregates.
    Returns the file (jobs started with spark-submit read definitions from files)."""
    import yaml

    data = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    data["topics"] = [topic]
    if keep_aggregates is not None:
        data["aggregates"] = data["aggregates"][:keep_aggregates]
    if lateness is not None:
        for aggregate in data["aggregates"]:
            aggregate["allowed_lateness"] = lateness
    path = Path(tmp_path) / f"{name}-{topic}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def pipeline_config(root, definition_file, **settings):
    """A PipelineConfig of the definition in ``definition_file`` under ``root``."""
    from streamlake.pipeline.config import PipelineConfig
    from streamlake.pipeline.definition import load_definition

    return PipelineConfig(root=str(root), definition=load_definition(definition_file), **settings)


def run_available_now(spark, cfg) -> dict:
    """Every stage of ``cfg`` once with the available-now trigger, in the test's SparkSession."""
    from streamlake.pipeline.control import JobControl
    from streamlake.pipeline.driver import run_stages

    return run_stages(spark, cfg.build_stages(), JobControl(cfg.control_dir), available_now=True,
                      report=lambda _line: None, poll_s=0.2)


def views_plugin(module_name: str = "streamlake_views_under_test"):
    """The StreamLake views plugin (plugins/streamlake_views.py) loaded as a module of its own,
    as Airflow's plugin manager loads it: each call is a separate app."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "plugins" / "streamlake_views.py"
    spec = importlib.util.spec_from_file_location(module_name, path)
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    return plugin


def views_client(plugin=None):
    """A client of the views app (``plugin``'s, else a new one) as if Airflow had authenticated
    the user (Airflow's ``get_user`` dependency overridden on that app)."""
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.testclient import TestClient

    plugin = plugin or views_plugin()
    plugin.app.dependency_overrides[get_user] = lambda: object()
    return TestClient(plugin.app, root_path="/streamlake")

