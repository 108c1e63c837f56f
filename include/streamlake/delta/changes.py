"""The rows that a range of Delta commits added, as a Spark DataFrame.

What an operation touched is a version range ``(from_version, to_version]``:
the commits after ``from_version`` up to and including ``to_version``. Their
rows are the data files of those commits' ``add`` actions with
``dataChange=true`` (a compaction's rewritten files carry ``dataChange=false``
and add no rows), less the files that a later commit of the same range removed
again (rows no longer in the table at ``to_version``), also when a compaction
had rewritten them in between. A RESTORE commit's adds
are the files it brought back, so a restore's range yields the restored rows.

``from_version=None`` means the whole snapshot at ``to_version`` (every row of
the table then). Commits are read from the JSON commit files of ``_delta_log``;
a range whose commit files were cleaned up (log retention) cannot be read and
raises :class:`ChangesUnavailableError`.

Rows are read with the table's own schema (from its Delta log), not a declared
one, so a quality check of the schema sees what the table really holds; like
:func:`streamlake.delta.table.read_table`, partition columns come from the
files' paths (``basePath``) and no Delta JVM jar is needed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from urllib.parse import unquote

from streamlake.delta.log import DeltaLog
from streamlake.delta.table import open_table, read_object_store_files, snapshot_files
from streamlake.errors import StreamLakeError
from streamlake.spark.session import local_frame
from streamlake.storage.location import is_object_store, join, normalize


class ChangesUnavailableError(StreamLakeError):
    """A commit of the requested range can no longer be read (its log file is gone), or the
    range is not a range of this table."""


@dataclass(frozen=True)
class VersionRange:
    """``(from_version, to_version]``; ``from_version=None``: the snapshot at ``to_version``."""

    from_version: int | None
    to_version: int

    def __str__(self) -> str:
        return f"v{self.to_version} (snapshot)" if self.from_version is None else \
            f"(v{self.from_version}, v{self.to_version}]"


def _local(path: str, root: str) -> str:
    raw = unquote(path[len("file://"):]) if path.startswith("file://") else unquote(path)
    return raw if os.path.isabs(raw) or "://" in raw else join(root, raw)


def _commit_actions(log: DeltaLog, version: int) -> list[dict]:
    root = log.root
    name = f"{version:020d}.json"
    try:
        return log.actions(version)
    except FileNotFoundError:
        raise ChangesUnavailableError(
            f"version {version} of {root}: commit file {name} no longer exists (log cleanup), so the rows "
            "it added cannot be told apart; validate the snapshot instead (no from-version)") from None


def resolve_range(path: str | os.PathLike, from_version: int | None = None,
                  to_version: int | None = None) -> VersionRange:
    """The range with ``to_version`` defaulting to the latest version; checks its bounds."""
    latest = open_table(path).version()
    to = latest if to_version is None else int(to_version)
    if to < 0 or to > latest:
        raise ChangesUnavailableError(f"table {path} has versions 0..{latest}; to-version {to} is not one")
    if from_version is not None and not (-1 <= int(from_version) <= to):
        raise ChangesUnavailableError(f"from-version {from_version} must be between -1 and the to-version {to}")
    return VersionRange(None if from_version is None else int(from_version), to)


def added_files(path: str | os.PathLike, from_version: int | None = None,
                to_version: int | None = None) -> tuple[VersionRange, list[str]]:
    """Paths (URIs on an object store) of the data files holding the rows the range added
    (see the module docstring), in commit order, and the resolved range.

    A compaction inside the range (``dataChange=false`` removes and adds) moves rows
    of files the range added into new files; those files' rows are still read from
    the original files, and are dropped if a later commit of the range removes one
    of the new files with a data change. Raises :class:`ChangesUnavailableError`
    if such an original file was vacuumed since."""
    root = normalize(path)
    log = DeltaLog(root)
    rng = resolve_range(root, from_version, to_version)
    if rng.from_version is None:
        return rng, snapshot_files(open_table(root, rng.to_version))
    added: dict[str, None] = {}  # insertion-ordered set of files with rows the range added
    carried: dict[str, set[str]] = {}  # a compaction's output file -> files of `added` it rewrote
    for version in range(rng.from_version + 1, rng.to_version + 1):
        moved: set[str] = set()
        rewritten: list[str] = []
        for action in _commit_actions(log, version):
            if "add" in action:
                file = _local(action["add"]["path"], root)
                if action["add"].get("dataChange", True):
                    added[file] = None
                else:
                    rewritten.append(file)
            elif "remove" in action:
                file = _local(action["remove"]["path"], root)
                if action["remove"].get("dataChange", True):
                    added.pop(file, None)
                    for original in carried.pop(file, ()):
                        added.pop(original, None)
                else:
                    if file in added:
                        moved.add(file)
                    moved |= carried.pop(file, set())
        if moved:
            for file in rewritten:
                carried[file] = set(moved)
    files = list(added)
    gone = [f for f in files if not log.file_exists(f)]
    if gone:
        raise ChangesUnavailableError(
            f"{len(gone)} data file(s) that commits {rng} of {root} added no longer exist (e.g. {gone[0]}; "
            "compacted and vacuumed?), so those rows cannot be read; validate the snapshot instead")
    return rng, files


def table_schema(path: str | os.PathLike, version: int | None = None):
    """The table's schema at ``version`` as a Spark StructType (Delta's schema JSON is Spark's)."""
    from pyspark.sql.types import StructType

    return StructType.fromJson(json.loads(open_table(path, version).schema().to_json()))


def read_changes(spark, path: str | os.PathLike, from_version: int | None = None,
                 to_version: int | None = None, schema=None):
    """``(DataFrame, VersionRange)``: the rows commits ``(from_version, to_version]`` added
    (the whole snapshot when ``from_version`` is None), with the table's schema at
    ``to_version`` unless ``schema`` (a Spark StructType) is given."""
    rng, files = added_files(path, from_version, to_version)
    if schema is None:
        schema = table_schema(path, rng.to_version)
    if not files:
        return local_frame(spark, [], schema), rng
    if is_object_store(path):
        return read_object_store_files(spark, normalize(path), schema, files, rng.to_version), rng
    return spark.read.schema(schema).option("basePath", os.path.abspath(os.fspath(path))).parquet(*files), rng
