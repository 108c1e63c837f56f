"""Hooks: what the platform's tasks take from Airflow connections.

:class:`ObjectStoreHook` gives a job whose root is on S3 (or an S3-compatible
store such as MinIO) its credentials and endpoint from an Airflow connection of
type ``aws``, the way Airflow users keep secrets: the connection's fields as
the Amazon provider reads them (login = access key id, password = secret
access key; extra ``region_name``, ``endpoint_url`` or
``service_config.s3.endpoint_url``, ``aws_session_token``) plus any extra key
already in delta-rs's environment form (``AWS_...``, e.g.
``AWS_S3_LOCKING_PROVIDER``). They reach the job's process as environment
variables (:meth:`ObjectStoreHook.environment`), never its command line.
Airflow masks the connection's password and secret extras in every task log.

:func:`connection_master` gives the master URL of a Spark connection.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Any, Iterator

from airflow.providers.common.compat.sdk import BaseHook

from streamlake.operations.jobs import DEFAULT_STORAGE_CONN_ID


class ObjectStoreHook(BaseHook):
    """Credentials and endpoint of an object store from an Airflow ``aws`` connection."""

    conn_name_attr = "aws_conn_id"
    default_conn_name = DEFAULT_STORAGE_CONN_ID
    conn_type = "aws"
    hook_name = "StreamLake object store (S3)"

    def __init__(self, aws_conn_id: str = DEFAULT_STORAGE_CONN_ID) -> None:
        super().__init__()
        self.aws_conn_id = aws_conn_id

    def environment(self) -> dict[str, str]:
        """The connection as ``AWS_*`` environment variables for a job's process (delta-rs,
        pyarrow and Spark's executors read them there). Raises Airflow's
        AirflowNotFoundException when the connection is not defined."""
        conn = self.get_connection(self.aws_conn_id)
        return connection_environment(conn.login, conn.password, conn.extra_dejson)


def connection_environment(login: str | None, password: str | None, extra: dict[str, Any]) -> dict[str, str]:
    """``AWS_*`` variables of an ``aws`` connection's fields (see the module docstring).
    An ``http://`` endpoint also sets ``AWS_ALLOW_HTTP=true`` (delta-rs refuses plain
    HTTP otherwise)."""
    if isinstance(extra, str):
        extra = json.loads(extra or "{}")
    env: dict[str, str] = {}
    if login:
        env["AWS_ACCESS_KEY_ID"] = login
    if password:
        env["AWS_SECRET_ACCESS_KEY"] = password
    if extra.get("aws_session_token"):
        env["AWS_SESSION_TOKEN"] = str(extra["aws_session_token"])
    if extra.get("region_name"):
        env["AWS_REGION"] = str(extra["region_name"])
    endpoint = extra.get("endpoint_url") or ((extra.get("service_config") or {}).get("s3") or {}).get("endpoint_url")
    if endpoint:
        env["AWS_ENDPOINT_URL"] = str(endpoint)
        if str(endpoint).startswith("http://"):
            env["AWS_ALLOW_HTTP"] = "true"
    env.update({k: str(v) for k, v in extra.items() if k.startswith("AWS_")})
    return env


def connection_master(conn_id: str) -> str:
    """The master URL spark-submit gets from the Spark connection ``conn_id`` (its host, with
    its port where it has one, as the Spark provider builds it). Raises what Airflow raises
    for a connection that is not defined."""
    conn = BaseHook.get_connection(conn_id)
    host = conn.host or ""
    return f"{host}:{conn.port}" if conn.port and not host.startswith("local") else host


def job_store_environment(job, log) -> dict[str, str]:
    """The environment a task adds for ``job``'s process: empty for a local root; for an
    object-store root, the job's storage connection (``job.storage_conn_id``, default
    ``aws_default``) as ``AWS_*`` variables, or nothing when that connection is not
    defined (the job then has the Airflow worker's own ``AWS_*`` environment; the log says
    so)."""
    from streamlake.storage.location import is_object_store

    if not is_object_store(job.root):
        return {}
    conn_id = job.storage_conn_id or DEFAULT_STORAGE_CONN_ID
    try:
        env = ObjectStoreHook(conn_id).environment()
    except Exception as exc:  # noqa: BLE001 (AirflowNotFoundException: no such connection)
        log.info("job %s is rooted at %s; no connection %r (%s): the worker's own AWS_* environment", job.name,
                 job.root, conn_id, exc)
        return {}
    log.info("job %s is rooted at %s: credentials and endpoint from connection %r (%s)", job.name, job.root,
             conn_id, ", ".join(sorted(env)))
    return env


def reach_store(job, log) -> None:
    """For ``job`` on an object store, its storage connection's credentials and endpoint
    (:func:`job_store_environment`) remembered as options of its root in this process
    (:func:`~streamlake.storage.location.remember_options`): every table opened under the
    root reaches the store. For long-lived processes that serve several requests at once
    (the views in Airflow's API server), where changing the environment for one would race
    with the others. Nothing for a local root or when the connection is not defined."""
    from streamlake.storage.location import remember_options

    env = job_store_environment(job, log)
    if env:
        remember_options(job.root, env)


@contextmanager
def store_credentials(job, log) -> Iterator[dict[str, str]]:
    """For the block, ``job``'s store credentials (:func:`job_store_environment`) in this
    process's environment, where delta-rs and pyarrow read them: for the tasks that open
    the tables in Airflow's worker itself (savepoint, restore). The environment is put
    back after the block."""
    env = job_store_environment(job, log)
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
