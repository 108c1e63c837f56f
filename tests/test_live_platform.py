"""The operations against the running platform, the way a user triggers them from the UI.

The platform is started as `make run` starts it (embedded broker, the demo producer
writing one record at a time with late, duplicated and malformed readings, a Spark
standalone cluster, Airflow standalone); every operation is triggered through
Airflow's REST API, as the UI's trigger button does, and must succeed with all its
checks passing. This is what failed for the first user: a savepoint of the live
demo timed out because the reader starved on a live topic's tiny record batches.
"""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from platform_harness import epoch

pytestmark = pytest.mark.slow

JOB = "sensors"
OPERATION_TIMEOUT_S = 420  # generous: the test's own scheduled runs and continuous job share 2 cores with it
# The run a restore or rescale starts may queue behind a scheduled run (max_active_runs=1),
# which under load takes minutes of its own: its wait covers both.
RESUMED_RUN_TIMEOUT_S = 2 * OPERATION_TIMEOUT_S


def first_successful_run(rest, dag_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = rest.runs(dag_id)
        done = [r for r in runs if r["state"] == "success"]
        if done:
            return done[-1]
        failed = [r for r in runs if r["state"] == "failed"]
        assert not failed, f"{dag_id} failed: {[rest.failed_tasks(dag_id, r['dag_run_id']) for r in failed]}"
        time.sleep(5)
    raise AssertionError(f"no successful {dag_id} run within {timeout:g}s: {rest.runs(dag_id)}")


def operate(rest, dag_id: str, conf: dict) -> dict:
    run_id = rest.trigger(dag_id, conf)
    run = rest.wait(dag_id, run_id, OPERATION_TIMEOUT_S)
    assert run["state"] == "success", f"{dag_id} {run_id}: {rest.failed_tasks(dag_id, run_id)}"
    print(f"{dag_id} {conf}: {run['seconds']} s")
    return run


def recorded_checks(rest) -> list[dict]:
    """Every check the platform recorded for the demo job (this platform is new: all of them)."""
    status, rows = rest.call("GET", f"/streamlake/api/checks?job={JOB}&limit=1000")
    assert status == 200, rows
    return rows


def test_savepoint_restore_rescale_and_backfills_on_the_running_demo(live_platform):
    rest = live_platform.rest
    # The demo's first scheduled pipeline run (the one that crawled before the fix).
    first = first_successful_run(rest, "streaming_ingest", 900)
    assert first["run_type"] == "scheduled"

    operate(rest, "savepoint", {"job": JOB})
    status, savepoints = rest.call("GET", f"/streamlake/api/savepoints?job={JOB}")
    assert status == 200 and savepoints, savepoints
    restore = operate(rest, "restore", {"savepoint_id": savepoints[0]["id"], "spark_conn_id": "spark_cluster"})
    # The restore started the job from the restored state: its streaming_ingest run
    # catches up and checks every stage.
    resumed = rest.wait("streaming_ingest", f"restored__{restore['dag_run_id']}", RESUMED_RUN_TIMEOUT_S)
    assert resumed["state"] == "success", rest.failed_tasks("streaming_ingest", resumed["dag_run_id"])
    rescale = operate(rest, "rescale", {"job": JOB, "spark_conn_id": "spark_cluster", "total_executor_cores": 2,
                                        "executor_cores": 1, "gold_partitions": 3})
    # The rescale started the job on its new resources: that run catches up, proves the
    # rescale lost and duplicated nothing, and records the throughput after.
    rescaled = rest.wait("streaming_ingest", f"rescaled__{rescale['dag_run_id']}", RESUMED_RUN_TIMEOUT_S)
    assert rescaled["state"] == "success", rest.failed_tasks("streaming_ingest", rescaled["dag_run_id"])
    status, operations = rest.call("GET", f"/streamlake/api/operations?job={JOB}")
    assert status == 200 and any(o["operation"] == "rescale-throughput" for o in operations), operations

    # Late events accumulate in the demo; a manual backfill of all of them repairs gold.
    operate(rest, "backfill_late_data", {"job": JOB, "all_pending": True, "dry_run": False})
    # Airflow's own backfill restates data intervals (hourly runs) of the last two hours.
    now = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)
    rest.backfill("backfill_late_data", (now - dt.timedelta(hours=2)).isoformat(), (now - dt.timedelta(hours=1)).isoformat())
    deadline = time.monotonic() + OPERATION_TIMEOUT_S
    while time.monotonic() < deadline:
        backfilled = rest.runs("backfill_late_data", run_type="backfill")
        if backfilled and all(r["state"] in ("success", "failed") for r in backfilled):
            break
        time.sleep(5)
    assert backfilled and all(r["state"] == "success" for r in backfilled), backfilled
    assert all(r["data_interval_end"] > r["data_interval_start"] for r in backfilled), "runs have data intervals"

    checks = recorded_checks(rest)
    kinds = {(c["operation"], c.get("kind")) for c in checks}
    assert all(c["verdict"] == "PASS" for c in checks), [c["summary"] for c in checks if c["verdict"] != "PASS"]
    for operation in ("ingest-scheduled", "savepoint", "restore", "rescale", "backfill"):
        assert any(op == operation for op, _ in kinds), f"no check recorded after {operation}: {sorted(kinds)}"
    assert {"kafka-audit", "pipeline-accounting", "gold"} <= {k for _, k in kinds}


def test_the_continuous_job_keeps_up_with_the_demo_producer_for_five_minutes(live_platform):
    """Lag, as each bronze micro-batch reports it, stays below two micro-batches' worth of
    the producer's records while the demo runs for five minutes."""
    from streamlake.operations.jobs import JobSpec

    rest = live_platform.rest
    run_id = rest.trigger("streaming_ingest", {"job": JOB, "mode": "continuous", "spark_conn_id": "spark_cluster"})
    spec = JobSpec.from_dict(json.loads((live_platform.home / "jobs" / f"{JOB}.json").read_text()))
    progress = spec.control.progress_file
    # The run may queue behind a scheduled one (max_active_runs=1): the five minutes start
    # when it runs, and while it runs no other run of the job writes progress.
    deadline = time.monotonic() + RESUMED_RUN_TIMEOUT_S
    while rest.run("streaming_ingest", run_id)["state"] == "queued":
        assert time.monotonic() < deadline, "the continuous run never left the queue"
        time.sleep(5)
    window_start = time.time()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and rest.run("streaming_ingest", run_id)["state"] == "running":
        time.sleep(10)
    window_end = time.time()
    lines = [json.loads(line) for line in progress.read_text().splitlines()]
    state = rest.run("streaming_ingest", run_id)["state"]
    assert state == "running", f"the continuous run ended early ({state}): " \
                               f"{rest.failed_tasks('streaming_ingest', run_id)}"
    operate(rest, "savepoint", {"job": JOB, "stop": True})  # stop-with-savepoint ends the continuous run
    run = rest.wait("streaming_ingest", run_id, OPERATION_TIMEOUT_S)
    assert run["state"] == "success", rest.failed_tasks("streaming_ingest", run_id)

    bronze = [p for p in lines if p.get("stage") == "bronze" and window_start <= epoch(p["timestamp"]) <= window_end]
    assert len(bronze) >= 10, f"too few micro-batches in five minutes: {len(bronze)}"
    steady = bronze[2:]  # the first batches catch up with what queued before the job started
    worst = max(sum(p["lag"].values()) for p in steady)
    per_batch = max(1, sorted(p["numInputRows"] for p in steady)[len(steady) // 2])
    assert worst < 2 * per_batch, f"lag {worst} records is not below two micro-batches ({per_batch} records each)"
    print(f"{len(bronze)} bronze micro-batches; median {per_batch} records; worst lag {worst}")

