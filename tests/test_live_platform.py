"""The running platform, driven the way a user drives it: the Trigger forms in a browser, and REST.

The platform is started as `make run` starts it (the local Kafka broker, a producer per
pipeline definition writing one record at a time with late, duplicated and
malformed records, a Spark standalone cluster, Airflow standalone), with Airflow's
scheduler creating no scheduled runs: every run here is one a test triggers. Headless
Chromium logs in through Airflow's login page and opens the Trigger dialog of
every DAG, clicking Trigger without touching a field: each run must start (a
form whose Trigger button stays disabled with its defaults passed every REST test
we had) and succeed. Then the views are read in the browser: the savepoint's note,
the orders pipeline's late events and quality, the checks by name and the
operations as readable fields. Airflow's own backfill (data intervals) goes through
the REST API, as the UI's Backfill does; and the continuous job is watched keeping
up with the live producer.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
import urllib.request

import pytest

from browser import keep_screenshots, launch, log_in, only_local, trigger_from_form
from platform_harness import epoch

pytestmark = pytest.mark.slow

PIPELINES = ("orders", "sensors")
DAGS = {"ingest_orders", "ingest_sensors", "backfill_orders", "backfill_sensors", "savepoint", "restore", "rescale"}
OPERATION_TIMEOUT_S = 420  # generous: both pipelines' runs share 2 cores with the operations
# A run an operation starts may wait for the job of one the forms triggered: its wait covers both.
RESUMED_RUN_TIMEOUT_S = 2 * OPERATION_TIMEOUT_S
NOTE = "before the rescale, typed in the browser"
KEEP_UP_WINDOW_S = 30


def wait_task(rest, dag_id: str, run_id: str, task_id: str, until, timeout: float = RESUMED_RUN_TIMEOUT_S) -> dict:
    """The task instance once ``until(it)`` holds (its run may not exist yet); fails on a failed task."""
    deadline = time.monotonic() + timeout
    ti = None
    while time.monotonic() < deadline:
        status, ti = rest.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id, safe='')}"
                                      f"/taskInstances/{task_id}")
        if status == 200:
            assert ti["state"] not in ("failed", "upstream_failed"), ti
            if until(ti):
                return ti
        time.sleep(1)
    raise AssertionError(f"{dag_id} {run_id} {task_id}: still {ti} after {timeout:g} s")


def succeeded(rest, dag_id: str, run_id: str, timeout: float = OPERATION_TIMEOUT_S) -> dict:
    run = rest.wait(dag_id, run_id, timeout)
    assert run["state"] == "success", f"{dag_id} {run_id}: {rest.failed_tasks(dag_id, run_id)}"
    print(f"{dag_id} {run_id}: {run['seconds']} s")
    return run


@pytest.fixture(scope="module")
def page(live_platform):
    """A logged-in browser page on the running platform (screenshots kept in tests/artifacts/)."""
    from playwright.sync_api import sync_playwright

    shots = live_platform.home / "artifacts" / "ui"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            tab = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
            tab.set_default_timeout(60_000)
            tab.route("**/*", only_local(live_platform.airflow_url))
            log_in(tab, live_platform.airflow_url, live_platform.user, live_platform.password,
                   screenshot=shots / "live-01-login.png")
            tab.shots = shots
            yield tab
        finally:
            browser.close()
            keep_screenshots(shots)


def test_every_dag_triggers_from_its_form_with_its_defaults_and_succeeds(live_platform, page):
    rest, base = live_platform.rest, live_platform.airflow_url
    status, body = rest.call("GET", "/api/v2/dags?limit=100")
    assert status == 200 and {d["dag_id"] for d in body["dags"]} == DAGS, body
    shot = lambda name: page.shots / f"live-{name}.png"  # noqa: E731

    # A savepoint and both pipelines' ingest, then, once data has landed, both backfills
    # (defaults: every aggregate, all pending late events), every field as the form shows it.
    # They run side by side, as a user's would: each must succeed.
    savepoint = trigger_from_form(page, base, "savepoint", screenshot=shot("02-savepoint-form"), rest=rest)
    runs = {dag: trigger_from_form(page, base, dag, rest=rest) for dag in ("ingest_sensors", "ingest_orders")}
    assert rest.run("savepoint", savepoint)["conf"]["job"] == "sensors"
    succeeded(rest, "savepoint", savepoint)
    for dag, run_id in runs.items():
        succeeded(rest, dag, run_id, RESUMED_RUN_TIMEOUT_S)
    backfills = {dag: trigger_from_form(page, base, dag, rest=rest) for dag in ("backfill_orders", "backfill_sensors")}
    for dag, run_id in backfills.items():
        succeeded(rest, dag, run_id, RESUMED_RUN_TIMEOUT_S)
    # The proofs and the backfills ran on the platform's Spark Connect server, not in a JVM of
    # their own, each as a client the fork server forked with its libraries imported; the
    # ingests, of jobs with Spark resources of their own, each in its own JVM.
    logs = {}
    for dag, run_id, task in (("savepoint", savepoint, "verify"), ("ingest_sensors", runs["ingest_sensors"], "verify"),
                              ("ingest_sensors", runs["ingest_sensors"], "quality"),
                              ("backfill_orders", backfills["backfill_orders"], "backfill")):
        log = logs[dag, task] = rest.task_log(dag, run_id, task, rest.tries(dag, run_id, task))
        assert "on the Spark Connect server sc://" in log, (dag, run_id, task)
        assert "ran as a client forked by the platform's fork server" in log, (dag, run_id, task)
    # an ingest run: the proof (the checks), then the quality report in a task of its own
    proof, report = logs["ingest_sensors", "verify"], logs["ingest_sensors", "quality"]
    assert "PASS kafka-audit" in proof and "quality silver" not in proof
    assert "quality silver" in report and "kafka-audit" not in report
    ingest_log = rest.task_log("ingest_orders", runs["ingest_orders"], "ingest_available_now",
                               rest.tries("ingest_orders", runs["ingest_orders"], "ingest_available_now"))
    assert "spark-submit, the job has Spark resources of its own" in ingest_log
    # its Python processes (the Kafka source's runner and workers) forked warm by the fork server
    assert "Spark's Python processes: forked by the platform's fork server" in ingest_log
    assert "runs -m pyspark.daemon pyspark.worker" in (live_platform.home / "logs" / "fork-server.log").read_text()
    backfill = rest.call("GET", "/streamlake/api/operations?job=orders&limit=100")[1]
    assert any(o["operation"] == "backfill" for o in backfill), backfill

    # A savepoint with a note typed: the note is in the Savepoints view.
    noted = trigger_from_form(page, base, "savepoint", {"note": NOTE}, screenshot=shot("03-savepoint-note"),
                              rest=rest)
    succeeded(rest, "savepoint", noted)
    page.goto(base + "/streamlake/savepoints")
    row = page.locator("tr", has_text=NOTE)
    row.wait_for()
    assert "sensors" in row.inner_text()
    page.screenshot(path=str(shot("04-savepoints")), full_page=True)

    # Restore (default: the newest savepoint of the demo pipeline, the noted one) and rescale
    # (default resources): each succeeds and the run it starts completes it.
    restore = trigger_from_form(page, base, "restore", screenshot=shot("05-restore-form"), rest=rest)
    succeeded(rest, "restore", restore)
    restored = f"restored__{restore}"
    # The rescale is triggered as soon as the restore's run has caught up, while that run still
    # proves itself (verify, quality): the rescale's run starts its job at once (two runs of the
    # ingest DAG at a time, each task one run at a time), not after that proof.
    wait_task(rest, "ingest_sensors", restored, "ingest_available_now", lambda ti: ti["state"] == "success")
    rescale = trigger_from_form(page, base, "rescale", screenshot=shot("06-rescale-form"), rest=rest)
    triggered = time.time()
    rescaled = f"rescaled__{rescale}"
    started = wait_task(rest, "ingest_sensors", rescaled, "ingest_available_now", lambda ti: ti["start_date"])
    restored_run = succeeded(rest, "ingest_sensors", restored, RESUMED_RUN_TIMEOUT_S)
    assert triggered < epoch(restored_run["end_date"]), "the restore's run had proven itself before the rescale " \
                                                        "was triggered: nothing to overlap (a faster proof than ever)"
    assert epoch(started["start_date"]) < epoch(restored_run["end_date"]), \
        f"the rescale's job started at {started['start_date']}, after the restore's run ended " \
        f"({restored_run['end_date']}): it queued behind that run's proof"
    # the restore's catch-up (the form's default master, local) ran on the warm server although
    # the demo job has cluster resources of its own: they do not apply locally, and the restore waits for it
    catch_up = rest.task_log("ingest_sensors", restored, "ingest_available_now",
                             rest.tries("ingest_sensors", restored, "ingest_available_now"))
    assert "pipeline.py of job sensors on the Spark Connect server sc://" in catch_up
    operations = rest.call("GET", "/streamlake/api/operations?job=sensors&limit=100")[1]
    restores = [json.loads(o["details"]) for o in operations if o["operation"] == "restore"]
    noted_id = next(s["id"] for s in rest.call("GET", "/streamlake/api/savepoints?job=sensors")[1]
                    if s["note"] == NOTE)
    assert restores and restores[0]["savepoint"] == noted_id, "the default restores the newest savepoint"
    succeeded(rest, "rescale", rescale)
    succeeded(rest, "ingest_sensors", rescaled, RESUMED_RUN_TIMEOUT_S)
    # The rescale announced its handover before the stop, handed the job over, and its run took it:
    # nothing else started the job between (test_control), and scheduled runs start it again.
    from streamlake.operations.jobs import JobSpec

    control = JobSpec.from_dict(json.loads((live_platform.home / "jobs" / "sensors.json").read_text())).control
    handover = json.loads(control.handover_file(rescale).read_text())
    assert handover["announced_at"] <= handover["at"] <= handover["taken_at"], handover
    assert control.pending_handover() is None


def test_a_rescale_no_worker_can_host_is_refused_before_the_stop(live_platform):
    """A rescale to executors of more cores than any worker of `make run`'s cluster offers
    (Spark's master would keep such an application waiting without end): its first task refuses
    it before the stop, naming what the workers offer, without retrying; the job keeps its
    settings and its savepoints; the run the rescale started first ends without starting it."""
    from streamlake.platform.spark_cluster import machine_cores

    rest = live_platform.rest
    spec_file = live_platform.home / "jobs" / "sensors.json"
    before = json.loads(spec_file.read_text())
    savepoints = len(rest.call("GET", "/streamlake/api/savepoints?job=sensors")[1])
    cores = machine_cores() + 1  # each worker offers the machine's cores
    run_id = rest.trigger("rescale", {"job": "sensors", "total_executor_cores": cores, "executor_cores": cores})
    assert rest.wait("rescale", run_id, OPERATION_TIMEOUT_S)["state"] == "failed"
    refused = rest.task("rescale", run_id, "savepoint_and_stop")
    assert refused["state"] == "failed" and refused["try_number"] == 1, refused
    log = rest.task_log("rescale", run_id, "savepoint_and_stop", 1)
    assert "refused before the stop, the job keeps running" in log, log[-3000:]
    assert f"offers {cores} cores (its workers offer {machine_cores()}, {machine_cores()})" in log, log[-3000:]
    assert json.loads(spec_file.read_text()) == before
    assert len(rest.call("GET", "/streamlake/api/savepoints?job=sensors")[1]) == savepoints
    resumed = f"rescaled__{run_id}"
    assert rest.wait("ingest_sensors", resumed, RESUMED_RUN_TIMEOUT_S)["state"] == "failed"
    told = rest.task_log("ingest_sensors", resumed, "ingest_available_now",
                         rest.tries("ingest_sensors", resumed, "ingest_available_now"))
    assert "savepoint_and_stop failed" in told, told[-3000:]
    assert_operation_metrics(live_platform)


def assert_operation_metrics(live_platform) -> None:
    """`streamlake metrics show` on the platform after the operations above, against what
    Airflow's REST API says of their runs: every savepoint, restore and backfill run proven, its
    seconds from the run's trigger to the end of its proof; the rescale of the form test proven
    by its job's run (to that run's verify), the refused one failed (one failed run, although it
    failed its own run and the job's run it had started): the newest rescale failed."""
    from prometheus_client.parser import text_string_to_metric_families

    rest = live_platform.rest
    shown = live_platform.streamlake("metrics", "show", timeout=180)
    assert shown.returncode == 0, shown.stderr[-3000:]
    samples = {(s.name, s.labels.get("pipeline"), s.labels.get("operation"), s.labels.get("le")): s.value
               for f in text_string_to_metric_families(shown.stdout) for s in f.samples
               if s.name.startswith("streamlake_operation_")}

    def proofs(dag_id: str, proof: str, prefix: str = "") -> list[float]:
        """Seconds from each successful run's trigger to the end of its proof task."""
        out = []
        for run in rest.runs(dag_id, state="success"):
            if not run["dag_run_id"].startswith(prefix):
                continue
            out.append(epoch(rest.task(dag_id, run["dag_run_id"], proof)["end_date"]) - epoch(run["run_after"]))
        return out

    rescales = [r for r in rest.runs("rescale") if r["state"] == "success"]
    expected = {("sensors", "savepoint"): proofs("savepoint", "verify"),
                ("sensors", "restore"): proofs("restore", "resume"),
                ("orders", "backfill"): proofs("backfill_orders", "report"),
                ("sensors", "backfill"): proofs("backfill_sensors", "report"),
                # the rescale's trigger to the end of its run's verify
                ("sensors", "rescale"): [epoch(rest.task("ingest_sensors", f"rescaled__{r['dag_run_id']}", "verify")
                                               ["end_date"]) - epoch(r["run_after"]) for r in rescales]}
    assert [len(v) for v in expected.values()] == [2, 1, 1, 1, 1], expected
    for (pipeline, operation), seconds in expected.items():
        key = ("streamlake_operation_duration_seconds_count", pipeline, operation, None)
        assert samples.get(key) == len(seconds), (pipeline, operation, samples.get(key), seconds)
        total = samples[("streamlake_operation_duration_seconds_sum", pipeline, operation, None)]
        # recorded by the proof's success callback, a moment after the end Airflow gives the task
        assert sum(seconds) - 1 <= total <= sum(seconds) + 10 * len(seconds), (pipeline, operation, total, seconds)
        assert samples[("streamlake_operation_failures_total", pipeline, operation, None)] == (
            operation == "rescale"), (pipeline, operation)
        assert samples[("streamlake_operation_last_success", pipeline, operation, None)] == (
            operation != "rescale"), (pipeline, operation)


def test_the_documents_shell_commands_run_beside_the_platform(live_platform):
    """The commands the README and docs/ give for a shell beside `make run`
    (test_docs_commands.ON_THE_PLATFORM), as typed: from the repository's root, in the platform's
    environment. Each exits 0 with what it must say."""
    import subprocess

    from test_docs_commands import ON_THE_PLATFORM, ROOT, every_command, key

    typed = {c.key: c.text for c in every_command()}
    for command, says in ON_THE_PLATFORM.items():
        text = typed[key(command)]
        done = subprocess.run(text, shell=True, cwd=ROOT, env=live_platform.env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0 and re.search(says, done.stdout + done.stderr, re.M), (
            text, done.returncode, done.stdout[-2000:], done.stderr[-3000:])


def test_the_views_read_well_in_the_browser(live_platform, page):
    """After the operations above: what a user reads in the StreamLake views."""
    from playwright.sync_api import expect

    base = live_platform.airflow_url
    shot = lambda name: str(page.shots / f"live-{name}.png")  # noqa: E731

    # Pipelines: both definitions, each with its tables.
    page.goto(base + "/streamlake/pipelines")
    for name in PIPELINES:
        expect(page.locator(f"[data-pipeline={name}]")).to_be_visible()
    expect(page.locator("[data-pipeline=orders]")).to_contain_text("gold/activity")
    # gold's freshness, read from Kafka and the tables by the views' process (its value against
    # records of known age: test_pipelines.py)
    for name in PIPELINES:
        expect(page.locator(f"[data-pipeline={name}] b.freshness")).to_have_text(re.compile(r"^\d+\.\d s$"))
    page.screenshot(path=shot("07-pipelines"), full_page=True)

    # Late events of the orders pipeline, one section per aggregate.
    page.goto(base + "/streamlake/late-events?job=orders")
    for aggregate in ("revenue_5m", "activity"):
        expect(page.locator(f"section.aggregate[data-aggregate={aggregate}]")).to_be_visible()
    expect(page.locator("section.aggregate[data-aggregate=revenue_5m] h2")).to_contain_text("gold/revenue_5m")
    page.screenshot(path=shot("08-late-events-orders"), full_page=True)

    # Quality of the orders pipeline: its tables' suites, each with a trend; nothing critical failing.
    page.goto(base + "/streamlake/quality?job=orders")
    sections = page.locator("section.validation")
    tables = {sections.nth(i).get_attribute("data-table") for i in range(sections.count())}
    assert {"silver", "quarantine", "gold/revenue_5m", "gold/activity"} <= tables, tables
    assert not page.locator("section.validation tr.failing[data-severity=critical]").count(), \
        page.locator("section.validation tr.failing").all_inner_texts()
    expect(page.locator("#trend-streamlake-orders-gold-revenue_5m svg")).to_be_visible()
    page.screenshot(path=shot("09-quality-orders"), full_page=True)

    # Consistency checks: every row names its check and what it covered.
    page.goto(base + "/streamlake/checks?job=sensors")
    rows = page.locator("tr.check")
    assert rows.count() > 3
    names = set(rows.locator("td.check-name").all_inner_texts())
    assert {"Kafka audit", "pipeline accounting", "gold = recompute"} <= names, names
    covered = rows.locator("td.check-covered").all_inner_texts()
    assert all(text.strip() for text in covered)
    assert any(re.search(r"bronze v\d+ against sensors", t) for t in covered), covered
    assert any("gold/per_minute against silver v" in t for t in covered), covered
    page.screenshot(path=shot("10-checks"), full_page=True)

    # Operations: readable fields, the raw JSON behind a toggle; times to the second, UTC on hover.
    page.goto(base + "/streamlake/operations?job=sensors")
    details = page.locator("dl.op-details").first
    expect(details).to_be_visible()
    assert details.locator("dt").count() >= 2
    raw = page.locator("details.raw-json").first
    expect(raw.locator("pre")).to_be_hidden()
    raw.locator("summary").click()
    expect(raw.locator("pre")).to_be_visible()
    json.loads(raw.locator("pre").inner_text())
    stamp = page.locator("time.ts").first
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} UTC", stamp.get_attribute("title"))
    assert not re.search(r"\d{2}:\d{2}:\d{2}\.\d", stamp.inner_text()), "no fractions of a second"
    page.screenshot(path=shot("11-operations"), full_page=True)


def test_airflow_backfill_restates_data_intervals_and_every_check_passed(live_platform):
    """Airflow's own Backfill (the trigger dialog's Backfill) of the orders pipeline's DAG, then
    every check the platform recorded in this module: all passed, after every operation. First,
    `streamlake check` by hand, as a user types it: a thin client of the Spark Connect server
    `make run` started, which it finds by itself (no --remote)."""
    rest = live_platform.rest
    by_hand = live_platform.streamlake("check", "--job", "orders", "--operation", "check-by-hand", timeout=300)
    assert by_hand.returncode == 0, by_hand.stdout + by_hand.stderr
    assert "check:orders on the Spark Connect server sc://" in by_hand.stderr, by_hand.stderr
    now = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)
    rest.backfill("backfill_orders", (now - dt.timedelta(hours=2)).isoformat(),
                  (now - dt.timedelta(hours=1)).isoformat())
    deadline = time.monotonic() + OPERATION_TIMEOUT_S
    while time.monotonic() < deadline:
        backfilled = rest.runs("backfill_orders", run_type="backfill")
        if backfilled and all(r["state"] in ("success", "failed") for r in backfilled):
            break
        time.sleep(5)
    assert backfilled and all(r["state"] == "success" for r in backfilled), backfilled
    assert all(r["data_interval_end"] > r["data_interval_start"] for r in backfilled), "runs have data intervals"

    for job, operations in (("sensors", ("savepoint", "restore", "rescale", "backfill")),
                            ("orders", ("backfill", "check-by-hand"))):
        status, checks = rest.call("GET", f"/streamlake/api/checks?job={job}&limit=1000")
        assert status == 200 and checks, checks
        assert all(c["verdict"] == "PASS" for c in checks), [c["summary"] for c in checks if c["verdict"] != "PASS"]
        kinds = {(c["operation"], c.get("kind")) for c in checks}
        for operation in ("ingest-scheduled", *operations):
            assert any(op == operation for op, _ in kinds), f"{job}: no check after {operation}: {sorted(kinds)}"
        assert {"kafka-audit", "pipeline-accounting", "gold"} <= {k for _, k in kinds}


def test_the_continuous_job_keeps_up_with_the_live_producer_and_survives_a_sigkill(live_platform):
    """Lag, as each bronze micro-batch reports it, stays below two micro-batches' worth of the
    producer's records while the demo pipeline runs continuously for KEEP_UP_WINDOW_S (six of its
    5-second micro-batches; on a slow machine until it ran four, at most four windows; the
    five-minute keep-up is `make bench`'s soak row). Then a savepoint pauses and resumes it,
    its driver is SIGKILLed (a lost node), the run's supervisor restarts it (fixed-delay), the
    restarted job takes the live stream on, a stop-with-savepoint ends the run, and the run's
    proof finds every record the producer wrote meanwhile in bronze exactly once."""
    import signal

    from streamlake.operations.jobs import JobSpec
    from streamlake.operations.runner import job_processes, kill_job

    rest = live_platform.rest
    run_id = rest.trigger("ingest_sensors", {"mode": "continuous", "spark_conn_id": "spark_cluster",
                                             "restart_delay_seconds": 1})
    spec = JobSpec.from_dict(json.loads((live_platform.home / "jobs" / "sensors.json").read_text()))
    progress = spec.control.progress_file
    # The run may queue behind earlier ones (two runs at a time): the window starts when it runs.
    deadline = time.monotonic() + RESUMED_RUN_TIMEOUT_S
    while rest.run("ingest_sensors", run_id)["state"] == "queued":
        assert time.monotonic() < deadline, "the continuous run never left the queue"
        time.sleep(5)
    while not progress.exists() or time.time() - progress.stat().st_mtime > 20:
        assert time.monotonic() < deadline and rest.run("ingest_sensors", run_id)["state"] == "running"
        time.sleep(3)  # until the job's first micro-batches (spark-submit start-up)
    window_start = time.time()
    # A scheduled run meanwhile does not queue behind the continuous one (two runs at a time): it
    # leaves the job to its supervisor, its job task skipped (saying why), and its proof with it.
    beside = rest.trigger("ingest_sensors", {"mode": "scheduled"})

    def batches_since(start: float, with_records: bool = False) -> int:
        count = 0
        for line in progress.read_text().splitlines():
            try:
                batch = json.loads(line)
            except ValueError:  # the line being written
                continue
            count += (batch.get("stage") == "bronze" and epoch(batch["timestamp"]) >= start
                      and (batch["numInputRows"] > 0 or not with_records))
        return count

    def wait_for(condition, what: str) -> None:
        deadline = time.monotonic() + RESUMED_RUN_TIMEOUT_S
        while not condition():
            assert time.monotonic() < deadline, f"{what}: not after {RESUMED_RUN_TIMEOUT_S} s"
            assert rest.run("ingest_sensors", run_id)["state"] == "running", \
                f"the continuous run ended: {rest.failed_tasks('ingest_sensors', run_id)}"
            time.sleep(2)

    # KEEP_UP_WINDOW_S, longer where the machine is slow (a busy CI machine: one micro-batch in
    # 30 s on 2026-12-04, with the other test worker on both cores): until four micro-batches,
    # at most four windows. The lag criterion below is the same whatever the window.
    time.sleep(KEEP_UP_WINDOW_S)
    while batches_since(window_start) < 4 and time.time() - window_start < 4 * KEEP_UP_WINDOW_S:
        time.sleep(2)
    window_end = time.time()
    state = rest.run("ingest_sensors", run_id)["state"]
    assert state == "running", f"the continuous run ended early ({state}): " \
                               f"{rest.failed_tasks('ingest_sensors', run_id)}"
    lines = [json.loads(line) for line in progress.read_text().splitlines()]
    succeeded(rest, "ingest_sensors", beside)
    assert [rest.task("ingest_sensors", beside, t)["state"] for t in ("ingest_available_now", "verify")] == \
        ["skipped", "skipped"]
    assert "this scheduled run has nothing to do" in rest.task_log("ingest_sensors", beside, "ingest_available_now")
    assert rest.run("ingest_sensors", run_id)["state"] == "running"

    # A savepoint while it runs: the job pauses for it and resumes (its run's proof, on the
    # Spark Connect server, goes on beside what follows).
    paused = rest.trigger("savepoint", {"job": "sensors"})
    wait_task(rest, "savepoint", paused, "take_savepoint", lambda ti: ti["state"] == "success")
    resumed = time.time()
    while_running = rest.call("GET", "/streamlake/api/savepoints?job=sensors")[1][0]
    assert while_running["job_was_running"], while_running
    wait_for(lambda: batches_since(resumed) >= 1, "the job to resume after the savepoint")

    # A lost driver: the supervisor restarts the job, which takes the live stream on (a bronze
    # micro-batch of records after the SIGKILL), until a stop-with-savepoint ends the run.
    killed = {p.pid for p in job_processes(spec)}
    assert killed and kill_job(spec, signal.SIGKILL) >= len(killed)
    died = time.time()
    wait_for(lambda: spec.control.is_running() and not killed & {p.pid for p in job_processes(spec)}
             and batches_since(died, with_records=True) >= 1, "the supervisor to restart the SIGKILLed job")
    stop = rest.trigger("savepoint", {"job": "sensors", "stop": True})
    succeeded(rest, "savepoint", paused)
    succeeded(rest, "savepoint", stop)
    succeeded(rest, "ingest_sensors", run_id)
    supervised = rest.task_log("ingest_sensors", run_id, "supervise_continuous")
    assert "restart 1 cause: killed by SIGKILL" in supervised, supervised[-3000:]
    proof = rest.task_log("ingest_sensors", run_id, "verify")
    assert "EXACTLY ONCE" in proof and "PASS kafka-audit" in proof, proof[-3000:]

    bronze = [p for p in lines if p.get("stage") == "bronze" and window_start <= epoch(p["timestamp"]) <= window_end]
    assert len(bronze) >= 4, f"too few micro-batches in {window_end - window_start:.0f} s: {len(bronze)}"
    steady = bronze[1:]  # the first batch catches up with what queued before
    worst = max(sum(p["lag"].values()) for p in steady)
    per_batch = max(1, sorted(p["numInputRows"] for p in steady)[len(steady) // 2])
    assert worst < 2 * per_batch, f"lag {worst} records is not below two micro-batches ({per_batch} records each)"
    print(f"{len(bronze)} bronze micro-batches; median {per_batch} records; worst lag {worst}")
