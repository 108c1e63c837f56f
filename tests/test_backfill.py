"""Late-data backfills on real Spark, broker and Delta: gold repaired, proven, idempotent.

Each test builds a small pipeline whose gold has pending late events: a first
stream of on-time readings moves the watermark, a second one brings readings
2-15 minutes late (labelled by the generator), which gold keeps in late_events.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest

from streamlake.delta.table import open_table, read_table
from streamlake.operations.control import JobControl
from streamlake.operations.pipeline_checks import check_gold
from streamlake.pipeline.backfill import PipelinePaths, plan_backfill, run_backfill
from streamlake.pipeline.config import PipelineConfig
from streamlake.pipeline.driver import run_stages
from streamlake.pipeline.schemas import GOLD, LATE_EVENTS, SILVER
from streamlake.pipeline.windows import WindowSpec

TUMBLING = WindowSpec.parse("tumbling:1m")


def tables(cfg: PipelineConfig) -> dict[str, str]:
    return {name: cfg.table(name) for name in ("bronze", "silver", "quarantine", "gold", "late_events")}


def run_once(spark, cfg: PipelineConfig) -> None:
    run_stages(spark, cfg.build_stages(), JobControl(cfg.control_dir), available_now=True,
               report=lambda _line: None, poll_s=0.2)


@pytest.fixture
def with_late_events(spark, produce, topic_name, tmp_path):
    """A pipeline whose gold has pending late events (and their windows not yet restated)."""
    cfg = PipelineConfig(root=str(tmp_path / "lake"), topics=(topic_name,), allowed_lateness="5s")
    produce(topic_name, 400, seed=31, out_of_order_seconds=3)
    run_once(spark, cfg)
    produce(topic_name, 600, seed=32, late_fraction=0.2, out_of_order_seconds=3, duplicate_fraction=0.05)
    run_once(spark, cfg)
    late = read_table(spark, cfg.table("late_events"), LATE_EVENTS)
    assert late.where("NOT applied").count() > 20, "the fixture needs pending late events"
    return cfg


def gold_rows(spark, cfg) -> dict:
    return {(r.sensor_id, r.window_start, r.window_end): (r["count"], r.sum_temperature, r.min_temperature,
                                                          r.max_temperature, r.avg_temperature)
            for r in read_table(spark, cfg.table("gold"), GOLD).collect()}


def test_backfill_repairs_gold_and_the_check_proves_it(spark, with_late_events):
    cfg = with_late_events
    before = check_gold(spark, tables(cfg), TUMBLING)
    assert before.passed and before.windows_pending > 0, before.summary()  # pending windows are set apart
    result = run_backfill(spark, PipelinePaths.of(cfg.root), TUMBLING)
    assert result.late_events > 0 and result.windows > 0 and result.changed_windows > 0
    after = check_gold(spark, tables(cfg), TUMBLING, late_seen_through=result.silver_version)
    assert after.passed, after.summary()
    assert after.windows_pending == 0 and after.windows_checked >= before.windows_checked + before.windows_pending
    late = read_table(spark, cfg.table("late_events"), LATE_EVENTS)
    assert late.where("NOT applied").count() == 0
    assert {r.applied_by for r in late.collect()} == {result.run_id}
    gold = read_table(spark, cfg.table("gold"), GOLD)
    silver_count = read_table(spark, cfg.table("silver"), SILVER).count()
    assert gold.agg({"count": "sum"}).first()[0] == silver_count, "every valid event is in gold now"


def test_backfill_twice_changes_nothing_and_dry_run_changes_nothing(spark, with_late_events):
    cfg = with_late_events
    paths = PipelinePaths.of(cfg.root)
    versions = {t: open_table(cfg.table(t)).version() for t in ("gold", "late_events")}
    plan = plan_backfill(paths, TUMBLING)
    dry = run_backfill(spark, paths, TUMBLING, dry_run=True)
    assert dry.dry_run and dry.late_events == plan.late_events.num_rows and dry.windows == len(plan.windows)
    assert dry.window_list and all(" [" in w for w in dry.window_list)
    assert {t: open_table(cfg.table(t)).version() for t in versions} == versions, "a dry run commits nothing"
    first = run_backfill(spark, paths, TUMBLING)
    rows = gold_rows(spark, cfg)
    versions = {t: open_table(cfg.table(t)).version() for t in ("gold", "late_events")}
    second = run_backfill(spark, paths, TUMBLING)
    assert first.late_events > 0 and second.late_events == 0 and second.windows == 0
    assert gold_rows(spark, cfg) == rows
    assert {t: open_table(cfg.table(t)).version() for t in versions} == versions, "the second run commits nothing"


def test_backfill_of_a_range_applies_only_that_range(spark, with_late_events):
    cfg = with_late_events
    late = read_table(spark, cfg.table("late_events"), LATE_EVENTS).orderBy("event_time").collect()
    middle = late[len(late) // 2].event_time.replace(tzinfo=dt.timezone.utc)
    result = run_backfill(spark, PipelinePaths.of(cfg.root), TUMBLING, start=middle)
    pending = read_table(spark, cfg.table("late_events"), LATE_EVENTS).where("NOT applied").collect()
    assert result.late_events == sum(1 for r in late if r.event_time.replace(tzinfo=dt.timezone.utc) >= middle)
    assert pending and all(r.event_time.replace(tzinfo=dt.timezone.utc) < middle for r in pending)
    report = check_gold(spark, tables(cfg), TUMBLING, middle, None, late_seen_through=result.silver_version)
    assert report.passed, report.summary()


def test_backfill_while_the_stream_runs_stays_equal_to_a_recompute(spark, produce, with_late_events):
    """The gold stage commits while the backfill restates: whichever loses the commit race
    re-plans; afterwards gold still equals the recompute and nothing is applied twice."""
    from dataclasses import replace

    cfg = replace(with_late_events, processing_time_s=0.5)
    control = JobControl(cfg.control_dir)
    errors: list[BaseException] = []

    def stream():
        try:
            run_stages(spark, cfg.build_stages(), control, available_now=False, report=lambda _l: None, poll_s=0.2)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    runner = threading.Thread(target=stream, daemon=True)
    runner.start()
    producer = threading.Thread(target=produce, args=(cfg.topics[0], 600), kwargs=dict(
        seed=33, rate=150, late_fraction=0.1, out_of_order_seconds=3))
    producer.start()
    results = []
    for _ in range(3):
        time.sleep(2)
        results.append(run_backfill(spark, PipelinePaths.of(cfg.root), TUMBLING))
    producer.join()
    time.sleep(6)
    control.request_stop()
    runner.join(120)
    assert not errors, errors
    run_once(spark, replace(cfg, processing_time_s=None))  # drain what is left
    final = run_backfill(spark, PipelinePaths.of(cfg.root), TUMBLING)
    report = check_gold(spark, tables(cfg), TUMBLING, late_seen_through=final.silver_version)
    assert report.passed, report.summary()
    applied = read_table(spark, cfg.table("late_events"), LATE_EVENTS).where("applied")
    assert applied.count() == applied.select("topic", "partition", "offset").distinct().count()
    assert sum(r.late_events for r in results) + final.late_events == applied.count()


def test_late_events_view_shows_pending_hours_and_links_the_prefilled_backfill_form(spark, with_late_events):
    """StreamLake -> Late events: pending and applied counts per hour, the windows they touch,
    a link to the backfill form filled in for that hour; after a backfill, nothing pending."""
    import importlib.util
    from pathlib import Path

    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.testclient import TestClient

    from streamlake.operations.jobs import JobSpec, save_job

    cfg = with_late_events
    job = save_job(JobSpec(name=f"view_{Path(cfg.root).parent.name[-20:]}", topics=list(cfg.topics), root=cfg.root))
    path = Path(__file__).resolve().parents[1] / "plugins" / "streamlake_views.py"
    spec = importlib.util.spec_from_file_location("streamlake_views_late", path)
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    assert "Late events" in [v["name"] for v in plugin.StreamLakePlugin.external_views]
    plugin.app.dependency_overrides[get_user] = lambda: object()  # as if Airflow had authenticated the user
    client = TestClient(plugin.app, root_path="/streamlake")
    try:
        hours = client.get(f"/api/late-events?job={job.name}").json()
        assert hours and sum(h["pending"] for h in hours) == read_table(
            spark, cfg.table("late_events"), LATE_EVENTS).where("NOT applied").count()
        assert all(h["windows"] >= 1 for h in hours if h["pending"])
        page = client.get(f"/late-events?job={job.name}").text
        assert "backfill this hour" in page and "gold windows to restate" in page
        link = page.split("class='backfill-link' href='")[1].split("'")[0].replace("&amp;", "&")
        form = client.get("/" + link).text
        hour = hours[0]["hour"][:19].replace(" ", "T")
        assert "type='datetime-local'" in form and hour in form and "Trigger backfill_late_data" in form
        run_backfill(spark, PipelinePaths.of(cfg.root), TUMBLING)
        after = client.get(f"/api/late-events?job={job.name}").json()
        assert sum(h["pending"] for h in after) == 0 and sum(h["applied"] for h in after) > 0
        assert "nothing pending" in client.get(f"/late-events?job={job.name}").text
    finally:
        plugin.app.dependency_overrides.clear()


def test_a_backfill_before_the_first_pipeline_run_has_nothing_to_do(tmp_path):
    """The hourly schedule's first run can come before the job's first pipeline run (it did on
    the live platform): no gold yet means no late event is pending, which is not a failure."""
    from streamlake.operations.backfills import backfill_job
    from streamlake.operations.jobs import JobSpec

    job = JobSpec(name="not-run-yet", topics=["t"], root=str(tmp_path / "job"))
    summary = backfill_job(None, job, run_id="bf-early")  # returns before it needs Spark
    assert summary["late_events"] == 0 and summary["gold_version"] is None and summary["checks"] == []
    assert "no gold table yet" in summary["summary"]
    assert not (tmp_path / "job" / "gold").exists()
