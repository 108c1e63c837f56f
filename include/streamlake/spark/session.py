"""SparkSession settings and spark-submit command lines, in one place.

Jobs run through ``spark-submit`` (the CLI, Airflow's SparkSubmitOperator) or
in-process (tests); both get the same configuration from here.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Mapping, Sequence

from streamlake import config
from streamlake.spark.interpreter import python_executable, spark_python

# Defaults suited to micro-batch ingestion; callers may override any of them.
SPARK_DEFAULTS: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "20000",
    "spark.sql.streaming.numRecentProgressUpdates": "20",
    "spark.driver.extraJavaOptions": "-Dlog4j2.level=WARN",
    # How long a Python worker (a streaming source's runner, a foreachBatch sink) may take to
    # connect back to its JVM: Spark's 15 s failed a run on 2 busy cores here
    # (CANNOT_OPEN_SOCKET ... timed out, a killed query), a wait the machine's load explains.
    "spark.python.authenticate.socketTimeout": "120s",
    # The tables are read from the files their Delta log names (delta.table.read_files), so
    # Spark has nothing to discover but those paths; above this many (Spark's default: 32) it
    # lists them in a Spark job of a task per path. The platform's tables gain a few files per
    # micro-batch (silver 201 after 17 minutes of `make run`'s demo), and those listing jobs
    # cost more than the proofs' own work: a verify's accounting and gold check on that lake,
    # warm, local[2], alternated, 2.45-2.84 s and 1.53-2.11 s against 2.92-4.43 s and
    # 2.17-3.64 s with the default. Listing on the driver is a stat per local file.
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
}

# Delta Lake's Spark connector (the "spark" jar set, on every Spark JVM's class path): its SQL
# extension (DESCRIBE HISTORY, OPTIMIZE, VACUUM, time travel, ...) and its catalog, so a user's
# spark.read.format("delta"), delta.`path` and tables by name work on every table of the
# platform. A snapshot's log replay is a Spark job of snapshotPartitions tasks (Delta's
# default: 50, each a task to schedule on 2 cores for logs of a few hundred commits).
DELTA_SQL: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "4",
    # s3:// paths (the platform's spelling, delta-rs's) through Hadoop's s3a, as s3a:// ones
    "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
}
SPARK_DEFAULTS.update(DELTA_SQL)

# A JVM that lives for one short run (an available-now pipeline run, a check, a backfill; the
# test session) stops JIT compilation at C1: C2's compilations cost more CPU than they save
# before it exits. Measured here: an available-now pipeline run of 1,300 records, 50-54 -> 32-35
# CPU-s and 37-40 -> 33-36 s. At C1 only, the JVM sizes its code cache as without tiers, 48 MB,
# and Spark's generated classes fill that within two minutes (jcmd Compiler.codecache): then
# the sweeper keeps evicting compiled methods that C1 compiles again (and without flushing the
# JIT stops, full_count=1, tried and reverted). 240 MB, the tiered JVM's default, leaves room:
# the test session's use levels off at 60-70 MB. Measured on test_verify.py + test_backfill.py +
# test_pipelines.py in one worker, runs alternated: the session JVM 239/258 -> 161/193 CPU-s,
# every process 413/445 -> 323/380 CPU-s, 336/358 -> 289/330 s. Flushing stays on, so a JVM
# that runs for days at C1 (the bronze job's continuous runs) keeps compiling.
# The same options serve the local Kafka broker's JVM (streamlake.platform.broker).
C1_JIT_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m")
SHORT_RUN_JVM: dict[str, str] = {
    "spark.driver.extraJavaOptions": " ".join(("-Dlog4j2.level=WARN", *C1_JIT_OPTIONS)),
    "spark.executor.extraJavaOptions": " ".join(C1_JIT_OPTIONS),
}

# What particular jobs add to SPARK_DEFAULTS (by entrypoint in jobs/).
JOB_DEFAULTS: dict[str, dict[str, str]] = {
    # The bronze job's data path is Python: its read tasks write the Parquet files
    # with pyarrow (streamlake.kafka.source, output=files); the JVM plans, schedules
    # and commits. There, C2's compilations cost more CPU than they save, CPU the read
    # tasks need on a small machine (measured: ~2.5 s of C2 compiler threads in a
    # job's first minute on 2 cores): the JVM stops at C1, continuous runs included.
    "ingest_bronze.py": SHORT_RUN_JVM,
    "verify.py": SHORT_RUN_JVM,
    "backfill.py": SHORT_RUN_JVM,
}


def job_defaults(job: str, short_run: bool = False) -> dict[str, str]:
    """What ``jobs/<job>`` adds to the platform defaults: its JOB_DEFAULTS, and SHORT_RUN_JVM
    when this run of it is short (``pipeline.py`` available-now; continuous runs keep C2)."""
    return {**JOB_DEFAULTS.get(Path(job).name, {}), **(SHORT_RUN_JVM if short_run else {})}


# The garbage collector of every Spark JVM of the platform: the throughput collector. Spark's
# JVMs here are batch and micro-batch work on small heaps, where G1's concurrent threads and
# write barriers cost CPU and its short pauses buy nothing. Measured here (2 cores), the same
# Spark work 12 times on a new Spark Connect server: 38.3/38.9 CPU-s with G1 (the default),
# 36.8 with this collector (36.5 serial), and as cheap or cheaper warm, in the last 10 rounds
# (19.5 against 20.6 CPU-s); two of the test suite's files with every JVM on the serial
# collector (as cheap as this one on the server): 6 % less CPU. A job's own extraJavaOptions
# must not pick another collector: the JVM refuses two (set
# spark.driver/executor.defaultJavaOptions instead).
GC_JAVA_OPTION = "-XX:+UseParallelGC"


# The class-data-sharing archive of Spark's JVM classes every Spark JVM maps
# (streamlake.spark.class_archive builds it, from a run of this warm-up job in jobs/).
CLASS_ARCHIVE_WARM_UP_JOB = "class_archive_warm_up.py"


@functools.lru_cache(maxsize=1)
def class_archive_path() -> Path:
    """Where the class archive of this environment's pyspark and of the current warm-up lives
    (inside the virtualenv: it belongs to the installed jars, not to a user's data)."""
    from streamlake import jars

    try:
        digest = hashlib.sha256((config.project_root() / "jobs" / CLASS_ARCHIVE_WARM_UP_JOB).read_bytes())
        # the jars on the class path (spark_class_path) belong to it too
        digest.update((jars.jar_dir(jars.SPARK) / jars.STAMP).read_bytes())
        warm_up = digest.hexdigest()[:12]
    except OSError:  # no warm-up or no jars here: no archive will be built, the JVMs start without one
        warm_up = "none"
    return Path(sys.prefix) / "share" / "streamlake" / f"spark-{version('pyspark')}-{warm_up}-classes.jsa"


def class_archive_option() -> str:
    """The JVM option that maps the class archive (harmless when it is missing or stale)."""
    return f"-XX:SharedArchiveFile={class_archive_path()}"


def spark_defaults(class_archive: bool = True) -> dict[str, str]:
    """SPARK_DEFAULTS plus, for the driver and executor JVMs, the garbage collector
    (GC_JAVA_OPTION) and the option that maps the class archive (:func:`class_archive_option`,
    built by streamlake.spark.class_archive: faster starts, ignored when missing or stale).
    They go in the ``defaultJavaOptions`` properties, so a job's own ``extraJavaOptions`` keep them."""
    option = GC_JAVA_OPTION
    if class_archive:
        option = f"{class_archive_option()} {option}"
    return {**SPARK_DEFAULTS, "spark.driver.defaultJavaOptions": option, "spark.executor.defaultJavaOptions": option}


def spark_class_path(environ: Mapping[str, str] | None = None) -> str:
    """SPARK_DIST_CLASSPATH for a Spark JVM of the platform: the "spark" jar set (Delta's
    connector, Spark's Kafka source, Hadoop's s3a: jars/spark.pom.xml), then what ``environ``
    already had there. Spark's launcher puts it after pyspark's jars for every JVM it starts (spark-submit, a local
    session's gateway, the standalone master, workers and the executors they launch), so the
    class archive, built with the same path, stays valid. Raises
    :class:`streamlake.jars.JarsNotInstalled` when the set is missing (``make setup``)."""
    from streamlake import jars

    ours = jars.classpath(jars.SPARK)
    theirs = (environ if environ is not None else os.environ).get("SPARK_DIST_CLASSPATH", "")
    parts = [p for p in theirs.split(os.pathsep) if p and p != ours]
    return os.pathsep.join([ours, *parts])


def job_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for spark-submit and the Spark services: this interpreter for driver and
    workers, the venv's bin first on PATH, the platform's jars on the class path
    (:func:`spark_class_path`), and the platform settings passed through."""
    env = dict(os.environ)
    env["SPARK_DIST_CLASSPATH"] = spark_class_path(env)
    python = python_executable()
    env["PYSPARK_PYTHON"] = python
    env["PYSPARK_DRIVER_PYTHON"] = python
    env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", "")])
    env.setdefault(config.ENV_BOOTSTRAP, config.bootstrap_servers())
    env.setdefault(config.ENV_HOME, str(config.home()))
    env.update(extra or {})
    return env


def spark_submit_executable() -> str:
    """pyspark's spark-submit: beside this interpreter (the environment running StreamLake),
    beside the workers' interpreter, else on PATH."""
    for python in (sys.executable, python_executable()):
        candidate = Path(python).parent / "spark-submit"
        if candidate.exists():
            return str(candidate)
    found = shutil.which("spark-submit")
    if not found:
        raise FileNotFoundError("spark-submit not found: run `make setup` (pyspark provides it)")
    return found


def job_path(name: str) -> str:
    """Absolute path of a Spark entrypoint in ``jobs/``."""
    path = config.project_root() / "jobs" / name
    if not path.exists():
        raise FileNotFoundError(f"no Spark job {path}")
    return str(path)


def spark_submit_command(job: str, args: Sequence[str], master: str = "local[*]",
                         conf: Mapping[str, str] | None = None, name: str | None = None,
                         class_archive: bool = True, short_run: bool = False) -> list[str]:
    """``spark-submit`` argv for ``jobs/<job>`` with the platform's defaults (spark_defaults(),
    then :func:`job_defaults`, then ``conf``); on a master of this machine where the platform's
    fork server runs, Spark's Python processes start with its launcher
    (:func:`streamlake.spark.interpreter.spark_python`)."""
    settings = {**spark_defaults(class_archive), **job_defaults(job, short_run), **(conf or {})}
    python = spark_python(master)
    if python != python_executable() and "spark.pyspark.python" not in settings:
        # Spark's Python processes forked warm by the platform's fork server; the driver is the interpreter.
        settings.update({"spark.pyspark.python": python, "spark.pyspark.driver.python": python_executable()})
    cmd = [spark_submit_executable(), "--master", master, "--name", name or Path(job).stem]
    for key, value in settings.items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd + [job_path(job), *args]


def connect_client_args(args: Sequence[str], remote: str) -> list[str]:
    """A job's arguments as a client of the Spark Connect server at ``remote`` (the job must
    accept ``--remote``)."""
    return [*args, "--remote", remote]


def connect_client_command(job: str, args: Sequence[str], remote: str) -> list[str]:
    """argv that runs ``jobs/<job>`` as a client of the Spark Connect server at ``remote``
    (this interpreter, no spark-submit)."""
    return [python_executable(), job_path(job), *connect_client_args(args, remote)]


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext, no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def local_frame(spark, rows: Sequence[tuple], schema):
    """A DataFrame of ``rows`` the driver holds (tuples in the order of ``schema``: a DDL string
    or a StructType), built from Arrow as a local relation. From a list of Python rows, classic
    PySpark converts them in a job of Python workers when the frame is first used (0.1-0.3 s
    in a warm session, 1-3 s in a new one); from Arrow no job runs. A Spark Connect client
    builds Arrow from the rows itself. Raises what Arrow raises for a value of the wrong type."""
    if is_connect(spark):
        return spark.createDataFrame(list(rows), schema)
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    struct = schema if isinstance(schema, StructType) else _parse_datatype_string(schema)
    arrow = to_arrow_schema(struct, timezone="UTC")  # instants; naive datetimes are read as UTC
    columns = list(zip(*rows)) if rows else [()] * len(arrow)
    table = pa.Table.from_arrays([pa.array(list(c), type=f.type) for c, f in zip(columns, arrow)], schema=arrow)
    return spark.createDataFrame(table, schema=struct)


def get_spark(app_name: str = "streamlake", master: str | None = None, conf: Mapping[str, str] | None = None,
              remote: str | None = None):
    """A SparkSession with the platform's defaults (reuses the active one if any).

    ``remote`` (``sc://host:port``): a Spark Connect session on that long-lived server
    instead of a JVM of this process's own; the process must then use Connect only (pyspark
    cannot mix a classic and a Connect session in one process)."""
    from pyspark.sql import SparkSession

    if remote:
        builder = SparkSession.builder.remote(remote).appName(app_name)
        for key in ("spark.sql.session.timeZone", "spark.sql.shuffle.partitions"):
            builder = builder.config(key, {**SPARK_DEFAULTS, **(conf or {})}[key])
        return builder.getOrCreate()
    os.environ.setdefault("PYSPARK_PYTHON", python_executable())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", python_executable())
    os.environ["SPARK_DIST_CLASSPATH"] = spark_class_path()  # read by the JVM this may start
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    for key, value in {**spark_defaults(), **(conf or {})}.items():
        builder = builder.config(key, value)
    # A new local context (and its JVM) reads PYSPARK_PYTHON as it starts: Spark's Python
    # processes forked warm where the platform's fork server runs (this process's own
    # interpreter setting is put back after).
    interpreter = os.environ["PYSPARK_PYTHON"]
    if master and SparkSession.getActiveSession() is None:
        os.environ["PYSPARK_PYTHON"] = spark_python(master)
    try:
        spark = builder.getOrCreate()
    finally:
        os.environ["PYSPARK_PYTHON"] = interpreter
    spark.sparkContext.setLogLevel("WARN")
    return spark


def quiet_local_session(app_name: str, master: str = "local[1]"):
    """A small local session whose JVM writes to a temporary file, not the terminal: a command
    that needs Spark for a moment (a definition's rules, ``streamlake sql``) then prints only its
    own output and its one-line errors. The JVM's output is shown only if it does not start
    (RuntimeError with its last lines)."""
    import tempfile

    with tempfile.TemporaryFile() as sink:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        for fd in saved:
            os.dup2(sink.fileno(), fd)  # the JVM inherits both and keeps them
        try:
            return get_spark(app_name, master=master,
                             conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1"})
        except Exception as exc:
            sink.seek(0)
            tail = sink.read().decode(errors="replace").strip().splitlines()[-20:]
            raise RuntimeError(f"a local Spark session ({app_name}) did not start: {exc}\n"
                               + "\n".join(tail)) from None
        finally:
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)


def reach_store(spark, uri: str, options: Mapping[str, str] | None = None) -> None:
    """Let ``spark`` (classic or Connect) read and write ``uri`` through Delta's connector and
    s3a with the options the platform uses for it (its environment's, those remembered for its
    root, then ``options``: :func:`streamlake.storage.location.storage_options`), set on the
    session for that bucket only. Nothing for a local path or a store that is not S3."""
    from streamlake.storage.location import is_object_store, storage_options

    if not is_object_store(uri):
        return
    for key, value in storage_options(uri, dict(options or {})).for_hadoop().items():
        spark.conf.set(key, value)
