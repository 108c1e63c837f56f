"""How the platform starts Spark JVMs: the class-data-sharing archive
(streamlake.spark.class_archive) every Spark JVM is told to map, and the archive `make setup`
built is one a spark-submit JVM can map (``-Xshare:on`` makes the JVM refuse to start
otherwise) with the platform's garbage collector (streamlake.spark.session.GC_JAVA_OPTION),
with the C1-only JIT of short runs (streamlake.spark.session.SHORT_RUN_JVM)."""

from __future__ import annotations

import subprocess

from streamlake.spark.session import (
    GC_JAVA_OPTION,
    class_archive_option,
    class_archive_path,
    job_environment,
    spark_submit_command,
)


def conf_of(cmd: list[str]) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, arg in enumerate(cmd) if arg == "--conf")


def test_every_spark_submit_maps_the_archive_and_a_jobs_own_java_options_keep_it():
    conf = conf_of(spark_submit_command("ingest_bronze.py", ["--help"]))
    expected = f"{class_archive_option()} {GC_JAVA_OPTION}"
    assert conf["spark.driver.defaultJavaOptions"] == conf["spark.executor.defaultJavaOptions"] == expected
    assert "TieredStopAtLevel=1" in conf["spark.driver.extraJavaOptions"], "the bronze job's own options stay"
    assert conf_of(spark_submit_command("pipeline.py", [], class_archive=False))[
        "spark.driver.defaultJavaOptions"] == GC_JAVA_OPTION


def test_the_test_sessions_jvm_runs_with_the_archive_option_and_the_throughput_collector(spark):
    management = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    assert class_archive_option() in list(management.getRuntimeMXBean().getInputArguments())
    collectors = {bean.getName() for bean in management.getGarbageCollectorMXBeans()}
    assert collectors == {"PS Scavenge", "PS MarkSweep"}, collectors  # the JVM's names for UseParallelGC


def test_the_archive_setup_built_is_mapped_by_a_spark_submit_jvm():
    assert class_archive_path().exists(), "make setup builds it: python -m streamlake.spark.class_archive"
    cmd = spark_submit_command("class_archive_warm_up.py", [], master="local[1]", short_run=True,
                               conf={"spark.driver.defaultJavaOptions":
                                     f"{class_archive_option()} {GC_JAVA_OPTION} -Xshare:on",
                                     "spark.ui.enabled": "false"})
    done = subprocess.run(cmd, env=job_environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "warm-up done" in done.stdout, done.stderr[-3000:]


def test_short_runs_stop_jit_at_c1_and_continuous_pipeline_runs_keep_c2():
    """Available-now pipeline runs, checks and backfills are short-lived JVMs (C1 only);
    a continuous pipeline run keeps the JVM's default tiered JIT. The same through the CLI's
    spark-submit and through the operators Airflow runs."""
    from streamlake.operations.jobs import JobSpec
    from streamlake.operations.runner import spark_conf
    from streamlake.orchestration.operators import JobBackfillOperator, JobRunOperator, JobVerifyOperator

    def c1(conf: dict) -> bool:
        return all("-XX:TieredStopAtLevel=1" in conf.get(f"spark.{side}.extraJavaOptions", "")
                   for side in ("driver", "executor"))

    assert c1(conf_of(spark_submit_command("pipeline.py", ["--available-now"], short_run=True)))
    assert not c1(conf_of(spark_submit_command("pipeline.py", ["--processing-time", "5"])))
    assert c1(conf_of(spark_submit_command("verify.py", []))) and c1(conf_of(spark_submit_command("backfill.py", [])))
    job = JobSpec(name="jit", root="/tmp/jit", topics=["t"], total_executor_cores=2)
    assert not c1(spark_conf(job)), "the supervisor's continuous runs"
    for operator in (JobRunOperator, JobVerifyOperator, JobBackfillOperator):
        conf = spark_conf(job, operator.job_application, short_run=operator.short_run)
        assert c1(conf) and conf["spark.cores.max"] == "2", operator.__name__
