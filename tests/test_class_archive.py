"""The Spark JVMs' class-data-sharing archive (streamlake.spark.class_archive): every Spark
JVM the platform starts is told to map it, and the archive `make setup` built is one the
JVM spark-submit starts can map (``-Xshare:on`` makes the JVM refuse to start otherwise)."""

from __future__ import annotations

import subprocess

from streamlake.spark.class_archive import archive_path, java_option
from streamlake.spark.session import job_environment, spark_submit_command


def conf_of(cmd: list[str]) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, arg in enumerate(cmd) if arg == "--conf")


def test_every_spark_submit_maps_the_archive_and_a_jobs_own_java_options_keep_it():
    conf = conf_of(spark_submit_command("ingest_bronze.py", ["--help"]))
    assert conf["spark.driver.defaultJavaOptions"] == conf["spark.executor.defaultJavaOptions"] == java_option()
    assert "TieredStopAtLevel=1" in conf["spark.driver.extraJavaOptions"], "the bronze job's own options stay"
    assert "spark.driver.defaultJavaOptions" not in conf_of(
        spark_submit_command("pipeline.py", [], class_archive=False))


def test_the_test_sessions_jvm_runs_with_the_archive_option(spark):
    args = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    assert java_option() in list(args)


def test_the_archive_setup_built_is_mapped_by_a_spark_submit_jvm():
    assert archive_path().exists(), "make setup builds it: python -m streamlake.spark.class_archive"
    cmd = spark_submit_command("class_archive_warm_up.py", [], master="local[1]",
                               conf={"spark.driver.defaultJavaOptions": f"{java_option()} -Xshare:on",
                                     "spark.ui.enabled": "false"})
    done = subprocess.run(cmd, env=job_environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "warm-up done" in done.stdout, done.stderr[-3000:]
