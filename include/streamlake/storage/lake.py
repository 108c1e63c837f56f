"""Where the lake is, as settings every process reads from its environment.

``STREAMLAKE_LAKE_ROOT``
    The folder or URI under which each pipeline of the pipelines directory keeps its
    tables (``<lake root>/<pipeline name>``) unless it was defined with a root of its own.
    Default: ``$STREAMLAKE_HOME/data``. ``s3://lake`` puts them on S3 (``gs://``,
    ``abfss://`` likewise).
``STREAMLAKE_PLATFORM_ROOT``
    The platform's own tables (the ledger of proofs, the checks, the operations, the
    quality results; :mod:`streamlake.delta.records`). Default:
    ``<lake root>/_platform``. On a cluster every machine must name the same one.
``STREAMLAKE_STORAGE_OPTIONS``
    Public storage options of both roots, comma-separated ``KEY=VALUE``
    (``AWS_ENDPOINT_URL=http://minio:9000,AWS_REGION=us-east-1,conditional_put=etag``).
    A secret there is refused: credentials come from the store's own environment
    variables (``AWS_ACCESS_KEY_ID``, ...) or its default chain (an instance role).
"""

from __future__ import annotations

import os

from streamlake import config
from streamlake.errors import StorageOptionError
from streamlake.storage.location import is_object_store, is_secret, join, normalize, parse_pairs, remember_options

ENV_LAKE_ROOT = "STREAMLAKE_LAKE_ROOT"
ENV_PLATFORM_ROOT = "STREAMLAKE_PLATFORM_ROOT"
ENV_STORAGE_OPTIONS = "STREAMLAKE_STORAGE_OPTIONS"


def lake_options() -> dict[str, str]:
    """The public options of ``STREAMLAKE_STORAGE_OPTIONS``. Raises StorageOptionError for
    a malformed pair or a secret."""
    pairs = [p for p in os.environ.get(ENV_STORAGE_OPTIONS, "").split(",") if p.strip()]
    options = parse_pairs(pairs)
    secrets = sorted(k for k in options if is_secret(k))
    if secrets:
        raise StorageOptionError(f"{ENV_STORAGE_OPTIONS} holds {secrets}: secrets go in the store's own environment "
                                 "variables (AWS_SECRET_ACCESS_KEY, ...), never in a setting")
    return options


def _root(raw: str) -> str:
    """``raw`` normalized; on an object store the lake's options are remembered for it in
    this process. Raises StorageOptionError for options given to a local root."""
    root = normalize(raw)
    options = lake_options()
    if options:
        if not is_object_store(root):
            raise StorageOptionError(f"{ENV_STORAGE_OPTIONS} is set but {root} is on the local filesystem: the "
                                     "options would have no effect")
        remember_options(root, options)
    return root


def lake_root() -> str:
    """``STREAMLAKE_LAKE_ROOT``, else ``$STREAMLAKE_HOME/data`` (see the module docstring)."""
    raw = os.environ.get(ENV_LAKE_ROOT, "").strip()
    return _root(raw) if raw else str(config.home() / "data")


def platform_root() -> str:
    """``STREAMLAKE_PLATFORM_ROOT``, else ``<lake root>/_platform`` (see the module docstring)."""
    raw = os.environ.get(ENV_PLATFORM_ROOT, "").strip()
    return _root(raw) if raw else join(lake_root(), "_platform")
