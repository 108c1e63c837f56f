"""Reading a Spark Structured Streaming checkpoint (the query's WAL) from Python.

Spark writes ``offsets/<batch>`` *before* it runs a micro-batch and
``commits/<batch>`` after the sink returned; the checkpoint's ``metadata`` holds
the query id, which survives restarts. The Delta sink reads the offset log to
learn exactly which Kafka range a batch covers, so the offsets it commits are
the ones Spark planned, including offsets without records (transaction
markers). Format: ``v1``, one line of batch metadata, then one JSON line per
source; queries built by :mod:`streamlake.pipeline.ingest` have exactly one source.

``streamlake/initial-offsets.json`` (Kafka sources) and
``streamlake/initial-position.json`` (Delta sources) are ours: the resolved
start of a new query, written once before the query starts, so a query
restarted before its first batch committed re-runs that batch from the same
start (as Spark's own Kafka source does with its initial-offset log). So is
``streamlake/batches/<batch>.json``: what the sink did with a micro-batch (Delta
version, counts), for the progress line of the process that follows the query,
which is not the one running the sink when the query runs on a Spark Connect
server (``foreachBatch`` then runs in a Python process of the server's).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from streamlake.kafka.offsets import Offsets, offsets_from_json, offsets_to_json


# A log entry Spark's checkpoint file manager was still writing: ``.<batch>.<uuid>.tmp``
# (and Hadoop's checksum of it, ``..<batch>.<uuid>.tmp.crc``) is renamed to ``<batch>``
# when complete; the rename is the commit.
_INTERRUPTED_WRITE = re.compile(r"^\.{1,2}\d+\.[0-9a-f-]+\.tmp(\.crc)?$")


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

    def discard_interrupted_first_batch(self) -> list[str]:
        """Before a (re)start: remove the temp file of an offset-log entry whose write a
        kill interrupted, if the log has no entry yet. Returns the names removed.

        Such a file was never part of the log, and Spark ignores it once the log has an
        entry. Before that, Spark 4.1+ takes the query for a new one and refuses to start
        it because its ``offsets`` directory is not empty
        (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``): a job killed while planning its
        first micro-batch could never restart. Call only while no other process runs
        this query (the job's lock)."""
        if self.has_offsets():
            return []
        removed = []
        for log in ("offsets", "commits"):
            folder = self.path / log
            for name in (os.listdir(folder) if folder.is_dir() else []):
                if _INTERRUPTED_WRITE.match(name):
                    (folder / name).unlink(missing_ok=True)
                    removed.append(f"{log}/{name}")
        return removed

    def batch_entry(self, batch_id: int) -> tuple[dict, dict]:
        """The source's end offset (parsed JSON) of a planned batch, and the batch metadata
        (``batchTimestampMs``, ``batchWatermarkMs``, ``conf``).

        Raises FileNotFoundError if Spark has not planned that batch, and
        CheckpointFormatError if the entry is not a single-source v1 entry.
        """
        entry = self.path / "offsets" / str(batch_id)
        lines = entry.read_text().splitlines()
        if not lines or lines[0] != "v1":
            raise CheckpointFormatError(f"{entry}: unsupported offset log version {lines[:1]}")
        if len(lines) != 3:
            raise CheckpointFormatError(f"{entry}: expected exactly one source, found {len(lines) - 2}")
        return json.loads(lines[2]), json.loads(lines[1])

    def batch_end(self, batch_id: int) -> tuple[Offsets, int]:
        """End Kafka offsets of a planned batch and its batch timestamp (epoch ms)."""
        offsets, meta = self.batch_entry(batch_id)
        return offsets_from_json(offsets, str(self.path / "offsets" / str(batch_id))), \
            int(meta.get("batchTimestampMs", 0))

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
        _write_atomically(self.initial_offsets_file, offsets_to_json(offsets))

    @property
    def initial_position_file(self) -> Path:
        return self.path / "streamlake" / "initial-position.json"

    def initial_position(self) -> dict | None:
        """The start offset of a Delta-fed query (None: from the upstream's beginning)."""
        try:
            return json.loads(self.initial_position_file.read_text())
        except FileNotFoundError:
            return None

    def save_initial_position(self, offset: dict | None) -> None:
        _write_atomically(self.initial_position_file, offset)

    KEPT_BATCH_RESULTS = 50  # results nobody took (nobody followed the query) are dropped after this many batches

    def save_batch_result(self, batch_id: int, result: dict) -> None:
        """What the sink did with micro-batch ``batch_id`` (JSON), written atomically for
        :meth:`take_batch_result`; drops results older than KEPT_BATCH_RESULTS batches."""
        folder = self.path / "streamlake" / "batches"
        _write_atomically(folder / f"{batch_id}.json", result)
        for name in os.listdir(folder):
            stem = name.removesuffix(".json")
            if stem.isdigit() and int(stem) < batch_id - self.KEPT_BATCH_RESULTS:
                (folder / name).unlink(missing_ok=True)

    def take_batch_result(self, batch_id: int | None) -> dict:
        """The result :meth:`save_batch_result` kept for ``batch_id``, removed once read;
        {} when there is none (a replayed batch, or one already taken)."""
        if batch_id is None:
            return {}
        path = self.path / "streamlake" / "batches" / f"{batch_id}.json"
        try:
            result = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        path.unlink(missing_ok=True)
        return result


def _write_atomically(target: Path, obj) -> None:
    """JSON to ``target`` through a temp file and a rename."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, sort_keys=True))
    os.replace(tmp, target)
