"""Expectation suites for the pipeline's tables, as code versioned with the repository.

One suite per table (``bronze``, ``silver``, ``quarantine``, ``gold``,
``late_events``), built from the table contracts in
:mod:`streamlake.pipeline.schemas` and :mod:`streamlake.pipeline.bronze`:

* **schema**: the exact column set, and each column's Spark type;
* **nulls**: the columns a row cannot do without;
* **value ranges**: temperature -60..80 °C in silver and late events, offsets
  and partitions >= 0 in bronze, ``count >= 1`` in gold;
* **uniqueness**: ``event_id`` in silver, the Kafka record (topic, partition,
  offset) in bronze and quarantine, the window key in gold;
* **gold window consistency**: ``window_end > window_start``,
  ``min <= avg <= max``, ``count >= 1``;
* **quarantine reasons** from :data:`~streamlake.pipeline.schemas.QUARANTINE_REASONS`;
* **freshness**: the newest event time of the validated rows is at most
  ``max_age_s`` old. Only while the job runs (a stopped job's data is
  legitimately old), and only when there are rows to judge.

Every check has a stable ``key`` (unique in its suite; results, tests and the
UI refer to it) and a GX ``severity``: ``critical`` fails the operation's task,
``warning`` lets it succeed and flags the result, ``info`` is only recorded.
The platform decides pass/fail from these severities
(:mod:`streamlake.quality.validate`), not from the suite's own ``success``,
which ignores them.

Every expectation used here is tested on pyspark 4.2.0 with ANSI mode on
(``tests/test_quality_suites.py``); GX 1.24.1 declares ``pyspark<4.2``.
Importing this module does not import Great Expectations (slow); only
:func:`build_suite` does.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamlake.delta.table import TableSpec

SEVERITIES = ("critical", "warning", "info")
TABLES = ("bronze", "silver", "quarantine", "gold", "late_events")
DEFAULT_MAX_AGE_S = 15 * 60
SUITE_PREFIX = "streamlake"


@dataclass(frozen=True)
class Check:
    """One expectation of a suite: a GX expectation class (by name, from
    ``great_expectations.expectations``) with its arguments, a key and a severity."""

    key: str
    expectation: str
    kwargs: Mapping = field(default_factory=dict)
    severity: str = "critical"
    description: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"check {self.key}: severity must be one of {SEVERITIES}, got {self.severity!r}")

    @property
    def label(self) -> str:
        """What Data Docs show for the expectation: key, severity and description."""
        return f"{self.key} [{self.severity}]: {self.description or self.expectation}"

    @property
    def column(self) -> str | None:
        kw = self.kwargs
        if "column" in kw:
            return kw["column"]
        if "column_A" in kw:
            return f"{kw['column_A']}, {kw['column_B']}"
        if "column_list" in kw:
            return ", ".join(kw["column_list"])
        return None


@dataclass(frozen=True)
class SuiteSpec:
    """A table's suite: its checks (without freshness), the column freshness is measured on,
    and the columns that identify a failing row in the results' examples."""

    table: str
    spec: TableSpec
    checks: tuple[Check, ...]
    freshness_column: str
    example_columns: tuple[str, ...]

    @property
    def name(self) -> str:
        return suite_name(self.table)


def suite_name(table: str) -> str:
    return f"{SUITE_PREFIX}.{table}"


def spark_type_name(arrow_type) -> str:
    """The pyspark.sql.types class name a column of this Arrow type reads as."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    return type(from_arrow_schema(pa.schema([("c", arrow_type)]))["c"].dataType).__name__


def schema_checks(spec: TableSpec) -> list[Check]:
    """The exact column set (critical) and each column's type (critical)."""
    checks = [Check("columns", "ExpectTableColumnsToMatchSet",
                    {"column_set": list(spec.schema.names), "exact_match": True},
                    description=f"exactly the {spec.name} columns")]
    for f in spec.schema:
        name = spark_type_name(f.type)
        checks.append(Check(f"type:{f.name}", "ExpectColumnValuesToBeOfType", {"column": f.name, "type_": name},
                            description=f"{f.name} is {name}"))
    return checks


def not_null(columns, severity: str = "critical") -> list[Check]:
    return [Check(f"not_null:{c}", "ExpectColumnValuesToNotBeNull", {"column": c}, severity, f"{c} is never null")
            for c in columns]


def between(key: str, column: str, low=None, high=None, severity: str = "critical") -> Check:
    kwargs = {"column": column}
    if low is not None:
        kwargs["min_value"] = low
    if high is not None:
        kwargs["max_value"] = high
    bounds = f"{'' if low is None else low}..{'' if high is None else high}"
    return Check(key, "ExpectColumnValuesToBeBetween", kwargs, severity, f"{column} in {bounds}")


def unique(key: str, columns, severity: str = "critical") -> Check:
    columns = list(columns)
    if len(columns) == 1:
        return Check(key, "ExpectColumnValuesToBeUnique", {"column": columns[0]}, severity,
                     f"{columns[0]} is unique")
    return Check(key, "ExpectCompoundColumnsToBeUnique", {"column_list": columns}, severity,
                 f"({', '.join(columns)}) is unique")


def greater(key: str, a: str, b: str, or_equal: bool, severity: str = "critical") -> Check:
    return Check(key, "ExpectColumnPairValuesAToBeGreaterThanB",
                 {"column_A": a, "column_B": b, "or_equal": or_equal}, severity,
                 f"{a} {'>=' if or_equal else '>'} {b}")


def _lineage_unique() -> Check:
    return unique("kafka_record_unique", ["topic", "partition", "offset"])


def _suites() -> dict[str, SuiteSpec]:
    from streamlake.pipeline.bronze import BRONZE
    from streamlake.pipeline.schemas import (
        GOLD,
        LATE_EVENTS,
        QUARANTINE,
        QUARANTINE_REASONS,
        SILVER,
        TEMPERATURE_RANGE,
    )

    lo, hi = TEMPERATURE_RANGE
    lineage = ("topic", "partition", "offset")
    return {s.table: s for s in (
        SuiteSpec("bronze", BRONZE, tuple(
            schema_checks(BRONZE)
            + not_null(["topic", "partition", "offset", "timestamp", "ingest_time", "batch_id", "ingest_date"])
            + not_null(["value"], "warning")
            + [between("partition_non_negative", "partition", 0),
               between("offset_non_negative", "offset", 0),
               _lineage_unique()]),
            freshness_column="timestamp", example_columns=lineage),
        SuiteSpec("silver", SILVER, tuple(
            schema_checks(SILVER)
            + not_null(["event_id", "sensor_id", "event_time", "temperature", "topic", "partition", "offset",
                        "bronze_version", "event_date"])
            + not_null(["kafka_timestamp"], "warning")
            + [between("temperature_in_range", "temperature", lo, hi),
               unique("event_id_unique", ["event_id"])]),
            freshness_column="event_time", example_columns=lineage),
        SuiteSpec("quarantine", QUARANTINE, tuple(
            schema_checks(QUARANTINE)
            + not_null(["topic", "partition", "offset", "reason", "bronze_version", "quarantined_at",
                        "ingest_date"])
            + not_null(["message"], "warning")
            + [Check("reason_known", "ExpectColumnValuesToBeInSet",
                     {"column": "reason", "value_set": list(QUARANTINE_REASONS)},
                     description="reason is one of the known quarantine reason codes"),
               _lineage_unique()]),
            freshness_column="kafka_timestamp", example_columns=lineage),
        SuiteSpec("gold", GOLD, tuple(
            schema_checks(GOLD)
            + not_null(["sensor_id", "window_start", "window_end", "count", "sum_temperature", "min_temperature",
                        "max_temperature", "avg_temperature", "window_date"])
            + [greater("window_end_after_start", "window_end", "window_start", or_equal=False),
               between("count_at_least_1", "count", 1),
               greater("avg_not_below_min", "avg_temperature", "min_temperature", or_equal=True),
               greater("max_not_below_avg", "max_temperature", "avg_temperature", or_equal=True),
               unique("window_unique", ["sensor_id", "window_start", "window_end"]),
               between("min_temperature_in_range", "min_temperature", lo, hi, "warning"),
               between("max_temperature_in_range", "max_temperature", lo, hi, "warning")]),
            freshness_column="window_end", example_columns=("sensor_id", "window_start")),
        SuiteSpec("late_events", LATE_EVENTS, tuple(
            schema_checks(LATE_EVENTS)
            + not_null(["event_id", "sensor_id", "event_time", "temperature", "topic", "partition", "offset",
                        "watermark", "arrived_at", "applied", "event_date"])
            + [between("temperature_in_range", "temperature", lo, hi),
               Check("applied_has_time", "ExpectColumnValuesToNotBeNull",
                     {"column": "applied_at", "row_condition": ("applied", "==", True)},
                     "warning", "an applied late event has applied_at")]),
            freshness_column="arrived_at", example_columns=lineage),
    )}


_SUITES: dict[str, SuiteSpec] | None = None


def suites() -> dict[str, SuiteSpec]:
    """Every table's suite spec, by table name."""
    global _SUITES
    if _SUITES is None:
        _SUITES = _suites()
    return _SUITES


def tables() -> list[str]:
    """The tables that have a suite (cheap: builds nothing)."""
    return list(TABLES)


def suite_spec(table: str) -> SuiteSpec:
    try:
        return suites()[table]
    except KeyError:
        raise KeyError(f"no quality suite for table {table!r} (known: {', '.join(suites())})") from None


def freshness_check(column: str, max_age_s: float, now: dt.datetime | None = None) -> Check:
    """The newest ``column`` value is at least ``now - max_age_s`` (warning).

    The bound is a naive local datetime, the form in which PySpark returns
    timestamps to the driver (what GX compares it with)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    bound = dt.datetime.fromtimestamp(now.timestamp() - max_age_s).replace(microsecond=0)
    return Check("freshness", "ExpectColumnMaxToBeBetween", {"column": column, "min_value": bound}, "warning",
                 f"newest {column} at most {max_age_s:g} s old (checked while the job runs)")


def checks_for(table: str, *, job_running: bool = False, max_age_s: float = DEFAULT_MAX_AGE_S,
               now: dt.datetime | None = None, has_rows: bool = True) -> list[Check]:
    """The checks of ``table``'s suite for one validation: freshness only while the job runs
    and there are rows to judge."""
    spec = suite_spec(table)
    checks = list(spec.checks)
    if job_running and has_rows:
        checks.append(freshness_check(spec.freshness_column, max_age_s, now))
    return checks


def _gx_kwargs(kwargs: Mapping) -> dict:
    """Check arguments as GX takes them: a ``row_condition`` given as ``(column, op, value)``
    becomes a GX condition object (string conditions are deprecated in GX 1.9+)."""
    out = dict(kwargs)
    cond = out.get("row_condition")
    if isinstance(cond, tuple):
        import operator

        from great_expectations.expectations.row_conditions import Column

        column, op, value = cond
        ops = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
               ">=": operator.ge}
        out["row_condition"] = ops[op](Column(column), value)
    return out


def build_suite(table: str, checks: list[Check] | None = None):
    """A GX ``ExpectationSuite`` named ``streamlake.<table>`` with ``checks`` (default: the
    table's checks without freshness); each expectation carries its key in ``meta`` and
    ``key [severity]: description`` as its description (what Data Docs show)."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    expectations = [
        getattr(gxe, check.expectation)(**_gx_kwargs(check.kwargs), severity=check.severity,
                                        meta={"key": check.key}, description=check.label)
        for check in (suite_spec(table).checks if checks is None else checks)
    ]
    return gx.ExpectationSuite(name=suite_name(table), expectations=expectations)
