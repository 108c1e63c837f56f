"""Reading a Spark Structured Streaming checkpoint (the query's WAL) from Python.

Spark writes ``offsets/<batch>`` *before* it runs a micro-batch and
``commits/<batch>`` after the sink returned; the checkpoint's ``metadata`` holds
the query id, which survives restarts. The Delta sink reads the offset log to
learn exactly which Kafka range a batch covers, so the offsets it commits are
the ones Spark planned, including offsets without records (transaction
markers). Format: ``v1``, one line of batch metadata, then one JSON line per
source; queries built by :mod:`streamlake.pipeline.ingest` have exactly one source.

``streamlake/initial-offsets.json`` is ours: the resolved start offsets of a new
query, written once before the query starts, so a query restarted before its
first batch committed re-runs that batch from the same start (as Spark's own
Kafka source does with its initial-offset log).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from streamlake.kafka.offsets import Offsets, offsets_from_json, offsets_to_json


class CheckpointFormatError(RuntimeError):
    """The checkpoint was written in a format this module does not understand."""


class QueryCheckpoint:
    """A streaming query's checkpoint directory (local filesystem)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    @property
    def initial_offsets_file(self) -> Path:
        return self.path / "streamlake" / "initial-offsets.json"

    def query_id(self) -> str | None:
        """The query id Spark keeps across restarts, or None for a fresh checkpoint."""
        try:
            return json.loads((self.path / "metadata").read_text())["id"]
        except (OSError, ValueError, KeyError):
            return None

    def _batches(self, log: str) -> list[int]:
        try:
            return sorted(int(n) for n in os.listdir(self.path / log) if n.isdigit())
        except FileNotFoundError:
            return []

    def offset_batches(self) -> list[int]:
        return self._batches("offsets")

    def committed_batches(self) -> list[int]:
        return self._batches("commits")

    def has_offsets(self) -> bool:
        return bool(self.offset_batches())

    def batch_end(self, batch_id: int) -> tuple[Offsets, int]:
        """End offsets of a planned batch and its batch timestamp (epoch ms).

        Raises FileNotFoundError if Spark has not planned that batch, and
        CheckpointFormatError if the entry is not a single-source v1 entry.
        """
        entry = self.path / "offsets" / str(batch_id)
        lines = entry.read_text().splitlines()
        if not lines or lines[0] != "v1":
            raise CheckpointFormatError(f"{entry}: unsupported offset log version {lines[:1]}")
        if len(lines) != 3:
            raise CheckpointFormatError(f"{entry}: expected exactly one source, found {len(lines) - 2}")
        meta = json.loads(lines[1])
        return offsets_from_json(lines[2], f"{entry}"), int(meta.get("batchTimestampMs", 0))

    def batch_start(self, batch_id: int) -> Offsets | None:
        """Start offsets of a batch: the previous batch's end, or the initial offsets."""
        if batch_id > 0:
            try:
                return self.batch_end(batch_id - 1)[0]
            except FileNotFoundError:
                return None
        return self.initial_offsets()

    def initial_offsets(self) -> Offsets | None:
        try:
            return offsets_from_json(self.initial_offsets_file.read_text(), str(self.initial_offsets_file))
        except FileNotFoundError:
            return None

    def save_initial_offsets(self, offsets: Offsets) -> None:
        """Write the initial offsets atomically (temp file + rename)."""
        target = self.initial_offsets_file
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(offsets_to_json(offsets), sort_keys=True))
        os.replace(tmp, target)
