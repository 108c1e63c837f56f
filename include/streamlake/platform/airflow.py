"""Airflow for the platform: one environment, shared by `make run`, the CLI and tests.

Airflow 3 standalone (SQLite, LocalExecutor) with this repository's ``dags/``
and ``plugins/``, sized for a 2-core machine, no example DAGs. Everything is set
through ``AIRFLOW__*`` environment variables (no airflow.cfg edits), and the
same variables drive docker-compose.yaml.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

from streamlake import config, procs
from streamlake.platform import spark_connect

SERVICE = "airflow"
DEFAULT_PORT = 8080
SPARK_LOCAL_CONN = "spark_default"
SPARK_CLUSTER_CONN = "spark_cluster"
SPARK_CONNECT_CONN = "spark_connect_default"
# The Airflow pool of the DAGs' tasks that start a Spark application (operators.SPARK_POOL_ENV).
# The platform makes one slot per core: on 2 cores four JVMs starting at once (both
# pipelines' first ingest and hourly backfill) took minutes and Python workers timed out.
SPARK_POOL = "streamlake_spark"

# SQLite lets one writer at a time; Python's sqlite3 gives up on a lock after 5 s and
# Airflow then answers a trigger with 500 "Database error" or a backfill with 503
# "Database is locked". On 2 cores with Spark jobs running, the scheduler's
# transactions can hold the lock longer than that, so waiters wait up to 60 s
# (the lock still serialises writers; it only stops giving up early). Airflow imports
# these through ``[database] sql_alchemy_connect_args(_async)``; one dict each,
# because Airflow adds keys to the sync one.
SQLITE_CONNECT_ARGS = {"timeout": 60}
SQLITE_CONNECT_ARGS_ASYNC = {"timeout": 60}
# Settings only SQLite needs (docker-compose.yaml runs PostgreSQL without them).
SQLITE_SETTINGS = {
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": f"{__name__}.SQLITE_CONNECT_ARGS",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC": f"{__name__}.SQLITE_CONNECT_ARGS_ASYNC",
}


def airflow_home() -> Path:
    path = Path(os.environ.get("AIRFLOW_HOME") or config.home() / "airflow")
    path.mkdir(parents=True, exist_ok=True)
    return path


def airflow_env(port: int = DEFAULT_PORT, cluster_port: int = 7077, connect_port: int = spark_connect.DEFAULT_PORT) -> dict[str, str]:
    """Environment for every Airflow process (standalone, CLI, `airflow dags test`). The
    ``spark_connect_default`` connection names the platform's Spark Connect server on
    ``connect_port``; where none answers, the checks use spark-submit."""
    from streamlake.spark.session import job_environment

    home = airflow_home()
    root = config.project_root()
    env = job_environment()
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(root / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        # Tasks at once. Most running tasks wait: on their Spark job (a JVM of its own, in the
        # Spark pool's slot per core) or as a client of the Spark Connect server (a verify, a
        # quality validation: 10-50 s each under load). With two runs of each ingest DAG at a time,
        # 4 slots were all such proofs on `make run` (2026-12-04 23:19) and a rescale's first task
        # waited 17 s for one; the operations' short tasks must not queue behind proofs.
        "AIRFLOW__CORE__PARALLELISM": "8",
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "4",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        **SQLITE_SETTINGS,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        # Each parse of a DAG file is a process of its own (about 0.35 CPU-s here); every 15 s,
        # the four files took 35 of the live platform test module's 695 CPU-s. A definition
        # added to pipelines/ gets its DAGs at the next parse, within a minute.
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "60",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "True",
        # An operation is a chain of short tasks (a restore: four, then its resumed run's three),
        # and a scheduler loop with nothing to do slept 1 s (Airflow's default) before it queued
        # the next. At 0.2 s, on `make run` (2026-11-28, restores by REST): the waits between a
        # restore's tasks 3.7/3.9 -> 0.9/1.8 s in all; the idle scheduler's CPU 1.1 -> 4.8 CPU-s a minute.
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
        # A task's calls to the API server (an XCom pull while its template renders) waited at
        # most 5 s: with Spark jobs on both cores a savepoint's verify failed its first try on a
        # ReadTimeout (test run of 2026-11-27). Airflow's advice under high load: raise it.
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30",
        "STREAMLAKE_SPARK_POOL": SPARK_POOL,
        f"AIRFLOW_CONN_{SPARK_LOCAL_CONN.upper()}": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        f"AIRFLOW_CONN_{SPARK_CLUSTER_CONN.upper()}": json.dumps(
            {"conn_type": "spark", "host": "spark://127.0.0.1", "port": cluster_port}),
        f"AIRFLOW_CONN_{SPARK_CONNECT_CONN.upper()}": spark_connect.connection(connect_port),
    })
    return env


def airflow_executable() -> str:
    from streamlake.spark.interpreter import python_executable

    return str(Path(python_executable()).parent / "airflow")


def run_airflow(*args: str, check: bool = True, timeout: float | None = None,
                env: dict | None = None) -> subprocess.CompletedProcess:
    """Run an ``airflow`` CLI command in the platform's Airflow environment."""
    return subprocess.run([airflow_executable(), *args], env={**airflow_env(), **(env or {})}, check=check,
                          capture_output=True, text=True, timeout=timeout)


def ui_ready(port: int = DEFAULT_PORT) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=3) as resp:
            health = json.load(resp)
    except (OSError, ValueError):
        return False
    return health.get("metadatabase", {}).get("status") == "healthy" and \
        health.get("scheduler", {}).get("status") == "healthy"


def credentials() -> tuple[str, str | None]:
    """The admin login; the password is generated by Airflow at first start."""
    try:
        return "admin", json.loads((airflow_home() / "passwords.json").read_text()).get("admin")
    except (OSError, ValueError):
        return "admin", None


def start(port: int = DEFAULT_PORT, timeout_s: float = 180, cluster_port: int = 7077,
          extra_env: dict | None = None, connect_port: int = spark_connect.DEFAULT_PORT) -> dict:
    """Start ``airflow standalone`` (idempotent) and wait until the UI answers
    (:func:`launch`, then :func:`wait_until_ready`)."""
    launch(port, cluster_port, extra_env, connect_port)
    return wait_until_ready(timeout_s)


def launch(port: int = DEFAULT_PORT, cluster_port: int = 7077, extra_env: dict | None = None,
           connect_port: int = spark_connect.DEFAULT_PORT) -> None:
    """Start ``airflow standalone`` (idempotent) and return at once: its start-up (about a minute
    on 2 cores) may go on beside other services'. The ``spark_cluster`` connection points at
    ``cluster_port``; ``extra_env`` adds variables (e.g. ``STREAMLAKE_INGEST_EVERY_MINUTES``).
    On a new Airflow database no task that starts a Spark application runs before
    :func:`wait_until_ready` has created their pool (Airflow's scheduler leaves a task of a pool
    that does not exist unscheduled)."""
    if procs.status(SERVICE) is None:
        procs.start(SERVICE, [airflow_executable(), "standalone"],
                    env={**airflow_env(port, cluster_port, connect_port), **(extra_env or {})},
                    cwd=str(airflow_home()), info={"port": port})


def wait_until_ready(timeout_s: float = 180) -> dict:
    """Wait until the UI of the Airflow :func:`launch` started answers, then create the Spark
    pool; return its URL and the admin's credentials. Raises TimeoutError, and RuntimeError
    when Airflow is not running."""
    state = procs.status(SERVICE)
    if state is None:
        raise RuntimeError(f"Airflow is not running (see {config.log_dir() / (SERVICE + '.log')})")
    port = state.info["port"]
    started = time.monotonic()
    procs.wait_for(lambda: ui_ready(port), timeout_s, interval=2, what=f"the Airflow UI on port {port}")
    ensure_spark_pool()
    user, password = credentials()
    return {"url": f"http://127.0.0.1:{port}", "user": user, "password": password,
            "seconds": round(time.monotonic() - started, 1)}


def ensure_spark_pool(slots: int | None = None) -> None:
    """Create (or resize) the pool the DAGs' Spark applications run in: ``slots`` at once, one per
    core by default. Until it exists those tasks wait in the scheduler (a few seconds at
    start-up). Tried three times (SQLite's lock may be busy with the scheduler); raises
    CalledProcessError when the Airflow CLI fails the third time."""
    slots = slots or max(1, os.cpu_count() or 1)
    for attempt in range(3):
        done = run_airflow("pools", "set", SPARK_POOL, str(slots), "StreamLake's Spark jobs: one JVM per slot",
                           check=attempt == 2, timeout=120)
        if done.returncode == 0:
            return


def stop() -> bool:
    return procs.stop(SERVICE, timeout=20)
