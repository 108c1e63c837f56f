"""The expectation suites on pyspark 4.2.0 with ANSI mode on (Spark 4's default).

Great Expectations 1.24.1 declares ``pyspark<4.2`` for its Spark support, so
every expectation the suites use is proven here on small DataFrames in the
session's SparkSession: clean rows of every table pass every expectation (none
raises), and injected bad data (nulls, out-of-range values, duplicate event ids
in silver, a broken gold window, an unknown quarantine reason, stale data, a
wrong schema) makes exactly the expected expectations fail, with the expected
severity and the platform's verdict (FAIL on critical, WARN on warnings only).
Recording, Data Docs and the UI are covered by test_quality_results.py.
"""

from __future__ import annotations

import datetime as dt

import pytest
from streamlake.quality import samples, suites
from streamlake.quality.validate import validate_dataframe

UTC = dt.timezone.utc


def _validate(spark, table, rows, **kwargs):
    kwargs.setdefault("record", False)
    kwargs.setdefault("build_docs", False)
    return validate_dataframe(samples.dataframe(spark, table, rows), table, operation="test", **kwargs)


def _failing(report) -> dict[str, str]:
    return {o.key: o.severity for o in report.failures}


def test_ansi_mode_is_on(spark):
    assert spark.version.startswith("4.2")
    assert spark.conf.get("spark.sql.ansi.enabled").lower() == "true"


def test_suites_are_complete_and_well_formed():
    import great_expectations.expectations as gxe

    assert list(suites.suites()) == list(suites.TABLES) == suites.tables()
    for table, spec in suites.suites().items():
        keys = [c.key for c in spec.checks]
        assert len(keys) == len(set(keys)), f"duplicate keys in {table}"
        assert {c.severity for c in spec.checks} <= set(suites.SEVERITIES)
        for check in spec.checks:
            assert hasattr(gxe, check.expectation), check.expectation
        # schema: the exact column set and one type check per column
        assert keys[0] == "columns"
        assert {k.split(":", 1)[1] for k in keys if k.startswith("type:")} == set(spec.spec.schema.names)
        assert spec.freshness_column in spec.spec.schema.names
        assert set(spec.example_columns) <= set(spec.spec.schema.names)
        gx_suite = suites.build_suite(table)
        assert gx_suite.name == f"streamlake.{table}"
        assert [e.meta["key"] for e in gx_suite.expectations] == keys
        assert all(e.severity.value == c.severity for e, c in zip(gx_suite.expectations, spec.checks))
    # both severities are in use, and the decided ranges/sets are the contract's
    silver = {c.key: c for c in suites.suite_spec("silver").checks}
    assert silver["temperature_in_range"].kwargs == {"column": "temperature", "min_value": -60.0, "max_value": 80.0}
    assert silver["event_id_unique"].severity == "critical"
    assert silver["not_null:kafka_timestamp"].severity == "warning"
    gold = {c.key: c for c in suites.suite_spec("gold").checks}
    assert gold["count_at_least_1"].kwargs == {"column": "count", "min_value": 1}
    assert gold["window_end_after_start"].kwargs["or_equal"] is False
    from streamlake.pipeline.schemas import QUARANTINE_REASONS

    quarantine = {c.key: c for c in suites.suite_spec("quarantine").checks}
    assert quarantine["reason_known"].kwargs["value_set"] == list(QUARANTINE_REASONS)
    # freshness only while the job runs, and only with rows to judge
    assert "freshness" not in {c.key for c in suites.checks_for("silver")}
    assert "freshness" in {c.key for c in suites.checks_for("silver", job_running=True)}
    assert "freshness" not in {c.key for c in suites.checks_for("silver", job_running=True, has_rows=False)}
    fresh = suites.freshness_check("event_time", 600)
    assert fresh.severity == "warning" and fresh.kwargs["column"] == "event_time"


@pytest.mark.parametrize("table", suites.TABLES)
def test_clean_rows_pass_every_expectation(spark, table):
    report = _validate(spark, table, samples.clean_rows(table), job_running=True)
    assert report.status == "PASS", report.summary()
    assert report.rows == 4
    keys = [o.key for o in report.outcomes]
    assert keys == [c.key for c in suites.checks_for(table, job_running=True)]
    assert "freshness" in keys
    # every expectation was evaluated by GX on Spark 4.2 (none raised)
    assert all(o.exception is None and o.success for o in report.outcomes), report.summary()


def test_empty_rows_pass_and_skip_freshness(spark):
    report = _validate(spark, "silver", [], job_running=True)
    assert report.status == "PASS", report.summary()
    assert report.rows == 0 and "freshness" not in {o.key for o in report.outcomes}


def test_silver_nulls_out_of_range_and_duplicate_event_ids(spark):
    rows = samples.clean_rows("silver", 5)
    rows[0]["sensor_id"] = None
    rows[1]["temperature"] = 95.5
    rows[2]["event_id"] = rows[3]["event_id"]
    rows[4]["kafka_timestamp"] = None
    report = _validate(spark, "silver", rows)
    assert _failing(report) == {"not_null:sensor_id": "critical", "temperature_in_range": "critical",
                                "event_id_unique": "critical", "not_null:kafka_timestamp": "warning"}, report.summary()
    assert report.status == "FAIL" and not report.passed
    hot = report.outcome("temperature_in_range")
    assert hot.unexpected_count == 1
    assert hot.examples == [{"topic": "sensors", "partition": 1, "offset": 1, "temperature": 95.5}]
    dup = report.outcome("event_id_unique")
    assert dup.unexpected_count == 2
    assert sorted(e["offset"] for e in dup.examples) == [2, 3]
    assert report.outcome("not_null:sensor_id").examples[0]["offset"] == 0


def test_silver_warning_only_is_flagged_not_failed(spark):
    rows = samples.clean_rows("silver")
    rows[1]["kafka_timestamp"] = None
    report = _validate(spark, "silver", rows)
    assert _failing(report) == {"not_null:kafka_timestamp": "warning"}
    assert report.status == "WARN" and report.passed


def test_gold_broken_windows(spark):
    rows = samples.clean_rows("gold", 5)
    rows[0]["window_end"] = rows[0]["window_start"]                      # empty window
    rows[1]["count"] = 0                                                 # count < 1
    rows[2]["avg_temperature"] = rows[2]["max_temperature"] + 0.5        # avg > max
    rows[3]["min_temperature"] = -70.0                                   # min out of range (warning only)
    rows[4]["avg_temperature"] = rows[4]["min_temperature"] - 0.25       # avg < min
    report = _validate(spark, "gold", rows)
    assert _failing(report) == {"window_end_after_start": "critical", "count_at_least_1": "critical",
                                "max_not_below_avg": "critical", "avg_not_below_min": "critical",
                                "min_temperature_in_range": "warning"}, report.summary()
    assert report.status == "FAIL"
    assert all(o.unexpected_count == 1 for o in report.failures)
    assert report.outcome("window_end_after_start").examples[0]["sensor_id"] == "s-0"


def test_gold_duplicate_window(spark):
    rows = samples.clean_rows("gold", 3)
    rows[2] = dict(rows[1])
    report = _validate(spark, "gold", rows)
    assert _failing(report) == {"window_unique": "critical"}, report.summary()


def test_quarantine_unknown_reason_and_nulls(spark):
    rows = samples.clean_rows("quarantine", 4)
    rows[0]["reason"] = "cosmic_ray"
    rows[1]["message"] = None
    rows[2]["offset"] = None
    report = _validate(spark, "quarantine", rows)
    assert _failing(report) == {"reason_known": "critical", "not_null:message": "warning",
                                "not_null:offset": "critical"}, report.summary()
    unknown = report.outcome("reason_known")
    assert unknown.unexpected_count == 1 and unknown.examples[0]["reason"] == "cosmic_ray"


def test_bronze_offsets_nulls_and_duplicate_records(spark):
    rows = samples.clean_rows("bronze", 5)
    rows[0]["offset"] = -1
    rows[1]["topic"] = None
    rows[3].update(partition=rows[2]["partition"], offset=rows[2]["offset"])  # the same Kafka record twice
    rows[4]["value"] = None
    report = _validate(spark, "bronze", rows)
    assert _failing(report) == {"offset_non_negative": "critical", "not_null:topic": "critical",
                                "kafka_record_unique": "critical", "not_null:value": "warning"}, report.summary()


def test_late_events_checks(spark):
    rows = samples.clean_rows("late_events", 4)
    rows[0]["temperature"] = 120.0
    rows[1].update(applied=True, applied_at=None)
    rows[2]["event_time"] = None
    report = _validate(spark, "late_events", rows)
    assert _failing(report) == {"temperature_in_range": "critical", "applied_has_time": "warning",
                                "not_null:event_time": "critical"}, report.summary()


def test_freshness_only_while_the_job_runs(spark):
    old = dt.datetime.now(UTC) - dt.timedelta(hours=2)
    rows = samples.clean_rows("silver", now=old)
    running = _validate(spark, "silver", rows, job_running=True, max_age_s=600)
    assert _failing(running) == {"freshness": "warning"}, running.summary()
    assert running.status == "WARN"
    assert running.outcome("freshness").observed_value  # the newest event time
    stopped = _validate(spark, "silver", rows, job_running=False)
    assert stopped.status == "PASS" and "freshness" not in {o.key for o in stopped.outcomes}


def test_schema_changes(spark):
    from pyspark.sql import functions as F

    df = samples.dataframe(spark, "silver", samples.clean_rows("silver"))
    # a column of another type
    narrowed = df.withColumn("bronze_version", F.col("bronze_version").cast("int"))
    report = validate_dataframe(narrowed, "silver", operation="test", record=False, build_docs=False)
    assert _failing(report) == {"type:bronze_version": "critical"}, report.summary()
    assert report.outcome("type:bronze_version").observed_value == "IntegerType"
    assert not narrowed.is_cached, "the DataFrame GX persisted is released after the validation"
    # an extra column
    report = validate_dataframe(df.withColumn("surprise", F.lit(1)), "silver", operation="test", record=False,
                                build_docs=False)
    assert _failing(report) == {"columns": "critical"}, report.summary()
    # a missing column: the column set fails, and so does every expectation on that column
    report = validate_dataframe(df.drop("kafka_timestamp"), "silver", operation="test", record=False,
                                build_docs=False)
    assert _failing(report) == {"columns": "critical", "type:kafka_timestamp": "critical",
                                "not_null:kafka_timestamp": "warning"}, report.summary()
    assert report.outcome("type:kafka_timestamp").exception
