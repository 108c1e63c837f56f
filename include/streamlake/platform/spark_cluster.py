"""A real Spark standalone cluster on 127.0.0.1, from the pip-installed pyspark.

``streamlake spark start`` runs a master and N workers (``spark-class
org.apache.spark.deploy.master.Master`` / ``...worker.Worker``) as platform
services; nothing is downloaded. Jobs reach it through the ``spark://`` URL,
or, in Airflow, the ``spark_cluster`` connection.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Mapping

from streamlake import config
from streamlake.platform import procs

MASTER = "spark-master"
DEFAULT_PORT = 7077
DEFAULT_UI_PORT = 8081


def spark_class() -> str:
    from streamlake.spark.session import python_executable

    path = Path(python_executable()).parent / "spark-class"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `make setup`")
    return str(path)


def master_url(port: int = DEFAULT_PORT) -> str:
    return f"spark://127.0.0.1:{port}"


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
            "cores_used": sum(w["coresused"] for w in workers),
            "active_apps": [a["name"] for a in info.get("activeapps", [])]}


def start(workers: int = 2, cores_per_worker: int = 1, memory: str = "2g", port: int = DEFAULT_PORT,
          ui_port: int = DEFAULT_UI_PORT, timeout_s: float = 60, worker_env: Mapping[str, str] | None = None) -> dict:
    """Start the master and ``workers`` workers (idempotent); wait until all are ALIVE. Each
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
                               "--cores", str(cores_per_worker), "--memory", memory, "--webui-port", "0",
                               "--work-dir", str(work_dir)], env=_env(worker_env), info={"master": url})
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
