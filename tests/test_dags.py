"""DAG integrity: every DAG parses quickly, without errors, documents itself, and its trigger
form can be submitted with its defaults; one ingest and one backfill DAG per pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ("orders", "sensors")  # pipelines/*.yaml
OPERATIONS = {"savepoint", "restore", "rescale"}
EXPECTED = OPERATIONS | {f"{kind}_{p}" for p in PIPELINES for kind in ("ingest", "backfill")}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


def test_dags_import_without_errors_in_a_few_seconds(dagbag):
    """A parse takes about 0.4 s on an idle machine; the bound guards against a collapse (a
    DAG file doing real work at parse time), not against a busy machine (2 s failed once
    while a platform started beside it, 2026-11-28)."""
    assert not dagbag.import_errors, dagbag.import_errors
    assert set(dagbag.dag_ids) == EXPECTED
    for stat in dagbag.dagbag_stats:
        assert stat.duration.total_seconds() < 5, f"{stat.file} took {stat.duration}"


@pytest.mark.parametrize("dag_id", sorted(EXPECTED))
def test_dag_documents_itself(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    assert dag.doc_md and len(dag.doc_md) > 300, "doc_md explains what the DAG does"
    assert "streamlake" in dag.tags and len(dag.tags) >= 2
    assert dag.default_args.get("retries") is not None
    assert dag.params, "manual triggers are configured through params"
    for name in dag.params:
        param = dag.params.get_param(name)
        assert param.description and len(param.description) > 15, f"{dag_id}.{name} lacks a description"
    for task in dag.tasks:
        assert task.retries is not None


@pytest.mark.parametrize("dag_id", sorted(EXPECTED))
def test_every_trigger_form_can_be_submitted_with_its_defaults(dagbag, dag_id):
    """What Airflow 3's trigger form does with each param (its FieldRow/isRequired rules): a
    field whose schema type has no "null" is required, and a required field holding null or
    an empty string keeps the Trigger button disabled. So every default is a value the form
    accepts, every empty default is nullable, and the defaults validate against the schema
    (the form's own submit sends them unchanged). Parameters only other DAGs set (what a
    resumed run completes) are not in the form at all."""
    dag = dagbag.dags[dag_id]
    for name in dag.params:
        param = dag.params.get_param(name)
        types = param.schema.get("type")
        required = bool(types) and not (isinstance(types, list) and "null" in types)
        if required:
            assert param.value not in (None, ""), f"{dag_id}.{name}: required in the form but its default is empty"
        if "enum" in param.schema:
            assert param.value in param.schema["enum"], f"{dag_id}.{name}: default not among the choices"
        param.resolve(param.value)  # raises ParamValidationError for a default the schema refuses
    assert "resumes" not in dag.params, "set by restore/rescale through conf, not a person's field"


@pytest.mark.parametrize("mode,was_running,resumed", [
    ("continuous", True, "continuous"),
    ("continuous", False, "scheduled"),
])
def test_restore_starts_the_job_from_its_trigger_task(dagbag, mode, was_running, resumed):
    """The restore's resume task renders the resumed run's DAG, id and conf from the
    operation's own XCom (no task in between): continuous only if the job ran continuously
    when it was stopped."""
    dag = dagbag.dags["restore"]
    resume = dag.get_task("resume")
    assert resume.upstream_task_ids == {"verify_restored"}
    pulled = []

    class TaskInstance:
        def xcom_pull(self, task_ids):
            pulled.append(task_ids)
            return {"job": "orders", "mode": mode, "job_was_running": was_running}

    env = dag.get_template_env()
    context = {"ti": TaskInstance(), "params": {"spark_conn_id": "spark_cluster"}, "run_id": "manual__1"}
    render = lambda field: env.from_string(getattr(resume, field)).render(**context)  # noqa: E731
    assert render("conf") == {"job": "orders", "mode": resumed, "spark_conn_id": "spark_cluster",
                              "resumes": "restore"}
    assert render("trigger_dag_id") == "ingest_orders"
    assert render("trigger_run_id") == "restored__manual__1"
    assert set(pulled) == {"restore"}


@pytest.mark.parametrize("mode,lock_holder,resumed", [
    ("available-now", "job", "scheduled"),
    ("continuous", "job", "continuous"),
    ("continuous", None, "scheduled"),
    ("continuous", "savepoint", "scheduled"),  # a savepoint of the stopped job holds its lock
    ("continuous", "restore", "scheduled"),
])
def test_rescale_starts_the_job_run_first_on_the_new_settings(dagbag, tmp_path, monkeypatch, mode, lock_holder,
                                                              resumed):
    """The rescale starts the job's run before anything else (its driver starts while the
    savepoint is taken): continuous if the job runs continuously at the trigger (its driver,
    not a savepoint or restore of the stopped job, holds the job lock), on the form's
    settings, waiting for this rescale's handover; the savepoint follows that task, and every
    task before the handover refuses it when it fails for good (and records the rescale failed).
    The run gets the rescale's trigger time, with which it records the rescale proven."""
    import datetime as dt
    import threading
    from types import SimpleNamespace

    from streamlake.operations.jobs import JobSpec, save_job
    from streamlake.orchestration.dag_parts import operation_failed
    from streamlake.orchestration.tasks import refuse_handover

    monkeypatch.setenv("STREAMLAKE_HOME", str(tmp_path / "home"))
    job = save_job(JobSpec(name="orders", definition_file=str(ROOT / "pipelines" / "orders.yaml"),
                           root=str(tmp_path / "orders")))
    job.control.write_state(mode=mode)
    dag = dagbag.dags["rescale"]
    resume = dag.get_task("resume")
    assert resume.upstream_task_ids == set()
    assert dag.get_task("savepoint_and_stop").upstream_task_ids == {"resume"}
    for task_id in ("savepoint_and_stop", "apply_settings"):
        assert refuse_handover in dag.get_task(task_id).on_failure_callback
        assert operation_failed in dag.get_task(task_id).on_failure_callback
    params = {"job": "orders", "spark_conn_id": "spark_cluster", "total_executor_cores": 2, "executor_cores": 1,
              "min_partitions": None, "max_offsets_per_trigger": None, "gold_partitions": 4}
    env = dag.get_template_env()
    triggered = dt.datetime(2026, 12, 7, 3, 0, 1, tzinfo=dt.timezone.utc)
    render = lambda field: env.from_string(getattr(resume, field)).render(  # noqa: E731
        params=params, run_id="manual__1", dag_run=SimpleNamespace(run_after=triggered))
    held, release = threading.Event(), threading.Event()
    if lock_holder:  # a driver, savepoint or restore holds the job lock while this renders
        def driver():
            with job.control.running(holder=lock_holder):
                held.set()
                release.wait(30)
        threading.Thread(target=driver, daemon=True).start()
        assert held.wait(10)
    try:
        conf = render("conf")
    finally:
        release.set()
    settings = {k: v for k, v in params.items() if k != "job"}
    assert conf == {"job": "orders", "mode": resumed, "spark_conn_id": "spark_cluster", "resumes": "rescale",
                    "settings": settings, "handover": "manual__1",
                    "operation_triggered_at": "2026-12-07T03:00:01+00:00"}
    assert render("trigger_dag_id") == "ingest_orders"
    assert render("trigger_run_id") == "rescaled__manual__1"


def test_an_operation_is_recorded_ending_when_its_proof_ended_not_when_its_callback_ran(tmp_path, monkeypatch):
    """The proof's success callback records the savepoint proven with the task's end as Airflow
    set it before the callbacks (``ti.end_date``), not the time the callback got to run: on
    the live platform one ran 48 s after its task had ended, Airflow's SQLite database having
    stalled the task's state update, and the operation's duration was 71 s instead of 23 s."""
    import datetime as dt
    from types import SimpleNamespace

    from streamlake.operations.outcomes import OPERATION_OUTCOMES
    from streamlake.delta.records import platform_rows
    from streamlake.orchestration.dag_parts import operation_proven

    monkeypatch.setenv("STREAMLAKE_HOME", str(tmp_path / "home"))
    triggered = dt.datetime(2026, 12, 7, 13, 0, 14, tzinfo=dt.timezone.utc)
    ended = triggered + dt.timedelta(seconds=23.5)
    run = SimpleNamespace(run_id="manual__1", run_type="manual", run_after=triggered, start_date=triggered,
                          conf={"job": "sensors"})
    operation_proven({"dag": SimpleNamespace(dag_id="savepoint"), "dag_run": run, "params": {"job": "sensors"},
                      "task": SimpleNamespace(task_id="verify"), "ti": SimpleNamespace(end_date=ended)})
    rows = platform_rows(OPERATION_OUTCOMES).to_pylist()
    assert [(r["operation"], r["job"], r["outcome"], r["duration_s"]) for r in rows] == \
        [("savepoint", "sensors", "proven", 23.5)], rows
    assert rows[0]["finished_at"] == ended


def test_the_ingest_run_takes_a_rescale_settings_and_handover_from_its_conf(dagbag, tmp_path, monkeypatch):
    """The run a rescale started: its available-now task runs the job on the conf's settings
    (not yet in the spec) and its driver waits for the rescale's handover."""
    from streamlake.operations.jobs import JobSpec, save_job

    monkeypatch.setenv("STREAMLAKE_HOME", str(tmp_path / "home"))
    save_job(JobSpec(name="orders", definition_file=str(ROOT / "pipelines" / "orders.yaml"),
                     root=str(tmp_path / "orders"), total_executor_cores=1))
    task = dagbag.dags["ingest_orders"].get_task("ingest_available_now")
    env = dagbag.dags["ingest_orders"].get_template_env()
    conf = {"resumes": "rescale", "handover": "manual__1",
            "settings": {"spark_conn_id": "spark_cluster", "total_executor_cores": 2, "executor_cores": 1,
                         "min_partitions": 4, "max_offsets_per_trigger": None, "gold_partitions": None}}

    class DagRun:
        def __init__(self, conf):
            self.conf = conf

    templates = {field: getattr(task, field) for field in ("settings", "handover")}
    try:
        for conf_of_run, cores, waits in ((conf, 2, True), ({}, 1, False)):  # a rescale's run; a scheduled one
            for field, template in templates.items():
                setattr(task, field, env.from_string(template).render(dag_run=DagRun(conf_of_run)))
            task._resumed_job = None  # a new task run (Airflow runs each on a fresh copy of the operator)
            job = task.job_spec()
            args = task.job_arguments(job)
            assert job.total_executor_cores == cores and ("--await-handover" in args) == waits, (conf_of_run, args)
            if waits:
                assert job.executor_cores == 1 and job.min_partitions == 4 and "--min-partitions" in args
                assert args[-2:] == ["--await-handover", "manual__1"]
    finally:
        task._resumed_job = None
        for field, template in templates.items():
            setattr(task, field, template)
    # A continuous run a rescale started (supervise_continuous) passes the handover the same way.
    from streamlake.operations.runner import job_args

    args = job_args(job, continuous=True, await_handover="manual__1")
    assert "--processing-time" in args and args[-2:] == ["--await-handover", "manual__1"]


def test_continuous_supervisor_is_not_retried_by_airflow(dagbag):
    """Restarts are the restart strategy's; an Airflow retry would hide that it gave up."""
    for pipeline in PIPELINES:
        assert dagbag.dags[f"ingest_{pipeline}"].get_task("supervise_continuous").retries == 0


def test_the_next_run_starts_its_job_while_the_one_before_proves_itself(dagbag, tmp_path, monkeypatch):
    """Two runs of an ingest DAG at a time, each of the job's tasks and proofs one run at a time:
    a restore's or rescale's run does not queue behind the previous run's verify and quality, and
    two runs' jobs never run side by side (with a supervisor: test_control). (On the running
    platform: test_live_platform.)"""
    from streamlake.operations.jobs import JobSpec, load_job, save_job

    monkeypatch.setenv("STREAMLAKE_HOME", str(tmp_path / "home"))
    save_job(JobSpec(name="orders", definition_file=str(ROOT / "pipelines" / "orders.yaml"),
                     root=str(tmp_path / "orders")))
    for pipeline in PIPELINES:
        dag = dagbag.dags[f"ingest_{pipeline}"]
        assert dag.max_active_runs == 2
        for task_id in ("ingest_available_now", "supervise_continuous", "verify", "quality"):
            assert dag.get_task(task_id).max_active_tis_per_dag == 1, task_id

    # A scheduled run's job task beside a supervisor: skipped, saying why; a restore's or
    # rescale's run fails instead (what it completes cannot be done beside a continuous run).
    from airflow.providers.common.compat.sdk import AirflowException, AirflowSkipException

    task = dagbag.dags["ingest_orders"].get_task("ingest_available_now")
    resumes, settings = task.resumes, task.settings  # templates: as rendered for a run without conf
    task.settings = ""
    try:
        with load_job("orders").control.supervising():
            task.resumes, task._resumed_job = "", None
            with pytest.raises(AirflowSkipException, match="this scheduled run has nothing to do: the job runs "
                                                           "continuously under its supervisor"):
                task.execute({})
            task.resumes, task._resumed_job = "rescale", None
            with pytest.raises(AirflowException, match="this run completes a rescale but the job runs continuously"):
                task.execute({})
    finally:
        task.resumes, task.settings, task._resumed_job = resumes, settings, None


def test_a_scheduled_run_leaves_the_job_to_a_rescale_handing_it_over(dagbag, tmp_path, monkeypatch):
    """Between a rescale's announcement (before its stop) and its run taking the job, a scheduled
    run's job task is skipped, saying why: before its driver starts, or, when the announcement
    came after that check, on its driver's exit status 3 (the driver's own check once it holds
    the job lock: test_control, with a real driver). The driver is replaced here by the
    application's failure as the Spark provider reports it (the boundary). A restore's run
    fails instead; the rescale's own run is not held back."""
    from airflow.providers.common.compat.sdk import AirflowException, AirflowSkipException

    from streamlake.operations.jobs import JobSpec, load_job, save_job
    from streamlake.operations.runner import submit_exit_status
    from streamlake.orchestration import operators

    # How the Spark provider's hook reports a spark-submit's exit status (apache-airflow-providers-apache-spark).
    assert submit_exit_status(AirflowException("Cannot execute: spark-submit --master x. Error code is: 3.")) == 3
    monkeypatch.setenv("STREAMLAKE_HOME", str(tmp_path / "home"))
    save_job(JobSpec(name="orders", definition_file=str(ROOT / "pipelines" / "orders.yaml"),
                     root=str(tmp_path / "orders")))
    control = load_job("orders").control
    task = dagbag.dags["ingest_orders"].get_task("ingest_available_now")
    saved = task.resumes, task.settings, task.handover
    started: list[str] = []

    def driver(self, context):
        started.append(self.handover)
        if not self.handover:  # the announcement came while it started: its check, once it held the lock
            raise operators.ApplicationFailed("Cannot execute: spark-submit ... Error code is: 3.", 3)

    monkeypatch.setattr(operators._ConnectFirstOperator, "execute", driver)
    try:
        task.settings, task.resumes, task.handover, task._resumed_job = "", "", "", None
        control.announce_handover("manual__r")
        with pytest.raises(AirflowSkipException, match="this scheduled run has nothing to do: operation manual__r "
                                                       "is stopping the job for a run of its own"):
            task.execute({})
        assert started == []  # skipped before its driver started
        task.resumes, task._resumed_job = "restore", None
        with pytest.raises(AirflowException, match="this run completes a restore but operation manual__r"):
            task.execute({})
        task.resumes, task.handover, task._resumed_job = "rescale", "manual__r", None
        task.execute({})  # the rescale's own run
        assert started == ["manual__r"]
        control.claim("manual__r")  # (its driver, holding the job lock)
        monkeypatch.setattr(control.__class__, "check_no_handover_pending", lambda self: None)
        task.resumes, task.handover, task._resumed_job = "", "", None
        with pytest.raises(AirflowSkipException, match="its driver found another operation handing the stopped job "
                                                       "over"):
            task.execute({})  # passed the check before the announcement; its driver exited with status 3
    finally:
        task.resumes, task.settings, task.handover = saved
        task._resumed_job = None


def test_a_continuous_run_leaves_the_job_to_a_rescale_handing_it_over(tmp_path, monkeypatch):
    """A continuous run's driver that meets a rescale's binding exits with status 3 (with a real
    driver: test_control); its supervisor does not restart it as after a failure, and the task is
    skipped, saying why, or fails when the run completes a restore. The rescale's own continuous
    run passes its handover to its driver until a start has taken it, then restarts like any
    other run. spark-submit is replaced here by the Spark provider's hook reporting the exit
    status (the boundary)."""
    import airflow.providers.apache.spark.hooks.spark_submit as spark_submit
    from airflow.providers.common.compat.sdk import AirflowException, AirflowSkipException

    from streamlake.operations.jobs import JobSpec, load_job, save_job
    from streamlake.operations.runner import submit_with_airflow_hook
    from streamlake.orchestration.tasks import supervise_continuous

    monkeypatch.setenv("STREAMLAKE_HOME", str(tmp_path / "home"))
    save_job(JobSpec(name="orders", definition_file=str(ROOT / "pipelines" / "orders.yaml"),
                     root=str(tmp_path / "orders")))
    control = load_job("orders").control
    starts: list[list[str]] = []
    exit_status = {"value": 3}

    class Hook:
        def __init__(self, **kwargs):
            starts.append(kwargs["application_args"])

        def submit(self, application):
            if exit_status["value"]:
                raise AirflowException(f"Cannot execute: spark-submit {application}. "
                                       f"Error code is: {exit_status['value']}.")

    monkeypatch.setattr(spark_submit, "SparkSubmitHook", Hook)
    strategy = {"kind": "fixed-delay", "attempts": 3, "delay_s": 0}
    control.announce_handover("manual__r")
    with pytest.raises(AirflowSkipException, match="this continuous run has nothing to do: the driver left the job "
                                                   "alone: operation manual__r stopped it for a run of its own"):
        supervise_continuous("orders", "spark_default", strategy)
    assert len(starts) == 1, "not restarted as after a failure"
    with pytest.raises(AirflowException, match="this run completes a restore but the driver left the job alone"):
        supervise_continuous("orders", "spark_default", strategy, resumes="restore")

    control.hand_over("manual__r")
    starts.clear()
    exit_status["value"] = 0  # stopped on request
    run_once = submit_with_airflow_hook(load_job("orders"), "spark_default", None, "manual__r")
    run_once()
    control.claim("manual__r")  # (that driver, holding the job lock)
    run_once()  # a restart
    assert starts[0][-2:] == ["--await-handover", "manual__r"] and "--await-handover" not in starts[1]


def test_spark_tasks_run_in_the_pool_the_platform_names(dagbag, monkeypatch):
    """Every pipeline run (ingest: a Spark application, or the heavy work on the Spark Connect
    server) takes a slot of the pool ``streamlake platform`` sizes to the cores
    (STREAMLAKE_SPARK_POOL); verify and backfill, light Spark Connect clients, do not wait for one.
    Without the variable, Airflow's default pool, so a user's own Airflow runs the DAGs unchanged."""
    from airflow.dag_processing.dagbag import DagBag

    from streamlake.orchestration.operators import SPARK_POOL_ENV
    from streamlake.platform.airflow import SPARK_POOL

    def pools(bag):
        return {t.task_id: t.pool for d in bag.dags.values() for t in d.tasks
                if t.task_id in ("ingest_available_now", "backfill", "verify", "quality")}

    assert set(pools(dagbag).values()) == {"default_pool"}
    monkeypatch.setenv(SPARK_POOL_ENV, SPARK_POOL)
    pooled = pools(DagBag(dag_folder=str(ROOT / "dags")))
    assert pooled == {"ingest_available_now": SPARK_POOL, "backfill": "default_pool", "verify": "default_pool",
                      "quality": "default_pool"}


def test_an_ingest_run_is_proven_by_its_checks_then_reports_its_quality(dagbag):
    """The ingest DAG's verify runs the checks alone (the proof of the run, and of the restore
    or rescale it completes); the quality task validates after it passed, recorded under the
    same operation; the savepoint's and the restore's own verify still run both."""
    from streamlake.operations.jobs import JobSpec

    job = JobSpec(name="j", root="/tmp/j", definition_file="pipelines/sensors.yaml")
    for pipeline in PIPELINES:
        dag = dagbag.dags[f"ingest_{pipeline}"]
        verify, quality = dag.get_task("verify"), dag.get_task("quality")
        assert quality.upstream_task_ids == {"verify"}
        assert dag.get_task("rescale_throughput").upstream_task_ids == {"verify"}
        assert verify.operation == quality.operation and "resumes" in quality.operation
        assert verify.job_arguments(job)[-1] == "--no-quality"
        assert quality.job_arguments(job)[-1] == "--quality-only"
        assert "--no-quality" not in quality.job_arguments(job)
    for dag_id, task_id in (("savepoint", "verify"), ("restore", "verify_restored")):
        both = dagbag.dags[dag_id].get_task(task_id).job_arguments(job)
        assert "--no-quality" not in both and "--quality-only" not in both


def test_a_pipeline_run_has_a_jvm_of_its_own_only_where_it_needs_one():
    """The ingest DAG's available-now run is a Spark Connect client when its connection names a
    local master and the job has no Spark resources of its own, or when it is the catch-up that
    completes a restore or rescale on a local master; on the cluster's master, for another run of a
    job with resources (``make run``'s, a rescaled one), or on an object store (bronze's files
    are written by the read tasks there), it is an application of its own."""
    from streamlake.operations.jobs import JobSpec
    from streamlake.orchestration.operators import JobRunOperator

    job = JobSpec(name="j", root="/tmp/j", definition_file="pipelines/sensors.yaml")
    local = JobRunOperator(task_id="a", job_name="j")
    assert local.needs_own_jvm(job) is None
    on_cluster = JobRunOperator(task_id="b", job_name="j", spark_conn_id="spark_cluster")
    assert "spark://127.0.0.1" in on_cluster.needs_own_jvm(job)
    unknown = JobRunOperator(task_id="c", job_name="j", spark_conn_id="no_such_connection")
    assert "no_such_connection" in unknown.needs_own_jvm(job)
    with_resources = JobSpec(name="j", root="/tmp/j", definition_file="pipelines/sensors.yaml",
                             total_executor_cores=1, executor_cores=1)
    assert "spark.cores.max" in local.needs_own_jvm(with_resources)
    # the catch-up that completes a restore: its resources do not apply on a local master, and
    # the operation waits for it (the warm server); on the cluster it is still an application
    resuming = JobRunOperator(task_id="d", job_name="j", resumes="restore")
    assert resuming.needs_own_jvm(with_resources) is None
    assert "spark://127.0.0.1" in JobRunOperator(task_id="e", job_name="j", spark_conn_id="spark_cluster",
                                                 resumes="rescale").needs_own_jvm(with_resources)
    assert "only the Kafka read tasks write the files" in resuming.needs_own_jvm(
        JobSpec(name="j", root="s3://lake/j", definition_file="pipelines/sensors.yaml", total_executor_cores=1))
    on_store = JobSpec(name="j", root="s3://lake/j", definition_file="pipelines/sensors.yaml")
    assert "only the Kafka read tasks write the files" in local.needs_own_jvm(on_store)


def test_a_rescale_to_executors_no_worker_can_host_is_refused_before_the_stop(tmp_path, monkeypatch):
    """The standalone master keeps an application whose executors no worker can host waiting
    without end: the rescale refuses such settings before it stops the job (its first task,
    savepoint_and_stop, which refuses the handover when it fails, and fails without retrying),
    naming what the workers offer. Here the cluster's status is given (the running platform's cluster refuses one in
    test_live_platform); a cluster this platform did not start is not inspected."""
    from airflow.sdk.exceptions import AirflowFailException

    from streamlake.operations.jobs import JobSpec, save_job
    from streamlake.orchestration.hooks import connection_master
    from streamlake.orchestration.tasks import check_rescale_fits
    from streamlake.platform import spark_cluster

    monkeypatch.setenv("STREAMLAKE_HOME", str(tmp_path / "home"))
    save_job(JobSpec(name="orders", definition_file=str(ROOT / "pipelines" / "orders.yaml"),
                     root=str(tmp_path / "orders"), spark_conn_id="spark_cluster", total_executor_cores=1,
                     executor_cores=1))
    master = connection_master("spark_cluster")
    offered = [1, 1]
    monkeypatch.setattr(spark_cluster, "status", lambda: {"running": True, "master": master,
                                                          "worker_cores": offered})
    two = {"spark_conn_id": "spark_cluster", "total_executor_cores": 2, "executor_cores": 2}
    with pytest.raises(AirflowFailException, match=f"the job keeps running: no alive worker of {master} offers 2 "
                                                 r"cores \(its workers offer 1, 1\)"):
        check_rescale_fits("orders", two)
    check_rescale_fits("orders", {**two, "executor_cores": 1})  # two executors of one core each
    offered[:] = [2, 2]
    check_rescale_fits("orders", two)
    offered[:] = [1, 1]
    check_rescale_fits("orders", {**two, "spark_conn_id": "spark_default"})  # local: no executors to host
    monkeypatch.setattr(spark_cluster, "status", lambda: {"running": False})
    check_rescale_fits("orders", two)  # not this platform's cluster: nothing known of its workers
    with pytest.raises(AirflowFailException, match="3 cores per executor but 2 in total"):
        check_rescale_fits("orders", {**two, "executor_cores": 3})


def test_a_check_falls_back_to_spark_submit_where_no_spark_connect_server_answers(monkeypatch, capsys):
    """The proof after an operation is a Spark Connect client where the connection's server
    answers (test_live_platform, test_airflow_e2e); where the connection is not defined, or its
    server does not answer, it is a spark-submit, and the task log says why (the spark-submit
    verify itself runs in test_object_storage's DAG test: its savepoint's proof, on a server that
    holds no credentials of the job's store)."""
    import json
    import socket

    from streamlake.orchestration.operators import JobVerifyOperator

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT",
                       json.dumps({"conn_type": "spark_connect", "host": "sc://127.0.0.1", "port": port}))
    verify = JobVerifyOperator(task_id="verify", job_name="j", operation="savepoint")
    assert verify._connect_server() is None
    log = capsys.readouterr().out  # the task log (Airflow's structlog writes to stdout here)
    assert f"(sc://127.0.0.1:{port}/) does not answer: spark-submit" in log, log
    undefined = JobVerifyOperator(task_id="verify2", job_name="j", operation="savepoint",
                                  spark_connect_conn_id="no_such_connect")
    assert undefined._connect_server() is None
    log = capsys.readouterr().out
    assert "no Spark Connect connection 'no_such_connect'" in log and "spark-submit" in log, log


def test_restore_form_suggests_existing_savepoints_and_defaults_to_the_newest(tmp_path):
    """The restore DAG's savepoint_id param suggests the savepoints on disk, newest first, and
    is optional: empty restores the newest savepoint of the chosen pipeline."""
    import importlib.util
    import json

    from streamlake import config

    root = config.savepoints_dir()
    for sp in ("sp-20260101-000000-aaaaaa", "sp-20260102-000000-bbbbbb"):
        (root / sp).mkdir(parents=True, exist_ok=True)
        (root / sp / "manifest.json").write_text(json.dumps({"id": sp}))
    try:
        spec = importlib.util.spec_from_file_location("restore_dag", ROOT / "dags" / "restore.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        param = module.dag.params.get_param("savepoint_id")
        offered = param.schema["examples"]
        assert offered == config.savepoint_ids(), "every savepoint on disk, newest first"
        assert offered.index("sp-20260102-000000-bbbbbb") < offered.index("sp-20260101-000000-aaaaaa")
        assert param.value is None and "null" in param.schema["type"], "empty means the newest of the pipeline"
        assert set(module.dag.params.get_param("job").schema["enum"]) >= set(PIPELINES)
    finally:
        for sp in ("sp-20260101-000000-aaaaaa", "sp-20260102-000000-bbbbbb"):
            (root / sp / "manifest.json").unlink()
            (root / sp).rmdir()


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_backfill_dag_has_the_range_form_and_an_hourly_schedule_without_catch_up(dagbag, pipeline):
    from airflow.timetables.interval import CronDataIntervalTimetable

    from streamlake.operations.jobs import load_job

    dag = dagbag.dags[f"backfill_{pipeline}"]
    assert not dag.catchup and isinstance(dag.timetable, CronDataIntervalTimetable), "runs need data intervals"
    assert dag.timetable._expression == "0 * * * *"
    start, end = dag.params.get_param("start"), dag.params.get_param("end")
    assert start.schema["format"] == end.schema["format"] == "date-time", "the form shows date-time pickers"
    assert dag.params.get_param("all_pending").schema["type"] == "boolean"
    assert dag.params.get_param("dry_run").schema["type"] == "boolean"
    aggregates = [a.name for a in load_job(pipeline).definition.aggregates]
    assert dag.params.get_param("aggregate").schema["enum"] == [None, *aggregates], "a drop-down of its aggregates"
    assert {t.task_id for t in dag.tasks} == {"resolve_range", "backfill", "report"}


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_tables_are_assets_written_by_the_tasks_that_write_them(dagbag, pipeline):
    """The Assets view shows what feeds what: Kafka -> every table of the pipeline -> backfills."""
    from streamlake.operations.jobs import load_job

    definition = load_job(pipeline).definition
    ingest = dagbag.dags[f"ingest_{pipeline}"].get_task("ingest_available_now")
    names = {a.name.split(".", 1)[1] for a in ingest.outlets}
    assert names == set(definition.table_names())
    assert {a.uri for a in ingest.inlets} == {f"kafka://streamlake/{t}" for t in definition.topics}
    backfill = dagbag.dags[f"backfill_{pipeline}"].get_task("backfill")
    assert {a.name.split(".", 1)[1] for a in backfill.outlets} == \
        {t for a in definition.aggregates for t in (a.gold_table, a.late_table)}


def test_backfill_range_follows_the_run_type():
    """Manual: the form (or all pending); scheduled/backfill runs: their data interval."""
    import datetime as dt

    from streamlake.orchestration.tasks import backfill_range

    a, b = dt.datetime(2026, 11, 22, 10, tzinfo=dt.timezone.utc), dt.datetime(2026, 11, 22, 11, tzinfo=dt.timezone.utc)
    form = {"all_pending": False, "start": "2026-11-22T08:00:00+00:00", "end": "2026-11-22T09:00:00+00:00",
            "dry_run": True, "aggregate": "revenue_5m"}
    manual = backfill_range(form, "manual", a, b, "manual__2026-11-22T10:00:00+00:00")
    assert (manual["start"], manual["end"], manual["dry_run"], manual["aggregate"]) == \
        (form["start"], form["end"], True, "revenue_5m")
    everything = backfill_range({**form, "all_pending": True}, "manual", a, b, "manual__x")
    assert everything["start"] is None and everything["end"] is None
    scheduled = backfill_range(form, "scheduled", a, b, "scheduled__2026-11-22T10:00:00+00:00")
    assert (scheduled["start"], scheduled["end"], scheduled["dry_run"]) == (a.isoformat(), b.isoformat(), False)
    assert scheduled["aggregate"] is None, "a scheduled run repairs every aggregate"
    backfill = backfill_range(form, "backfill", a, b, "backfill__2026-11-22T10:00:00+00:00")
    assert backfill["start"] == a.isoformat() and backfill["run_id"].startswith("bf-backfill")


def test_a_job_on_a_store_runs_on_the_server_only_where_it_holds_that_jobs_storage_connection():
    """A job rooted on S3 goes to the Spark Connect server only where the server's connection
    declares the job's storage connection (extra ``storage_conn_id``; unnamed: aws_default);
    the reason names both connections. A local job goes anywhere."""
    from streamlake.operations.jobs import JobSpec
    from streamlake.orchestration.operators import JobVerifyOperator

    verify = JobVerifyOperator(task_id="verify", job_name="j", operation="savepoint")
    on_s3 = JobSpec(name="j", root="s3://lake/j", definition_file="pipelines/sensors.yaml", storage_conn_id="lake")
    assert verify.store_not_on_server(on_s3, {"storage_conn_id": "lake"}) is None
    other = verify.store_not_on_server(on_s3, {"storage_conn_id": "aws_default"})
    assert "the credentials of 'aws_default', not those of 'lake'" in other, other
    assert "holds no store credentials, not those of 'lake'" in verify.store_not_on_server(on_s3, {})
    unnamed = JobSpec(name="j", root="s3://lake/j", definition_file="pipelines/sensors.yaml")
    assert verify.store_not_on_server(unnamed, {"storage_conn_id": "aws_default"}) is None
    local = JobSpec(name="j", root="/tmp/j", definition_file="pipelines/sensors.yaml")
    assert verify.store_not_on_server(local, {}) is None


def test_rescale_throughput_measures_the_rescale_its_run_completes(tmp_path):
    """The rescale DAG records a rescale while the job starts (beside ``resume``): the resumed
    run (``rescaled__<rescale run id>``) measures that rescale, not merely the newest, and
    waits for its record when it comes late."""
    import json
    import threading

    from helpers import example
    from streamlake.operations.jobs import JobSpec, save_job
    from streamlake.delta.records import record_operation
    from streamlake.orchestration.tasks import measure_rescale

    job = save_job(JobSpec(name=f"measure_{tmp_path.name}", root=str(tmp_path / "lake"),
                           definition_file=str(example("sensors", tmp_path, "t"))))
    progress = job.control.progress_file
    progress.parent.mkdir(parents=True, exist_ok=True)
    rates = [100.0, 200.0, 300.0, 400.0]  # one bronze micro-batch each
    progress.write_text("".join(json.dumps({"stage": "bronze", "numInputRows": 10, "processedRowsPerSecond": r})
                                + "\n" for r in rates))
    for run_id, mark in (("manual__a", 1), ("manual__b", 3)):
        record_operation("rescale", job.name, {"settings": {"progress_mark": mark, "after": {}},
                                               "throughput_before": {"rows_per_second": 1.0}, "run_id": run_id})
    first = measure_rescale(job.name, "manual__a")
    assert first["rescale_run_id"] == "manual__a" and first["throughput_after"]["rows_per_second"] == 300.0
    assert measure_rescale(job.name)["rescale_run_id"] == "manual__b", "without a run id: the newest"
    with pytest.raises(LookupError, match="manual__c"):
        measure_rescale(job.name, "manual__c")
    # recorded while the resumed run already measures: found once it is there
    late = threading.Timer(1.5, record_operation, ("rescale", job.name, {
        "settings": {"progress_mark": 2, "after": {}}, "throughput_before": {"rows_per_second": 1.0},
        "run_id": "manual__d"}))
    late.start()
    try:
        assert measure_rescale(job.name, "manual__d", wait_s=60)["throughput_after"]["rows_per_second"] == 350.0
    finally:
        late.join()


def test_an_operation_run_is_timed_from_its_trigger():
    """Trigger to proof: a run triggered by hand from its run_after (the click); a scheduled run
    from its start, not from the end of its data interval (an hour past when the platform was
    down then); a rescale's run from the rescale's trigger in its conf."""
    import datetime as dt
    from types import SimpleNamespace

    from streamlake.orchestration.dag_parts import operation_run

    utc = dt.timezone.utc
    due, started = dt.datetime(2026, 12, 7, 2, 0, tzinfo=utc), dt.datetime(2026, 12, 7, 2, 36, 5, tzinfo=utc)

    def context(dag_id, run_type, conf=None):
        run = SimpleNamespace(run_id="r1", run_type=run_type, run_after=due, start_date=started, conf=conf)
        return {"dag": SimpleNamespace(dag_id=dag_id), "dag_run": run, "params": {"job": "orders"}}

    assert operation_run(context("savepoint", "manual")) == ("savepoint", "orders", "r1", due)
    assert operation_run(context("backfill_orders", "scheduled")) == ("backfill", "orders", "r1", started)
    rescaled = {"resumes": "rescale", "handover": "manual__9", "operation_triggered_at": "2026-12-07T01:00:00+00:00"}
    assert operation_run(context("ingest_orders", "manual", rescaled)) == (
        "rescale", "orders", "manual__9", dt.datetime(2026, 12, 7, 1, 0, tzinfo=utc))
    assert operation_run(context("ingest_orders", "scheduled", {})) is None
