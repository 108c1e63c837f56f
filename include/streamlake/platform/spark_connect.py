"""A long-lived Spark Connect server, from the pip-installed pyspark, for the proofs.

Every check and quality validation after an operation (``jobs/verify.py``) needs a
Spark session. Started per check, that is a JVM start, a SparkContext and Python
workers each time: 15 s on an idle machine, a minute and more on 2 busy cores.
``streamlake platform`` (``make run``) therefore runs one Spark Connect server
(``org.apache.spark.sql.connect.service.SparkConnectServer``, shipped in pyspark's
jars) as a platform service, and a check runs as a thin Python client of it
(``jobs/verify.py --remote sc://...``); Airflow reaches it through the Spark
provider's ``spark_connect`` connection type (``spark_connect_default``). When no
server answers, the checks fall back to spark-submit (:func:`connect_url` returns None).

The server binds to 127.0.0.1 only: it has no authentication of its own.

A lake on an object store: the server's processes (its Python workers read and write
the tables' files) need the store's credentials in their environment. ``start`` takes
them with the name of the Airflow ``aws`` connection they are from, and the
``spark_connect`` connection declares that name in its extra (``storage_conn_id``,
:func:`connection`); a task of a job whose storage connection is that one runs on the
server, any other job on a store keeps its own spark-submit
(:class:`streamlake.orchestration.operators.JobVerifyOperator` and friends). Anyone who
can reach the server's port reads and writes the store with those credentials: it is for
one machine's or one team's lake, not a shared multi-tenant service.
"""

from __future__ import annotations

import json
import socket
from typing import Mapping
from urllib.parse import urlparse

from streamlake import procs

SERVICE = "spark-connect"
DEFAULT_PORT = 15002
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# The same server inside an application that runs anyway (``spark.plugins``): no JVM of its own.
SERVER_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"


def url(port: int = DEFAULT_PORT) -> str:
    return f"sc://127.0.0.1:{port}"


def reachable(remote: str, timeout_s: float = 2.0) -> bool:
    """Whether a Spark Connect server accepts connections at ``remote`` (``sc://host:port``)."""
    parsed = urlparse(remote.replace("sc://", "http://", 1))
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or DEFAULT_PORT), timeout_s):
            return True
    except OSError:
        return False


def connection(port: int = DEFAULT_PORT, storage_conn_id: str | None = None) -> str:
    """The Airflow ``spark_connect`` connection (JSON) of a server on 127.0.0.1:``port``; with
    ``storage_conn_id``, declaring that the server holds that storage connection's credentials."""
    conn = {"conn_type": "spark_connect", "host": "sc://127.0.0.1", "port": port}
    if storage_conn_id:
        conn["extra"] = {"storage_conn_id": storage_conn_id}
    return json.dumps(conn)


def start(port: int = DEFAULT_PORT, master: str = "local[2]", timeout_s: float = 120,
          store_environment: Mapping[str, str] | None = None, storage_conn_id: str | None = None) -> dict:
    """Start the server (idempotent) with the platform's Spark defaults; return when it accepts
    connections (:func:`launch`, then :func:`wait_until_reachable`). Raises what they raise."""
    server = launch(port, master, store_environment, storage_conn_id)
    wait_until_reachable(server["url"], timeout_s)
    return server


def launch(port: int = DEFAULT_PORT, master: str = "local[2]", store_environment: Mapping[str, str] | None = None,
           storage_conn_id: str | None = None) -> dict:
    """Start the server (idempotent) with the platform's Spark defaults and return at once its
    URL, master and storage connection (a running server's own: those it was started with).
    ``store_environment``: an object store's ``AWS_*`` credentials and endpoint for the
    server's processes, those of the Airflow connection ``storage_conn_id`` (see the module
    docstring; the returned dict and the service state name it). Raises ValueError for
    credentials without the name of their connection."""
    if store_environment and not storage_conn_id:
        raise ValueError("a store's credentials for the Spark Connect server need the name of their Airflow "
                         "connection (storage_conn_id): the tasks that may use them are that connection's")
    from streamlake.spark.interpreter import python_executable, spark_python
    from streamlake.spark.session import job_environment, spark_defaults, spark_submit_executable

    if procs.status(SERVICE) is None:
        python = spark_python(master)  # its Python processes forked warm where the fork server runs
        conf = {**spark_defaults(), "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": str(port), "spark.ui.enabled": "false",
                "spark.pyspark.python": python, "spark.pyspark.driver.python": python_executable()}
        cmd = [spark_submit_executable(), "--master", master, "--name", "streamlake-spark-connect",
               "--class", SERVER_CLASS]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        procs.start(SERVICE, [*cmd, "spark-internal"],
                    env=job_environment({**(store_environment or {}), "SPARK_LOCAL_IP": "127.0.0.1",
                                         "PYSPARK_PYTHON": python}),
                    info={"url": url(port), "storage_conn_id": storage_conn_id})
    state = procs.status(SERVICE)
    return {"url": state.info["url"], "master": master, "storage_conn_id": state.info.get("storage_conn_id")}


def wait_until_reachable(remote: str, timeout_s: float = 120) -> None:
    """Wait until the server at ``remote`` accepts connections; TimeoutError after ``timeout_s``."""
    procs.wait_for(lambda: reachable(remote), timeout_s, interval=1, what=f"the Spark Connect server at {remote}")


def stop() -> bool:
    return procs.stop(SERVICE, timeout=20)


def connect_url(explicit: str | None = None) -> str | None:
    """Where the checks should run: ``explicit`` (``--remote``, an Airflow connection's URL) if
    given, else the platform's running server; None when that server does not answer (the
    caller falls back to spark-submit)."""
    if explicit:
        return explicit if reachable(explicit) else None
    state = procs.status(SERVICE)
    if state is not None and reachable(state.info["url"]):
        return state.info["url"]
    return None


def holds_store_credentials() -> bool:
    """Whether the platform's running server was started with a store's credentials (its
    service state names their connection: :func:`start`)."""
    state = procs.status(SERVICE)
    return bool(state is not None and state.info.get("storage_conn_id"))
