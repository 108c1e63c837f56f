"""Helpers shared by the integration tests."""

from __future__ import annotations

import json
from pathlib import Path

from streamlake.operations.audit import audit_offsets
from streamlake.pipeline.ingest import IngestConfig, progress_file, run_ingest


def ingest(spark, lake, topic, **kwargs) -> dict:
    """Run the bronze ingest in the test session's Spark (available-now unless told)."""
    cfg = IngestConfig(table=lake["table"], checkpoint=lake["checkpoint"], topics=(topic,), **kwargs)
    lines: list[str] = []
    summary = run_ingest(spark, cfg, report=lines.append, poll_s=0.2)
    summary["lines"] = lines
    return summary


def progress(lake) -> list[dict]:
    path = progress_file(lake["checkpoint"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_exactly_once(lake, topic, expected_rows: int | None = None):
    report = audit_offsets(lake["table"], [topic])
    assert report.exactly_once, report.summary()
    if expected_rows is not None:
        assert report.totals()["table_rows"] == expected_rows, report.summary()
    return report


def delta_log_entries(table: str) -> list[list[dict]]:
    """Actions of every commit file, in version order."""
    log = Path(table) / "_delta_log"
    return [[json.loads(line) for line in f.read_text().splitlines()] for f in sorted(log.glob("*.json"))]


def interrupted_checkpoint_write(folder, batch=0):
    """What a process killed inside Spark's checkpoint write leaves: the entry's temp file
    and its checksum, never renamed into place (names as found after such a kill)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f".{batch}.0c6c30bc-6f33-4085-8810-f7bab4997059.tmp"
    (folder / name).write_text("v1\n{}\n{}")
    (folder / f".{name}.crc").write_bytes(b"crc")
    return {name, f".{name}.crc"}
