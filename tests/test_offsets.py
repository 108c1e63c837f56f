"""Unit tests of the pure offset logic (no Kafka, no Spark)."""

import pytest

from streamlake.errors import InvalidOptionError
from streamlake.kafka.offsets import (
    OffsetRange,
    TopicPartition as TP,
    offsets_from_json,
    offsets_to_json,
    parse_starting_offsets,
    plan_ranges,
    rate_limit,
)


def test_json_round_trip_uses_sparks_shape():
    offsets = {TP("b", 1): 7, TP("a", 0): 3, TP("a", 10): 5}
    as_json = offsets_to_json(offsets)
    assert as_json == {"a": {"0": 3, "10": 5}, "b": {"1": 7}}
    assert offsets_from_json(as_json) == offsets
    assert offsets_from_json('{"a": {"0": -2}}') == {TP("a", 0): -2}


@pytest.mark.parametrize("bad, words", [
    ("{not json", "not valid JSON"),
    ('["a"]', "must be a JSON object"),
    ('{"a": {"x": 1}}', "partition 'x'"),
    ('{"a": {"0": "5"}}', "not an integer"),
    ('{"a": {"0": -3}}', "out of range"),
    ('{"a": 5}', "expected"),
])
def test_malformed_offsets_name_the_problem(bad, words):
    with pytest.raises(InvalidOptionError, match=words):
        offsets_from_json(bad, "startingOffsets")


def test_starting_offsets_parsing():
    assert parse_starting_offsets(None, None).kind == "latest"
    assert parse_starting_offsets("EARLIEST", None).kind == "earliest"
    spec = parse_starting_offsets('{"t": {"0": 5, "1": -2}}', None)
    assert spec.kind == "specific" and spec.specific == {TP("t", 0): 5, TP("t", 1): -2}
    assert parse_starting_offsets(None, "1700000000000").timestamp_ms == 1700000000000
    with pytest.raises(InvalidOptionError, match="'earliest', 'latest' or JSON"):
        parse_starting_offsets("beginning", None)
    with pytest.raises(InvalidOptionError, match="not both"):
        parse_starting_offsets("earliest", "5")
    with pytest.raises(InvalidOptionError, match="epoch milliseconds"):
        parse_starting_offsets(None, "yesterday")


def test_rate_limit_admits_exactly_the_budget_in_proportion():
    start = {TP("t", 0): 0, TP("t", 1): 100, TP("t", 2): 50}
    latest = {TP("t", 0): 600, TP("t", 1): 400, TP("t", 2): 150}  # backlog 600, 300, 100
    end = rate_limit(start, latest, 100)
    taken = {tp: end[tp] - start[tp] for tp in start}
    assert sum(taken.values()) == 100
    assert taken == {TP("t", 0): 60, TP("t", 1): 30, TP("t", 2): 10}
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in start)


def test_rate_limit_remainders_and_small_budgets():
    start = {TP("t", p): 0 for p in range(3)}
    latest = {TP("t", p): 10 for p in range(3)}
    for budget in (1, 2, 7, 29):
        end = rate_limit(start, latest, budget)
        assert sum(end.values()) == budget
        assert max(end.values()) - min(end.values()) <= 1
    assert rate_limit(start, latest, 1000) == latest
    with pytest.raises(InvalidOptionError):
        rate_limit(start, latest, 0)


def test_plan_ranges_skips_empty_and_splits_for_min_partitions():
    start = {TP("t", 0): 0, TP("t", 1): 10, TP("t", 2): 5}
    end = {TP("t", 0): 100, TP("t", 1): 10, TP("t", 2): 25}
    ranges = plan_ranges(start, end)
    assert ranges == [OffsetRange("t", 0, 0, 100), OffsetRange("t", 2, 5, 25)]
    split = plan_ranges(start, end, min_partitions=6)
    assert len(split) >= 6
    for tp in (TP("t", 0), TP("t", 2)):
        pieces = sorted((r.start, r.end) for r in split if r.topic_partition == tp)
        assert pieces[0][0] == start[tp] and pieces[-1][1] == end[tp]
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:])), "pieces must tile the range"
