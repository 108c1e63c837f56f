"""The StreamLake views as HTML: every check names itself and what it covered, operations read
as fields (raw JSON behind a toggle), times are seconds with UTC on hover, and the Pipelines
view lists every pipeline of pipelines/. In-process through FastAPI's test client (the
Airflow login itself, in a real browser, is tests/test_live_platform.py)."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """The views' app, on a home of this module's own: the jobs, checks and operations other
    files recorded in the session's home (a job named ``orders`` on another topic) are not
    what these tests read."""
    from helpers import views_client

    with pytest.MonkeyPatch.context() as env:
        env.setenv("STREAMLAKE_HOME", str(tmp_path_factory.mktemp("views-home")))
        client = views_client()
        yield client
        client.app.dependency_overrides.clear()


def _rows(page: str, cls: str) -> list[str]:
    return re.findall(rf"<tr class='{cls}'[^>]*>.*?</tr>", page, flags=re.S)


def test_every_check_names_itself_and_what_it_covered(client, tmp_path):
    from streamlake.operations.consistency import RESULTS, migrate_results_table, record_pipeline_check
    from streamlake.operations.jobs import JobSpec
    from streamlake.delta.records import append_row

    job = JobSpec(name="views-job", root=str(tmp_path / "root"), topics=["views-topic"])
    migrate_results_table()
    append_row(RESULTS, {
        "check_id": "chk-audit", "operation": "savepoint", "checked_at": dt.datetime(2026, 11, 25, 10, 11, 12, 345678,
                                                                                     tzinfo=dt.timezone.utc),
        "job": job.name, "table_path": f"{job.root}/bronze", "topics": json.dumps(["views-topic"]),
        "delta_version": 7, "kafka_records": 10, "table_rows": 10, "missing": 0, "duplicated": 0, "extra": 0,
        "mismatched": 0, "offsets_expected": json.dumps({"views-topic": {"0": 5, "1": 5}}), "offsets_match": True,
        "verdict": "PASS", "summary": "ok", "context": json.dumps({"dag_id": "savepoint", "run_id": "r1"}),
        "mode": "incremental", "proof_version": 5, "kind": "kafka-audit"})
    record_pipeline_check(job, "ingest-scheduled", "pipeline-accounting", True, "ok",
                          {"bronze_version": 9, "since_version": 7, "bronze_rows": 4}, {})
    record_pipeline_check(job, "backfill", "gold", False, "VIOLATED",
                          {"silver_version": 4, "range_start": "2026-11-25T10:00:00+00:00", "range_end": None,
                           "windows_checked": 3, "mismatched": 1}, {}, table_path=f"{job.root}/gold/revenue_5m")
    page = client.get(f"/checks?job={job.name}").text
    rows = _rows(page, "check")
    kinds = [re.search(r"data-kind='([^']+)'", r).group(1) for r in rows]
    assert sorted(kinds) == ["gold", "kafka-audit", "pipeline-accounting"]
    by_kind = dict(zip(kinds, rows))
    name = lambda row: re.search(r"class='check-name'[^>]*>([^<]+)<", row).group(1)  # noqa: E731
    covered = lambda row: re.search(r"<td class='check-covered'>([^<]+)<", row).group(1)  # noqa: E731
    assert name(by_kind["kafka-audit"]) == "Kafka audit"
    assert covered(by_kind["kafka-audit"]).startswith("bronze v7 against views-topic (incremental from the proof of v5)")
    assert "offsets expected views-topic-0: 5, views-topic-1: 5" in covered(by_kind["kafka-audit"]).replace("&#x27;", "'")
    assert name(by_kind["pipeline-accounting"]) == "pipeline accounting"
    assert "bronze versions (7, 9]" in covered(by_kind["pipeline-accounting"])
    assert name(by_kind["gold"]) == "gold = recompute"
    assert covered(by_kind["gold"]).startswith("gold/revenue_5m against silver v4, event time [2026-11-25T10:00:00")
    assert "<td class='FAIL'>FAIL</td>" in by_kind["gold"]
    # times: to the second, UTC in the page and on hover, no microseconds
    assert ("<time class='ts' datetime='2026-11-25T10:11:12Z' title='2026-11-25 10:11:12 UTC'>"
            "2026-11-25 10:11:12 UTC</time>") in by_kind["kafka-audit"]
    assert "345678" not in page and "time.ts[datetime]" in page, "the browser shows local time (the page's script)"


def test_operations_read_as_fields_with_the_raw_json_behind_a_toggle(client):
    from streamlake.delta.records import record_operation

    record_operation("savepoint", "views-ops", {"savepoint": "sp-1", "stopped": False,
                                                "versions": {"bronze": 3, "silver": 2},
                                                "offsets": {"t": {"0": 10}}, "dag_id": "savepoint",
                                                "run_id": "manual__1", "task_id": "take_savepoint"})
    record_operation("rescale", "views-ops", {"settings": {"before": {"total_executor_cores": 1},
                                                           "after": {"total_executor_cores": 2}},
                                              "throughput_before": {"rows_per_second": 100.0}})
    page = client.get("/operations?job=views-ops").text
    details = re.findall(r"<dl class='op-details'>.*?</dl>\s*<details class='raw-json'>", page, flags=re.S)
    assert len(details) == 2
    savepoint = next(d for d in details if "sp-1" in d)
    for field in ("<dt>savepoint</dt><dd>sp-1</dd>", "<dt>stopped</dt><dd>False</dd>", "<dt>versions</dt>",
                  "<dt>bronze</dt><dd>3</dd>", "<dt>DAG run</dt><dd>savepoint / manual__1 / take_savepoint</dd>"):
        assert field in savepoint, field
    rescale = next(d for d in details if "throughput before" in d)
    assert "<dt>settings after</dt>" in rescale and "<dt>total executor cores</dt><dd>2</dd>" in rescale
    assert "measured by the job&#x27;s next run" in rescale
    raw = re.search(r"<details class='raw-json'><summary>raw JSON</summary><pre>(.*?)</pre>", page, flags=re.S)
    assert json.loads(raw.group(1).replace("&quot;", '"').replace("&#x27;", "'"))
    assert re.search(r"<time class='ts' datetime='[0-9T:-]+Z' title='[0-9 :-]+ UTC'>", page)


def test_the_pipelines_view_lists_every_definition_with_its_tables(client):
    page = client.get("/pipelines").text
    sections = dict(re.findall(r"<section class='pipeline' data-pipeline='([^']+)'>(.*?)</section>", page, re.S))
    assert {"orders", "sensors"} <= set(sections)
    orders = sections["orders"]
    for table in ("bronze", "silver", "quarantine", "gold/revenue_5m", "late_events/revenue_5m", "gold/activity",
                  "late_events/activity"):
        sql = "orders." + table.replace("/", "_")  # what `streamlake sql` and the Connect server call it
        assert f"<td class=''>{table}</td><td><code>{sql}</code></td>" in orders, table
    assert "ingest_orders" in orders and "backfill_orders" in orders and "late-events?job=orders" in orders
    assert "gold/activity</b>: per window and session:2m window" in orders
    api = {p["name"]: p for p in client.get("/api/pipelines").json()}
    assert set(api["sensors"]["aggregates"]) == {"per_minute"}
    assert api["orders"]["topics"] == ["orders"]
    # gold's freshness (its value on a running pipeline: test_pipelines.py, test_live_platform.py)
    assert api["orders"]["freshness_s"] == "no tables yet"
    assert "gold freshness: <span class='freshness'>no tables yet</span>" in orders


def test_a_definition_that_does_not_load_is_listed_with_why_and_the_others_stay(client, tmp_path, monkeypatch):
    import shutil

    from airflow.dag_processing.dagbag import DagBag

    for name in ("sensors.yaml", "orders.yaml"):
        shutil.copy(ROOT / "pipelines" / name, tmp_path / name)
    (tmp_path / "typo.yaml").write_text((ROOT / "pipelines" / "orders.yaml").read_text()
                                        .replace("name: orders", "name: typo").replace("decimal(12,2)", "decimal(12"))
    monkeypatch.setenv("STREAMLAKE_PIPELINES", str(tmp_path))
    page = client.get("/pipelines").text
    errors = re.search(r"<section class='definition-errors'>(.*?)</section>", page, re.S)
    assert errors and "typo.yaml" in errors.group(1) and "schema.amount" in errors.group(1), page[-2000:]
    assert "data-pipeline='orders'" in page and "data-pipeline='sensors'" in page
    dags = DagBag(dag_folder=str(ROOT / "dags"))
    assert {"ingest_orders", "ingest_sensors"} <= set(dags.dag_ids)
    assert [Path(f).name for f in dags.import_errors] == ["pipeline_definitions.py"], dags.import_errors
    assert "typo.yaml: schema.amount: " in next(iter(dags.import_errors.values()))
    assert not any("typo" in d for d in dags.dag_ids)


def test_the_pipelines_are_read_side_by_side_in_their_order(monkeypatch):
    """Each pipeline's overview waits on its store and Kafka (3 s when Kafka does not answer):
    four of them take about one's time, not four times it, and come back in the order asked."""
    import threading
    import time

    from helpers import views_plugin

    plugin = views_plugin("streamlake_views_side_by_side")
    threads = set()

    def overview(name):
        threads.add(threading.get_ident())
        time.sleep(0.5)  # one pipeline's wait on Kafka
        return {"name": name}

    monkeypatch.setattr(plugin, "_pipeline_overview", overview)
    started = time.monotonic()
    assert [p["name"] for p in plugin._pipeline_overviews(["d", "a", "c", "b"])] == ["d", "a", "c", "b"]
    assert len(threads) == 4 and time.monotonic() - started < 4 * 0.5, time.monotonic() - started
