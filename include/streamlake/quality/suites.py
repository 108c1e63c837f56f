"""Expectation suites of a pipeline's tables, derived from its definition.

One suite per table (``bronze``, ``silver``, ``quarantine``, and each
aggregate's ``gold/<aggregate>`` and ``late_events/<aggregate>``), built from
the table contracts in :mod:`streamlake.pipeline.schemas` and the pipeline
definition (:mod:`streamlake.pipeline.definition`):

* **schema**: the exact column set, and each column's Spark type;
* **nulls**: the columns a row cannot do without (the definition's required
  fields, lineage, the keys and windows of gold);
* **rules**: every rule of the definition holds for every silver row (a Spark
  SQL query for the rows where it does not);
* **uniqueness**: the event id in silver (with an ``event_id``), the Kafka record
  (topic, partition, offset) in bronze and quarantine, the window key in gold;
* **gold window consistency**: ``window_end > window_start``, at least one event
  per window, ``count(*)`` measures equal to the window's events, and for a field
  with min, max (and avg) measures ``min <= avg <= max``;
* **quarantine reasons** from the definition's reasons;
* **freshness**: the newest time of the validated rows is at most ``max_age_s``
  old. Only while the job runs (a stopped job's data is legitimately old), and
  only when there are rows to judge.

Every check has a stable ``key`` (unique in its suite; results, tests and the
UI refer to it) and a GX ``severity``: ``critical`` fails the operation's task,
``warning`` lets it succeed and flags the result, ``info`` is only recorded.
The platform decides pass/fail from these severities
(:mod:`streamlake.quality.validate`), not from the suite's own ``success``,
which ignores them. Suites are named ``streamlake.<pipeline>.<table>`` (``/``
as ``.``), bronze of a job without a definition ``streamlake.bronze``.

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
DEFAULT_MAX_AGE_S = 15 * 60
SUITE_PREFIX = "streamlake"
LINEAGE = ("topic", "partition", "offset")


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
    name: str
    spec: TableSpec
    checks: tuple[Check, ...]
    freshness_column: str
    example_columns: tuple[str, ...]


def suite_name(table: str, definition=None) -> str:
    """``streamlake.<pipeline>.<table>`` (``/`` as ``.``; ``streamlake.bronze`` without a definition)."""
    parts = [SUITE_PREFIX] + ([definition.name] if definition is not None else []) + table.split("/")
    return ".".join(parts)


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
    return unique("kafka_record_unique", list(LINEAGE))


def rows_where(key: str, condition: str, description: str, severity: str = "critical") -> Check:
    """No row for which the Spark SQL ``condition`` holds (GX's UnexpectedRowsExpectation)."""
    return Check(key, "UnexpectedRowsExpectation",
                 {"unexpected_rows_query": f"SELECT * FROM {{batch}} WHERE {condition}"}, severity, description)


def _quoted(name: str) -> str:
    return f"`{name}`"


def bronze_suite(definition=None) -> SuiteSpec:
    from streamlake.pipeline.bronze import BRONZE

    return SuiteSpec("bronze", suite_name("bronze", definition), BRONZE, tuple(
        schema_checks(BRONZE)
        + not_null(["topic", "partition", "offset", "timestamp", "ingest_time", "batch_id", "ingest_date"])
        + not_null(["value"], "warning")
        + [between("partition_non_negative", "partition", 0), between("offset_non_negative", "offset", 0),
           _lineage_unique()]),
        freshness_column="timestamp", example_columns=LINEAGE)


def _silver_suite(definition) -> SuiteSpec:
    from streamlake.pipeline.schemas import silver_spec

    spec = silver_spec(definition)
    checks = (schema_checks(spec)
              + not_null([*definition.required, *LINEAGE, "bronze_version", "event_date"])
              + not_null(["kafka_timestamp"], "warning")
              + [rows_where(f"rule:{r.name}", f"NOT coalesce(({r.check}), false)", f"rule {r.name}: {r.check}")
                 for r in definition.rules])
    if definition.event_id:
        checks.append(unique("event_id_unique", [definition.event_id]))
    return SuiteSpec("silver", suite_name("silver", definition), spec, tuple(checks),
                     freshness_column=definition.event_time, example_columns=LINEAGE)


def _quarantine_suite(definition) -> SuiteSpec:
    from streamlake.pipeline.schemas import QUARANTINE

    return SuiteSpec("quarantine", suite_name("quarantine", definition), QUARANTINE, tuple(
        schema_checks(QUARANTINE)
        + not_null([*LINEAGE, "reason", "bronze_version", "quarantined_at", "ingest_date"])
        + not_null(["message"], "warning")
        + [Check("reason_known", "ExpectColumnValuesToBeInSet",
                 {"column": "reason", "value_set": list(definition.quarantine_reasons())},
                 description="reason is one of the pipeline's quarantine reasons"),
           _lineage_unique()]),
        freshness_column="kafka_timestamp", example_columns=LINEAGE)


def _gold_suite(definition, aggregate) -> SuiteSpec:
    from streamlake.pipeline.schemas import EVENTS_COLUMN, gold_spec

    spec = gold_spec(definition, aggregate)
    keys = list(aggregate.keys)
    checks = (schema_checks(spec)
              + not_null([*keys, "window_start", "window_end", EVENTS_COLUMN, "window_date"])
              + [greater("window_end_after_start", "window_end", "window_start", or_equal=False),
                 between("events_at_least_1", EVENTS_COLUMN, 1),
                 unique("window_unique", [*keys, "window_start", "window_end"])])
    by_field: dict[str, dict[str, str]] = {}
    for m in aggregate.measures:
        if m.function == "count":
            if m.field is None:
                checks.append(rows_where(f"count_is_events:{m.column}", f"{_quoted(m.column)} != {EVENTS_COLUMN}",
                                         f"{m.column} (count(*)) equals the window's events"))
            else:
                checks.append(between(f"count_in_range:{m.column}", m.column, 0))
        elif m.field is not None:
            by_field.setdefault(m.field, {})[m.function] = m.column
    for field_name, functions in by_field.items():
        low, high, mean = functions.get("min"), functions.get("max"), functions.get("avg")
        if low and high:
            checks.append(greater(f"min_not_above_max:{field_name}", high, low, or_equal=True))
        if mean and low and definition.field(field_name).type.numeric:
            checks.append(greater(f"avg_not_below_min:{field_name}", mean, low, or_equal=True))
        if mean and high and definition.field(field_name).type.numeric:
            checks.append(greater(f"max_not_below_avg:{field_name}", high, mean, or_equal=True))
    return SuiteSpec(aggregate.gold_table, suite_name(aggregate.gold_table, definition), spec, tuple(checks),
                     freshness_column="window_end", example_columns=tuple([*keys, "window_start"]))


def _late_suite(definition, aggregate) -> SuiteSpec:
    from streamlake.pipeline.schemas import late_spec

    spec = late_spec(definition, aggregate)
    return SuiteSpec(aggregate.late_table, suite_name(aggregate.late_table, definition), spec, tuple(
        schema_checks(spec)
        + not_null([*definition.required, *LINEAGE, "watermark", "arrived_at", "applied", "event_date"])
        + [Check("applied_has_time", "ExpectColumnValuesToNotBeNull",
                 {"column": "applied_at", "row_condition": ("applied", "==", True)},
                 "warning", "an applied late event has applied_at")]),
        freshness_column="arrived_at", example_columns=LINEAGE)


def pipeline_suites(definition) -> dict[str, SuiteSpec]:
    """Every table's suite of a pipeline, by table name (bronze only without a definition)."""
    if definition is None:
        return {"bronze": bronze_suite()}
    out = {"bronze": bronze_suite(definition), "silver": _silver_suite(definition),
           "quarantine": _quarantine_suite(definition)}
    for aggregate in definition.aggregates:
        out[aggregate.gold_table] = _gold_suite(definition, aggregate)
        out[aggregate.late_table] = _late_suite(definition, aggregate)
    return out


def suite_spec(table: str, definition=None) -> SuiteSpec:
    """The suite of one of the pipeline's tables. Raises KeyError naming the pipeline's tables."""
    suites = pipeline_suites(definition)
    try:
        return suites[table]
    except KeyError:
        what = f"pipeline {definition.name}" if definition is not None else "a job without a definition"
        raise KeyError(f"{what} has no table {table!r} to validate (its tables: {', '.join(suites)})") from None


def freshness_check(column: str, max_age_s: float, now: dt.datetime | None = None) -> Check:
    """The newest ``column`` value is at least ``now - max_age_s`` (warning).

    The bound is a naive local datetime, the form in which PySpark returns
    timestamps to the driver (what GX compares it with)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    bound = dt.datetime.fromtimestamp(now.timestamp() - max_age_s).replace(microsecond=0)
    return Check("freshness", "ExpectColumnMaxToBeBetween", {"column": column, "min_value": bound}, "warning",
                 f"newest {column} at most {max_age_s:g} s old (checked while the job runs)")


def checks_for(table: str, definition=None, *, job_running: bool = False, max_age_s: float = DEFAULT_MAX_AGE_S,
               now: dt.datetime | None = None, has_rows: bool = True) -> list[Check]:
    """The checks of ``table``'s suite for one validation: freshness only while the job runs
    and there are rows to judge."""
    spec = suite_spec(table, definition)
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


def build_suite(table: str, definition=None, checks: list[Check] | None = None):
    """A GX ``ExpectationSuite`` for ``table`` (see :func:`suite_name`) with ``checks``
    (default: the table's checks without freshness); each expectation carries its key in
    ``meta`` and ``key [severity]: description`` as its description (what Data Docs show)."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    spec = suite_spec(table, definition)
    expectations = [
        getattr(gxe, check.expectation)(**_gx_kwargs(check.kwargs), severity=check.severity,
                                        meta={"key": check.key}, description=check.label)
        for check in (spec.checks if checks is None else checks)
    ]
    return gx.ExpectationSuite(name=spec.name, expectations=expectations)
