"""Quality results as data: the rows an operation touched, the quality_results table, Data Docs, the UI, the CLI.

Real Delta tables (delta-rs) are validated by version range with Great
Expectations on the session's Spark; the results land in the platform table
``quality_results`` and in Data Docs HTML; the plugin's Data quality view and
its Data Docs route are exercised in-process through FastAPI's test client
(the Airflow login itself, in a real browser, is tests/test_ui_browser.py).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
from conftest import sensors_definition
from deltalake import DeltaTable

import quality_samples as samples
from streamlake.pipeline.definition import load_definition
from streamlake.quality import docs, results
from streamlake.quality.validate import QualityError, validate_operation, validate_table

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = {"dag_id": "ingest_orders", "run_id": "manual__2026-11-22T03:00:00+00:00", "task_id": "quality_check"}
ORDERS = load_definition(ROOT / "pipelines" / "orders.yaml")
SENSORS = load_definition(ROOT / "pipelines" / "sensors.yaml")
GOLD = "gold/revenue_5m"


def docs_failures(html_text: str) -> dict[str, str]:
    """Failing expectations on a Data Docs validation page: {key: severity} (rows with a ✗ icon)."""
    out = {}
    for row in html_text.split("<tr>"):
        if "fa-times text-danger" in row:
            m = re.search(r"([\w:.-]+) \[(critical|warning|info)\]:", row)
            if m:
                out[m.group(1)] = m.group(2)
    return out


def silver_bad_rows(start: int) -> list[dict]:
    import decimal

    rows = samples.clean_rows(ORDERS, "silver", 4, start=start)
    rows[0]["customer"] = None                       # critical: null
    rows[1]["amount"] = decimal.Decimal("-9.50")     # critical: rule positive_amount
    rows[2]["order_id"] = rows[3]["order_id"]        # critical: duplicate event id
    rows[3]["kafka_timestamp"] = None                # warning: null
    return rows


SILVER_BAD = {"not_null:customer": "critical", "rule:positive_amount": "critical", "event_id_unique": "critical",
              "not_null:kafka_timestamp": "warning"}
SILVER_SUITE = "streamlake.orders.silver"


def write(path, table: str, rows, definition=ORDERS) -> int:
    return samples.write_rows(path, definition, table, rows)


def clean(table: str, n: int = 4, start: int = 0, definition=ORDERS) -> list[dict]:
    return samples.clean_rows(definition, table, n, start=start)


# -- the rows a version range added ---------------------------------------------------------------


def test_read_changes_by_version_range(spark, tmp_path):
    from deltalake import DeltaTable, write_deltalake
    from streamlake.delta.changes import ChangesUnavailableError, read_changes

    path = str(tmp_path / "silver")
    v1 = write(path, "silver", clean("silver", 3, start=0))
    v2 = write(path, "silver", clean("silver", 2, start=10))
    v3 = write(path, "silver", clean("silver", 4, start=20))
    assert (v1, v2, v3) == (1, 2, 3)

    def offsets(frm, to):
        df, rng = read_changes(spark, path, frm, to)
        return sorted(r.offset for r in df.select("offset").collect()), rng

    assert offsets(1, 3)[0] == [10, 11, 20, 21, 22, 23]
    assert offsets(2, None)[0] == [20, 21, 22, 23]
    assert offsets(None, 2)[0] == [0, 1, 2, 10, 11]               # the snapshot at v2
    got, rng = offsets(3, 3)
    assert got == [] and (rng.from_version, rng.to_version) == (3, 3)
    df, _ = read_changes(spark, path, 0, 3)
    assert df.schema["event_date"].dataType.typeName() == "date"  # partition column from the paths
    assert df.filter("event_date IS NULL").count() == 0

    # a compaction rewrites files without changing data: it adds no rows
    DeltaTable(path).optimize.compact()
    v4 = DeltaTable(path).version()
    assert offsets(v3, v4)[0] == []
    assert offsets(1, v4)[0] == [10, 11, 20, 21, 22, 23]
    # an overwrite removes what earlier commits of the range added: only its rows remain
    write_deltalake(path, samples.arrow_table(ORDERS, "silver", clean("silver", 2, start=40)), mode="overwrite")
    v5 = DeltaTable(path).version()
    assert offsets(0, v5)[0] == [40, 41]
    with pytest.raises(ChangesUnavailableError):
        read_changes(spark, path, 0, v5 + 1)


# -- results table and Data Docs -------------------------------------------------------------------


def test_validate_table_records_results_and_data_docs(spark, tmp_path):
    path = str(tmp_path / "silver")
    v1 = write(path, "silver", clean("silver", 4, start=0))
    v2 = write(path, "silver", silver_bad_rows(start=100))

    passing = validate_table(spark, "silver", path, 0, v1, definition=ORDERS, operation="ingest", context=CONTEXT)
    assert passing.status == "PASS" and passing.rows == 4
    bad = validate_table(spark, "silver", path, v1, v2, definition=ORDERS, operation="restore", context=CONTEXT)
    assert bad.status == "FAIL" and bad.rows == 4  # only the rows commit v2 added
    assert {o.key: o.severity for o in bad.failures} == SILVER_BAD

    # the results table: one row per expectation, the failing ones exactly as expected
    rows = results.read_results(validation_id=bad.validation_id)
    assert len(rows) == len(bad.outcomes)
    assert {r["expectation_key"]: r["severity"] for r in rows if not r["success"]} == SILVER_BAD
    by_key = {r["expectation_key"]: r for r in rows}
    rule = by_key["rule:positive_amount"]
    assert rule["expectation"] == "unexpected_rows_expectation" and rule["observed_value"] == "1"
    assert by_key["event_id_unique"]["unexpected_count"] == 2
    assert json.loads(by_key["event_id_unique"]["examples"])[0]["topic"] == "orders"
    assert by_key["type:amount"]["observed_value"] == "DecimalType"
    for r in rows:
        assert (r["operation"], r["table_name"], r["table_path"], r["from_version"], r["to_version"], r["rows"]) == \
            ("restore", "silver", path, v1, v2, 4)
        assert (r["dag_id"], r["dag_run_id"], r["task_id"]) == (CONTEXT["dag_id"], CONTEXT["run_id"], CONTEXT["task_id"])
        assert r["suite"] == SILVER_SUITE and r["status"] == "FAIL" and r["docs_page"] == bad.docs_page

    # summaries and "latest"
    summary = next(v for v in results.validations("silver") if v["validation_id"] == bad.validation_id)
    assert summary["critical_failures"] == sorted(k for k, s in SILVER_BAD.items() if s == "critical")
    assert summary["warnings"] == ["not_null:kafka_timestamp"]
    assert summary["unexpected"] == 1 + 2 + 1
    assert summary["passed"] == summary["expectations"] - 4
    latest = next(v for v in results.latest("silver") if v["suite"] == SILVER_SUITE)
    assert latest["validation_id"] == bad.validation_id
    assert [r["success"] for r in latest["results"]][:4] == [False] * 4  # failing first
    assert [r["severity"] for r in latest["results"][:4]] == ["critical"] * 3 + ["warning"]
    assert results.last_validated_version(path) == v2

    # Data Docs: the validation page shows exactly these failures, with their severities
    page = docs.data_docs_dir() / bad.docs_page
    html_text = page.read_text()
    assert docs_failures(html_text) == SILVER_BAD
    assert SILVER_SUITE in html_text and "Failed" in html_text
    assert docs_failures((docs.data_docs_dir() / passing.docs_page).read_text()) == {}
    index = (docs.data_docs_dir() / "index.html").read_text()
    assert "expectations/streamlake/orders/silver.html" in index
    assert (docs.data_docs_dir() / docs.suite_page("streamlake.orders.gold.revenue_5m")).is_file()
    # A validation of another pipeline's table (here the demo's) rebuilds the docs and keeps
    # every other pipeline's suite pages (GX deletes pages of suites its context lacks).
    sensors = sensors_definition()
    other = str(tmp_path / "sensors-silver")
    validate_table(spark, "silver", other, None, samples.write_rows(other, sensors, "silver",
                                                                    samples.clean_rows(sensors, "silver", 3)),
                   definition=sensors, operation="ingest", context=CONTEXT)
    for suite in ("streamlake.orders.silver", "streamlake.orders.gold.revenue_5m", "streamlake.sensors.silver"):
        assert (docs.data_docs_dir() / docs.suite_page(suite)).is_file(), suite


def test_data_docs_keep_each_suites_newest_validations_and_the_table_keeps_every_outcome(spark, tmp_path,
                                                                                          monkeypatch, ui):
    """GX lists its whole results store several times per build: the store is bounded per suite
    (STREAMLAKE_QUALITY_DOCS_PER_SUITE), the pruned pages go, the results table keeps everything."""
    _, client, _ = ui
    monkeypatch.setenv("STREAMLAKE_QUALITY_DOCS_PER_SUITE", "2")
    sensors = sensors_definition()
    other = str(tmp_path / "sensors-silver")
    kept_other = validate_table(spark, "silver", other, None,
                                samples.write_rows(other, sensors, "silver", samples.clean_rows(sensors, "silver", 3)),
                                definition=sensors, operation="ingest", context=CONTEXT)
    path, reports, version = str(tmp_path / "silver"), [], 0
    for i in range(3):
        start, version = version, write(path, "silver", clean("silver", 2, start=700 + 10 * i))
        reports.append(validate_table(spark, "silver", path, None if i == 0 else start, version, definition=ORDERS,
                                      operation="ingest", context=CONTEXT))
    pruned, kept = reports[0], reports[1:]

    stored = {(k.expectation_suite_identifier.name, k.run_id.run_name)
              for k in docs.gx_context().validation_results_store.list_keys()}
    assert [(SILVER_SUITE, f"ingest.{r.run_id}") in stored for r in reports] == [False, True, True]
    assert sum(1 for suite, _ in stored if suite == SILVER_SUITE) == 2
    assert ("streamlake.sensors.silver", f"ingest.{kept_other.run_id}") in stored  # another suite: its own count
    # nothing of the pruned one is left in the store's folders (each run a folder of its own)
    assert not [d for d in docs.validations_dir().rglob("*") if d.is_dir() and not any(d.iterdir())]
    assert not list(docs.validations_dir().rglob(f"ingest.{pruned.run_id}"))
    assert not (docs.data_docs_dir() / pruned.docs_page).exists()
    assert all((docs.data_docs_dir() / r.docs_page).is_file() for r in kept + [kept_other])
    gone = client.get(f"/quality/docs/{pruned.docs_page}")
    assert gone.status_code == 404 and "STREAMLAKE_QUALITY_DOCS_PER_SUITE" in gone.text
    # every outcome of every validation, the pruned one's included, is still in the results table
    for r in reports:
        assert len(results.read_results(validation_id=r.validation_id)) == len(r.outcomes) > 0

    monkeypatch.setenv("STREAMLAKE_QUALITY_DOCS_PER_SUITE", "0")
    with pytest.raises(ValueError, match="STREAMLAKE_QUALITY_DOCS_PER_SUITE"):
        docs.kept_per_suite()


def test_the_results_table_stays_compact_and_its_queries_pick_the_right_validations(monkeypatch, tmp_path):
    """Thousands of validations a day, one append each: the table is compacted as it grows
    (a bound of 4 files here) and vacuumed past its retention, no row is lost, and the
    queries, which choose validations in Arrow, return what the test works out from the rows
    it appended."""
    import datetime as dt

    from streamlake.delta.table import open_table
    from streamlake.delta import records

    monkeypatch.setenv("STREAMLAKE_PLATFORM_ROOT", str(tmp_path / "platform"))
    monkeypatch.setattr(records, "COMPACT_FILES", 4)
    monkeypatch.setattr(records, "VACUUM_RETENTION_HOURS", 1)
    t0 = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.timezone.utc)
    # (validation, table, suite, path, to_version, seconds after t0, status); appended in this order
    plan = [("a1", "silver", "streamlake.p.silver", "/lake/p/silver", 3, 0, "PASS"),
            ("a2", "silver", "streamlake.p.silver", "/lake/p/silver", 7, 10, "FAIL"),
            ("a3", "silver", "streamlake.p.silver", "/lake/p/silver", 5, 20, "PASS"),   # a restore: lower version
            ("a4", "silver", "streamlake.p.silver", "/lake/p/silver", 7, 30, "WARN"),   # ties a2's, newer
            ("b1", "bronze", "streamlake.p.bronze", "/lake/p/bronze", 2, 5, "PASS"),
            ("b2", "bronze", "streamlake.p.bronze", "/lake/p/bronze", None, 40, "PASS"),
            ("c1", "silver", "streamlake.q.silver", "/lake/q/silver", 9, 15, "FAIL")]
    plan += [(f"z{i}", "gold/x", "streamlake.q.gold.x", "/lake/q/gold", i, 100 + i, "PASS") for i in range(8)]
    for vid, table, suite, path, to, secs, status in plan:
        results.append_results([{"validation_id": vid, "run_id": "r" + vid, "table_name": table, "suite": suite,
                                 "table_path": path, "to_version": to, "validated_at": t0 + dt.timedelta(seconds=secs),
                                 "status": status, "expectation_key": f"k{j}", "severity": "critical",
                                 "success": status != "FAIL" or j > 0, "operation": "ingest"} for j in range(3)])
    results_dir = records.platform_table_path(results.QUALITY_RESULTS.name)
    files = len(open_table(results_dir).file_uris())
    assert files <= 4 + 1, f"{files} files after {len(plan)} appends: not compacted"
    # a retention of one hour: the files the compactions removed a moment ago stay on disk
    assert len(list(Path(results_dir).glob("*.parquet"))) > files
    assert sorted(r["validation_id"] for r in results.read_results()) == sorted(p[0] for p in plan for _ in range(3))

    by_id = {p[0]: p for p in plan}
    newest = lambda ids: max(ids, key=lambda i: (by_id[i][5], i))  # noqa: E731
    for path in {p[3] for p in plan}:
        mine = [p for p in plan if p[3] == path and p[4] is not None]
        top = max(p[4] for p in mine)
        assert results.last_validation(path)["validation_id"] == newest([p[0] for p in mine if p[4] == top]), path
    assert results.last_validation("/lake/nowhere") is None
    expected_latest = {(p[1], p[2]): newest([q[0] for q in plan if (q[1], q[2]) == (p[1], p[2])]) for p in plan}
    got = results.latest()
    assert {(v["table_name"], v["suite"]): v["validation_id"] for v in got} == expected_latest
    assert [v["status"] for v in got] == sorted((v["status"] for v in got), key=results.STATUSES.index)
    assert {v["validation_id"] for v in results.latest(pipeline="p")} == {"a4", "b2"}
    assert {v["validation_id"] for v in results.latest(table="silver")} == {"a4", "c1"}
    assert [v["validation_id"] for v in results.validations(limit=3)] == ["z7", "z6", "z5"]
    assert [v["validation_id"] for v in results.validations("silver", pipeline="p")] == ["a4", "a3", "a2", "a1"]
    assert all(len(v["results"]) == 3 for v in got)

    # a retention of none: the next compaction's vacuum leaves only the snapshot's files, every row readable
    monkeypatch.setattr(records, "VACUUM_RETENTION_HOURS", 0)
    monkeypatch.setattr(records, "COMPACT_FILES", 0)
    assert records.compact_if_needed(results_dir)
    assert {f.name for f in Path(results_dir).glob("*.parquet")} == \
        {Path(u).name for u in open_table(results_dir).file_uris()}
    assert len(results.read_results()) == 3 * len(plan)


def test_validate_operation_fails_on_critical_and_records_everything(spark, tmp_path):
    root = tmp_path / "lake"
    tables = {t: str(root / t) for t in ("silver", GOLD, "quarantine")}
    write(tables["silver"], "silver", clean("silver", 3, start=200))
    g1 = write(tables[GOLD], GOLD, clean(GOLD, 3))
    gold_bad = clean(GOLD, 2, start=5)
    gold_bad[0]["window_end"] = gold_bad[0]["window_start"]
    g2 = write(tables[GOLD], GOLD, gold_bad)
    # quarantine does not exist yet: skipped

    with pytest.raises(QualityError) as err:
        validate_operation(tables, {GOLD: (g1, g2)}, "backfill", CONTEXT, definition=ORDERS, spark=spark)
    message = str(err.value)
    assert "window_end_after_start [critical]" in message and "1 of 2 validations" in message
    reports = err.value.reports
    assert [r.table for r in reports] == ["silver", GOLD]
    assert len({r.run_id for r in reports}) == 1
    silver, gold = reports
    assert silver.status == "PASS" and (silver.from_version, silver.to_version) == (None, 1)
    assert gold.failing_keys() == {"window_end_after_start"} and gold.rows == 2
    recorded = results.read_results(run_id=silver.run_id)
    assert {r["table_name"] for r in recorded} == {"silver", GOLD}
    assert {r["operation"] for r in recorded} == {"backfill"}
    assert all((docs.data_docs_dir() / r.docs_page).is_file() for r in reports)

    # the next operation validates what was added since (last validated version .. latest)
    s2 = write(tables["silver"], "silver", clean("silver", 2, start=300))
    again = validate_operation({"silver": tables["silver"]}, None, "savepoint", {}, definition=ORDERS, spark=spark,
                               job_running=True)
    assert [(r.from_version, r.to_version, r.rows, r.status) for r in again] == [(1, s2, 2, "PASS")]
    assert "freshness" in {o.key for o in again[0].outcomes}


def test_validate_operation_does_not_revalidate_an_unchanged_table_unless_it_failed(spark, tmp_path):
    root = tmp_path / "lake"
    tables = {"silver": str(root / "silver"), GOLD: str(root / GOLD)}
    s1 = write(tables["silver"], "silver", clean("silver", 3, start=400))
    gold_bad = clean(GOLD, 2, start=9)
    gold_bad[0]["window_end"] = gold_bad[0]["window_start"]
    write(tables[GOLD], GOLD, gold_bad)
    first = validate_operation(tables, None, "ingest", CONTEXT, definition=ORDERS, spark=spark,
                               raise_on_critical=False)
    assert [r.status for r in first] == ["PASS", "FAIL"]

    # no commit since: silver is covered by its passing validation (nothing run, nothing
    # recorded); gold's failed, so its suite runs again (on the rows added since: none)
    silver, gold = validate_operation(tables, None, "savepoint", {}, definition=ORDERS, spark=spark)
    assert silver.covered_by["validation_id"] == first[0].validation_id and silver.outcomes == []
    assert (silver.status, silver.rows, silver.to_version) == ("PASS", 0, s1)
    assert f"unchanged since v{s1} (no rows added up to v{s1}): nothing new to validate; PASS by " \
           f"{first[0].validation_id}" in silver.summary()
    assert gold.covered_by is None and gold.outcomes and gold.rows == 0
    recorded = results.read_results(run_id=silver.run_id)
    assert {r["table_name"] for r in recorded} == {GOLD}

    # a commit that only removes rows (as a restore does) adds nothing to validate
    DeltaTable(tables["silver"]).delete()  # every file removed, none rewritten
    (removed,) = validate_operation({"silver": tables["silver"]}, None, "restore", {}, definition=ORDERS, spark=spark)
    assert removed.covered_by["validation_id"] == first[0].validation_id
    assert (removed.from_version, removed.to_version) == (s1, s1 + 1)

    # a new commit is validated again, from the covered version on
    s2 = write(tables["silver"], "silver", clean("silver", 2, start=500))
    (after,) = validate_operation({"silver": tables["silver"]}, None, "ingest", {}, definition=ORDERS, spark=spark)
    assert after.covered_by is None and (after.from_version, after.to_version, after.rows) == (s1, s2, 2)


# -- the UI view and the Data Docs route -----------------------------------------------------------


@pytest.fixture(scope="module")
def ui():
    from fastapi.testclient import TestClient

    from helpers import views_client, views_plugin

    plugin = views_plugin()
    logged_in = views_client(plugin)
    anonymous = TestClient(views_plugin().app, root_path="/streamlake")  # a separate app: no override
    yield plugin, logged_in, anonymous
    plugin.app.dependency_overrides.clear()


def test_data_quality_view_and_docs_route(spark, tmp_path, ui):
    plugin, client, _ = ui
    names = [v["name"] for v in plugin.StreamLakePlugin.external_views]
    assert names == ["Pipelines", "Savepoints", "Consistency checks", "Operations", "Late events", "Data quality",
                     "Health"]

    path = str(tmp_path / "silver")
    v1 = write(path, "silver", clean("silver", 4, start=500))
    validate_table(spark, "silver", path, 0, v1, definition=ORDERS, operation="ingest", context=CONTEXT)
    v2 = write(path, "silver", silver_bad_rows(start=600))
    bad = validate_table(spark, "silver", path, v1, v2, definition=ORDERS, operation="restore", context=CONTEXT)
    qpath = str(tmp_path / "quarantine")
    q_rows = clean("quarantine", 3)
    q_rows[0]["reason"] = "cosmic_ray"
    validate_table(spark, "quarantine", qpath, None, write(qpath, "quarantine", q_rows), definition=ORDERS,
                   operation="ingest", context={})

    page = client.get("/quality")
    assert page.status_code == 200
    text = page.text
    section = text[text.index(f"id='v-{bad.validation_id}'"):]
    section = section[: section.index("</section>")]
    failing = dict(re.findall(r"<tr class='failing' data-key='([^']+)' data-severity='([^']+)'>", section))
    assert failing == SILVER_BAD
    # failing expectations come before passing ones
    assert section.index("class='failing'") < section.index("class='passing'")
    assert section.rindex("class='failing'") < section.index("class='passing'")
    # link to the DAG run and task, and to the Data Docs page served by the plugin
    assert "href='/dags/ingest_orders/runs/manual__2026-11-22T03%3A00%3A00%2B00%3A00' target='_top'" in section
    assert "/tasks/quality_check" in section
    assert f"href='quality/docs/{bad.docs_page}'" in section
    assert "(v1, v2]" in section and "restore" in section
    # the quarantine result, its unknown reason, and trend plots per table
    assert "data-key='reason_known' data-severity='critical'" in text
    assert "not from a DAG run" in text
    for suite, table in (("streamlake-orders-silver", "silver"), ("streamlake-orders-quarantine", "quarantine")):
        assert f"<div class='trend-box' id='trend-{suite}' data-table='{table}'><svg" in text
    assert "class=\"point FAIL\"" in text and "class=\"bar\"" in text
    # the summary lists failing validations first
    summary = text[: text.index("<h2>Trend</h2>")]
    statuses = re.findall(r"<td class='(PASS|WARN|FAIL)'>", summary)
    assert statuses == sorted(statuses, key=["FAIL", "WARN", "PASS"].index) and statuses[0] == "FAIL"

    doc = client.get(f"/quality/docs/{bad.docs_page}")
    assert doc.status_code == 200 and doc.headers["content-type"].startswith("text/html")
    assert docs_failures(doc.text) == SILVER_BAD
    assert client.get("/quality/docs/index.html").status_code == 200
    assert client.get("/quality/docs/static/styles/data_docs_custom_styles_template.css").status_code in (200, 404)
    redirect = client.get("/quality/docs", follow_redirects=False)
    assert redirect.status_code in (302, 307) and redirect.headers["location"].endswith("docs/index.html")
    api = client.get("/api/quality", params={"table": "silver", "job": "orders"}).json()
    assert api[0]["validation_id"] == bad.validation_id and api[0]["status"] == "FAIL"
    assert client.get("/api/quality", params={"table": "silver", "job": "sensors"}).json() == [] or all(
        v["suite"].startswith("streamlake.sensors.") for v in client.get(
            "/api/quality", params={"table": "silver", "job": "sensors"}).json())
    assert client.get("/api/quality/validations").status_code == 200


def test_docs_route_rejects_paths_outside_the_docs_folder(ui, tmp_path):
    _, client, _ = ui
    secret = docs.quality_dir() / "secret.txt"
    secret.write_text("not for the web")
    (docs.data_docs_dir()).mkdir(parents=True, exist_ok=True)
    link = docs.data_docs_dir() / "escape.txt"
    if not link.exists():
        link.symlink_to(secret)
    for bad in ("../secret.txt", "..%2Fsecret.txt", "%2e%2e/secret.txt", "static/../../secret.txt",
                "%2Fetc%2Fpasswd", "escape.txt", "nope.html"):
        resp = client.get(f"/quality/docs/{bad}")
        assert resp.status_code == 404, (bad, resp.status_code)
        assert "not for the web" not in resp.text
    assert docs.resolve_page("../secret.txt") is None
    assert docs.resolve_page("/etc/passwd") is None
    assert docs.resolve_page("escape.txt") is None


def test_every_streamlake_page_needs_a_login(ui):
    _, _, anonymous = ui
    for url in ("/quality", "/quality/docs/index.html", "/quality/docs/no/such/page.html", "/api/quality",
                "/api/quality/validations", "/savepoints", "/pipelines", "/api/pipelines", "/late-events",
                "/api/late-events", "/checks", "/operations", "/api/checks", "/api/savepoints"):
        assert anonymous.get(url, follow_redirects=False).status_code == 401, url


# -- the command line ------------------------------------------------------------------------------


def _cli(argv):
    from streamlake.cli import quality as quality_cli

    parser = argparse.ArgumentParser(prog="streamlake")
    quality_cli.add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_quality_run_and_show(spark, tmp_path, capsys):
    root = tmp_path / "lake"
    definition = str(ROOT / "pipelines" / "sensors.yaml")
    table = "gold/per_minute"
    v1 = write(root / table, table, clean(table, 3, definition=SENSORS), definition=SENSORS)
    assert _cli(["quality", "run", "--table", table, "--root", str(root), "--definition", definition]) == 0
    out = capsys.readouterr().out
    assert f"{table} v1 (snapshot), 3 rows, suite streamlake.sensors.gold.per_minute: PASS" in out

    bad = clean(table, 2, start=9, definition=SENSORS)
    bad[1]["_events"] = 0
    v2 = write(root / table, table, bad, definition=SENSORS)
    assert _cli(["quality", "run", "--table", table, "--root", str(root), "--from-version", str(v1),
                 "--to-version", str(v2)]) == 1  # the root knows its job and definition now
    out = capsys.readouterr().out
    assert f"{table} (v{v1}, v{v2}], 2 rows" in out and ": FAIL" in out
    assert "CRITICAL: events_at_least_1 [critical]" in out and "CRITICAL: count_is_events:count [critical]" in out

    ok = clean(table, 1, start=20, definition=SENSORS)
    v3 = write(root / table, table, ok, definition=SENSORS)
    assert _cli(["quality", "run", "--table", table, "--root", str(root), "--from-version", str(v2), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "PASS" and report["to_version"] == v3

    assert _cli(["quality", "show", "--table", table]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"PASS  {table}")

    with pytest.raises(KeyError, match="has no table 'gold'"):
        _cli(["quality", "run", "--table", "gold", "--root", str(root)])
    with pytest.raises(KeyError, match="no pipeline has run under"):
        _cli(["quality", "run", "--table", "silver", "--root", str(tmp_path / "nowhere")])
