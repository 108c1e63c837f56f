"""Late-data backfills on real Spark, broker and Delta: gold repaired, proven, idempotent.

The orders example (a tumbling aggregate per customer and a session aggregate without
keys), with 5 s of allowed lateness: a first stream of on-time orders moves the
watermarks, a second one brings orders late enough for every window (labelled by the
generator), which each aggregate keeps in its late_events table.
"""

from __future__ import annotations

import datetime as dt
import shutil
import threading
import time
from dataclasses import replace

import pytest

from helpers import example, pipeline_config, run_available_now
from streamlake.delta.table import open_table, read_table
from streamlake.pipeline.control import JobControl
from streamlake.operations.pipeline_checks import check_gold
from streamlake.pipeline.backfill import AggregatePaths, plan_backfill, run_backfill
from streamlake.pipeline.driver import run_stages
from streamlake.pipeline.schemas import gold_spec, late_spec, silver_spec


def tables(cfg) -> dict[str, str]:
    return {name: cfg.table(name) for name in cfg.definition.table_names()}


@pytest.fixture(scope="module")
def late_events_lake(spark, broker, tmp_path_factory):
    """A pipeline whose gold tables have pending late events (their windows not yet restated),
    built once for the module: two streams, two available-now runs."""
    import uuid

    from streamlake.kafka.producer import produce_records

    tmp = tmp_path_factory.mktemp("backfill-lake")
    topic = f"backfill-{uuid.uuid4().hex[:8]}"
    cfg = pipeline_config(tmp / "lake", example("orders", tmp, topic, lateness="5s"))
    common = dict(partitions=3, progress=False, value_bytes=200, out_of_order_seconds=3)
    produce_records(cfg.definition, topic, 400, seed=31, **common)
    run_available_now(spark, cfg)
    produce_records(cfg.definition, topic, 600, seed=32, late_fraction=0.2, duplicate_fraction=0.05, **common)
    run_available_now(spark, cfg)
    for agg in cfg.definition.aggregates:
        late = read_table(spark, cfg.table(agg.late_table), late_spec(cfg.definition, agg))
        assert late.where("NOT applied").count() > 20, f"the fixture needs pending late events in {agg.name}"
    return cfg


@pytest.fixture
def with_late_events(late_events_lake, tmp_path):
    """A copy of that pipeline's root (tables, checkpoints, control) for one test: each test
    restates and streams into its own. Delta logs hold relative paths and the stages'
    checkpoints name tables by id, so the copy is a pipeline of its own on the same topic."""
    root = tmp_path / "lake"
    shutil.copytree(late_events_lake.root, root)
    return replace(late_events_lake, root=str(root))


def gold_rows(spark, cfg, aggregate) -> dict:
    spec = gold_spec(cfg.definition, aggregate)
    rows = read_table(spark, cfg.table(aggregate.gold_table), spec).toArrow().to_pylist()
    return {(*(r[k] for k in aggregate.keys), r["window_start"], r["window_end"]):
            {k: v for k, v in r.items() if k != "updated_at"} for r in rows}


@pytest.mark.parametrize("name", ["revenue_5m", "activity"])
def test_backfill_repairs_gold_and_the_check_proves_it(spark, with_late_events, name):
    cfg = with_late_events
    d = cfg.definition
    agg = d.aggregate(name)
    before = check_gold(spark, tables(cfg), d, agg)
    assert before.passed and before.windows_pending > 0, before.summary()  # pending windows are set apart
    result = run_backfill(spark, d, agg, AggregatePaths.of(cfg.root, agg))
    assert result.late_events > 0 and result.windows > 0 and result.changed_windows > 0
    after = check_gold(spark, tables(cfg), d, agg, late_seen_through=result.silver_version)
    assert after.passed, after.summary()
    assert after.windows_pending == 0
    late = read_table(spark, cfg.table(agg.late_table), late_spec(d, agg))
    assert late.where("NOT applied").count() == 0
    assert {r.applied_by for r in late.collect()} == {result.run_id}
    gold = read_table(spark, cfg.table(agg.gold_table), gold_spec(d, agg))
    silver_count = read_table(spark, cfg.table("silver"), silver_spec(d)).count()
    assert gold.agg({"orders": "sum"}).first()[0] == silver_count, "every valid order is in gold now"
    other = next(a for a in d.aggregates if a.name != name)
    assert read_table(spark, cfg.table(other.late_table), late_spec(d, other)).where("NOT applied").count() > 0, \
        "a backfill of one aggregate leaves the other's late events pending"


def test_backfill_twice_changes_nothing_and_dry_run_changes_nothing(spark, with_late_events):
    cfg = with_late_events
    d = cfg.definition
    agg = d.aggregate("revenue_5m")
    paths = AggregatePaths.of(cfg.root, agg)
    versions = {t: open_table(cfg.table(t)).version() for t in (agg.gold_table, agg.late_table)}
    plan = plan_backfill(d, agg, paths)
    dry = run_backfill(spark, d, agg, paths, dry_run=True)
    assert dry.dry_run and dry.late_events == plan.late_events.num_rows and dry.windows == len(plan.windows)
    assert dry.window_list and all(" [" in w for w in dry.window_list)
    assert {t: open_table(cfg.table(t)).version() for t in versions} == versions, "a dry run commits nothing"
    first = run_backfill(spark, d, agg, paths)
    rows = gold_rows(spark, cfg, agg)
    versions = {t: open_table(cfg.table(t)).version() for t in versions}
    second = run_backfill(spark, d, agg, paths)
    assert first.late_events > 0 and second.late_events == 0 and second.windows == 0
    assert gold_rows(spark, cfg, agg) == rows
    assert {t: open_table(cfg.table(t)).version() for t in versions} == versions, "the second run commits nothing"


def test_backfill_of_a_range_applies_only_that_range(spark, with_late_events):
    cfg = with_late_events
    d = cfg.definition
    agg = d.aggregate("activity")
    late = read_table(spark, cfg.table(agg.late_table), late_spec(d, agg)).orderBy(d.event_time).collect()
    times = [r[d.event_time].replace(tzinfo=dt.timezone.utc) for r in late]
    middle = times[len(times) // 2]
    result = run_backfill(spark, d, agg, AggregatePaths.of(cfg.root, agg), start=middle)
    pending = read_table(spark, cfg.table(agg.late_table), late_spec(d, agg)).where("NOT applied").collect()
    assert result.late_events == sum(1 for t in times if t >= middle)
    assert pending and all(r[d.event_time].replace(tzinfo=dt.timezone.utc) < middle for r in pending)
    report = check_gold(spark, tables(cfg), d, agg, middle, None, late_seen_through=result.silver_version)
    assert report.passed, report.summary()


def test_backfill_while_the_stream_runs_stays_equal_to_a_recompute(spark, produce, with_late_events):
    """The gold stages commit while backfills restate: whichever loses the commit race
    re-plans; afterwards gold still equals the recompute and nothing is applied twice. The
    gold stages also compact late_events (after every 2 small files) while the backfills mark
    its rows applied: a compaction that loses to a mark is tried again later, a mark that
    loses to a compaction is made again, and no late event is lost, doubled or unmarked."""
    cfg = replace(with_late_events, processing_time_s=0.5, compact_after_files=2)
    d = cfg.definition
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
        seed=33, rate=150, late_fraction=0.1, out_of_order_seconds=3, definition=d))
    producer.start()
    results = {a.name: [] for a in d.aggregates}
    for _ in range(3):
        time.sleep(2)
        for agg in d.aggregates:
            results[agg.name].append(run_backfill(spark, d, agg, AggregatePaths.of(cfg.root, agg)))
    producer.join()
    time.sleep(6)
    control.request_stop()
    runner.join(120)
    assert not errors, errors
    run_available_now(spark, replace(cfg, processing_time_s=None))  # drain what is left
    for agg in d.aggregates:
        final = run_backfill(spark, d, agg, AggregatePaths.of(cfg.root, agg))
        report = check_gold(spark, tables(cfg), d, agg, late_seen_through=final.silver_version)
        assert report.passed, report.summary()
        applied = read_table(spark, cfg.table(agg.late_table), late_spec(d, agg)).where("applied")
        assert applied.count() == applied.select("topic", "partition", "offset").distinct().count()
        assert sum(r.late_events for r in results[agg.name]) + final.late_events == applied.count()
        assert any(h["operation"] == "OPTIMIZE" for h in open_table(cfg.table(agg.late_table)).history()), \
            f"{agg.late_table} was never compacted while the backfills ran"


def test_a_backfill_before_the_pipeline_reached_gold_has_nothing_to_do(tmp_path):
    """The hourly schedule's first run, or a user's, can come before the job's first pipeline
    run has reached gold (both happened on the live platform): no gold yet, or a gold table
    the stage created but has not committed to, means no late event is pending, which is not
    a failure; nothing is written."""
    from helpers import EXAMPLES
    from streamlake.delta.table import ensure_table, open_table
    from streamlake.operations.backfills import backfill_job
    from streamlake.operations.jobs import JobSpec
    from streamlake.pipeline.schemas import gold_spec

    job = JobSpec(name="not-run-yet", root=str(tmp_path / "job"), definition_file=str(EXAMPLES / "orders.yaml"))
    summary = backfill_job(None, job, run_id="bf-early")  # returns before it needs Spark
    assert summary["late_events"] == 0 and summary["checks"] == []
    assert all(e["gold_version"] is None and "gold has consumed no silver yet" in e["summary"]
               for e in summary["aggregates"])
    assert not (tmp_path / "job" / "gold").exists()

    d = job.definition
    for agg in d.aggregates:  # what the gold stage's start creates before its first micro-batch
        ensure_table(job.table_path(agg.gold_table), gold_spec(d, agg))
    summary = backfill_job(None, job, run_id="bf-early-2")
    assert summary["late_events"] == 0 and summary["checks"] == []
    assert all("gold has consumed no silver yet" in e["summary"] for e in summary["aggregates"])
    assert all(open_table(job.table_path(a.gold_table)).version() == 0 for a in d.aggregates), "nothing written"
    from streamlake.delta.records import recent_operations

    listed = [o for o in recent_operations(10, job.name) if o["operation"] == "backfill"]
    assert len(listed) == 2, "each run is listed in the operations view, nothing to do as it was"


def test_late_events_view_shows_pending_hours_per_aggregate_and_links_the_prefilled_form(spark, with_late_events):
    """StreamLake -> Late events: per aggregate, pending and applied counts per hour, the
    windows they touch, a link to the backfill form filled in for that hour and aggregate;
    after a backfill, nothing pending."""
    from pathlib import Path

    from helpers import views_client
    from streamlake.operations.jobs import job_for_root, save_job

    cfg = with_late_events
    d = cfg.definition
    job = save_job(job_for_root(cfg.root, definition_file=d.source, name=f"view_{Path(cfg.root).parent.name[-20:]}"))
    client = views_client()
    try:
        hours = client.get(f"/api/late-events?job={job.name}").json()
        for agg in d.aggregates:
            mine = [h for h in hours if h["aggregate"] == agg.name]
            pending = read_table(spark, cfg.table(agg.late_table), late_spec(d, agg)).where("NOT applied").count()
            assert mine and sum(h["pending"] for h in mine) == pending
            assert all(h["windows"] >= 1 for h in mine if h["pending"])
        page = client.get(f"/late-events?job={job.name}").text
        assert "data-aggregate='revenue_5m'" in page and "data-aggregate='activity'" in page
        assert "backfill this hour" in page and "gold windows to restate" in page
        link = page.split("class='backfill-link' href='")[1].split("'")[0].replace("&amp;", "&")
        assert "aggregate=revenue_5m" in link
        form = client.get("/" + link).text
        hour = next(h for h in hours if h["aggregate"] == "revenue_5m")["hour"][:19].replace(" ", "T")
        assert "type='datetime-local'" in form and hour in form and f"Trigger backfill_{job.name}" in form
        assert "<option value='revenue_5m' selected>" in form
        for agg in d.aggregates:
            run_backfill(spark, d, agg, AggregatePaths.of(cfg.root, agg))
        after = client.get(f"/api/late-events?job={job.name}").json()
        assert sum(h["pending"] for h in after) == 0 and sum(h["applied"] for h in after) > 0
        assert "nothing pending" in client.get(f"/late-events?job={job.name}").text
    finally:
        client.app.dependency_overrides.clear()
