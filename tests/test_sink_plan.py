"""Unit tests of the sink's planning step: what a micro-batch adds to a table."""

import pytest

from streamlake.delta.sink import plan_batch
from streamlake.errors import OffsetGapError
from streamlake.kafka.offsets import TopicPartition as TP

P0, P1 = TP("t", 0), TP("t", 1)


def test_first_batch_on_new_table_writes_everything_and_records_first_offsets():
    plan = plan_batch(0, {P0: 0, P1: 5}, {P0: 10, P1: 8}, {})
    assert plan.write_from == {P0: 0, P1: 5}
    assert plan.first == {P0: 0, P1: 5}
    assert plan.next_offsets == {P0: 10, P1: 8}
    assert not plan.filter_needed() and not plan.is_replay


def test_replayed_batch_commits_nothing():
    plan = plan_batch(3, {P0: 10, P1: 8}, {P0: 20, P1: 9}, {P0: 20, P1: 9})
    assert plan.is_replay


def test_overlap_with_a_racing_writer_keeps_only_the_missing_offsets():
    plan = plan_batch(2, {P0: 10, P1: 8}, {P0: 20, P1: 12}, {P0: 15, P1: 12})
    assert plan.write_from == {P0: 15}
    assert plan.next_offsets == {P0: 20}
    assert plan.filter_needed()


def test_table_behind_the_checkpoint_is_a_gap_not_a_silent_skip():
    with pytest.raises(OffsetGapError, match=r"t-0: the table holds offsets below 5, this batch starts at 10"):
        plan_batch(4, {P0: 10}, {P0: 20}, {P0: 5})


def test_table_without_offsets_for_a_partition_the_query_already_read_is_a_gap():
    with pytest.raises(OffsetGapError, match="no offsets"):
        plan_batch(4, {P0: 10}, {P0: 20}, {})


def test_unknown_start_takes_first_offset_from_the_data():
    plan = plan_batch(0, None, {P0: 20}, {})
    assert plan.write_from == {P0: -1} and plan.first_from_data == {P0}
