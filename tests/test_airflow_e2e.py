"""The DAGs end to end with `airflow dags test`: real Airflow, broker, Spark and Delta.

One `airflow dags test` runs at a time (the metadata DB is SQLite); jobs that
must keep running meanwhile are started continuously by a DAG run or the CLI
in the background.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import delta_log_entries, ingest
from streamlake.operations.audit import audit_offsets
from streamlake.operations.control import JobControl
from streamlake.delta.table import open_table
from streamlake.delta.txn import committed_offsets
from streamlake.operations.jobs import JobSpec, load_job, save_job
from streamlake.kafka.offsets import TopicPartition

pytestmark = pytest.mark.slow
STREAMLAKE = str(Path(sys.executable).parent / "streamlake")


@pytest.fixture(scope="module")
def airflow(broker):
    from streamlake.platform.airflow import run_airflow

    run_airflow("db", "migrate", timeout=300)
    return broker


def dags_test(dag_id: str, conf: dict, env: dict | None = None, background: bool = False, timeout: float = 900):
    from streamlake.platform.airflow import airflow_env, airflow_executable

    cmd = [airflow_executable(), "dags", "test", dag_id, "-c", json.dumps(conf)]
    full_env = {**airflow_env(), **(env or {})}
    if background:
        return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    done = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def define_job(tmp_path, name: str, topic: str, **kwargs) -> JobSpec:
    return save_job(JobSpec(name=name, topics=[topic], table=str(tmp_path / "bronze"),
                            checkpoint=str(tmp_path / "checkpoint"), **kwargs))


def rows_committed(job: JobSpec, partitions: int = 3) -> int:
    try:
        table = open_table(job.table)
    except FileNotFoundError:
        return 0
    return sum(committed_offsets(table, [TopicPartition(job.topics[0], p) for p in range(partitions)]).values())


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def assert_clean(job: JobSpec, rows: int | None = None):
    report = audit_offsets(job.table, job.topics)
    assert report.exactly_once, report.summary()
    if rows is not None:
        assert report.totals()["table_rows"] == rows, report.summary()
    return report


def test_ingest_savepoint_more_data_restore_ingest(airflow, produce, topic_name, tmp_path):
    from streamlake.operations.consistency import recent_checks
    from streamlake.operations.savepoints import list_savepoints

    job = define_job(tmp_path, f"flow_{topic_name}", topic_name, max_offsets_per_trigger=400)
    produce(topic_name, 1500, seed=1)
    code, out = dags_test("streaming_ingest", {"job": job.name, "mode": "scheduled"})
    assert code == 0, out[-4000:]
    assert "EXACTLY ONCE: 1500 rows" in out

    code, out = dags_test("savepoint", {"job": job.name, "stop": False})
    assert code == 0, out[-4000:]
    savepoint = list_savepoints(job.name)[0]
    assert savepoint.offsets() == committed_offsets(open_table(job.table), savepoint.offsets())
    assert (savepoint.path / "checkpoint" / "offsets").is_dir()

    produce(topic_name, 700, seed=2)
    code, out = dags_test("streaming_ingest", {"job": job.name, "mode": "scheduled"})
    assert code == 0 and "EXACTLY ONCE: 2200 rows" in out, out[-4000:]

    code, out = dags_test("restore", {"savepoint_id": savepoint.id})
    assert code == 0, out[-4000:]
    assert "[restore] job" in out and "EXACTLY ONCE: 1500 rows" in out and "offsets match the expected ones" in out
    assert "[restore-resumed] job" in out and "EXACTLY ONCE: 2200 rows" in out
    restores = [a["commitInfo"] for c in delta_log_entries(job.table) for a in c
                if "commitInfo" in a and a["commitInfo"]["operation"] == "RESTORE"]
    assert len(restores) == 1, "the restore is a new commit: history is kept"

    produce(topic_name, 300, seed=3)
    code, out = dags_test("streaming_ingest", {"job": job.name, "mode": "scheduled"})
    assert code == 0, out[-4000:]
    assert_clean(job, 2500)
    done = {c["operation"]: c["verdict"] for c in recent_checks(50, job.name)}
    assert done == {"ingest-scheduled": "PASS", "savepoint": "PASS", "restore": "PASS", "restore-resumed": "PASS"}


def test_supervisor_restarts_after_sigkill_savepoints_while_running_and_stops(airflow, produce, topic_name, tmp_path):
    from streamlake.errors import StreamLakeError
    from streamlake.operations.runner import kill_job, job_processes
    from streamlake.operations.savepoints import create_savepoint, dispose_savepoint, restore_savepoint

    job = define_job(tmp_path, f"cont_{topic_name}", topic_name, processing_time_s=1.0)
    produce(topic_name, 600, seed=4)
    # A savepoint of the idle (empty) job, restored at once: the run below is "restored from" it.
    first = create_savepoint(job)
    restore_savepoint(first.id)

    run = dags_test("streaming_ingest", {"job": job.name, "mode": "continuous", "restart_strategy": "fixed-delay",
                                          "restart_attempts": 3, "restart_delay_seconds": 1}, background=True)
    try:
        wait(lambda: rows_committed(job) == 600, 180, "the continuous job to ingest the first records")
        pids = {p.pid for p in job_processes(job)}
        assert kill_job(job, signal.SIGKILL) > 0
        wait(lambda: JobControl(job.checkpoint).is_running() and not pids & {p.pid for p in job_processes(job)},
             180, "the supervisor to restart the job")
        produce(topic_name, 400, seed=5)
        wait(lambda: rows_committed(job) == 1000, 180, "the restarted job to ingest new records")

        started = time.monotonic()
        running_sp = create_savepoint(job)  # what the savepoint DAG does, while the job runs
        assert running_sp.job_was_running and time.monotonic() - started < 60
        assert JobControl(job.checkpoint).is_running(), "the job resumed after the savepoint"
        with pytest.raises(StreamLakeError, match="cannot be disposed: running job"):
            dispose_savepoint(first.id)

        JobControl(job.checkpoint).request_stop()
        out, _ = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 0, out[-4000:]
    assert "restart 1 cause: killed by SIGKILL" in out
    assert "[ingest-continuous] job" in out and "EXACTLY ONCE: 1000 rows" in out
    dispose_savepoint(first.id)  # allowed once the job is stopped
    assert_clean(job, 1000)


def test_supervisor_gives_up_when_the_failure_rate_is_exceeded(airflow, spark, produce, topic_name, tmp_path):
    job = define_job(tmp_path, f"flaky_{topic_name}", topic_name, processing_time_s=1.0)
    produce(topic_name, 300, seed=6)
    code, out = dags_test("streaming_ingest", {
        "job": job.name, "mode": "continuous", "restart_strategy": "failure-rate",
        "max_failures_per_interval": 1, "failure_interval_seconds": 600, "restart_delay_seconds": 1,
    }, env={"STREAMLAKE_CRASH_AT": "after_files"})  # every run is SIGKILLed after writing its files
    assert code != 0
    assert "failure-rate: 1 of at most 1 failures" in out
    assert "GaveUp: giving up after 2 run(s): failure-rate: 2 failures within 600s exceeds the maximum of 1; " \
           "last failure: killed by SIGKILL" in out
    # Nothing the crashes interrupted is lost or doubled once the job runs again.
    ingest(spark, {"table": job.table, "checkpoint": job.checkpoint}, topic_name)
    assert_clean(job, 300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rescale_a_running_job_on_a_standalone_cluster_from_one_core_to_two(airflow, topic_name, tmp_path):
    from streamlake.platform import spark_cluster
    from streamlake.kafka.producer import produce_sensor_readings
    from streamlake.operations.records import recent_operations

    port, ui = _free_port(), _free_port()
    spark_cluster.start(workers=2, cores_per_worker=1, memory="1g", port=port, ui_port=ui)
    master = spark_cluster.master_url(port)
    cluster_conn = {"AIRFLOW_CONN_SPARK_CLUSTER": json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1",
                                                              "port": port})}
    job = define_job(tmp_path, f"scale_{topic_name}", topic_name, processing_time_s=1.0, master=master,
                     spark_conn_id="spark_cluster", total_executor_cores=1, executor_cores=1)
    stop = threading.Event()
    producer = threading.Thread(target=produce_sensor_readings, kwargs=dict(
        topic=topic_name, count=0, partitions=3, rate=200, value_bytes=200, progress=False,
        should_stop=stop.is_set))
    producer.start()
    running = subprocess.Popen([STREAMLAKE, "job", "run", job.name, "--restart-strategy", "none"],
                               env=os.environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait(lambda: rows_committed(job) > 1000, 240, "the 1-core job to ingest a while")
        code, out = dags_test("rescale", {"job": job.name, "spark_conn_id": "spark_cluster",
                                          "total_executor_cores": 2, "executor_cores": 1, "min_partitions": 4},
                              env=cluster_conn)
        assert code == 0, out[-4000:]
        out_cli, _ = running.communicate(timeout=120)
        assert running.returncode == 0, f"the running job stops with the savepoint: {out_cli[-2000:]}"
    finally:
        stop.set()
        producer.join(30)
        if running.poll() is None:
            running.kill()
        with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as resp:
            apps = json.load(resp)["completedapps"]
        spark_cluster.stop()
    assert [a["cores"] for a in sorted(apps, key=lambda a: a["starttime"])] == [1, 2], apps
    assert load_job(job.name).total_executor_cores == 2 and load_job(job.name).min_partitions == 4
    rescale = json.loads(recent_operations(5, job.name)[0]["details"])
    assert rescale["throughput_before"]["rows_per_second"] and rescale["throughput_after"]["rows_per_second"]
    assert "[rescale] job" in out and "EXACTLY ONCE" in out
    # The stream went on while the job was stopped: catch up, then prove nothing was lost or doubled.
    code, out = dags_test("streaming_ingest", {"job": job.name, "mode": "scheduled", "spark_conn_id": "spark_default"})
    assert code == 0, out[-4000:]
    assert_clean(job)
