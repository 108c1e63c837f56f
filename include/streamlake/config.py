"""Settings shared by every component, read from the environment in one place.

``STREAMLAKE_KAFKA_BOOTSTRAP``
    Kafka bootstrap servers. Unset means the local Kafka broker (``streamlake kafka
    start``), so pointing the platform at another cluster is a change of this
    variable and nothing else.
``STREAMLAKE_HOME``
    Runtime directory for pid files, logs and the demo's tables. Default:
    ``.streamlake`` in the project checkout.

Where the lake and the platform's own tables are (``STREAMLAKE_LAKE_ROOT``,
``STREAMLAKE_PLATFORM_ROOT``, ``STREAMLAKE_STORAGE_OPTIONS``) is read by
:mod:`streamlake.storage.lake`, beside the storage options it needs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV_BOOTSTRAP = "STREAMLAKE_KAFKA_BOOTSTRAP"
ENV_HOME = "STREAMLAKE_HOME"
DEFAULT_BROKER_PORT = 19092


def project_root() -> Path:
    """The checkout this package was installed from (editable install)."""
    return Path(__file__).resolve().parents[2]


def home(create: bool = True) -> Path:
    """Runtime directory; created on first use (``create=False``: a reader that writes nothing)."""
    path = Path(os.environ.get(ENV_HOME) or project_root() / ".streamlake")
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def run_dir(create: bool = True) -> Path:
    """Where services keep their pid/state files (``create=False``: see :func:`home`)."""
    path = home(create) / "run"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def log_dir() -> Path:
    path = home() / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def savepoints_dir() -> Path:
    """Where savepoints are kept (one directory per savepoint id)."""
    path = home() / "savepoints"
    path.mkdir(parents=True, exist_ok=True)
    return path


def savepoint_ids() -> list[str]:
    """Ids of existing savepoints, newest first. Cheap (directory names only):
    the restore DAG lists them in its form at parse time."""
    return sorted((p.parent.name for p in savepoints_dir().glob("sp-*/manifest.json")), reverse=True)


def embedded_bootstrap() -> str:
    """Bootstrap servers of the embedded Kafka while it runs (every node's host:port, from
    ``run/kafka.json``, which streamlake.platform.broker writes at start and removes at
    stop), else the default port."""
    try:
        return json.loads((run_dir(create=False) / "kafka.json").read_text())["info"]["bootstrap"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"127.0.0.1:{DEFAULT_BROKER_PORT}"


def bootstrap_servers() -> str:
    """The Kafka bootstrap servers every component uses."""
    return os.environ.get(ENV_BOOTSTRAP) or embedded_bootstrap()
