"""A local S3 API server for development and tests (moto's standalone server).

moto 5.2 speaks the S3 REST API, honours conditional writes (``If-None-Match:
*`` on an existing key fails with ``PreconditionFailed``), which is what
delta-rs's ``conditional_put=etag`` commits rely on, and keeps objects in
memory: a restart loses every bucket. It runs from a venv of its own
(``.venv-s3``, made by ``make setup``): its botocore and the platform's lock
disagree on python-dateutil. MinIO is the compose file's store
(``docker-compose.yaml``); a real bucket needs only the storage options.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import urllib.request
from pathlib import Path

from streamlake import config
from streamlake import procs

SERVICE = "s3"
DEFAULT_PORT = 19070
ENV_BINARY = "STREAMLAKE_MOTO_SERVER"
# moto accepts any credentials; these name the local server's test account.
LOCAL_ACCESS_KEY_ID = "streamlake-local"
LOCAL_REGION = "us-east-1"


def moto_server_binary() -> Path:
    """``moto_server`` of the project's ``.venv-s3`` (or ``$STREAMLAKE_MOTO_SERVER``).
    Raises FileNotFoundError when it is not installed."""
    path = Path(os.environ.get(ENV_BINARY) or config.project_root() / ".venv-s3" / "bin" / "moto_server")
    if not path.exists():
        raise FileNotFoundError(f"local S3 server not found at {path}: run `make setup`")
    return path


def endpoint(port: int = DEFAULT_PORT) -> str:
    return f"http://127.0.0.1:{port}"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/", timeout=1) as response:
            return response.status < 500
    except OSError:
        return False


def start(port: int = DEFAULT_PORT) -> dict:
    """Start the server on 127.0.0.1:``port`` (idempotent). Returns its status.

    Raises RuntimeError if the port is taken by something else or the server does
    not answer within 30 s."""
    running = status()
    if running["running"]:
        if running["port"] != port:
            raise RuntimeError(f"the local S3 server already runs on port {running['port']}; stop it first")
        return {**running, "already_running": True}
    if procs.accepts_connections(port):
        raise RuntimeError(f"port {port} is already in use by another program")
    url = endpoint(port)
    procs.start_until_ready(SERVICE, [str(moto_server_binary()), "-H", "127.0.0.1", "-p", str(port)],
                            lambda: _answers(url), 30, f"the local S3 server on {url}",
                            info={"port": port, "endpoint": url})
    return {**status(), "already_running": False}


def stop() -> bool:
    """Stop the server (its buckets are lost: memory only). False if it was not running."""
    return procs.stop(SERVICE)


def status() -> dict:
    state = procs.status(SERVICE)
    if state is None:
        return {"running": False, "port": None, "endpoint": None, "pid": None}
    return {"running": True, "port": state.info["port"], "endpoint": state.info["endpoint"], "pid": state.pid,
            "answers": _answers(state.info["endpoint"]), "log": state.log}


def local_options(port: int = DEFAULT_PORT, secret: str = "streamlake-local-secret") -> dict[str, str]:
    """Storage options for the local server: endpoint, region, plain HTTP, and
    conditional-put commits (the server honours ``If-None-Match``)."""
    return {"AWS_ENDPOINT_URL": endpoint(port), "AWS_REGION": LOCAL_REGION, "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": LOCAL_ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": secret,
            "conditional_put": "etag"}


def airflow_connection(port: int = DEFAULT_PORT) -> str:
    """The Airflow ``aws`` connection (JSON) of the local server's account, as
    :func:`streamlake.orchestration.hooks.connection_environment` reads one back."""
    options = local_options(port)
    return json.dumps({"conn_type": "aws", "login": options["AWS_ACCESS_KEY_ID"],
                       "password": options["AWS_SECRET_ACCESS_KEY"],
                       "extra": {"region_name": options["AWS_REGION"], "endpoint_url": options["AWS_ENDPOINT_URL"]}})


def lake_settings(port: int = DEFAULT_PORT, bucket: str = "lake") -> dict[str, str]:
    """The environment that puts the lake on this server (``make run LAKE=s3``): every
    pipeline of the pipelines directory and the platform's own tables under
    ``s3://<bucket>`` (:mod:`streamlake.storage.lake`), the public options in
    ``STREAMLAKE_STORAGE_OPTIONS``, the local account's credentials in ``AWS_*``."""
    from streamlake.storage.lake import ENV_LAKE_ROOT, ENV_STORAGE_OPTIONS

    options = local_options(port)
    credentials = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    return {ENV_LAKE_ROOT: f"s3://{bucket}",
            ENV_STORAGE_OPTIONS: ",".join(f"{k}={v}" for k, v in options.items() if k not in credentials),
            **{k: options[k] for k in credentials}}


def create_bucket(uri: str, options) -> None:
    """Create the bucket of ``uri`` (``s3://bucket/...``) if it does not exist."""
    from urllib.parse import urlsplit

    import pyarrow.fs as pafs

    from streamlake.storage.location import arrow_filesystem, storage_options

    fs, bucket = arrow_filesystem(storage_options(f"s3://{urlsplit(uri).netloc}", options), create_buckets=True)
    if fs.get_file_info(bucket).type == pafs.FileType.NotFound:
        fs.create_dir(bucket)


#: Directories of STREAMLAKE_HOME that describe the lake's contents: the tables, their
#: checkpoints and the platform's ledgers (data/), the checkpoints and control files of
#: object-store roots (lakes/), savepoints, Data Docs and validation results (quality/),
#: backfill summaries (backfills/). Job specs, the Airflow home, logs and Kafka's data are
#: not: they stay.
LAKE_BOUND = ("data", "lakes", "savepoints", "quality", "backfills")

#: Services that read or write that state; it is not moved while one runs.
LAKE_USERS = ("airflow", "pipeline")


def _has_content(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def archive_for_new_lake(home: Path | None = None) -> Path | None:
    """Move the state that described the previous lake (``LAKE_BOUND``) into
    ``<home>/archive/<UTC time>/``, keeping each directory's name.

    This server keeps objects in memory: once it stops, the checkpoints, savepoints, proofs
    and quality results under ``home`` describe tables no server holds any more, and a job
    resuming from them would fail on every run. Call it right after starting a *new*
    server (``make run LAKE=s3``): the platform starts over on the empty lake and nothing is
    deleted. Returns the archive directory, or None when there was nothing to move. Raises
    RuntimeError when a service that uses the state (Airflow, the demo pipeline) still runs:
    moving its tables under it would break it; stop it first (``make stop``)."""
    home = home or config.home()
    present = [name for name in LAKE_BOUND if _has_content(home / name)]
    if not present:
        return None
    running = [name for name in LAKE_USERS if procs.status(name) is not None]
    if running:
        raise RuntimeError(f"the local S3 server started empty, but {', '.join(running)} still use(s) the state "
                           f"of the previous lake; run `make stop`, then start again")
    target = home / "archive" / dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target.mkdir(parents=True)
    for name in present:
        (home / name).rename(target / name)
    return target
