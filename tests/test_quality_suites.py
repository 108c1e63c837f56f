"""The expectation suites of both example pipelines, on pyspark 4.2.0 with ANSI mode on.

Great Expectations 1.24.1 declares ``pyspark<4.2`` for its Spark support, so every
expectation the suites use is proven here on small DataFrames in the session's
SparkSession: clean rows of every table of both examples pass every expectation
(none raises), and injected bad data (nulls, a broken rule, duplicate event ids, a
broken gold window, an unknown quarantine reason, stale data, a wrong schema)
makes exactly the expected expectations fail, with the expected severity and the
platform's verdict (FAIL on critical, WARN on warnings only). Recording, Data Docs
and the UI are covered by test_quality_results.py.
"""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import pytest

import quality_samples as samples
from streamlake.pipeline.definition import load_definition
from streamlake.quality import suites
from streamlake.quality.validate import validate_dataframe

UTC = dt.timezone.utc
PIPELINES = Path(__file__).resolve().parents[1] / "pipelines"
SENSORS = load_definition(PIPELINES / "sensors.yaml")
ORDERS = load_definition(PIPELINES / "orders.yaml")
EVERY_TABLE = [(d, t) for d in (SENSORS, ORDERS) for t in d.table_names()]


def _validate(spark, definition, table, rows, **kwargs):
    kwargs.setdefault("record", False)
    kwargs.setdefault("build_docs", False)
    df = samples.dataframe(spark, definition, table, rows)
    return validate_dataframe(df, table, definition=definition, operation="test", **kwargs)


def _failing(report) -> dict[str, str]:
    return {o.key: o.severity for o in report.failures}


def test_ansi_mode_is_on(spark):
    assert spark.version.startswith("4.2")
    assert spark.conf.get("spark.sql.ansi.enabled").lower() == "true"


@pytest.mark.parametrize("definition", [SENSORS, ORDERS], ids=["sensors", "orders"])
def test_suites_are_complete_and_well_formed(definition):
    import great_expectations.expectations as gxe

    specs = suites.pipeline_suites(definition)
    assert list(specs) == definition.table_names()
    for table, spec in specs.items():
        keys = [c.key for c in spec.checks]
        assert len(keys) == len(set(keys)), f"duplicate keys in {table}"
        assert {c.severity for c in spec.checks} <= set(suites.SEVERITIES)
        for check in spec.checks:
            assert hasattr(gxe, check.expectation), check.expectation
        assert keys[0] == "columns"
        assert {k.split(":", 1)[1] for k in keys if k.startswith("type:")} == set(spec.spec.schema.names)
        assert spec.freshness_column in spec.spec.schema.names
        assert set(spec.example_columns) <= set(spec.spec.schema.names)
        gx_suite = suites.build_suite(table, definition)
        assert gx_suite.name == spec.name == f"streamlake.{definition.name}.{table.replace('/', '.')}"
        assert [e.meta["key"] for e in gx_suite.expectations] == keys
        assert all(e.severity.value == c.severity for e, c in zip(gx_suite.expectations, spec.checks))
    silver = {c.key: c for c in specs["silver"].checks}
    for rule in definition.rules:
        assert silver[f"rule:{rule.name}"].severity == "critical"
        assert rule.check in silver[f"rule:{rule.name}"].kwargs["unexpected_rows_query"]
    assert silver["event_id_unique"].kwargs == {"column": definition.event_id}
    assert {f"not_null:{f}" for f in definition.required} <= set(silver)
    assert silver["not_null:kafka_timestamp"].severity == "warning"
    quarantine = {c.key: c for c in specs["quarantine"].checks}
    assert quarantine["reason_known"].kwargs["value_set"] == list(definition.quarantine_reasons())
    for agg in definition.aggregates:
        gold = {c.key: c for c in specs[agg.gold_table].checks}
        assert gold["window_unique"].kwargs["column_list"] == [*agg.keys, "window_start", "window_end"]
        assert {f"not_null:{k}" for k in agg.keys} <= set(gold)
        assert gold["window_end_after_start"].kwargs["or_equal"] is False
    assert "freshness" not in {c.key for c in suites.checks_for("silver", definition)}
    assert "freshness" in {c.key for c in suites.checks_for("silver", definition, job_running=True)}
    assert "freshness" not in {c.key for c in suites.checks_for("silver", definition, job_running=True,
                                                                has_rows=False)}
    with pytest.raises(KeyError, match="has no table 'gold'"):
        suites.suite_spec("gold", definition)


@pytest.mark.parametrize("definition, table", EVERY_TABLE, ids=[f"{d.name}-{t}" for d, t in EVERY_TABLE])
def test_clean_rows_pass_every_expectation(spark, definition, table):
    report = _validate(spark, definition, table, samples.clean_rows(definition, table), job_running=True)
    assert report.status == "PASS", report.summary()
    assert report.rows == 4
    keys = [o.key for o in report.outcomes]
    assert keys == [c.key for c in suites.checks_for(table, definition, job_running=True)]
    assert "freshness" in keys
    assert all(o.exception is None and o.success for o in report.outcomes), report.summary()


def test_empty_rows_pass_and_skip_freshness(spark):
    report = _validate(spark, ORDERS, "silver", [], job_running=True)
    assert report.status == "PASS", report.summary()
    assert report.rows == 0 and "freshness" not in {o.key for o in report.outcomes}


def test_orders_silver_nulls_a_broken_rule_and_duplicate_event_ids(spark):
    rows = samples.clean_rows(ORDERS, "silver", 5)
    rows[0]["customer"] = None
    rows[1]["amount"] = decimal.Decimal("-3.00")
    rows[2]["order_id"] = rows[3]["order_id"]
    rows[4]["kafka_timestamp"] = None
    report = _validate(spark, ORDERS, "silver", rows)
    assert _failing(report) == {"not_null:customer": "critical", "rule:positive_amount": "critical",
                                "event_id_unique": "critical", "not_null:kafka_timestamp": "warning"}, report.summary()
    assert report.status == "FAIL" and not report.passed
    assert report.outcome("rule:positive_amount").observed_value == 1
    dup = report.outcome("event_id_unique")
    assert dup.unexpected_count == 2 and sorted(e["offset"] for e in dup.examples) == [2, 3]
    assert report.outcome("not_null:customer").examples[0]["offset"] == 0


def test_sensors_silver_rule_and_warning_only(spark):
    rows = samples.clean_rows(SENSORS, "silver")
    rows[0]["temperature"] = 95.5
    report = _validate(spark, SENSORS, "silver", rows)
    assert _failing(report) == {"rule:out_of_range": "critical"}, report.summary()
    rows = samples.clean_rows(SENSORS, "silver")
    rows[1]["kafka_timestamp"] = None
    report = _validate(spark, SENSORS, "silver", rows)
    assert _failing(report) == {"not_null:kafka_timestamp": "warning"}
    assert report.status == "WARN" and report.passed


def test_gold_broken_windows(spark):
    rows = samples.clean_rows(SENSORS, "gold/per_minute", 5)
    rows[0]["window_end"] = rows[0]["window_start"]                       # empty window
    rows[1]["_events"] = 0                                                # no events, and count(*) != events
    rows[2]["avg_temperature"] = rows[2]["max_temperature"] + 0.5         # avg > max
    rows[3]["min_temperature"] = rows[3]["max_temperature"] + 1.0         # min > max (and min > avg)
    rows[4]["avg_temperature"] = rows[4]["min_temperature"] - 0.25        # avg < min
    report = _validate(spark, SENSORS, "gold/per_minute", rows)
    assert _failing(report) == {
        "window_end_after_start": "critical", "events_at_least_1": "critical", "count_is_events:count": "critical",
        "max_not_below_avg:temperature": "critical", "avg_not_below_min:temperature": "critical",
        "min_not_above_max:temperature": "critical"}, report.summary()
    assert report.status == "FAIL"
    assert report.outcome("window_end_after_start").examples[0]["sensor_id"] == rows[0]["sensor_id"]


def test_gold_of_a_session_aggregate_without_keys(spark):
    rows = samples.clean_rows(ORDERS, "gold/activity", 3)
    rows[2] = dict(rows[1])
    rows[0]["orders"] = rows[0]["_events"] + 1
    report = _validate(spark, ORDERS, "gold/activity", rows)
    assert _failing(report) == {"window_unique": "critical", "count_is_events:orders": "critical"}, report.summary()


def test_quarantine_unknown_reason_and_nulls(spark):
    rows = samples.clean_rows(ORDERS, "quarantine", 4)
    rows[0]["reason"] = "out_of_range"  # a sensors reason: not one of the orders pipeline's
    rows[1]["message"] = None
    rows[2]["offset"] = None
    report = _validate(spark, ORDERS, "quarantine", rows)
    assert _failing(report) == {"reason_known": "critical", "not_null:message": "warning",
                                "not_null:offset": "critical"}, report.summary()
    unknown = report.outcome("reason_known")
    assert unknown.unexpected_count == 1 and unknown.examples[0]["reason"] == "out_of_range"


def test_bronze_offsets_nulls_and_duplicate_records(spark):
    rows = samples.clean_rows(SENSORS, "bronze", 5)
    rows[0]["offset"] = -1
    rows[1]["topic"] = None
    rows[3].update(partition=rows[2]["partition"], offset=rows[2]["offset"])  # the same Kafka record twice
    rows[4]["value"] = None
    report = _validate(spark, SENSORS, "bronze", rows)
    assert _failing(report) == {"offset_non_negative": "critical", "not_null:topic": "critical",
                                "kafka_record_unique": "critical", "not_null:value": "warning"}, report.summary()


def test_late_events_checks(spark):
    rows = samples.clean_rows(ORDERS, "late_events/revenue_5m", 4)
    rows[1].update(applied=True, applied_at=None)
    rows[2]["placed_at"] = None
    report = _validate(spark, ORDERS, "late_events/revenue_5m", rows)
    assert _failing(report) == {"applied_has_time": "warning", "not_null:placed_at": "critical"}, report.summary()


def test_freshness_only_while_the_job_runs(spark):
    old = dt.datetime.now(UTC) - dt.timedelta(hours=2)
    rows = samples.clean_rows(ORDERS, "silver", now=old)
    running = _validate(spark, ORDERS, "silver", rows, job_running=True, max_age_s=600)
    assert _failing(running) == {"freshness": "warning"}, running.summary()
    assert running.status == "WARN"
    assert running.outcome("freshness").observed_value
    stopped = _validate(spark, ORDERS, "silver", rows, job_running=False)
    assert stopped.status == "PASS" and "freshness" not in {o.key for o in stopped.outcomes}


def test_schema_changes(spark):
    from pyspark.sql import functions as F

    df = samples.dataframe(spark, ORDERS, "silver", samples.clean_rows(ORDERS, "silver"))

    def validate(frame):
        return validate_dataframe(frame, "silver", definition=ORDERS, operation="test", record=False,
                                  build_docs=False)

    narrowed = df.withColumn("bronze_version", F.col("bronze_version").cast("int"))
    report = validate(narrowed)
    assert _failing(report) == {"type:bronze_version": "critical"}, report.summary()
    assert report.outcome("type:bronze_version").observed_value == "IntegerType"
    assert not narrowed.is_cached, "the DataFrame GX persisted is released after the validation"
    report = validate(df.withColumn("surprise", F.lit(1)))
    assert _failing(report) == {"columns": "critical"}, report.summary()
    report = validate(df.drop("kafka_timestamp"))
    assert _failing(report) == {"columns": "critical", "type:kafka_timestamp": "critical",
                                "not_null:kafka_timestamp": "warning"}, report.summary()
    assert report.outcome("type:kafka_timestamp").exception


def test_gx_gives_the_same_outcomes_without_the_queries_whose_answer_is_not_used(spark, monkeypatch):
    """streamlake.quality.gx_spark answers GX's ``limit(0)`` unexpected-value queries and the
    rows of rule queries outside ``COMPLETE`` without Spark: with broken rows for column,
    column-pair, compound-key and rule expectations, every outcome (examples of the second
    pass included) equals GX's own; GX's own sends those queries (one per map expectation
    in the first pass, one per rule in each pass), ours sends none of them to Spark."""
    from dataclasses import asdict

    from great_expectations.expectations import registry

    from streamlake.quality import gx_spark

    gx_spark.skip_needless_queries()
    skipped = gx_spark.skipped_metrics()
    assert {"column_values.nonnull.unexpected_values": "limit_zero",
            "column_pair_values.a_greater_than_b.unexpected_values": "limit_zero",
            "compound_columns.unique.unexpected_values": "limit_zero",
            "unexpected_rows_query.table": "rows_unused"}.items() <= skipped.items(), skipped
    providers = {name: registry._registered_metrics[name]["providers"] for name in skipped}
    ours = {name: p[gx_spark.ENGINE] for name, p in providers.items()}
    reached = []  # (metric, whether its answer is used) of each query that reached GX's own function

    def counted(name, query):
        needless = getattr(gx_spark, skipped[name])

        def run(*args, **kwargs):
            reached.append((name, needless(kwargs)))
            return query(*args, **kwargs)
        return run

    gold = samples.clean_rows(SENSORS, "gold/per_minute", 5)
    gold[0]["window_end"] = gold[0]["window_start"]
    gold[1] = {**gold[2], "_events": 2}                   # the same window twice
    silver = samples.clean_rows(ORDERS, "silver", 5)
    silver[0]["customer"] = None
    silver[2]["order_id"] = silver[3]["order_id"]
    silver[4]["amount"] = -silver[4]["amount"]            # breaks the rule positive_amount
    cases = [(SENSORS, "gold/per_minute", gold), (ORDERS, "silver", silver)]

    def outcomes():
        return [[asdict(o) for o in _validate(spark, d, t, rows).outcomes] for d, t, rows in cases]

    with monkeypatch.context() as m:  # GX's own queries, each counted
        m.setattr(gx_spark, "skip_needless_queries", lambda: 0)
        for name, p in providers.items():
            m.setitem(p, gx_spark.ENGINE, (ours[name][0], counted(name, ours[name][1].__wrapped__)))
        theirs = outcomes()
    needless = [name for name, skip in reached if skip]
    assert sum(n.endswith(".unexpected_values") for n in needless) >= 10, reached
    assert needless.count(gx_spark.ROWS_QUERY_TABLE) >= 4, reached  # 2 rules, 2 passes
    reached.clear()
    for name, p in providers.items():  # ours, the same queries counted when they reach GX's
        test = getattr(gx_spark, skipped[name])
        monkeypatch.setitem(p, gx_spark.ENGINE,
                            (ours[name][0], gx_spark._skipping(counted(name, ours[name][1].__wrapped__), test)))
    monkeypatch.setattr(gx_spark, "skip_needless_queries", lambda: 0)
    assert outcomes() == theirs
    assert reached and not any(skip for _, skip in reached), reached  # only the examples reached Spark
    assert any(o["examples"] for case in theirs for o in case)
    assert any(o["key"] == "rule:positive_amount" and not o["success"] and o["observed_value"] == 1
               for case in theirs for o in case), theirs
