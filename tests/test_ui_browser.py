"""The StreamLake views in a real browser, behind the real Airflow login.

Starts the platform's Airflow as ``make run`` does
(:func:`streamlake.platform.airflow.start`, this session's STREAMLAKE_HOME, a
free port), records quality results (small tables validated with Great
Expectations: a failing silver range, a clean gold, a quarantine with an unknown
reason, the bronze table of a job), a consistency check and a savepoint, then:

* with plain HTTP and no login, every StreamLake page and API answers 401 (or
  redirects to the login), and 401/403 with a forged cookie or bearer token; a
  token from ``POST /auth/token`` opens them;
* headless Chromium (tests/browser.py) logs in through Airflow's login
  page, opens Data quality (inside Airflow's UI and on its own), a Data Docs page
  from its link, Savepoints and Consistency checks, and checks what they show.

Screenshots are written to ``$STREAMLAKE_HOME/artifacts/ui/`` and copied to
``tests/artifacts/``. Without Chromium the test fails, saying how to install it
(``scripts/setup.sh`` does, and CI runs it).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import quality_samples as samples
from browser import chromium, keep_screenshots, launch, log_in, only_local
from conftest import sensors_definition
from platform_harness import free_port
from streamlake.quality.validate import validate_table

pytestmark = pytest.mark.slow

CONTEXT = {"dag_id": "ingest_sensors", "run_id": "scheduled__2026-11-22T03:00:00+00:00", "task_id": "quality"}
STREAMLAKE_URLS = ("/streamlake/quality", "/streamlake/quality/docs/index.html", "/streamlake/quality/docs/x.html",
                   "/streamlake/api/quality", "/streamlake/api/quality/validations", "/streamlake/savepoints",
                   "/streamlake/checks", "/streamlake/operations", "/streamlake/api/checks",
                   "/streamlake/api/savepoints", "/streamlake/pipelines", "/streamlake/late-events",
                   "/streamlake/health", "/streamlake/api/health")


def artifacts_dir() -> Path:
    path = Path(os.environ["STREAMLAKE_HOME"]) / "artifacts" / "ui"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def launched_airflow(broker):
    """The platform's Airflow, starting (:func:`streamlake.platform.airflow.launch`): a test may
    record what its views show while Airflow starts, then wait for it (``airflow_ui``)."""
    chromium()  # fail early, before a minute of Airflow start-up
    from streamlake.platform import airflow

    # The scheduler must not start the ingest DAGs' scheduled runs (spark-submit jobs) meanwhile.
    key = "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE"
    saved = os.environ.get(key)
    os.environ[key] = "False"
    try:
        airflow.launch(free_port())
        yield
    finally:
        airflow.stop()
        if saved is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved


@pytest.fixture(scope="module")
def airflow_ui(launched_airflow):
    """The UI's URL and the admin's credentials, once it answers."""
    from streamlake.platform import airflow

    info = airflow.wait_until_ready(timeout_s=420)
    assert info["password"], "Airflow generated no admin password"
    return info


def _get(url: str, headers: dict | None = None) -> tuple[int, str, dict]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with opener.open(request, timeout=30) as resp:
            return resp.status, resp.read().decode(errors="replace"), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace"), dict(err.headers)


def _token(base: str, user: str, password: str) -> str:
    body = json.dumps({"username": user, "password": password}).encode()
    request = urllib.request.Request(f"{base}/auth/token", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.load(resp)["access_token"]


def _record_content(spark, produce, topic_name, tmp_path) -> dict:
    """Quality results of the demo pipeline's tables (a failing silver, a clean gold, a quarantine
    with an unknown reason), a consistency check and a savepoint for the views to show."""
    from streamlake.operations.consistency import check_consistency
    from streamlake.operations.jobs import JobSpec, save_job
    from streamlake.operations.savepoints import create_savepoint

    d = sensors_definition()
    lake = tmp_path / "lake"
    silver = str(lake / "silver")
    v1 = samples.write_rows(silver, d, "silver", samples.clean_rows(d, "silver", 6))
    validate_table(spark, "silver", silver, 0, v1, definition=d, operation="ingest", context=CONTEXT)
    bad = samples.clean_rows(d, "silver", 4, start=100)
    bad[0]["sensor_id"] = None
    bad[1]["temperature"] = 99.5
    bad[2]["event_id"] = bad[3]["event_id"]
    v2 = samples.write_rows(silver, d, "silver", bad)
    failing = validate_table(spark, "silver", silver, v1, v2, definition=d, operation="restore", context=CONTEXT)
    gold = str(lake / "gold" / "per_minute")
    gold_rows = samples.clean_rows(d, "gold/per_minute", 5)
    clean_gold = validate_table(spark, "gold/per_minute", gold, None,
                                samples.write_rows(gold, d, "gold/per_minute", gold_rows), definition=d,
                                operation="backfill", context={**CONTEXT, "dag_id": "backfill_sensors"})
    quarantine = str(lake / "quarantine")
    q_rows = samples.clean_rows(d, "quarantine", 3)
    q_rows[0]["reason"] = "cosmic_ray"
    unknown_reason = validate_table(spark, "quarantine", quarantine, None,
                                    samples.write_rows(quarantine, d, "quarantine", q_rows), definition=d,
                                    operation="ingest", context=CONTEXT)

    produce(topic_name, 30, partitions=2)
    job = save_job(JobSpec(name=f"ui-{topic_name}", topics=[topic_name], root=str(tmp_path / "job"),
                           stages=["bronze"]))
    savepoint = create_savepoint(job, note="browser test")
    check = check_consistency(job, "savepoint", context=CONTEXT)
    bronze = validate_table(spark, "bronze", job.table_path("bronze"), None, None, operation="savepoint",
                            context=CONTEXT)
    return {"failing": failing, "savepoint": savepoint, "check": check, "job": job, "bronze": bronze,
            "unknown_reason": unknown_reason, "clean_gold": clean_gold}


def test_views_in_a_real_browser(launched_airflow, spark, produce, topic_name, tmp_path, request):
    from playwright.sync_api import expect, sync_playwright

    content = _record_content(spark, produce, topic_name, tmp_path)  # while Airflow starts (this file's first test)
    airflow_ui = request.getfixturevalue("airflow_ui")
    failing = content["failing"]
    base = airflow_ui["url"]
    shots = artifacts_dir()

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
            page.set_default_timeout(60_000)
            page.route("**/*", only_local(base))
            log_in(page, base, airflow_ui["user"], airflow_ui["password"], screenshot=shots / "01-login.png")

            # Plugins -> StreamLake holds the views
            page.get_by_role("button", name="Plugins").click()
            page.get_by_role("menuitem", name="StreamLake").click()
            for name in ("Pipelines", "Savepoints", "Consistency checks", "Operations", "Late events",
                         "Data quality", "Health"):
                expect(page.get_by_role("menuitem", name=name)).to_be_visible()
            page.screenshot(path=str(shots / "02-streamlake-menu.png"))
            page.get_by_role("menuitem", name="Data quality").click()
            page.wait_for_url(re.compile(r".*/plugin/streamlake-quality.*"))
            frame = page.frame_locator("iframe")
            expect(frame.locator("h1")).to_have_text("Data quality")
            expect(frame.locator(f"#v-{failing.validation_id}")).to_be_visible()
            page.screenshot(path=str(shots / "03-data-quality-in-airflow.png"))

            # the view on its own: latest result per table and suite, failing first
            page.goto(base + "/streamlake/quality")
            expect(page.locator("h1")).to_have_text("Data quality")
            section = page.locator(f"#v-{failing.validation_id}")
            failing_rows = section.locator("tr.failing")
            keys = {failing_rows.nth(i).get_attribute("data-key"): failing_rows.nth(i).get_attribute("data-severity")
                    for i in range(failing_rows.count())}
            # the null sensor_id also breaks empty_field (a rule that is null for a row fails it)
            assert keys == {"not_null:sensor_id": "critical", "rule:empty_field": "critical",
                            "rule:out_of_range": "critical", "event_id_unique": "critical"}
            first_row = section.locator("table.expectations tbody tr").first
            assert first_row.get_attribute("class") == "failing"
            expect(section.locator("h2")).to_contain_text("FAIL")
            expect(section.locator("a.run-link")).to_have_attribute(
                "href", "/dags/ingest_sensors/runs/scheduled__2026-11-22T03%3A00%3A00%2B00%3A00")
            summary = page.locator("table").first.locator("tbody tr")
            statuses = summary.locator("td:nth-child(1)").all_inner_texts()
            tables = summary.locator("td:nth-child(2)").all_inner_texts()
            rank = {"FAIL": 0, "WARN": 1, "PASS": 2}
            assert statuses and set(statuses) <= set(rank), statuses
            assert [rank[s] for s in statuses] == sorted(rank[s] for s in statuses), f"failing first: {statuses}"
            # what this test recorded (other tests of the session may have validated more tables)
            assert {"silver", "gold/per_minute", "quarantine", "bronze"} <= set(tables), tables
            assert statuses[tables.index("silver")] == "FAIL"
            for suite in ("streamlake-sensors-silver", "streamlake-sensors-gold-per_minute",
                          "streamlake-sensors-quarantine"):
                expect(page.locator(f"#trend-{suite} svg")).to_be_visible()
            expect(page.locator(f"#v-{content['unknown_reason'].validation_id} tr.failing[data-key=reason_known]")
                   ).to_be_visible()
            page.screenshot(path=str(shots / "04-data-quality.png"), full_page=True)

            # its Data Docs page, served by the plugin behind the login
            section.locator("a.docs-link").first.click()
            page.wait_for_url(re.compile(r".*/streamlake/quality/docs/validations/.*\.html"))
            expect(page.get_by_text("streamlake.sensors.silver").first).to_be_visible()
            body = page.content()
            for key in ("not_null:sensor_id [critical]", "rule:empty_field [critical]",
                        "rule:out_of_range [critical]", "event_id_unique [critical]"):
                assert key in body
            assert "Failed" in body
            page.screenshot(path=str(shots / "05-data-docs-validation.png"), full_page=True)
            # offline, the pages stay legible: a cross marks each failing expectation
            crosses = page.locator("i.fa-times.text-danger")
            assert crosses.count() == 1 + 4  # the page's status, and one per failing expectation
            assert page.evaluate("getComputedStyle(document.querySelector('i.fa-times'), '::before').content") \
                == '"\u2717"'
            # the index is served (GX draws its lists with scripts from CDNs) and the suite pages are static
            response = page.goto(base + "/streamlake/quality/docs/index.html")
            assert response.status == 200 and "expectations/streamlake/sensors/gold/per_minute.html" in page.content()
            page.goto(base + "/streamlake/quality")
            # (other tests of the session validate gold tables of their own pipelines: this test's one)
            page.locator(f"#v-{content['clean_gold'].validation_id} h2 a.suite-link").click()
            page.wait_for_url(re.compile(r".*/streamlake/quality/docs/expectations/streamlake/sensors/gold/"
                                         r"per_minute\.html"))
            expect(page.get_by_text("window_end_after_start [critical]")).to_be_visible()
            expect(page.get_by_text("avg_not_below_min:temperature [critical]")).to_be_visible()
            page.screenshot(path=str(shots / "06-data-docs-suite.png"), full_page=True)

            # Savepoints and Consistency checks
            page.goto(base + "/streamlake/savepoints")
            expect(page.locator("h1")).to_have_text("Savepoints")
            expect(page.get_by_text(content["savepoint"].id)).to_be_visible()
            expect(page.get_by_text("browser test")).to_be_visible()
            page.screenshot(path=str(shots / "07-savepoints.png"), full_page=True)
            page.goto(base + "/streamlake/checks")
            expect(page.locator("h1")).to_have_text("Consistency checks")
            row = page.locator("tr", has_text=content["job"].name).first
            expect(row).to_contain_text("savepoint")
            expect(row.locator("td.check-name")).to_have_text("Kafka audit")
            expect(row.locator("td.check-covered")).to_contain_text(
                f"bronze v{content['check'].report.delta_version} against {topic_name}")
            expect(row).to_contain_text("PASS" if content["check"].passed else "FAIL")
            expect(row).to_contain_text("ingest_sensors")
            page.screenshot(path=str(shots / "08-consistency-checks.png"), full_page=True)

            # Health: no Prometheus runs for this Airflow's home, so the exporter's current values,
            # saying so (the plots from a real Prometheus: test_metrics.py)
            page.goto(base + "/streamlake/health")
            expect(page.locator("h1")).to_have_text("Health")
            expect(page.locator("p.source-error")).to_contain_text("no Prometheus runs for this platform")
            expect(page.locator("section.alerts")).to_contain_text("No alert is firing.")
            expect(page.locator(f"section[data-pipeline='{content['job'].name}'] svg.series").first).to_be_visible()
            page.screenshot(path=str(shots / "09-health.png"), full_page=True)

            # the Data Docs route refuses paths outside its folder, even logged in
            status = page.request.get(base + "/streamlake/quality/docs/%2e%2e/validations").status
            assert status == 404
        finally:
            browser.close()
            kept = keep_screenshots(shots)
    assert len(kept) >= 8, kept


def test_streamlake_pages_need_a_login(airflow_ui):
    base = airflow_ui["url"]
    for path in STREAMLAKE_URLS:
        status, body, head = _get(base + path)  # no login at all
        redirected_to_login = status in (301, 302, 303, 307) and "login" in head.get("Location", "")
        assert status == 401 or redirected_to_login, (path, status, body[:200])
        assert "Data quality" not in body and "savepoint" not in body.lower()
        for forged in ({"Cookie": "_token=not-a-token"}, {"Authorization": "Bearer not-a-token"}):
            status, body, _ = _get(base + path, forged)  # Airflow: 403 "Invalid JWT token"
            assert status in (401, 403), (path, forged, status, body[:200])
            assert "Data quality" not in body and "savepoint" not in body.lower()
    token = _token(base, airflow_ui["user"], airflow_ui["password"])
    status, body, _ = _get(base + "/streamlake/api/quality", {"Authorization": f"Bearer {token}"})
    assert status == 200 and isinstance(json.loads(body), list)
    status, body, _ = _get(base + "/streamlake/quality", {"Authorization": f"Bearer {token}"})
    assert status == 200 and "<h1>Data quality</h1>" in body
