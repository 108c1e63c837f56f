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
    """The JVM maps the archive as it starts, before any work (``-Xshare:on``: or refuses to
    start), so a job that only prints its usage shows it: 2 s instead of the 13 s of the
    archive's whole warm-up, which `make setup` runs and checks. An archive that cannot be
    mapped is refused: the check can fail."""
    assert class_archive_path().exists(), "make setup builds it: python -m streamlake.spark.class_archive"

    def submit(archive_option: str) -> subprocess.CompletedProcess:
        options = f"{archive_option} {GC_JAVA_OPTION} -Xshare:on"
        cmd = spark_submit_command("ingest_bronze.py", ["--help"], master="local[1]", short_run=True,
                                   conf={"spark.driver.defaultJavaOptions": options})
        return subprocess.run(cmd, env=job_environment(), capture_output=True, text=True, timeout=300)

    done = submit(class_archive_option())
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-3000:]
    refused = submit(f"-XX:SharedArchiveFile={class_archive_path()}.missing")
    assert refused.returncode != 0 and "shared archive" in refused.stderr, refused.stderr[-3000:]


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
