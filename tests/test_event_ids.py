"""Silver's per-file id hashes (``streamlake.pipeline.event_ids``) and the de-duplication on them.

No Spark: silver tables written with delta-rs, compacted and restored as the stage and
an operator would. Every expected answer is computed here: FNV-1a by a plain loop over
the bytes, and which ids silver holds (and in which file) from what each test wrote.
The pipeline tests (test_pipelines.py, test_pipeline_crashes.py) run the same lookup in
every micro-batch of records produced one at a time, duplicates among them.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from streamlake.delta.table import compact_small_files, open_table
from streamlake.pipeline.definition import load_definition
from streamlake.pipeline.event_ids import FileIdHashes, hash_ids
from streamlake.pipeline.silver import LINEAGE, SilverStage, ensure_silver

ROOT = Path(__file__).resolve().parents[1]
UTC = dt.timezone.utc
T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOUR_US = 3_600_000_000


def fnv1a(text: str) -> int:
    value = 0xCBF29CE484222325
    for byte in text.encode():
        value = ((value ^ byte) * 0x100000001B3) % 2**64
    return value


def test_an_ids_hash_is_fnv1a_of_its_text_whatever_the_arrays_shape():
    texts = ["", "a", "sensor-7", "é€😀", "x" * 70, "ab", "ba"]
    assert hash_ids(pa.array(texts)).tolist() == [fnv1a(t) for t in texts]
    assert hash_ids(pa.array(["zz", *texts])[1:]).tolist() == [fnv1a(t) for t in texts]  # a slice
    assert hash_ids(pa.chunked_array([texts[:2], texts[2:]])).tolist() == [fnv1a(t) for t in texts]
    assert hash_ids(pa.array([7, 1234567890123, -5])).tolist() == [fnv1a("7"), fnv1a("1234567890123"), fnv1a("-5")]
    assert hash_ids(pa.array(["a", None])).tolist() == [fnv1a("a"), fnv1a("")]
    assert hash_ids(pa.array([], pa.string())).size == 0


def test_files_with_names_every_file_holding_an_id_reads_each_once_and_forgets_files_gone(tmp_path):
    files, ids_of = [], {}
    for n in range(5):
        path = str(tmp_path / f"part-{n}.parquet")
        ids_of[path] = [f"f{n}-{i}" for i in range(50)]
        pq.write_table(pa.table({"event_id": ids_of[path]}), path)
        files.append(path)
    reads = []

    def read_ids(path):
        reads.append(path)
        return pq.read_table(path).column("event_id")

    cache = FileIdHashes(forget_after=1)
    wanted = hash_ids(pa.array(["f1-3", "f3-49", "f3-0", "nowhere", "f9-1"]))
    assert cache.files_with(files, wanted, read_ids) == [files[1], files[3]]
    assert sorted(reads) == sorted(files) and cache.ids_held() == 250
    assert cache.files_with(files, hash_ids(pa.array(["f4-10"])), read_ids) == [files[4]]
    assert len(reads) == 5  # each file's ids read once
    # a snapshot without files 2-4 (compacted away, restored away): they are not consulted ...
    assert cache.files_with(files[:2], wanted, read_ids) == [files[1]]
    assert len(cache) == 5 and len(reads) == 5
    # ... and forgotten after forget_after lookups without them
    assert cache.files_with(files[:2], wanted, read_ids) == [files[1]]
    assert len(cache) == 2 and cache.ids_held() == 100
    # ... and read again if a snapshot lists them again
    assert cache.files_with(files, wanted, read_ids) == [files[1], files[3]]
    assert sorted(reads[5:]) == sorted(files[2:])
    assert cache.files_with(files, hash_ids(pa.array([], pa.string())), read_ids) == []


def silver_rows(spec, first: int, count: int, hours: float) -> tuple[pa.Table, dict[str, int]]:
    """``count`` silver events ``e<first>``... at T0 + ``hours``, and each id's event time (µs)."""
    when = T0 + dt.timedelta(hours=hours)
    ids = [f"e{i}" for i in range(first, first + count)]
    table = pa.table({
        "event_id": ids, "sensor_id": ["s1"] * count, "event_time": [when] * count, "temperature": [20.5] * count,
        "topic": ["sensors"] * count, "partition": pa.array([0] * count, pa.int32()),
        "offset": list(range(first, first + count)), "kafka_timestamp": [when] * count,
        "bronze_version": [1] * count, "event_date": pa.array([when.date()] * count, pa.date32()),
    }, schema=spec.schema)
    micros = int(when.timestamp() * 1_000_000)
    return table, {i: micros for i in ids}


def candidates(picks: list[tuple[str, float]]) -> pa.Table:
    """A micro-batch's valid records: (event id, event time in hours after T0) each."""
    t0 = int(T0.timestamp() * 1_000_000)
    return pa.table({"event_id": [p[0] for p in picks], "t": [t0 + int(p[1] * HOUR_US) for p in picks],
                     "kt": [t0] * len(picks), "topic": ["sensors"] * len(picks),
                     "partition": pa.array([1] * len(picks), pa.int32()),
                     "offset": pa.array(range(1000, 1000 + len(picks)), pa.int64())})


def expected_drops(batch: pa.Table, held: dict[str, int], horizon_us: int) -> list[int]:
    """Offsets of the batch's records silver already holds within the horizon (ids unique here)."""
    return sorted(o for i, t, o in zip(batch.column("event_id").to_pylist(), batch.column("t").to_pylist(),
                                       batch.column("offset").to_pylist())
                  if i in held and abs(held[i] - t) <= horizon_us)


def test_the_lookup_drops_what_silver_holds_across_appends_a_compaction_and_a_restore(tmp_path):
    definition = load_definition(ROOT / "pipelines" / "sensors.yaml")
    path = str(tmp_path / "silver")
    stage = SilverStage(definition, str(tmp_path / "bronze"), path, str(tmp_path / "quarantine"),
                        str(tmp_path / "ck"))
    _, spec = ensure_silver(path, definition)
    horizon = stage.dedup_horizon_us
    held: dict[str, int] = {}
    for n in range(8):  # eight micro-batches' appends, an hour apart
        rows, times = silver_rows(spec, n * 20, 20, hours=n)
        write_deltalake(path, rows, mode="append")
        held.update(times)
    version_after_four = 4  # version 0 made the table; appends 1-4 hold e0..e79

    def check(batch: pa.Table, held: dict[str, int]) -> None:
        dropped = stage.duplicates(batch, open_table(path), spec)
        assert dropped.column_names == list(LINEAGE)
        assert sorted(dropped.column("offset").to_pylist()) == expected_drops(batch, held, horizon)

    batch = candidates([("e3", 0.1), ("e45", 3), ("e159", 7.5), ("new-1", 7), ("e100", 31), ("e20", -24.5),
                        ("e21", 24.9), ("e120", 6)])
    assert expected_drops(batch, held, horizon)  # some are resends, some are not
    check(batch, held)
    table = open_table(path)
    assert compact_small_files(table, max_small_files=2) is not None  # new files, the same rows
    assert len(open_table(path).file_uris()) < 8
    check(batch, held)
    DeltaTable(path).restore(version_after_four)  # an operator rolls silver back: e80.. are gone
    check(batch, {i: t for i, t in held.items() if int(i[1:]) < 80})
    for _ in range(stage.id_hashes.forget_after):
        stage.duplicates(batch, open_table(path), spec)
    assert len(stage.id_hashes) == len(open_table(path).file_uris())  # files gone from the snapshot are forgotten
