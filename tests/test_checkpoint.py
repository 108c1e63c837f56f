"""Reading Spark's offset log (format checked against files Spark wrote in the integration tests)."""

import json

import pytest

from helpers import interrupted_checkpoint_write
from streamlake.spark.checkpoint import CheckpointFormatError, QueryCheckpoint
from streamlake.kafka.offsets import TopicPartition as TP


def _write_offsets(root, batch, offsets, ts=1700000000000, sources=1):
    (root / "offsets").mkdir(parents=True, exist_ok=True)
    lines = ["v1", json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": ts, "conf": {}})]
    lines += [json.dumps(offsets)] * sources
    (root / "offsets" / str(batch)).write_text("\n".join(lines))


def test_batch_range_comes_from_consecutive_offset_log_entries(tmp_path):
    ck = QueryCheckpoint(tmp_path)
    assert not ck.has_offsets() and ck.batch_start(0) is None
    ck.save_initial_offsets({TP("t", 0): 3})
    _write_offsets(tmp_path, 0, {"t": {"0": 10}})
    _write_offsets(tmp_path, 1, {"t": {"0": 25}}, ts=1700000001000)
    assert ck.batch_start(0) == {TP("t", 0): 3}
    assert ck.batch_end(0) == ({TP("t", 0): 10}, 1700000000000)
    assert ck.batch_start(1) == {TP("t", 0): 10}
    assert ck.batch_end(1)[1] == 1700000001000
    assert ck.offset_batches() == [0, 1]


def test_unexpected_formats_are_refused(tmp_path):
    _write_offsets(tmp_path, 0, {"t": {"0": 1}}, sources=2)
    with pytest.raises(CheckpointFormatError, match="exactly one source"):
        QueryCheckpoint(tmp_path).batch_end(0)
    (tmp_path / "offsets" / "1").write_text("v9\n{}\n{}")
    with pytest.raises(CheckpointFormatError, match="version"):
        QueryCheckpoint(tmp_path).batch_end(1)


def test_an_interrupted_first_entry_is_discarded_and_nothing_else(tmp_path):
    ck = QueryCheckpoint(tmp_path)
    planted = interrupted_checkpoint_write(tmp_path / "offsets")
    (tmp_path / "offsets" / "notes.tmp").write_text("not Spark's")
    assert sorted(ck.discard_interrupted_first_batch()) == sorted(f"offsets/{n}" for n in planted)
    assert {p.name for p in (tmp_path / "offsets").iterdir()} == {"notes.tmp"}
    assert ck.discard_interrupted_first_batch() == []


def test_once_the_log_has_an_entry_spark_ignores_temp_files_and_so_does_this(tmp_path):
    _write_offsets(tmp_path, 0, {"t": {"0": 10}})
    planted = interrupted_checkpoint_write(tmp_path / "offsets", batch=1)
    assert QueryCheckpoint(tmp_path).discard_interrupted_first_batch() == []
    assert planted <= {p.name for p in (tmp_path / "offsets").iterdir()}


def test_batch_results_are_taken_once_and_old_ones_not_taken_are_dropped(tmp_path):
    """What the sink did with a batch reaches the process that follows the query, which on a
    Spark Connect server is not the one running the sink: through the checkpoint."""
    ck = QueryCheckpoint(tmp_path)
    assert ck.take_batch_result(0) == {} and ck.take_batch_result(None) == {}
    ck.save_batch_result(0, {"version": 3, "rows": 17})
    assert QueryCheckpoint(tmp_path).take_batch_result(0) == {"version": 3, "rows": 17}
    assert ck.take_batch_result(0) == {}, "taken once"
    for batch in range(1, 60):
        ck.save_batch_result(batch, {"rows": batch})
    kept = sorted(int(p.stem) for p in (tmp_path / "streamlake" / "batches").glob("*.json"))
    assert kept == list(range(59 - QueryCheckpoint.KEPT_BATCH_RESULTS, 60))
    assert ck.take_batch_result(59) == {"rows": 59}
