"""Savepoints: a job's complete, consistent state at a micro-batch boundary.

Flink's savepoints, for Spark + Delta. A savepoint holds a manifest
(:class:`SavepointManifest`: each table's Delta version, the Kafka offsets per
partition as recorded in the table, the job's config and the code version) and
a copy of the query checkpoint. It is taken with the job paused at a batch
boundary (:meth:`streamlake.operations.control.JobControl.quiesced`), so the checkpoint copy
and the table versions describe the same instant.

Restoring rolls every table back to its version *as a new commit* (history is
kept, time travel still reaches the later versions) with the offsets reset in
the same atomic commit, and puts the checkpoint copy in place. The job then
resumes from exactly the savepoint's offsets.

Savepoints live in ``$STREAMLAKE_HOME/savepoints/<id>/`` (``manifest.json``,
``checkpoint/``). The tables' data files of a savepoint's version stay on disk
while ``vacuum`` retention covers them; restoring after they were vacuumed
fails with a clear error.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from streamlake import __version__, config
from streamlake.config import savepoints_dir
from streamlake.pipeline.bronze import ensure_bronze_table
from streamlake.spark.checkpoint import QueryCheckpoint
from streamlake.operations.control import JobControl
from streamlake.delta.table import open_table
from streamlake.delta.txn import committed_offsets, first_offsets, last_batch_id, offset_transactions
from streamlake.errors import StreamLakeError
from streamlake.operations.jobs import JobSpec, list_jobs, load_job
from streamlake.kafka.client import KafkaMetadataClient, client_config
from streamlake.kafka.offsets import Offsets, offsets_from_json, offsets_to_json

# Control and run-history files of the job: not part of its state.
_NOT_STATE = {"job.lock", "STOP", "PAUSE", "PAUSED", "state.json", "progress.jsonl"}


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
    name: str
    path: str
    version: int


@dataclass
class SavepointManifest:
    id: str
    created_at: str
    job: str
    job_config: dict
    tables: list[TableState]
    kafka_offsets: dict  # {"topic": {"partition": next offset}} as recorded in the table
    first_offsets: dict
    query_id: str | None
    last_batch_id: int | None
    code_version: str
    job_was_running: bool
    checkpoint: str = "checkpoint"  # directory of the checkpoint copy, inside the savepoint
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return savepoints_dir() / self.id

    def offsets(self) -> Offsets:
        return offsets_from_json(self.kafka_offsets)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "SavepointManifest":
        data = dict(data)
        data["tables"] = [TableState(**t) for t in data["tables"]]
        return cls(**data)


def _copy_checkpoint(src: Path, dst: Path) -> None:
    def ignore(directory: str, names: list[str]) -> set[str]:
        return {n for n in names if n in _NOT_STATE} if Path(directory).name == "streamlake" else set()

    if src.exists():
        shutil.copytree(src, dst, ignore=ignore)
    else:
        dst.mkdir(parents=True)


def create_savepoint(job: JobSpec, *, stop: bool = False, timeout_s: float = 180.0, note: str = "") -> SavepointManifest:
    """Take a savepoint of ``job`` at a micro-batch boundary; stop the job after it if ``stop``.

    A running job is paused for the copy and then resumed (or stopped); an idle
    job is kept from starting meanwhile. Raises TimeoutError if the job does not
    reach a boundary in time.
    """
    control = JobControl(job.checkpoint)
    sp_id = f"sp-{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    target = savepoints_dir() / sp_id
    with control.quiesced(timeout_s, stop_after=stop) as paused:
        table = ensure_bronze_table(job.table)  # a job that never ran: its empty state
        with KafkaMetadataClient(client_config({f"kafka.{k}": v for k, v in job.kafka.items()})) as kafka:
            tps = kafka.partitions(topics=job.topics)
        ckpt = QueryCheckpoint(job.checkpoint)
        query_id = ckpt.query_id()
        tmp = savepoints_dir() / f".{sp_id}.tmp"
        _copy_checkpoint(Path(job.checkpoint), tmp / "checkpoint")
        manifest = SavepointManifest(
            id=sp_id, created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            job=job.name, job_config=job.to_dict(),
            tables=[TableState("bronze", job.table, table.version())],
            kafka_offsets=offsets_to_json(committed_offsets(table, tps)),
            first_offsets=offsets_to_json(first_offsets(table, tps)),
            query_id=query_id, last_batch_id=last_batch_id(table, query_id) if query_id else None,
            code_version=code_version(), job_was_running=paused is not None, note=note,
        )
        (tmp / "manifest.json").write_text(json.dumps(manifest.to_dict(), indent=2))
        os.replace(tmp, target)
    return manifest


def load_savepoint(savepoint_id: str) -> SavepointManifest:
    path = savepoints_dir() / savepoint_id / "manifest.json"
    if not path.exists():
        raise SavepointError(f"no savepoint {savepoint_id!r} (see `streamlake savepoint list`)")
    return SavepointManifest.from_dict(json.loads(path.read_text()))


def list_savepoints(job: str | None = None) -> list[SavepointManifest]:
    """Savepoints, newest first (optionally of one job)."""
    found = []
    for path in savepoints_dir().glob("sp-*/manifest.json"):
        manifest = SavepointManifest.from_dict(json.loads(path.read_text()))
        if job is None or manifest.job == job:
            found.append(manifest)
    return sorted(found, key=lambda m: m.id, reverse=True)


def jobs_restored_from(savepoint_id: str, running_only: bool = True) -> list[str]:
    out = []
    for name in list_jobs():
        control = JobControl(load_job(name).checkpoint)
        if control.read_state().get("restored_from") == savepoint_id and (not running_only or control.is_running()):
            out.append(name)
    return out


def dispose_savepoint(savepoint_id: str) -> None:
    """Delete a savepoint. Refused (SavepointError) while a running job was restored from it."""
    load_savepoint(savepoint_id)
    running = jobs_restored_from(savepoint_id)
    if running:
        raise SavepointError(
            f"savepoint {savepoint_id} cannot be disposed: running job(s) {', '.join(running)} were restored "
            f"from it. Stop the job first (`streamlake job stop NAME`)."
        )
    shutil.rmtree(savepoints_dir() / savepoint_id)


def restore_savepoint(savepoint_id: str, *, timeout_s: float = 180.0) -> dict:
    """Put the savepoint's job back to the savepoint: tables, offsets and checkpoint.

    Stops the job if it runs. Each table is restored to its savepoint version
    as a new commit that also resets the Kafka offsets (``txn``) to the
    savepoint's; the job's checkpoint is replaced by the savepoint's copy. The
    job is not restarted here (the caller decides how: DAG, CLI). Returns what
    was done. Raises SavepointError if a table's files are gone (vacuumed).
    """
    from deltalake.transaction import CommitProperties

    manifest = load_savepoint(savepoint_id)
    job = load_job(manifest.job)
    control = JobControl(job.checkpoint)
    was_running = control.is_running()
    if was_running:
        control.request_stop()
        control.wait_stopped(timeout_s)
    restored = []
    with control.running(timeout_s):
        txns = offset_transactions(offsets_from_json(manifest.kafka_offsets), offsets_from_json(manifest.first_offsets),
                                   manifest.query_id, manifest.last_batch_id)
        for state in manifest.tables:
            table = open_table(state.path)
            properties = CommitProperties(app_transactions=txns, custom_metadata={
                "streamlake": {"operation": "restore", "savepoint": savepoint_id, "toVersion": state.version}})
            if table.version() == state.version:
                table.create_write_transaction([], "append", table.schema(), commit_properties=properties)
            else:
                try:
                    table.restore(state.version, commit_properties=properties)
                except Exception as exc:  # noqa: BLE001 - delta-rs raises generic errors for missing files
                    raise SavepointError(f"cannot restore {state.path} to version {state.version}: {exc}") from exc
            restored.append({"table": state.path, "restored_to": state.version,
                             "new_version": open_table(state.path).version()})
        # Swap in the savepoint's checkpoint atomically (rename), carrying the lock
        # file we hold (same inode) so the job cannot start until we are done.
        checkpoint = Path(job.checkpoint)
        staged = checkpoint.with_name(checkpoint.name + f".restoring-{uuid.uuid4().hex[:6]}")
        _copy_checkpoint(manifest.path / manifest.checkpoint, staged)
        (staged / "streamlake").mkdir(exist_ok=True)
        os.replace(control.lock_file, staged / "streamlake" / "job.lock")
        old = checkpoint.with_name(checkpoint.name + f".replaced-{uuid.uuid4().hex[:6]}")
        checkpoint.rename(old)
        staged.rename(checkpoint)
        shutil.rmtree(old, ignore_errors=True)
        control.write_state(restored_from=savepoint_id, restored_at=time.time())
    return {"savepoint": savepoint_id, "job": job.name, "job_was_running": was_running, "tables": restored,
            "offsets": manifest.kafka_offsets}
