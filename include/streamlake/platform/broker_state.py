"""State under ``STREAMLAKE_HOME`` that belongs to the embedded broker's topics.

The embedded broker keeps topics in memory: once it stops, the tables,
checkpoints, savepoints, proofs and quality results written from its topics
describe offsets no broker holds any more. A new broker starts its topics at
offset 0, so a job resuming from those checkpoints would fail with a data-loss
error on every run (and a restore from one of those savepoints could never
match Kafka again). :func:`archive_for_new_broker` moves that state aside,
whole, so the platform starts over on the new topics and nothing is deleted.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from streamlake import config
from streamlake.platform import procs

#: Directories of STREAMLAKE_HOME derived from the broker's topics: the tables, their
#: checkpoints and the platform's ledgers (data/), the checkpoints and control files
#: of object-store roots (lakes/), savepoints, Data Docs and validation results
#: (quality/), backfill summaries (backfills/). Job specs, the Airflow home and logs
#: are not: they stay.
BROKER_BOUND = ("data", "lakes", "savepoints", "quality", "backfills")

#: Services that read or write that state; it is not moved while one runs.
USERS = ("airflow", "pipeline")


def _has_content(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def archive_for_new_broker(home: Path | None = None) -> Path | None:
    """Move the state written from a previous embedded broker's topics (``BROKER_BOUND``)
    into ``<home>/archive/<UTC time>/``, keeping each directory's name.

    Call it right after starting a *new* embedded broker. Returns the archive
    directory, or None when there was nothing to move. Raises RuntimeError when a
    service that uses the state (Airflow, the demo pipeline) still runs:
    moving its tables under it would break it; stop it first (``make stop``).
    """
    home = home or config.home()
    present = [name for name in BROKER_BOUND if _has_content(home / name)]
    if not present:
        return None
    running = [name for name in USERS if procs.status(name) is not None]
    if running:
        raise RuntimeError(f"the embedded broker started empty, but {', '.join(running)} still use(s) the tables "
                           f"written from its previous topics; run `make stop`, then start again")
    target = home / "archive" / dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target.mkdir(parents=True)
    for name in present:
        (home / name).rename(target / name)
    return target
