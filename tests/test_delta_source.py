"""The ``streamlake-delta`` streaming source: real Spark (the session's), real Delta
tables written by delta-rs into ``tmp_path``, micro-batches collected with foreachBatch.

Every table row has ``id`` (unique) and ``v`` (the number of the write that added it),
so a test can tell which commit each row came from and that each row came once.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake
from pyspark.sql.streaming.datasource import ReadAllAvailable
from streamlake.delta.log import DataFile, parse_commit
from streamlake.delta.source import (
    AdmissionLimits,
    DeltaSourceOffset,
    DeltaSourceOptions,
    covered_versions,
    group_files,
    register,
    starting_options_after,
)
from streamlake.errors import InvalidOptionError

ROWS = 3  # rows per write


@pytest.fixture(scope="module")
def dspark(spark):
    register(spark)
    return spark


def rows(v: int, n: int = ROWS) -> pa.Table:
    return pa.table({
        "id": pa.array([v * 100 + i for i in range(n)], pa.int64()),
        "v": pa.array([v] * n, pa.int32()),
    })


def write(path, v: int, mode: str = "append") -> None:
    write_deltalake(str(path), rows(v), mode=mode)


def table_with(path, writes: int) -> str:
    """A table with versions 0..writes-1; write v adds rows ``id = v*100 + i`` with ``v = v``."""
    write_deltalake(str(path), rows(0), configuration={"delta.enableDeletionVectors": "false"})
    for v in range(1, writes):
        write(path, v)
    return str(path)


def run(spark, path, checkpoint, *, trigger: dict | None = None, until_rows: int | None = None,
        timeout: float = 90, **options) -> list[dict]:
    """Run a query into foreachBatch; available-now unless ``trigger`` says otherwise (then
    stop once ``until_rows`` rows arrived). Returns the batches: id, rows, input partitions."""
    batches: list[dict] = []

    def collect(df, batch_id):
        got = [r.asDict() for r in df.collect()]
        batches.append({"id": batch_id, "rows": got, "parts": df.rdd.getNumPartitions()})

    reader = spark.readStream.format("streamlake-delta")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    query = (reader.load(str(path)).writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint))
             .trigger(**(trigger or {"availableNow": True})).start())
    try:
        if trigger is None:
            assert query.awaitTermination(timeout), "available-now query did not finish"
        else:
            deadline = time.time() + timeout
            while sum(len(b["rows"]) for b in batches) < until_rows and time.time() < deadline:
                if query.exception():
                    raise query.exception()
                time.sleep(0.1)
    finally:
        query.stop()
    return batches


def ids(batches) -> list[int]:
    return [r["id"] for b in batches for r in b["rows"]]


def versions_per_batch(batches) -> list[list[int]]:
    return [sorted({r["v"] for r in b["rows"]}) for b in batches if b["rows"]]


def assert_commit_order(batches) -> None:
    seen = versions_per_batch(batches)
    for earlier, later in itertools.pairwise(seen):
        assert max(earlier) <= min(later), f"commits out of order across batches: {seen}"


def expected_ids(*versions: int) -> list[int]:
    return sorted(v * 100 + i for v in versions for i in range(ROWS))


def file_sizes(path) -> dict[int, int]:
    """Data file size of each append-only version (one file per write)."""
    out = {}
    for f in sorted((Path(path) / "_delta_log").glob("*.json")):
        adds = [json.loads(line)["add"] for line in f.read_text().splitlines() if '"add"' in line[:8]]
        if len(adds) == 1:
            out[int(f.stem)] = adds[0]["size"]
    return out


# -- pure parts ---------------------------------------------------------------------------

def test_offsets_round_trip_and_coverage():
    off = DeltaSourceOffset("tid", 7, 2, False)
    assert json.loads(off.to_json()) == {"sourceVersion": 1, "reservoirId": "tid", "reservoirVersion": 7,
                                         "index": 2, "isStartingVersion": False}
    assert DeltaSourceOffset.from_json(off.to_json()) == off == DeltaSourceOffset.from_json(off.to_dict())
    with pytest.raises(InvalidOptionError):
        DeltaSourceOffset.from_json({"reservoirId": "tid"})

    def o(v, i=-1, s=False):
        return DeltaSourceOffset("tid", v, i, s)

    # A whole version and a split one.
    c = covered_versions(o(3), o(5))
    assert (list(c.fully), c.partly, c.consumed_through) == ([3, 4], (), 4)
    c = covered_versions(o(3, 1), o(5, 0))
    assert (list(c.fully), c.partly, c.consumed_through) == ([4], (3, 5), 4)
    c = covered_versions(o(3, 1), o(3, 4))
    assert (list(c.fully), c.partly, c.consumed_through) == ([], (3,), 2)
    # The initial snapshot: version not chosen yet, fixed by the end offset.
    c = covered_versions(o(-1, -1, True), o(6, 9, True))
    assert (list(c.fully), c.partly, c.consumed_through, c.snapshot) == ([], (6,), None, 6)
    c = covered_versions(o(-1, -1, True), o(7))
    assert (list(c.fully), c.partly, c.consumed_through, c.snapshot) == ([6], (), 6, 6)
    c = covered_versions(o(6, 9, True), o(7))
    assert (list(c.fully), c.partly, c.consumed_through) == ([], (6,), 6)
    assert covered_versions(o(4), o(4)).fully == range(0)
    with pytest.raises(ValueError):
        covered_versions(o(5), o(3))
    assert starting_options_after(6) == {"startingVersion": "7"}


def test_admission_limits_and_file_groups():
    limits = AdmissionLimits(max_files=None, max_bytes=100)
    assert [limits.admit(s) for s in (150, 10)] == [True, False]  # soft: at least one file
    limits = AdmissionLimits(max_files=2, max_bytes=100)
    assert [limits.admit(s) for s in (10, 10, 10)] == [True, True, False]
    files = [DataFile(f"f{i}", 1000) for i in range(10)]
    groups = group_files(files, min_partitions=2)
    assert [len(g) for g in groups] == [5, 5] and [f for g in groups for f in g] == files
    big = [DataFile(f"b{i}", 100 << 20) for i in range(3)]
    assert [len(g) for g in group_files(big, min_partitions=1)] == [1, 1, 1]
    assert group_files([], 2) == []


def test_commit_classification():
    def commit(*actions):
        return parse_commit(9, [json.dumps(a) for a in actions], {})

    add = {"add": {"path": "a%20b.parquet", "size": 5, "partitionValues": {}, "dataChange": True}}
    append = commit({"commitInfo": {"operation": "WRITE"}}, add)
    assert not append.is_change and append.files == (DataFile("a b.parquet", 5),)
    compaction = commit({"commitInfo": {"operation": "OPTIMIZE"}},
                        {"add": {**add["add"], "dataChange": False}},
                        {"remove": {"path": "x", "dataChange": False}})
    assert not compaction.is_change and compaction.files == ()
    delete = commit({"commitInfo": {"operation": "DELETE"}}, {"remove": {"path": "x", "dataChange": True}})
    assert delete.is_change and delete.is_delete_only
    restore = commit({"commitInfo": {"operation": "RESTORE", "operationParameters": {"version": "4"}}}, add)
    assert restore.is_change and restore.restore_to == 4
    platform = commit({"commitInfo": {"operation": "RESTORE", "operationParameters": {"datetime": 1},
                                      "streamlake": {"operation": "restore", "toVersion": 3}}})
    assert platform.restore_to == 3


def test_options_are_validated():
    assert DeltaSourceOptions.parse({"path": "/t"}).max_files == 1000
    opts = DeltaSourceOptions.parse({"path": "/t", "maxBytesPerTrigger": "2k", "startingVersion": "latest"})
    assert (opts.max_files, opts.max_bytes_per_trigger, opts.starting_version) == (None, 2048, "latest")
    for bad in ({"path": "/t", "startingVersion": "-1"}, {"path": "/t", "maxFilesPerTrigger": "0"},
                {"path": "/t", "maxBytesPerTrigger": "lots"}, {"path": "/t", "skipChangeCommits": "yes"},
                {"path": "/t", "startingVersion": "1", "startingTimestamp": "2026-01-01"}, {},
                {"path": "/t", "waitForCommitMs": "0"}, {"path": "/t", "waitForCommitMs": "soon"}):
        with pytest.raises(InvalidOptionError):
            DeltaSourceOptions.parse(bad)
    with pytest.raises(InvalidOptionError, match="maxFilesPerTrigger"):
        DeltaSourceOptions.parse({"path": "/t", "maxFilesPerTriger": "1"})


def _reader(table, **options):
    """The driver side of the source, without Spark."""
    from streamlake.delta.log import DeltaLog
    from streamlake.delta.source import DeltaStreamReader

    parsed = DeltaSourceOptions.parse({"path": table, **{k: str(v) for k, v in options.items()}})
    return DeltaStreamReader(parsed, DeltaLog(table).spark_schema())


def _plan(reader, start: dict):
    """End offset of the next batch (no read limit) and the write numbers of its files."""
    import pyarrow.parquet as pq

    end = reader.latestOffset(start, ReadAllAvailable())
    files = reader.plan_files(start, end)
    return end, [pq.read_table(f.location(reader.options.path)).column("v")[0].as_py() for f in files]


def test_driver_side_rules_without_spark(tmp_path):
    from streamlake.delta.log import ChangeCommitError, SchemaChangedError

    table = table_with(tmp_path / "t", 3)
    DeltaTable(table).delete("v = 2")  # version 3 removes a whole file, adds nothing
    write(table, 4)
    start = _reader(table, startingVersion=0).initialOffset()
    end, got = _plan(_reader(table, startingVersion=0, ignoreDeletes="true"), start)
    assert (end["reservoirVersion"], got) == (5, [0, 1, 2, 4])
    strict = _reader(table, startingVersion=0)
    end, got = _plan(strict, start)
    assert (end["reservoirVersion"], end["index"], got) == (3, -1, [0, 1, 2]), "stops before the delete"
    with pytest.raises(ChangeCommitError, match="at version 3"):
        strict.latestOffset(end, ReadAllAvailable())

    # delta-rs's own restore (no platform metadata), twice to the same version: a stream at the
    # start of version 6 continues after the later restore.
    write(table, 5)                       # version 5 (consumed through here)
    write(table, 6)                       # version 6
    DeltaTable(table).restore(5)          # version 7
    write(table, 8)                       # version 8
    DeltaTable(table).restore(5)          # version 9
    write(table, 10)                      # version 10
    reader = _reader(table, startingVersion=6)
    end, got = _plan(reader, reader.initialOffset())
    assert (end["reservoirVersion"], got) == (11, [10])

    # startingTimestamp: the first commit at or after it.
    info = [json.loads(line)["commitInfo"] for line in
            (Path(table) / "_delta_log" / f"{8:020d}.json").read_text().splitlines() if "commitInfo" in line]
    when = dt.datetime.fromtimestamp(info[0]["timestamp"] / 1000, dt.timezone.utc).isoformat()
    assert _reader(table, startingTimestamp=when).initialOffset()["reservoirVersion"] == 8

    # A column the running query does not know stops it; restarting picks the new schema up.
    old = _reader(table, startingVersion=11)
    start = old.initialOffset()
    write_deltalake(table, rows(11).append_column("extra", pa.array(["x"] * ROWS)), mode="append",
                    schema_mode="merge")
    with pytest.raises(SchemaChangedError, match="version 11"):
        _plan(old, start)
    end, got = _plan(_reader(table, startingVersion=11), start)
    assert got == [11]


def test_a_caught_up_stream_waits_for_the_next_commit_and_no_longer(tmp_path):
    """``waitForCommitMs``: a stream that has read every commit answers as soon as the next
    commit lands during its wait, with that commit's files; with no commit, after the wait,
    that nothing is new. A stream with unread commits, and one without the option, never wait."""
    import threading

    table = table_with(tmp_path / "t", 2)
    reader = _reader(table, startingVersion=0, waitForCommitMs=5000)
    end, got = _plan(reader, reader.initialOffset())
    assert (end["reservoirVersion"], got) == (2, [0, 1])  # unread commits: at once

    started = time.monotonic()
    writer = threading.Timer(0.5, write, (table, 2))
    writer.start()
    later, got = _plan(reader, end)
    waited = time.monotonic() - started
    writer.join()
    assert (later["reservoirVersion"], got) == (3, [2])
    assert 0.5 <= waited < 4.0, f"answered {waited:.2f} s after the start, the commit came at 0.5 s"

    short = _reader(table, startingVersion=0, waitForCommitMs=300)
    started = time.monotonic()
    assert short.latestOffset(later, ReadAllAvailable()) == later
    assert 0.3 <= time.monotonic() - started < 3.0
    started = time.monotonic()
    assert _reader(table, startingVersion=0).latestOffset(later, ReadAllAvailable()) == later
    assert time.monotonic() - started < 0.3


# -- streaming on Spark -------------------------------------------------------------------

def test_snapshot_then_appends_in_commit_order(dspark, tmp_path):
    table = table_with(tmp_path / "t", 3)
    ck = tmp_path / "ck"
    first = run(dspark, table, ck, minPartitions=2)
    assert sorted(ids(first)) == expected_ids(0, 1, 2)
    assert first[0]["parts"] >= 2, "a batch of several files is spread over several tasks"
    offset = json.loads((ck / "offsets" / "0").read_text().splitlines()[-1])
    assert offset["reservoirId"] == DeltaTable(table).metadata().id
    assert (offset["reservoirVersion"], offset["sourceVersion"]) == (3, 1)  # snapshot of 2 consumed

    for v in (3, 4, 5):
        write(table, v)
    second = run(dspark, table, ck, maxFilesPerTrigger=2)
    assert ids(second) == expected_ids(3, 4, 5), "later commits once each, in commit order"
    assert versions_per_batch(second) == [[3, 4], [5]]
    assert run(dspark, table, ck) == [], "nothing new: no batch"


def test_starting_version_and_latest(dspark, tmp_path):
    table = table_with(tmp_path / "t", 3)
    assert sorted(ids(run(dspark, table, tmp_path / "ck1", startingVersion=1))) == expected_ids(1, 2)
    assert ids(run(dspark, table, tmp_path / "ck2", startingVersion="latest")) == []  # (Spark runs an empty batch 0)
    write(table, 3)
    assert sorted(ids(run(dspark, table, tmp_path / "ck2", startingVersion="latest"))) == expected_ids(3)
    # Resuming from a consumed version alone (a lost checkpoint): startingVersion = consumed + 1.
    resumed = run(dspark, table, tmp_path / "ck3", **starting_options_after(2))
    assert sorted(ids(resumed)) == expected_ids(3)


def test_read_limits_under_available_now(dspark, tmp_path):
    table = table_with(tmp_path / "t", 6)
    by_files = run(dspark, table, tmp_path / "ck1", startingVersion=0, maxFilesPerTrigger=2)
    assert versions_per_batch(by_files) == [[0, 1], [2, 3], [4, 5]]
    assert ids(by_files) == expected_ids(*range(6))

    sizes = file_sizes(table)
    limit = 2 * min(sizes.values())
    by_bytes = run(dspark, table, tmp_path / "ck2", startingVersion=0, maxBytesPerTrigger=limit)
    assert ids(by_bytes) == expected_ids(*range(6))
    for batch in versions_per_batch(by_bytes):
        assert sum(sizes[v] for v in batch[:-1]) < limit, "a file is admitted only while under the byte limit"
    assert 1 < len(by_bytes) < 6


def test_read_limit_under_processing_time_and_live_appends(dspark, tmp_path):
    table = table_with(tmp_path / "t", 3)
    batches: list[dict] = []

    def collect(df, batch_id):
        batches.append({"id": batch_id, "rows": [r.asDict() for r in df.collect()]})

    query = (dspark.readStream.format("streamlake-delta").option("maxFilesPerTrigger", 1).load(table)
             .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        deadline = time.time() + 60
        while len(ids(batches)) < 3 * ROWS and time.time() < deadline:
            time.sleep(0.1)
        write(table, 3)
        write(table, 4)
        while len(ids(batches)) < 5 * ROWS and time.time() < deadline:
            assert query.exception() is None
            time.sleep(0.1)
    finally:
        query.stop()
    assert sorted(ids(batches)) == expected_ids(*range(5))
    assert all(len(v) == 1 for v in versions_per_batch(batches)), "maxFilesPerTrigger=1 holds"
    assert_commit_order(batches)


def test_restart_continues_and_replays_the_same_batch(dspark, tmp_path):
    table = table_with(tmp_path / "t", 2)
    ck = tmp_path / "ck"
    first = run(dspark, table, ck)  # one batch: the snapshot of version 1
    assert [b["id"] for b in first] == [0] and sorted(ids(first)) == expected_ids(0, 1)

    # Crash after the batch ran but before Spark recorded it: batch 0 is replayed after
    # new commits arrived, and must read the same snapshot (not the new latest version).
    for name in ("0", ".0.crc"):
        (ck / "commits" / name).unlink(missing_ok=True)
    write(table, 2)
    write(table, 3)
    again = run(dspark, table, ck, maxFilesPerTrigger=1)
    assert again[0]["id"] == 0 and sorted(ids(again[:1])) == expected_ids(0, 1)
    assert ids(again[1:]) == expected_ids(2, 3) and versions_per_batch(again[1:]) == [[2], [3]]

    write(table, 4)
    last = run(dspark, table, ck, maxFilesPerTrigger=1)
    assert ids(last) == expected_ids(4), "no row twice, none lost"


def test_change_commits_stop_the_query_unless_skipped(dspark, tmp_path):
    from pyspark.errors import StreamingQueryException

    table = table_with(tmp_path / "t", 2)
    ck = tmp_path / "ck"
    assert sorted(ids(run(dspark, table, ck))) == expected_ids(0, 1)
    write(table, 2)                       # version 2: streams before the error
    DeltaTable(table).delete("id = 1")    # version 3
    write(table, 4)                       # version 4
    with pytest.raises(StreamingQueryException) as err:
        run(dspark, table, ck)  # streams version 2, then stops at version 3
    message = str(err.value)
    assert "at version 3" in message and "DELETE" in message and "skipChangeCommits" in message
    assert table in message
    rest = run(dspark, table, ck, skipChangeCommits="true")
    assert ids(rest) == expected_ids(4), "version 2 came before the error; the delete is skipped"

    write(table, 5, mode="overwrite")     # version 5: an overwrite is a change too
    with pytest.raises(StreamingQueryException, match="at version 5"):
        run(dspark, table, ck)
    write(table, 6)
    assert ids(run(dspark, table, ck, skipChangeCommits="true")) == expected_ids(6)


def test_compaction_is_skipped(dspark, tmp_path):
    table = table_with(tmp_path / "t", 3)
    ck = tmp_path / "ck"
    assert ids(run(dspark, table, ck, startingVersion=0)) == expected_ids(0, 1, 2)
    DeltaTable(table).optimize.compact()  # version 3: dataChange=false
    write(table, 4)
    assert ids(run(dspark, table, ck)) == expected_ids(4)
    # From the start, through the compaction: every row once.
    assert sorted(ids(run(dspark, table, tmp_path / "ck2", startingVersion=0))) == expected_ids(0, 1, 2, 4)


def _platform_restore(table: str, version: int) -> None:
    """What the savepoint restore does: delta-rs restore + the platform's commit metadata."""
    DeltaTable(table).restore(version, commit_properties=CommitProperties(custom_metadata={
        "streamlake": {"operation": "restore", "savepoint": "sp-test", "toVersion": version}}))


def test_restore_to_the_consumed_position_continues(dspark, tmp_path):
    table = table_with(tmp_path / "t", 2)
    ck = tmp_path / "ck"
    assert sorted(ids(run(dspark, table, ck))) == expected_ids(0, 1)  # consumed through version 1
    write(table, 2)
    write(table, 3)
    _platform_restore(table, 1)  # version 4 restores version 1: versions 2..4 add up to nothing
    write(table, 5)
    assert ids(run(dspark, table, ck)) == expected_ids(5)


def test_restore_behind_the_stream_is_a_change_commit(dspark, tmp_path):
    from pyspark.errors import StreamingQueryException

    table = table_with(tmp_path / "t", 3)
    ck = tmp_path / "ck"
    assert sorted(ids(run(dspark, table, ck))) == expected_ids(0, 1, 2)  # consumed through version 2
    _platform_restore(table, 1)  # version 3 removes rows the stream already emitted
    write(table, 4)
    with pytest.raises(StreamingQueryException) as err:
        run(dspark, table, ck)
    assert "at version 3" in str(err.value) and "restores version 1" in str(err.value)
    assert ids(run(dspark, table, ck, skipChangeCommits="true")) == expected_ids(4)


def test_vacuumed_files_are_data_loss(dspark, tmp_path):
    from pyspark.errors import StreamingQueryException

    table = table_with(tmp_path / "t", 2)
    dtable = DeltaTable(table)
    dtable.optimize.compact()  # version 2 replaces the files of versions 0 and 1
    DeltaTable(table).vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
    write(table, 3)
    with pytest.raises(StreamingQueryException) as err:
        run(dspark, table, tmp_path / "ck1", startingVersion=0)
    message = str(err.value)
    assert "version 0 of" in message and "no longer exists" in message and "failOnDataLoss=false" in message
    kept = run(dspark, table, tmp_path / "ck2", startingVersion=0, failOnDataLoss="false")
    assert ids(kept) == expected_ids(3)


def test_partition_columns_have_their_types(dspark, tmp_path):
    table = str(tmp_path / "t")
    noon = dt.datetime(2026, 1, 1, 12, 30, 0, 250, tzinfo=dt.timezone.utc)

    def part(ids_, days, ns):
        return pa.table({
            "id": pa.array(ids_, pa.int64()),
            "day": pa.array(days, pa.date32()),
            "n": pa.array(ns, pa.int32()),
            "ts": pa.array([noon] * len(ids_), pa.timestamp("us", tz="UTC")),
            "name": pa.array([f"r{i}" for i in ids_]),
        })

    write_deltalake(table, part([1, 2], [dt.date(2026, 1, 1), None], [7, 8]), partition_by=["day", "n", "ts"])
    write_deltalake(table, part([3], [dt.date(2026, 1, 2)], [7]), mode="append", partition_by=["day", "n", "ts"])
    ts_us = int(noon.timestamp()) * 1_000_000 + 250
    expected = [
        {"id": 1, "day": dt.date(2026, 1, 1), "n": 7, "ts_us": ts_us, "name": "r1"},
        {"id": 2, "day": None, "n": 8, "ts_us": ts_us, "name": "r2"},
        {"id": 3, "day": dt.date(2026, 1, 2), "n": 7, "ts_us": ts_us, "name": "r3"},
    ]
    # Partition values come from the snapshot (typed by delta-rs) and from commit files (strings).
    for name, options in (("snapshot", {}), ("commits", {"startingVersion": "0"})):
        df = dspark.readStream.format("streamlake-delta").options(**options).load(table)
        assert df.dtypes == [("id", "bigint"), ("day", "date"), ("n", "int"), ("ts", "timestamp"),
                             ("name", "string")]
        got: list = []
        query = (df.selectExpr("id", "day", "n", "unix_micros(ts) AS ts_us", "name").writeStream
                 .foreachBatch(lambda b, _, got=got: got.extend(r.asDict() for r in b.collect()))
                 .option("checkpointLocation", str(tmp_path / f"ck-{name}")).trigger(availableNow=True).start())
        assert query.awaitTermination(90)
        assert sorted(got, key=lambda r: r["id"]) == expected, name


def test_unknown_option_and_missing_table_are_clear_errors(dspark, tmp_path):
    table = table_with(tmp_path / "t", 1)
    with pytest.raises(Exception) as err:
        dspark.readStream.format("streamlake-delta").option("maxFilesPerTriger", 1).load(table)
    assert "maxFilesPerTriger".lower() in str(err.value).lower() and "maxFilesPerTrigger" in str(err.value)
    with pytest.raises(Exception, match="no Delta table at"):
        dspark.readStream.format("streamlake-delta").load(str(tmp_path / "nowhere"))


def test_a_read_of_more_files_than_sparks_listing_threshold_starts_no_listing_job(spark, tmp_path):
    """A table's files are read as its Delta log names them (``read_table``, ``read_files``).
    Above 32 paths (its default threshold) Spark lists them in a job of a task per path, which
    cost the proofs more than their own work on `make run`'s tables of a few hundred small
    files; the platform's sessions list them on the driver: a sum over a table of 40 files
    runs the jobs the same sum over one file does, no listing job besides."""
    from streamlake.delta.table import TableSpec, read_table

    def jobs_of_a_sum(path, group: str) -> tuple[int, int]:
        spark.sparkContext.setJobGroup(group, f"a sum over {path.name}")
        try:
            total = read_table(spark, path, TableSpec(path.name, rows(0, 1).schema)).agg({"v": "sum"}).first()[0]
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        return total, len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))

    one, many = tmp_path / "one", tmp_path / "many"
    write_deltalake(str(one), rows(1, 2))
    for i in range(40):
        write_deltalake(str(many), rows(i, 2), mode="append")
    assert len(DeltaTable(str(many)).file_uris()) == 40
    total_one, jobs_one = jobs_of_a_sum(one, f"one-{tmp_path.name}")
    total_many, jobs_many = jobs_of_a_sum(many, f"many-{tmp_path.name}")
    assert (total_one, total_many) == (2, sum(2 * i for i in range(40)))
    assert jobs_many == jobs_one, f"{jobs_many} Spark jobs for a read of 40 files, {jobs_one} for one: a listing job"


CONCURRENT_REGISTRATIONS = """
import sys, threading
from pyspark.sql import SparkSession
from streamlake import data_sources
from streamlake.delta.source import register

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
errors = []

def one():
    try:
        register(spark)
    except Exception as exc:
        errors.append(repr(exc)[:300])

threads = [threading.Thread(target=one) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(len(errors), len(data_sources._registered), errors)
print(spark.read.format("streamlake-delta").load(sys.argv[2]).count())
"""


def test_threads_of_a_connect_client_register_the_source_once_and_read(spark, tmp_path):
    """A proof's checks read object-store tables from threads of one Spark Connect client, each
    registering streamlake-delta first: one registration reaches the server, none is refused."""
    import subprocess
    import sys

    from conftest import SPARK_CONNECT_PORT

    path = str(tmp_path / "table")
    write_deltalake(path, pa.table({"id": pa.array(range(5), pa.int64())}))
    done = subprocess.run([sys.executable, "-c", CONCURRENT_REGISTRATIONS, f"sc://127.0.0.1:{SPARK_CONNECT_PORT}",
                           path], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["0 1 []", "5"], done.stdout + done.stderr[-2000:]


def test_a_read_freezes_its_workers_heap_once_it_has_run():
    """The platform's sources yield their rows through ``freeze_heap_after``: in a fresh
    interpreter nothing is frozen before the first read ends, everything the read left on the
    heap is after it, and the rows pass unchanged (a second read adds nothing frozen)."""
    import subprocess
    import sys

    script = """
import gc, json
from streamlake.data_sources import freeze_heap_after
before = gc.get_freeze_count()
rows = freeze_heap_after(iter([(1,), (2,)]))
first = next(rows)
during = gc.get_freeze_count()
rest = list(rows)
after = gc.get_freeze_count()
again = list(freeze_heap_after(iter([(3,)])))
print(json.dumps([before, during, after, gc.get_freeze_count(), [first, *rest], again]))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    before, during, after, later, rows, again = json.loads(done.stdout)
    assert before == 0 and during == 0, "nothing is frozen before the first read has run"
    assert after > 1000, f"the heap the first read left is frozen: {after} objects"
    assert later == after, "a later read freezes nothing more"
    assert rows == [[1], [2]] and again == [[3]]
