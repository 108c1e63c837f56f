"""A real Spark standalone cluster on 127.0.0.1, from the pip-installed pyspark.

``streamlake spark start`` runs a master and N workers (``spark-class
org.apache.spark.deploy.master.Master`` / ``...worker.Worker``) as platform
services; nothing is downloaded. Jobs reach it through the ``spark://`` URL,
or, in Airflow, the ``spark_cluster`` connection.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Mapping

from streamlake import config
from streamlake import procs

MASTER = "spark-master"
DEFAULT_PORT = 7077
DEFAULT_UI_PORT = 8081


def machine_cores() -> int:
    """The cores a worker offers by default: all of the machine's, as Spark's own worker does
    (``SPARK_WORKER_CORES``'s default). Two workers on one machine then each offer them all,
    so an executor may hold every core of the machine: one JVM and one set of Python workers
    to start and warm instead of one per core."""
    return os.cpu_count() or 1


def spark_class() -> str:
    from streamlake.spark.interpreter import python_executable

    path = Path(python_executable()).parent / "spark-class"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `make setup`")
    return str(path)


def master_url(port: int = DEFAULT_PORT) -> str:
    return f"spark://127.0.0.1:{port}"


def planned_master(port: int = DEFAULT_PORT) -> str:
    """The URL of the master :func:`start` with ``port`` leaves running: the running one's, if
    any (``start`` is idempotent), else the one it will start (known before it answers)."""
    state = procs.status(MASTER)
    return state.info["url"] if state is not None else master_url(port)


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    from streamlake.spark.session import job_environment

    return job_environment({"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1", **(extra or {})})


def status(ui_port: int | None = None) -> dict:
    """Master URL and alive workers/cores, from the master's JSON endpoint."""
    state = procs.status(MASTER)
    if state is None:
        return {"running": False}
    ui = ui_port or state.info["ui_port"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=3) as resp:
            info = json.load(resp)
    except (OSError, ValueError) as exc:  # not listening yet, or an empty page while starting
        return {"running": True, "master": state.info["url"], "error": str(exc)}
    workers = [w for w in info.get("workers", []) if w.get("state") == "ALIVE"]
    return {"running": True, "master": state.info["url"], "ui": f"http://127.0.0.1:{ui}",
            "alive_workers": len(workers), "cores": sum(w["cores"] for w in workers),
            "cores_used": sum(w["coresused"] for w in workers), "worker_cores": [w["cores"] for w in workers],
            "active_apps": [a["name"] for a in info.get("activeapps", [])]}


def executor_does_not_fit(master: str, executor_cores: int) -> str | None:
    """Why an executor of ``executor_cores`` cores can never start on this platform's cluster at
    ``master``: no alive worker offers that many cores, and the standalone master would keep
    the application waiting for one without end ("Initial job has not accepted any
    resources"). None when a worker offers them, or when ``master`` is not this platform's
    running cluster (nothing is known of its workers then)."""
    info = status()
    if not info.get("running") or info.get("master") != master or "worker_cores" not in info:
        return None
    offered = info["worker_cores"]
    if executor_cores <= max(offered, default=0):
        return None
    return (f"no alive worker of {master} offers {executor_cores} cores (its workers offer "
            f"{', '.join(map(str, offered)) or 'none'}): an executor of {executor_cores} cores would never start")


def start(workers: int = 2, cores_per_worker: int | None = None, memory: str = "2g", port: int = DEFAULT_PORT,
          ui_port: int = DEFAULT_UI_PORT, timeout_s: float = 60, worker_env: Mapping[str, str] | None = None) -> dict:
    """Start the master and ``workers`` workers (idempotent); wait until all are ALIVE, each
    offering ``cores_per_worker`` cores (default: :func:`machine_cores`). Each
    worker has a work directory of its own (``$STREAMLAKE_HOME/spark/spark-worker-<n>``);
    ``worker_env`` is added to the workers' environment, which their executors inherit: an
    object-store lake's credentials (the ``AWS_*`` variables) are all a worker needs besides
    the package, as on a worker machine of a real cluster. Never on a command line."""
    if procs.status(MASTER) is None:
        procs.start(MASTER, [spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                             "--port", str(port), "--webui-port", str(ui_port)], env=_env(),
                    info={"url": master_url(port), "ui_port": ui_port})
    url = procs.status(MASTER).info["url"]
    for i in range(1, workers + 1):
        name = f"spark-worker-{i}"
        if procs.status(name) is None:
            work_dir = config.home() / "spark" / name
            work_dir.mkdir(parents=True, exist_ok=True)
            procs.start(name, [spark_class(), "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                               "--cores", str(cores_per_worker or machine_cores()), "--memory", memory,
                               "--webui-port", "0", "--work-dir", str(work_dir)], env=_env(worker_env),
                        info={"master": url})
    procs.wait_for(lambda: status().get("alive_workers", 0) >= workers, timeout_s,
                   what=f"{workers} Spark workers to register with {url}")
    return status()


def stop() -> list[str]:
    """Stop workers, then the master. Returns the services stopped."""
    stopped = []
    for state in sorted(procs.running_services(), key=lambda s: s.name == MASTER):
        if state.name.startswith("spark-worker-") or state.name == MASTER:
            procs.stop(state.name)
            stopped.append(state.name)
    return stopped
