"""Verified ranges: what each passing consistency check proved, and what a table did since.

**The ledger.** A passing check appends its proof to the platform table
``verified_ranges`` (under the platform root, :mod:`streamlake.delta.records`:
``$STREAMLAKE_HOME/data/_platform`` or an object-store URI shared by every machine): one
row per topic-partition with the offset range ``[first_offset, next_offset)`` it
proved the table holds exactly once at ``delta_version``, the row and record
counts of that range, and one marker row (``topic`` null) so that a proof of a
table with no partitions yet exists too. Proofs are keyed by the Delta table's
id (``metaData.id``), so a table deleted and created again at the same path has
none, and a table moved elsewhere keeps its own.

**What changed since a proof** (:func:`changes_since`) comes from the Delta log:
the commit files from the proven version to the checked one. Files are immutable,
so rows of the proven version are unchanged exactly as long as no commit removed
the file holding them:

* ``add`` actions (ingest commits, or any other writer): the files are new and
  their rows are audited, whatever their offsets, so rows added again into a
  proven range are caught (as duplicates, or extra rows);
* ``remove`` of a file added since the proof: its rows simply leave the set to
  audit;
* ``remove`` of a proven file (compaction, delete, overwrite, a restore to an
  unproven version, an unknown writer): the partitions it held are *touched*
  and audited again in full;
* a restore commit of the platform (``streamlake.operation == "restore"`` with
  ``toVersion``) to a version at or after some proof, whose snapshot has exactly
  the files of that version: the state is that version's (a proof *at* that
  version is inherited as it is);
* a commit file that is gone (log cleanup) or unreadable: everything is audited
  in full.

Ingest commits of a run with ``failOnDataLoss=false`` record the offsets their batch
skipped because Kafka no longer held them (``skippedOffsets``, see
:class:`streamlake.delta.sink.DeltaKafkaSink`): :attr:`Changes.skipped` since the proof,
:func:`skipped_since` for any span of versions. The check expects no row there instead of
calling the range unverified.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from streamlake.delta.table import (
    TableSpec,
    open_table,
    snapshot_files,
)
from streamlake.kafka.offsets import TopicPartition
from streamlake.operations.audit import (
    FileInfo,
    data_file_path,
    file_info_from_add,
    partitions_in_files,
    snapshot_index,
    table_filesystem,
)
from streamlake.delta.records import append_rows, platform_rows, platform_table_path

log = logging.getLogger(__name__)

VERIFIED_RANGES = TableSpec(
    name="verified_ranges",
    schema=pa.schema([
        ("check_id", pa.string()), ("job", pa.string()), ("table_path", pa.string()), ("table_id", pa.string()),
        ("delta_version", pa.int64()), ("proven_at", pa.timestamp("us", tz="UTC")), ("mode", pa.string()),
        ("base_version", pa.int64()), ("topics", pa.string()),
        ("topic", pa.string()), ("partition", pa.int32()), ("first_offset", pa.int64()), ("next_offset", pa.int64()),
        ("kafka_records", pa.int64()), ("table_rows", pa.int64()),
    ]),
    description="offset ranges each passing consistency check proved, per topic-partition and table version",
)
# Nested restores followed when rebasing onto a restored version.
MAX_RESTORE_DEPTH = 8


@dataclass(frozen=True)
class ProvenRange:
    first: int
    next: int
    kafka_records: int
    table_rows: int


@dataclass
class Proof:
    """A passing check: at ``version`` the table held each range of ``ranges`` exactly
    once (and no other row of ``topics``)."""

    check_id: str
    job: str
    table_path: str
    table_id: str
    version: int
    proven_at: dt.datetime
    topics: tuple[str, ...]
    ranges: dict[TopicPartition, ProvenRange]
    mode: str = "full"
    base_version: int | None = None

    def describe(self) -> str:
        return f"version {self.version} on {self.proven_at.strftime('%Y-%m-%d %H:%M UTC')} ({self.check_id})"


def ledger_path() -> str:
    return platform_table_path(VERIFIED_RANGES.name)


def record_proof(proof: Proof) -> None:
    """Append a proof to the ledger (blind append: concurrent checks do not conflict).
    Raises UnsafeStoreError, writing nothing, on a store without safe commits."""
    common = {"check_id": proof.check_id, "job": proof.job, "table_path": proof.table_path,
              "table_id": proof.table_id, "delta_version": proof.version, "proven_at": proof.proven_at,
              "mode": proof.mode, "base_version": proof.base_version, "topics": json.dumps(list(proof.topics))}
    rows = [{**common, "topic": None, "partition": None, "first_offset": None, "next_offset": None,
             "kafka_records": None, "table_rows": None}]
    rows += [{**common, "topic": tp.topic, "partition": tp.partition, "first_offset": r.first,
              "next_offset": r.next, "kafka_records": r.kafka_records, "table_rows": r.table_rows}
             for tp, r in sorted(proof.ranges.items())]
    append_rows(VERIFIED_RANGES, rows)


def _ledger_rows(filter_expr=None, columns=None) -> pa.Table | None:
    return platform_rows(VERIFIED_RANGES, filter_expr, columns)


class ProofIndex:
    """The proofs of one table (by Delta table id), held as Arrow columns: a year of
    checks is a few hundred thousand small rows, and a check needs one or two proofs
    out of them, so no Python object is made per proof."""

    def __init__(self, table_id: str):
        self.table_id = table_id
        rows = _ledger_rows(pc.field("table_id") == table_id)
        self._rows = rows if rows is not None else VERIFIED_RANGES.schema.empty_table()
        markers = self._rows.filter(pc.is_null(self._rows.column("topic")))
        self._markers = markers.sort_by([("delta_version", "ascending"), ("proven_at", "ascending")])
        self._cache: dict[str, Proof] = {}

    def __len__(self) -> int:
        return self._markers.num_rows

    def latest(self, version: int) -> Proof | None:
        """The newest proof of a version at or before ``version``."""
        versions = self._markers.column("delta_version").to_numpy(zero_copy_only=False)
        import numpy as np

        index = int(np.searchsorted(versions, version, side="right")) - 1
        return self._proof(index) if index >= 0 else None

    def all(self) -> list[Proof]:
        """Every proof, oldest first (small ledgers: tests, listings)."""
        return [self._proof(i) for i in range(len(self))]

    def _proof(self, index: int) -> Proof:
        r = self._markers.slice(index, 1).to_pylist()[0]
        if r["check_id"] in self._cache:
            return self._cache[r["check_id"]]
        proof = Proof(r["check_id"], r["job"], r["table_path"], r["table_id"], r["delta_version"], r["proven_at"],
                      tuple(json.loads(r["topics"] or "[]")), {}, r["mode"] or "full", r["base_version"])
        ranges = self._rows.filter(pc.and_(pc.equal(self._rows.column("check_id"), r["check_id"]),
                                           pc.is_valid(self._rows.column("topic"))))
        for x in ranges.to_pylist():
            proof.ranges[TopicPartition(x["topic"], x["partition"])] = ProvenRange(
                x["first_offset"], x["next_offset"], x["kafka_records"] or 0, x["table_rows"] or 0)
        self._cache[proof.check_id] = proof
        return proof


def recent_proofs(limit: int = 20, job: str | None = None) -> list[dict]:
    """Newest proofs first (one dict per proof with its ranges), for ``streamlake check --proofs``."""
    rows = _ledger_rows(pc.field("job") == job if job is not None else None)
    if rows is None:
        return []
    markers = rows.filter(pc.is_null(rows.column("topic"))).sort_by([("proven_at", "descending")]).slice(0, limit)
    out = []
    for m in markers.to_pylist():
        entry = {k: m[k] for k in ("check_id", "job", "table_path", "delta_version", "proven_at", "mode",
                                   "base_version")}
        ranges = rows.filter(pc.and_(pc.equal(rows.column("check_id"), m["check_id"]),
                                     pc.is_valid(rows.column("topic"))))
        entry["ranges"] = {f"{r['topic']}-{r['partition']}": [r["first_offset"], r["next_offset"]]
                           for r in ranges.to_pylist()}
        out.append(entry)
    return out


# -- the Delta log since a proof ----------------------------------------------------


@dataclass
class Changes:
    """What happened to a table between ``proof.version`` and ``version``."""

    proof: Proof
    version: int
    added: dict[str, FileInfo] = field(default_factory=dict)  # files added since, still in the table
    touched: dict[TopicPartition, str] = field(default_factory=dict)  # proven rows removed -> why
    everything: str | None = None  # set when every partition must be audited in full: why
    commits: Counter = field(default_factory=Counter)  # commit kinds since the proof
    notes: list[str] = field(default_factory=list)
    # offsets ingest commits since the proof skipped, Kafka no longer holding them: (from, to, version)
    skipped: dict[TopicPartition, list[tuple[int, int, int]]] = field(default_factory=dict)

    def describe_commits(self) -> str:
        n = sum(self.commits.values())
        if not n:
            return "no commits since"
        kinds = ", ".join(f"{c} {k}" for k, c in sorted(self.commits.items(), key=lambda kv: (-kv[1], kv[0])))
        return f"{n} commit{'s' if n != 1 else ''} since ({kinds})"


def _same_files(root: str, a: int, b: int) -> bool:
    try:
        return set(snapshot_files(open_table(root, a))) == set(snapshot_files(open_table(root, b)))
    except Exception as exc:
        log.info("cannot compare versions %d and %d of %s: %s", a, b, root, exc)
        return False


def changes_since(table_path: str, proof: Proof, version: int, proofs: ProofIndex | None = None,
                  _depth: int = 0) -> Changes:
    """Walk the Delta log of ``table_path`` from ``proof.version`` to ``version``
    (see the module docstring). ``proofs`` are the table's other proofs, for
    restores back to a proven version."""
    from streamlake.delta.log import DeltaLog
    from streamlake.storage.location import normalize

    root = normalize(table_path)
    delta_log = DeltaLog(root)
    fs = table_filesystem(root)
    ch = Changes(proof, version)
    base: dict[str, FileInfo] | None = None

    def base_files() -> dict[str, FileInfo] | None:
        nonlocal base
        if base is None:
            try:
                base = {f.path: f for f in snapshot_index(open_table(root, ch.proof.version))}
            except Exception as exc:
                log.info("cannot load version %d of %s: %s", ch.proof.version, root, exc)
                base = {}
                return None
        return base

    for v in range(proof.version + 1, version + 1):
        try:
            actions = delta_log.actions(v)
        except FileNotFoundError:
            ch.everything = f"commit {v} is no longer in the Delta log (log cleanup), so what changed since " \
                            f"the proof of version {ch.proof.version} is unknown"
            return ch
        except (OSError, ValueError) as exc:
            ch.everything = f"commit {v} of the Delta log cannot be read ({exc})"
            return ch
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), None) or {}
        custom = info.get("streamlake") if isinstance(info.get("streamlake"), dict) else {}
        kind = custom.get("operation") or info.get("operation") or "unknown writer"
        if custom.get("operation") == "restore" and isinstance(custom.get("toVersion"), int) \
                and 0 <= custom["toVersion"] < v:
            rebased = _restored(root, v, custom["toVersion"], proofs, _depth) if proofs is not None else None
            if rebased is not None:
                rebased.commits = ch.commits  # what the log did since the first proof, for the summary
                rebased.notes = ch.notes + rebased.notes
                ch, base = rebased, None
                ch.commits[kind] += 1
                continue
            ch.notes.append(f"commit {v} restores version {custom['toVersion']}, which no check proved: "
                            "its files are treated like any other commit's")
        ch.commits[kind] += 1
        for tp, lo, hi in skipped_offsets(custom):
            ch.skipped.setdefault(tp, []).append((lo, hi, v))
        for action in actions:
            if "remove" in action:
                path = data_file_path(root, action["remove"]["path"], fs)
                if ch.added.pop(path, None) is not None:
                    continue
                known = base_files()
                proven = known.get(path) if known is not None else None
                if proven is None:
                    ch.everything = (f"commit {v} ({kind}) removed a file the proven version {ch.proof.version} "
                                     "is not known to hold")
                    return ch
                tps = {proven.single_partition} if proven.single_partition else None
                if tps is None:
                    try:
                        tps = partitions_in_files([proven], ch.proof.topics)
                    except (OSError, pa.ArrowInvalid):
                        ch.everything = f"commit {v} ({kind}) removed proven rows of partitions that cannot be told"
                        return ch
                for tp in tps:
                    ch.touched.setdefault(tp, f"commit {v} ({kind}) removed or rewrote rows proven at "
                                              f"version {ch.proof.version}")
            elif "add" in action:
                add = action["add"]
                ch.added[data_file_path(root, add["path"], fs)] = file_info_from_add(root, add, fs)
    ch.version = version
    return ch


def skipped_offsets(custom: Mapping) -> list[tuple[TopicPartition, int, int]]:
    """The ``skippedOffsets`` of a commit's ``streamlake`` metadata: (partition, from, to)."""
    found = custom.get("skippedOffsets") if isinstance(custom, Mapping) else None
    out = []
    for topic, partitions in (found.items() if isinstance(found, Mapping) else ()):
        for partition, span in (partitions.items() if isinstance(partitions, Mapping) else ()):
            try:
                lo, hi = (int(x) for x in span)
                out.append((TopicPartition(topic, int(partition)), lo, hi))
            except (TypeError, ValueError):
                log.info("ignoring a malformed skippedOffsets entry %r of %s", span, topic)
    return out


def skipped_since(table_path: str, after: int, version: int) -> dict[TopicPartition, list[tuple[int, int, int]]]:
    """What the ingest commits of versions ``(after, version]`` skipped (see :class:`Changes`);
    a commit file that is gone (log cleanup) or unreadable adds nothing, so its ranges stay
    unverified."""
    from streamlake.delta.log import DeltaLog
    from streamlake.storage.location import normalize

    delta_log = DeltaLog(normalize(table_path))
    out: dict[TopicPartition, list[tuple[int, int, int]]] = {}
    for v in range(max(0, after + 1), version + 1):
        try:
            info = delta_log.commit_info(v)
        except (OSError, ValueError) as exc:
            log.info("commit %d of %s cannot be read for skipped offsets: %s", v, table_path, exc)
            continue
        custom = info.get("streamlake") if isinstance(info.get("streamlake"), dict) else {}
        for tp, lo, hi in skipped_offsets(custom):
            out.setdefault(tp, []).append((lo, hi, v))
    return out


def _restored(root: str, commit: int, to_version: int, proofs: ProofIndex, depth: int) -> Changes | None:
    """The state after a platform restore commit: that of the restored version, relative
    to the newest proof at or before it; None if no proof helps or the restore's
    files are not exactly the restored version's."""
    target = proofs.latest(to_version)
    if target is None or depth >= MAX_RESTORE_DEPTH:
        return None
    if not _same_files(root, commit, to_version):
        return None
    if target.version == to_version:
        ch = Changes(target, to_version)
        ch.notes.append(f"commit {commit} restores version {to_version}, proven at {target.describe()}: "
                        "inherits that proof")
        return ch
    ch = changes_since(root, target, to_version, proofs, depth + 1)
    if ch.everything:
        return None
    ch.notes.append(f"commit {commit} restores version {to_version}: what changed between the proof of version "
                    f"{target.version} and version {to_version} is audited")
    return ch


def proven_files(snapshot: Iterable[FileInfo], changes: Changes) -> list[FileInfo]:
    """Files of the checked snapshot that the proof covers (not added since)."""
    return [f for f in snapshot if f.path not in changes.added]


def describe_ranges(ranges: Mapping[TopicPartition, ProvenRange]) -> str:
    return ", ".join(f"{tp} [{r.first}, {r.next})" for tp, r in sorted(ranges.items()))
