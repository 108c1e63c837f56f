"""The DAGs end to end with `airflow dags test`: real Airflow, broker, Spark and Delta.

Every job here is a whole pipeline (bronze -> silver -> gold) from a definition
written into a pipelines directory of the test's own (``STREAMLAKE_PIPELINES``),
so Airflow builds its ``ingest_<job>`` and ``backfill_<job>`` DAGs as it does for
``pipelines/``. One `airflow dags test` runs at a time (the metadata DB is
SQLite); jobs that must keep running meanwhile are started continuously by a DAG
run or the CLI in the background. The proofs after each operation run on the test
session's Spark Connect server (as on `make run`). Ingest, savepoint, more data and
restore through the DAGs are proven on S3 (test_object_storage's DAG test, with the
manifest, the RESTORE commits and the recorded checks) and on the running platform
through the forms (test_live_platform); the fallback to spark-submit where no server
answers is test_dags'.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

import yaml

from conftest import SPARK_CONNECT_PORT, _free_port
from helpers import EXAMPLES, run_available_now
from streamlake.delta.table import open_table, read_table
from streamlake.delta.txn import committed_offsets
from streamlake.kafka.offsets import TopicPartition
from streamlake.operations.audit import audit_offsets
from streamlake.operations.jobs import JobSpec, load_job, save_job
from streamlake.operations.pipeline_checks import account_for_bronze, check_gold
from streamlake.pipeline.schemas import gold_spec

pytestmark = pytest.mark.slow
STREAMLAKE = str(Path(sys.executable).parent / "streamlake")


@pytest.fixture(scope="module")
def airflow(broker):
    from streamlake.platform.airflow import run_airflow

    run_airflow("db", "migrate", timeout=300)
    return broker


def dags_test(dag_id: str, conf: dict, env: dict | None = None, background: bool = False, timeout: float = 900):
    """`airflow dags test` of ``dag_id``. Its proofs run on the test session's Spark Connect
    server (conftest's ``spark`` fixture serves it), as on `make run`."""
    from streamlake.platform.airflow import airflow_env, airflow_executable

    cmd = [airflow_executable(), "dags", "test", dag_id, "-c", json.dumps(conf)]
    airflow = airflow_env(connect_port=SPARK_CONNECT_PORT)
    full_env = {**airflow, "STREAMLAKE_PIPELINES": os.environ["STREAMLAKE_PIPELINES"], **(env or {})}
    if background:
        return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    done = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(autouse=True)
def pipelines_dir(tmp_path, monkeypatch):
    """The test's own pipelines directory: the DAGs Airflow builds are those of its definitions."""
    folder = tmp_path / "pipelines"
    folder.mkdir()
    monkeypatch.setenv("STREAMLAKE_PIPELINES", str(folder))
    return folder


def define_job(tmp_path, name: str, topic: str, example: str = "sensors", **kwargs) -> JobSpec:
    """A job of the example definition ``example`` renamed ``name``, reading ``topic``, its
    definition in the test's pipelines directory."""
    data = yaml.safe_load((EXAMPLES / f"{example}.yaml").read_text())
    data.update(name=name, topics=[topic])
    path = Path(os.environ["STREAMLAKE_PIPELINES"]) / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return save_job(JobSpec(name=name, root=str(tmp_path / name), definition_file=str(path), **kwargs))


def rows_committed(job: JobSpec, partitions: int = 3) -> int:
    try:
        table = open_table(job.table)
    except FileNotFoundError:
        return 0
    topic = job.source_topics[0]
    return sum(committed_offsets(table, [TopicPartition(topic, p) for p in range(partitions)]).values())


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def assert_every_stage(spark, job: JobSpec, rows: int | None = None):
    report = audit_offsets(job.table, job.source_topics)
    assert report.exactly_once, report.summary()
    if rows is not None:
        assert report.totals()["table_rows"] == rows, report.summary()
    definition = job.definition
    accounting = account_for_bronze(spark, job.tables(), definition)
    assert accounting.passed, accounting.summary()
    for aggregate in definition.aggregates:
        gold = check_gold(spark, job.tables(), definition, aggregate)
        assert gold.passed, gold.summary()
    return accounting


def gold_of(spark, job: JobSpec, columns=("sensor_id", "window_start", "count", "sum_temperature")) -> set:
    definition = job.definition
    aggregate = definition.aggregates[0]
    rows = read_table(spark, job.table_path(aggregate.gold_table), gold_spec(definition, aggregate))
    return {tuple(r) for r in rows.select(*columns).collect()}


@pytest.mark.scenario
def test_supervisor_restarts_after_sigkill_savepoints_while_running_and_stops(airflow, spark, produce, topic_name,
                                                                              tmp_path):
    from streamlake.errors import StreamLakeError
    from streamlake.operations.runner import job_processes, kill_job
    from streamlake.operations.savepoints import create_savepoint, dispose_savepoint, restore_savepoint

    job = define_job(tmp_path, f"cont-{topic_name}", topic_name, processing_time_s=1.0)
    produce(topic_name, 600, seed=4)
    # A savepoint of the idle (empty) job, restored at once: the run below is "restored from" it.
    first = create_savepoint(job)
    restore_savepoint(first.id)

    run = dags_test(f"ingest_{job.name}", {"mode": "continuous", "restart_strategy": "fixed-delay",
                                            "restart_attempts": 3, "restart_delay_seconds": 1}, background=True)
    try:
        wait(lambda: rows_committed(job) == 600, 240, "the continuous job to ingest the first records")
        pids = {p.pid for p in job_processes(job)}
        assert kill_job(job, signal.SIGKILL) > 0
        wait(lambda: job.control.is_running() and not pids & {p.pid for p in job_processes(job)},
             180, "the supervisor to restart the job")
        produce(topic_name, 400, seed=5)
        wait(lambda: rows_committed(job) == 1000, 180, "the restarted job to ingest new records")

        started = time.monotonic()
        running_sp = create_savepoint(job)  # what the savepoint DAG does, while the job runs
        assert running_sp.job_was_running and time.monotonic() - started < 90
        assert job.control.is_running(), "the job resumed after the savepoint"
        with pytest.raises(StreamLakeError, match="cannot be disposed: running job"):
            dispose_savepoint(first.id)

        job.control.request_stop()
        out, _ = run.communicate(timeout=400)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 0, out[-4000:]
    assert "restart 1 cause: killed by SIGKILL" in out
    assert "[ingest-continuous] job" in out and "EXACTLY ONCE: 1000 rows" in out
    dispose_savepoint(first.id)  # allowed once the job is stopped
    assert_every_stage(spark, job, 1000)


@pytest.mark.scenario
def test_supervisor_gives_up_when_the_failure_rate_is_exceeded(airflow, spark, produce, topic_name, tmp_path):
    job = define_job(tmp_path, f"flaky-{topic_name}", topic_name, processing_time_s=1.0)
    produce(topic_name, 300, seed=6)
    code, out = dags_test(f"ingest_{job.name}", {
        "mode": "continuous", "restart_strategy": "failure-rate",
        "max_failures_per_interval": 1, "failure_interval_seconds": 600, "restart_delay_seconds": 1,
    }, env={"STREAMLAKE_CRASH_AT": "after_files"})  # every run is SIGKILLed after writing its bronze files
    assert code != 0
    restarts = [line for line in out.splitlines() if "job failed" in line or "GaveUp" in line]  # what a failure shows
    assert "failure-rate: 1 of at most 1 failures" in out, restarts
    assert "GaveUp: giving up after 2 run(s): failure-rate: 2 failures within 600s exceeds the maximum of 1; " \
           "last failure: killed by SIGKILL" in out, restarts
    # Nothing the crashes interrupted is lost or doubled once the job runs again: the ingest
    # DAG's available-now run, a client of the test session's Spark Connect server (the job has
    # no Spark resources of its own), then its proofs.
    code, out = dags_test(f"ingest_{job.name}", {"mode": "scheduled"})
    assert code == 0, out[-4000:]
    assert f"pipeline.py of job {job.name} on the Spark Connect server sc://" in out, out[-4000:]
    assert "EXACTLY ONCE: 300 rows" in out and "EVERY BRONZE ROW ONCE" in out and "GOLD EQUALS RECOMPUTE" in out
    assert_every_stage(spark, job, 300)


@pytest.mark.scenario
def test_rescale_mid_stream_on_a_cluster_keeps_gold_identical_to_a_run_without_it(airflow, spark, topic_name,
                                                                                   tmp_path):
    """1 core -> 2 cores and gold's aggregation 2 -> 5 partitions while the stream runs; gold
    is then identical to gold of a reference run over the same topic without the rescale
    (late events applied in both, so micro-batch boundaries cannot matter)."""
    from conftest import sensors_definition
    from streamlake.kafka.producer import produce_records
    from streamlake.pipeline.control import JobControl
    from streamlake.delta.records import recent_operations
    from streamlake.operations.savepoints import list_savepoints
    from streamlake.pipeline.backfill import AggregatePaths, run_backfill
    from streamlake.pipeline.driver import run_stages
    from streamlake.platform import spark_cluster

    port, ui = _free_port(), _free_port()
    spark_cluster.start(workers=2, cores_per_worker=1, memory="1g", port=port, ui_port=ui)
    master = spark_cluster.master_url(port)
    cluster_conn = {"AIRFLOW_CONN_SPARK_CLUSTER": json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1",
                                                              "port": port})}
    job = define_job(tmp_path, f"scale-{topic_name}", topic_name, processing_time_s=1.0, master=master,
                     spark_conn_id="spark_cluster", total_executor_cores=1, executor_cores=1, gold_partitions=2)
    stop = threading.Event()
    shape = dict(topic=topic_name, partitions=3, rate=150, value_bytes=200, progress=False, late_fraction=0.05,
                 out_of_order_seconds=5, duplicate_fraction=0.03, should_stop=stop.is_set)

    def stream():
        # 2,000 records, then the last 1,000 once the rescale's savepoint stopped the job: records
        # arrive while it is stopped, so the restarted job has work to measure throughput on.
        produce_records(sensors_definition(), count=2000, seed=41, **shape)
        while not stop.is_set() and not any(s.note == "rescale" for s in list_savepoints(job.name)):
            time.sleep(0.5)
        produce_records(sensors_definition(), count=1000, seed=42, **shape)

    producer = threading.Thread(target=stream)
    producer.start()
    running = subprocess.Popen([STREAMLAKE, "job", "run", job.name, "--restart-strategy", "none"],
                               env=os.environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait(lambda: rows_committed(job) > 800, 300, "the 1-core job to run a while")
        code, out = dags_test("rescale", {"job": job.name, "spark_conn_id": "spark_cluster",
                                          "total_executor_cores": 2, "executor_cores": 1, "min_partitions": 4,
                                          "gold_partitions": 5}, env=cluster_conn)
        assert code == 0, out[-4000:]
        assert "rescaled__" in out, "the rescale starts the job on its new resources (a run of its ingest DAG)"
        out_cli, _ = running.communicate(timeout=120)
        assert running.returncode == 0, f"the running job stops with the savepoint: {out_cli[-2000:]}"
        # That run, as the scheduler would run it (`dags test` does not run triggered runs), on the
        # cluster with the new resources; available-now rather than continuous so that it ends. It
        # takes the rescale's handover, which binds the job until then (no other run starts it).
        operation, handover = load_job(job.name).control.pending_handover()
        assert handover["handed_over"], handover
        code, out = dags_test(f"ingest_{job.name}", {"mode": "scheduled", "spark_conn_id": "spark_cluster",
                                                     "resumes": "rescale", "handover": operation}, env=cluster_conn)
        assert code == 0, out[-4000:]
    finally:
        producer.join(120)
        stop.set()
        if running.poll() is None:
            running.kill()
        with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as resp:
            apps = json.load(resp)["completedapps"]
        spark_cluster.stop()
    pipeline_apps = [a for a in sorted(apps, key=lambda a: a["starttime"]) if a["name"].startswith("pipeline:")]
    assert [a["cores"] for a in pipeline_apps][:2] == [1, 2], apps
    rescaled = load_job(job.name)
    assert rescaled.total_executor_cores == 2 and rescaled.min_partitions == 4 and rescaled.gold_partitions == 5
    measured = recent_operations(5, job.name)[0]
    assert measured["operation"] == "rescale-throughput", measured
    details = json.loads(measured["details"])
    assert details["throughput_before"]["rows_per_second"] and details["throughput_after"]["rows_per_second"]
    assert details["settings"]["after"]["total_executor_cores"] == 2
    assert "[rescale] job" in out and "EXACTLY ONCE" in out  # the resumed run's proof, under the rescale
    # The stream went on while the job was stopped: catch up (the rescaled job's settings, in
    # the test's SparkSession), then build the reference from the same topic in one go,
    # without any rescale.
    run_available_now(spark, rescaled.pipeline_config())
    reference = define_job(tmp_path, f"ref-{topic_name}", topic_name, gold_partitions=2)
    cfg = reference.pipeline_config()
    run_stages(spark, cfg.build_stages(), JobControl(cfg.control_dir), available_now=True, report=lambda _: None)
    for j in (rescaled, reference):
        definition = j.definition
        for aggregate in definition.aggregates:
            run_backfill(spark, definition, aggregate, AggregatePaths.of(j.root, aggregate))
        assert_every_stage(spark, j, 3000)
    columns = ("sensor_id", "window_start", "window_end", "count", "sum_temperature", "min_temperature",
               "max_temperature", "avg_temperature")
    assert gold_of(spark, rescaled, columns) == gold_of(spark, reference, columns)


@pytest.mark.scenario
def test_a_running_job_keeps_its_last_good_definition_when_the_file_breaks(airflow, produce, topic_name, tmp_path):
    """The definition file of a continuously running job is changed into one whose rule names
    an undeclared field. The job keeps running on the definition its tables were built with
    (records produced after the change reach silver); Airflow keeps the pipeline's DAGs and
    shows the file as an import error naming the file and the key; the next DAG run fails,
    saying why, having started nothing; the Pipelines view shows the error beside the pipeline."""
    from airflow.dag_processing.dagbag import DagBag

    from helpers import views_client
    from streamlake.delta.table import open_table

    job = define_job(tmp_path, f"keep-{topic_name}", topic_name, example="orders", processing_time_s=1.0)
    produce(topic_name, 200, seed=7, definition=job.file_definition())
    run = subprocess.Popen([STREAMLAKE, "job", "run", job.name, "--restart-strategy", "none"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        def silver_rows() -> int:
            try:
                return open_table(job.table_path("silver")).to_pyarrow_dataset().count_rows()
            except FileNotFoundError:
                return 0

        wait(lambda: (rows_committed(job) == 200 and silver_rows() > 0) or run.poll() is not None, 240,
             "the job to ingest the first records")
        assert run.poll() is None, run.communicate()[0][-3000:]
        path = Path(job.definition_file)
        broken = yaml.safe_load(path.read_text())
        broken["rules"][0]["check"] = "price > 0"
        path.write_text(yaml.safe_dump(broken, sort_keys=False))
        before = silver_rows()
        produce(topic_name, 100, seed=8, definition=job.definition)
        wait(lambda: rows_committed(job) == 300 and silver_rows() > before, 180,
             "the running job to go on with its last good definition")
        assert run.poll() is None, "the job still runs"

        dags = DagBag(dag_folder=str(Path(__file__).resolve().parents[1] / "dags"))
        assert f"ingest_{job.name}" in dags.dag_ids and f"backfill_{job.name}" in dags.dag_ids
        errors = {Path(f).name: e for f, e in dags.import_errors.items()}
        assert f"{path}: rules[0].check: rule positive_amount: 'price > 0': price is not a declared field" in \
            errors["pipeline_definitions.py"]

        code, out = dags_test(f"ingest_{job.name}", {}, timeout=300)
        assert code != 0, out[-3000:]
        assert "the job was not started: its definition file does not load" in out and \
            f"{path}: rules[0].check" in out, out[-3000:]
        assert run.poll() is None and rows_committed(job) == 300, "the failed run touched nothing"

        page = views_client().get("/pipelines").text
        section = page.split(f"data-pipeline='{job.name}'", 1)[1].split("</section>", 1)[0]
        assert "The definition file does not load" in section and "price is not a declared field" in section
    finally:
        job.control.request_stop()
        try:
            run.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
