"""Savepoints: a job's complete, consistent state at a micro-batch boundary.

Flink's savepoints, for Spark + Delta, covering every stage of the pipeline. A
savepoint holds a manifest (:class:`SavepointManifest`: each table's Delta
version and the ``txn`` state it was at - Kafka offsets per partition for
bronze, the upstream position consumed for silver, quarantine and every
aggregate's gold and late_events tables, each gold table's watermark - plus the
job's config, its applied definition and the code version)
and a copy of every stage's query checkpoint. It is taken with the job paused
at micro-batch boundaries (:meth:`streamlake.pipeline.control.JobControl.quiesced`),
so the checkpoint copies and the table versions describe the same instant.

Restoring rolls every table back to its version *as a new commit* (history is
kept, time travel still reaches the later versions) whose ``txn`` actions reset
the offsets, positions and watermark to the savepoint's, and puts the checkpoint
copies in place. The job then resumes from exactly the savepoint's state: the
``streamlake-delta`` source recognises a restore of its upstream back to the
version it had consumed and continues after it (see :mod:`streamlake.delta.source`).

Savepoints live in ``$STREAMLAKE_HOME/savepoints/<id>/`` (``manifest.json``,
``checkpoints/<stage>/``). A job whose root is on an object store keeps them
beside its tables, in ``<root>/_savepoints/<id>/`` (or under the target URI
given), with only the manifest in ``$STREAMLAKE_HOME/savepoints/<id>/`` as an
index: a driver that has nothing else (a new machine) restores one from its
URI, and the job is defined again from the manifest. The manifest is written
last, so a savepoint folder without one is incomplete and never restored. The
tables' data files of a savepoint's version stay while ``vacuum`` retention
covers them; restoring after they were vacuumed fails with a clear error.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from streamlake import __version__, config
from streamlake.config import savepoints_dir
from streamlake.delta.table import open_table
from streamlake.delta.txn import (
    commit_info,
    committed_offsets,
    first_offset_app_id,
    first_offsets,
    next_offset_app_id,
    query_app_id,
)
from streamlake.errors import StreamLakeError
from streamlake.kafka.client import KafkaMetadataClient, client_config
from streamlake.kafka.offsets import offsets_from_json, offsets_to_json
from streamlake.operations.jobs import JobSpec, list_jobs, load_job
from streamlake.spark.checkpoint import QueryCheckpoint

log = logging.getLogger(__name__)

FORMAT_VERSION = 3
# Control and run-history files inside a checkpoint: not part of its state.
_NOT_STATE = {"job.lock", "STOP", "PAUSE", "PAUSED", "state.json", "progress.jsonl", "handovers"}


class SavepointError(StreamLakeError):
    """A savepoint operation cannot be done (the message says why)."""


def code_version() -> str:
    """Package version and the checkout's git commit (``-dirty`` if modified)."""
    try:
        sha = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=config.project_root(),
                             capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{__version__}+{sha}" if sha else __version__


@dataclass
class TableState:
    """One table at the savepoint: its version and the ``txn`` actions (app id ->
    version) a restore must reset in the same commit."""

    name: str
    path: str
    version: int
    transactions: dict[str, int] = field(default_factory=dict)


@dataclass
class SavepointManifest:
    id: str
    created_at: str
    job: str
    job_config: dict
    tables: list[TableState]
    kafka_offsets: dict  # {"topic": {"partition": next offset}} as recorded in bronze
    first_offsets: dict
    watermarks: dict  # {"gold/<aggregate>": watermark ms} of the gold tables that have one
    checkpoints: list[str]  # stages whose checkpoint is copied under checkpoints/
    code_version: str
    job_was_running: bool
    note: str = ""
    # the savepoint's folder when it is not savepoints_dir()/<id> (a root on an object store)
    location: str = ""
    format: int = FORMAT_VERSION

    @property
    def path(self) -> Path:
        """The savepoint's folder on this machine (for a stored savepoint: its manifest only)."""
        return savepoints_dir() / self.id

    @property
    def uri(self) -> str:
        """Where the savepoint's checkpoints and manifest are."""
        return self.location or str(self.path)

    def offsets(self):
        return offsets_from_json(self.kafka_offsets)

    def table(self, name: str) -> TableState:
        return next(t for t in self.tables if t.name == name)

    def versions(self) -> dict[str, int]:
        return {t.name: t.version for t in self.tables}

    @property
    def definition(self) -> dict | None:
        """The pipeline definition the savepoint's tables were built with (normal form)."""
        return self.job_config.get("applied_definition")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "SavepointManifest":
        if data.get("format") != FORMAT_VERSION:
            raise SavepointError(f"savepoint {data.get('id')} was written by code version "
                                 f"{data.get('code_version', '?')} in an older format; it cannot be restored "
                                 f"by this version (dispose it with `streamlake savepoint dispose`)")
        data = dict(data)
        data["tables"] = [TableState(**t) for t in data["tables"]]
        return cls(**data)


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy checkpoints, leaving out control and run-history files."""
    if src.exists():
        shutil.copytree(src, dst, ignore=lambda _d, names: {n for n in names if n in _NOT_STATE})
    else:
        dst.mkdir(parents=True)


def managed_transactions(job: JobSpec, name: str, table) -> dict[str, int]:
    """The ``txn`` actions of ``table`` that the platform reads back: what a restore resets."""
    from streamlake.pipeline.gold import WATERMARK_APP_ID
    from streamlake.pipeline.stage import position_app_id

    txns: dict[str, int] = {}
    stage = job.stage_of(name)
    query_id = QueryCheckpoint(job.checkpoint_path(stage)).query_id()
    if query_id and table.transaction_version(query_app_id(query_id)) is not None:
        txns[query_app_id(query_id)] = table.transaction_version(query_app_id(query_id))
    if name == "bronze":
        with KafkaMetadataClient(client_config({f"kafka.{k}": v for k, v in job.kafka.items()})) as kafka:
            tps = kafka.partitions(topics=job.source_topics)
        txns.update({next_offset_app_id(tp): off for tp, off in committed_offsets(table, tps).items()})
        txns.update({first_offset_app_id(tp): off for tp, off in first_offsets(table, tps).items()})
        return txns
    upstream = "bronze" if stage == "silver" else "silver"
    for app_id in (position_app_id(upstream), WATERMARK_APP_ID if name.startswith("gold/") else None):
        if app_id and table.transaction_version(app_id) is not None:
            txns[app_id] = table.transaction_version(app_id)
    return txns


def savepoint_location(job: JobSpec, savepoint_id: str, target: str | None = None) -> str:
    """The folder of a new savepoint: under ``target`` when given; ``<root>/_savepoints`` for a
    root on an object store; else "" (``savepoints_dir()/<id>`` on this machine)."""
    from streamlake.storage.location import is_object_store, join, normalize

    if target:
        return join(normalize(target), savepoint_id)
    return join(job.root, "_savepoints", savepoint_id) if is_object_store(job.root) else ""


def create_savepoint(job: JobSpec, *, stop: bool = False, timeout_s: float = 180.0, note: str = "",
                     target: str | None = None) -> SavepointManifest:
    """Take a savepoint of ``job`` at micro-batch boundaries; stop the job after it if ``stop``.

    A running job is paused for the copy and then resumed (or stopped); an idle
    job is kept from starting meanwhile. The savepoint goes to :func:`savepoint_location`
    (``target``: a folder URI of its own). Raises TimeoutError if the job does not reach
    a boundary in time.
    """
    from streamlake.storage.objects import upload_dir, write_text

    from streamlake.delta.table import evolve_table
    from streamlake.pipeline.bronze import BRONZE
    from streamlake.pipeline.gold import WATERMARK_APP_ID
    from streamlake.pipeline.schemas import table_spec

    definition = job.definition
    control = job.control
    sp_id = f"sp-{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    location = savepoint_location(job, sp_id, target)
    folder = savepoints_dir() / sp_id
    with control.quiesced(timeout_s, stop_after=stop) as paused:
        states = []
        for name, path in job.tables().items():
            spec = BRONZE if definition is None else table_spec(definition, name)
            table = evolve_table(path, spec)[0]  # a job that never ran: its empty state
            states.append(TableState(name, path, table.version(), managed_transactions(job, name, table)))
        bronze = next(t for t in states if t.name == "bronze")
        tmp = savepoints_dir() / f".{sp_id}.tmp"
        _copy_tree(Path(job.checkpoints_dir), tmp / "checkpoints")
        with KafkaMetadataClient(client_config({f"kafka.{k}": v for k, v in job.kafka.items()})) as kafka:
            tps = kafka.partitions(topics=job.source_topics)
        config = {**job.to_dict(), "applied_definition": definition.to_dict() if definition else None}
        manifest = SavepointManifest(
            id=sp_id, created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            job=job.name, job_config=config, tables=states,
            kafka_offsets=offsets_to_json({tp: bronze.transactions[next_offset_app_id(tp)] for tp in tps
                                           if next_offset_app_id(tp) in bronze.transactions}),
            first_offsets=offsets_to_json({tp: bronze.transactions[first_offset_app_id(tp)] for tp in tps
                                           if first_offset_app_id(tp) in bronze.transactions}),
            watermarks={t.name: t.transactions[WATERMARK_APP_ID] for t in states
                        if WATERMARK_APP_ID in t.transactions},
            checkpoints=sorted(p.name for p in (tmp / "checkpoints").iterdir() if p.is_dir()),
            code_version=code_version(), job_was_running=paused is not None, note=note, location=location,
        )
        text = json.dumps(manifest.to_dict(), indent=2)
        if location:  # checkpoints first, the manifest last: from then on the savepoint is complete
            upload_dir(tmp / "checkpoints", f"{location}/checkpoints")
            write_text(f"{location}/manifest.json", text)
            shutil.rmtree(tmp / "checkpoints")
        (tmp / "manifest.json").write_text(text)
        os.replace(tmp, folder)
    return manifest


def load_savepoint(savepoint_id: str) -> SavepointManifest:
    """The savepoint of that id on this machine, or at that folder URI (``s3://.../sp-...``:
    a savepoint this machine has no trace of). Raises SavepointError when there is none."""
    from streamlake.storage.location import normalize
    from streamlake.storage.objects import read_text

    if "://" in savepoint_id:
        try:
            return SavepointManifest.from_dict(json.loads(read_text(f"{normalize(savepoint_id)}/manifest.json")))
        except FileNotFoundError:
            raise SavepointError(f"no savepoint at {savepoint_id} (no manifest.json there: none was taken, "
                                 "or it was not completed)") from None
    path = savepoints_dir() / savepoint_id / "manifest.json"
    if not path.exists():
        raise SavepointError(f"no savepoint {savepoint_id!r} (see `streamlake savepoint list`)")
    return SavepointManifest.from_dict(json.loads(path.read_text()))


def list_savepoints(job: str | None = None) -> list[SavepointManifest]:
    """Savepoints, newest first (optionally of one job)."""
    found = []
    for path in savepoints_dir().glob("sp-*/manifest.json"):
        try:
            manifest = SavepointManifest.from_dict(json.loads(path.read_text()))
        except (SavepointError, ValueError, TypeError, KeyError) as exc:
            log.warning("skipping savepoint %s: %s", path.parent.name, exc)
            continue
        if job is None or manifest.job == job:
            found.append(manifest)
    return sorted(found, key=lambda m: m.id, reverse=True)


def jobs_restored_from(savepoint_id: str, running_only: bool = True) -> list[str]:
    out = []
    for name in list_jobs():
        control = load_job(name).control
        if control.read_state().get("restored_from") == savepoint_id and (not running_only or control.is_running()):
            out.append(name)
    return out


def dispose_savepoint(savepoint_id: str) -> None:
    """Delete a savepoint (and its folder on the store). Refused (SavepointError) while a
    running job was restored from it."""
    from streamlake.storage.objects import delete_dir, delete_file

    if "://" in savepoint_id:
        manifest = load_savepoint(savepoint_id)
        savepoint_id, location = manifest.id, manifest.location
    else:  # read as it is: a savepoint of an older format is disposed of too
        path = savepoints_dir() / savepoint_id / "manifest.json"
        if not path.exists():
            raise SavepointError(f"no savepoint {savepoint_id!r} (see `streamlake savepoint list`)")
        location = json.loads(path.read_text()).get("location") or ""
    running = jobs_restored_from(savepoint_id)
    if running:
        raise SavepointError(
            f"savepoint {savepoint_id} cannot be disposed: running job(s) {', '.join(running)} were restored "
            f"from it. Stop the job first (`streamlake job stop NAME`)."
        )
    if location:
        delete_file(f"{location}/manifest.json")  # first: an incomplete savepoint is never restored
        delete_dir(location)
    shutil.rmtree(savepoints_dir() / savepoint_id, ignore_errors=True)


def restore_savepoint(savepoint_id: str, *, timeout_s: float = 180.0) -> dict:
    """Put the savepoint's job back to the savepoint: every table, its ``txn`` state and
    every stage's checkpoint.

    ``savepoint_id`` is an id this machine knows, or a savepoint's folder URI; a job this
    machine does not know is defined again from the manifest (a new driver machine).
    Stops the job if it runs. Each table is restored to its savepoint version as
    a new commit whose ``txn`` actions reset offsets, positions and watermark to
    the savepoint's (Delta's restore alone keeps the newest ``txn`` versions); the
    job's checkpoints are replaced by the savepoint's copies. The job is not
    restarted here (the caller decides how: DAG, CLI). Returns what was done.
    Raises SavepointError if a table's files are gone (vacuumed), or, on an object store,
    when the job has tables the savepoint has no state of (an aggregate added since).
    Interrupted half-way (the process killed), running it again completes it.
    """
    from deltalake.transaction import CommitProperties, Transaction

    from streamlake.storage.objects import download_dir

    manifest = load_savepoint(savepoint_id)
    job = _job_of(manifest)
    _refuse_unsaved_tables_on_a_store(job, manifest)
    control = job.control
    was_running = control.is_running()
    if was_running:
        control.request_stop()
        control.wait_stopped(timeout_s)
    restored = []
    with control.running(timeout_s, holder="restore"):
        for state in manifest.tables:
            table = open_table(state.path)
            properties = CommitProperties(
                app_transactions=[Transaction(app, v) for app, v in sorted(state.transactions.items())],
                custom_metadata=commit_info({"operation": "restore", "savepoint": manifest.id,
                                             "toVersion": state.version}))
            if table.version() == state.version:
                table.create_write_transaction([], "append", table.schema(), commit_properties=properties)
            else:
                try:
                    table.restore(state.version, commit_properties=properties)
                except Exception as exc:  # noqa: BLE001 - delta-rs raises generic errors for missing files
                    raise SavepointError(f"cannot restore {state.path} to version {state.version}: {exc}") from exc
            restored.append({"table": state.name, "path": state.path, "restored_to": state.version,
                             "new_version": open_table(state.path).version()})
        archived = _archive_tables_without_state(job, manifest, manifest.id)
        # Swap in the savepoint's checkpoints with directory renames while holding the job lock.
        checkpoints = Path(job.checkpoints_dir)
        staged = checkpoints.with_name(checkpoints.name + f".restoring-{uuid.uuid4().hex[:6]}")
        if manifest.location:
            download_dir(f"{manifest.location}/checkpoints", staged)
        else:
            _copy_tree(manifest.path / "checkpoints", staged)
        old = checkpoints.with_name(checkpoints.name + f".replaced-{uuid.uuid4().hex[:6]}")
        if checkpoints.exists():
            checkpoints.rename(old)
        staged.rename(checkpoints)
        shutil.rmtree(old, ignore_errors=True)
        control.write_state(restored_from=manifest.id, restored_at=time.time())
    if manifest.location and not (manifest.path / "manifest.json").exists():  # this machine's index of it
        manifest.path.mkdir(parents=True, exist_ok=True)
        (manifest.path / "manifest.json").write_text(json.dumps(manifest.to_dict(), indent=2))
    return {"savepoint": manifest.id, "location": manifest.uri, "job": job.name, "job_was_running": was_running,
            "tables": restored, "offsets": manifest.kafka_offsets, "versions": manifest.versions(),
            "watermarks": manifest.watermarks, "archived": archived}


def _job_of(manifest: SavepointManifest) -> JobSpec:
    """The savepoint's job; defined again from the manifest where this machine has no spec
    of it (a new driver machine restoring from the savepoint's URI)."""
    from streamlake.operations.jobs import jobs_dir, save_job

    if (jobs_dir() / f"{manifest.job}.json").exists():
        return load_job(manifest.job)
    spec = JobSpec.from_dict({k: v for k, v in manifest.job_config.items() if k != "applied_definition"})
    log.info("job %s is not defined here: defined again from savepoint %s (root %s)", spec.name, manifest.id,
             spec.root)
    return save_job(spec)


def _refuse_unsaved_tables_on_a_store(job: JobSpec, manifest: SavepointManifest) -> None:
    """On an object store a table cannot be moved aside (no rename): refuse, before anything
    is changed, a restore that would have to (see :func:`_archive_tables_without_state`)."""
    from streamlake.delta.table import table_exists
    from streamlake.storage.location import is_object_store

    if not is_object_store(job.root):
        return
    saved = {t.name for t in manifest.tables}
    unsaved = [name for name, path in job.tables().items() if name not in saved and table_exists(path)]
    if unsaved:
        raise SavepointError(f"savepoint {manifest.id} has no state of {', '.join(unsaved)} (added after it); on "
                             f"an object store those tables cannot be moved aside: nothing was restored")


def _archive_tables_without_state(job: JobSpec, manifest: SavepointManifest, savepoint_id: str) -> list[str]:
    """Move the job's tables the savepoint has no state of (an aggregate added after it) to
    ``<root>/_archive/<savepoint>-<time>/``: the job builds them again from the restored silver."""
    saved = {t.name for t in manifest.tables}
    moved = []
    stamp = f"{savepoint_id}-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S}"
    for name, path in job.tables().items():
        if name in saved or "://" in path or not Path(path).exists():  # a store's: refused before
            continue
        target = Path(job.root) / "_archive" / stamp / name
        target.parent.mkdir(parents=True, exist_ok=True)
        Path(path).rename(target)
        moved.append(name)
        log.info("restore %s: %s has no state in the savepoint; moved to %s (rebuilt from silver)",
                 savepoint_id, name, target)
    return moved
