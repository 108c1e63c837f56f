"""Validate the rows an operation touched with Great Expectations; decide by severity.

:func:`validate_table` reads the rows that a table's commits
``(from_version, to_version]`` added (:mod:`streamlake.delta.changes`; the
whole snapshot when ``from_version`` is None), runs the table's suite (derived
from the pipeline's definition, :mod:`streamlake.quality.suites`) on them with
GX 1.x on Spark, records one row per expectation in ``quality_results``
(:mod:`streamlake.quality.results`) and rebuilds the Data Docs
(:mod:`streamlake.quality.docs`).

The verdict is the platform's, from each expectation's ``severity``:

* ``FAIL``: a ``critical`` expectation failed (or could not be evaluated);
* ``WARN``: only ``warning`` expectations failed: the operation succeeds,
  the result is flagged;
* ``PASS``: nothing failed but, possibly, ``info`` expectations.

GX's own ``success`` of the suite ignores severities and is not used.
:func:`validate_operation` validates several tables for one operation and
raises :class:`QualityError`, listing every failing critical expectation, if
any table failed; that is what fails an Airflow task.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from streamlake.errors import StreamLakeError
from streamlake.quality.suites import (
    DEFAULT_MAX_AGE_S,
    Check,
    build_suite,
    checks_for,
    suite_name,
    suite_spec,
)

log = logging.getLogger(__name__)

EXAMPLES = 5
_TEXT_LIMIT = 1000
# Result formats of the two passes of validate_dataframe: counts and observed values only,
# then, when an expectation failed, up to EXAMPLES unexpected rows with their lineage.
QUICK_RESULT_FORMAT = {"result_format": "SUMMARY", "partial_unexpected_count": 0,
                       "return_unexpected_index_query": False}
EXAMPLES_RESULT_FORMAT = {"result_format": "SUMMARY", "partial_unexpected_count": EXAMPLES}


class QualityError(StreamLakeError):
    """A critical expectation failed; the message lists every failing expectation."""

    def __init__(self, message: str, reports: list[QualityReport] | None = None):
        super().__init__(message)
        self.reports = reports or []


@dataclass
class ExpectationOutcome:
    key: str
    expectation: str
    column: str | None
    severity: str
    success: bool
    description: str = ""
    kwargs: dict = field(default_factory=dict)
    observed_value: object = None
    unexpected_count: int | None = None
    unexpected_percent: float | None = None
    examples: list = field(default_factory=list)
    exception: str | None = None

    def line(self) -> str:
        what = f"{self.key} [{self.severity}] {self.expectation}"
        if self.column:
            what += f"({self.column})"
        if self.exception:
            return f"{what}: could not be evaluated: {self.exception}"
        bits = []
        if self.unexpected_count:
            bits.append(f"{self.unexpected_count} unexpected")
        if self.observed_value is not None:
            bits.append(f"observed {_short(self.observed_value, 120)}")
        if self.examples:
            bits.append(f"e.g. {_short(self.examples[:3], 200)}")
        return what + (": " + ", ".join(bits) if bits else "")


@dataclass
class QualityReport:
    """One suite run on one table's rows, with the platform's verdict."""

    validation_id: str
    run_id: str
    operation: str
    table: str
    path: str | None
    suite: str
    from_version: int | None
    to_version: int | None
    rows: int
    validated_at: dt.datetime
    outcomes: list[ExpectationOutcome]
    docs_page: str | None = None
    context: dict = field(default_factory=dict)
    result_id: object = field(default=None, repr=False, compare=False)  # GX ValidationResultIdentifier
    # Set when no commit added rows since an earlier validation that passed: the
    # summary (streamlake.quality.results.summarize) of that validation, which covers
    # this version. Nothing was run and nothing is recorded for this report.
    covered_by: dict | None = None

    @property
    def failures(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if not o.success]

    @property
    def critical_failures(self) -> list[ExpectationOutcome]:
        return [o for o in self.failures if o.severity == "critical"]

    @property
    def warnings(self) -> list[ExpectationOutcome]:
        return [o for o in self.failures if o.severity == "warning"]

    @property
    def status(self) -> str:
        if self.covered_by:
            return self.covered_by["status"]
        if self.critical_failures:
            return "FAIL"
        return "WARN" if self.warnings else "PASS"

    @property
    def passed(self) -> bool:
        """No critical expectation failed (warnings allowed)."""
        return not self.critical_failures

    def failing_keys(self, severity: str | None = None) -> set[str]:
        return {o.key for o in self.failures if severity is None or o.severity == severity}

    def outcome(self, key: str) -> ExpectationOutcome:
        for o in self.outcomes:
            if o.key == key:
                return o
        raise KeyError(f"{self.suite} has no expectation {key!r}")

    @property
    def version_range(self) -> str:
        if self.to_version is None:
            return "DataFrame"
        return f"v{self.to_version} (snapshot)" if self.from_version is None else \
            f"(v{self.from_version}, v{self.to_version}]"

    def summary(self) -> str:
        if self.covered_by:
            c = self.covered_by
            return (f"[{self.operation}] {self.table} unchanged since v{c['to_version']} "
                    f"(no rows added up to v{self.to_version}): nothing new to validate; "
                    f"{c['status']} by {c['validation_id']} ({c['operation']}, {c['rows']} rows, "
                    f"{c['passed']}/{c['expectations']} expectations met)")
        head = (f"[{self.operation}] {self.table} {self.version_range}, {self.rows} rows, suite {self.suite}: "
                f"{self.status} ({len(self.outcomes) - len(self.failures)}/{len(self.outcomes)} expectations met")
        head += f"; {len(self.critical_failures)} critical, {len(self.warnings)} warning failures)"
        lines = [head] + [f"  {'CRITICAL' if o.severity == 'critical' else o.severity.upper()}: {o.line()}"
                          for o in sorted(self.failures, key=lambda o: (o.severity != "critical", o.key))]
        if self.docs_page:
            lines.append(f"  Data Docs: {self.docs_page}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"validation_id": self.validation_id, "run_id": self.run_id, "operation": self.operation,
                "table": self.table, "path": self.path, "suite": self.suite, "from_version": self.from_version,
                "to_version": self.to_version, "rows": self.rows, "status": self.status,
                "validated_at": self.validated_at.isoformat(),
                "critical_failures": sorted(o.key for o in self.critical_failures),
                "warnings": sorted(o.key for o in self.warnings), "docs_page": self.docs_page,
                "covered_by": self.covered_by and self.covered_by["validation_id"],
                "expectations": [asdict(o) for o in self.outcomes]}


def _short(value, limit: int = _TEXT_LIMIT) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _new_id(prefix: str, now: dt.datetime) -> str:
    return f"{prefix}-{now.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def _outcome(result, checks: Mapping[str, Check]) -> ExpectationOutcome:
    cfg = result.expectation_config
    key = (cfg.meta or {}).get("key") or cfg.type
    check = checks.get(key)
    severity = getattr(cfg.severity, "value", cfg.severity) or "critical"
    res = result.result or {}
    info = result.exception_info or {}
    exception = None
    if info.get("raised_exception"):
        exception = info.get("exception_message") or "exception"
    elif info and "raised_exception" not in info:  # keyed by metric: any raised
        raised = [v.get("exception_message") for v in info.values() if isinstance(v, dict) and v.get("raised_exception")]
        exception = "; ".join(m or "exception" for m in raised) or None
    examples = res.get("partial_unexpected_index_list") or res.get("partial_unexpected_list") or []
    kwargs = {k: v for k, v in (check.kwargs if check else cfg.kwargs).items() if k != "batch_id"}
    return ExpectationOutcome(
        key=key, expectation=cfg.type, column=check.column if check else cfg.kwargs.get("column"),
        severity=str(severity), success=bool(result.success) and exception is None,
        description=check.description if check else (cfg.description or ""), kwargs=kwargs,
        observed_value=res.get("observed_value"), unexpected_count=res.get("unexpected_count"),
        unexpected_percent=res.get("unexpected_percent"),
        examples=json.loads(json.dumps(list(examples)[:EXAMPLES], default=str)), exception=exception)


def _result_rows(report: QualityReport) -> list[dict]:
    ctx = report.context or {}
    return [{
        "run_id": report.run_id, "validation_id": report.validation_id, "operation": report.operation,
        "validated_at": report.validated_at, "table_name": report.table, "table_path": report.path,
        "from_version": report.from_version, "to_version": report.to_version, "rows": report.rows,
        "suite": report.suite, "expectation_key": o.key, "expectation": o.expectation, "column_name": o.column,
        "kwargs": _short(o.kwargs), "severity": o.severity, "success": o.success,
        "observed_value": None if o.observed_value is None else _short(o.observed_value),
        "unexpected_count": o.unexpected_count, "unexpected_percent": o.unexpected_percent,
        "examples": _short(o.examples) if o.examples else None, "exception": o.exception,
        "status": report.status, "docs_page": report.docs_page,
        "dag_id": ctx.get("dag_id"), "dag_run_id": ctx.get("run_id"), "task_id": ctx.get("task_id"),
        "context": _short(ctx),
    } for o in report.outcomes]


def validate_dataframe(df, table: str, *, definition=None, operation: str = "manual", path: str | None = None,
                       from_version: int | None = None, to_version: int | None = None,
                       context: Mapping | None = None, job_running: bool = False,
                       max_age_s: float = DEFAULT_MAX_AGE_S, run_id: str | None = None,
                       now: dt.datetime | None = None, record: bool = True, build_docs: bool = True,
                       gx_context=None) -> QualityReport:
    """Run ``table``'s suite (of ``definition``'s pipeline) on ``df`` (rows already selected)
    and return the report; with ``record``, append the results to ``quality_results``; with
    ``build_docs``, rebuild the Data Docs. Never raises for failing expectations."""
    now = now or dt.datetime.now(dt.timezone.utc)
    spec = suite_spec(table, definition)
    run_id = run_id or _new_id("q", now)
    validation_id = _new_id("qv", now)
    # GX persists the batch's DataFrame and never releases it: persisted here first, the row
    # count fills the cache GX's jobs read, and it is released after (unless the caller cached it).
    cached_by_caller = df.is_cached
    df = df.persist()
    try:
        return _validate_persisted(df, table, spec, definition, operation=operation, path=path,
                                   from_version=from_version,
                                   to_version=to_version, context=context, job_running=job_running,
                                   max_age_s=max_age_s, run_id=run_id, validation_id=validation_id, now=now,
                                   record=record, build_docs=build_docs, gx_context=gx_context)
    finally:
        if not cached_by_caller:
            df.unpersist()


def _validate_persisted(df, table: str, spec, definition, *, operation: str, path, from_version, to_version, context,
                        job_running: bool, max_age_s: float, run_id: str, validation_id: str, now: dt.datetime,
                        record: bool, build_docs: bool, gx_context) -> QualityReport:
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    from streamlake.quality import docs
    from streamlake.quality.gx_spark import skip_needless_queries

    skip_needless_queries()
    rows = df.count()
    checks = checks_for(table, definition, job_running=job_running, max_age_s=max_age_s, now=now,
                        has_rows=rows > 0)
    by_key = {c.key: c for c in checks}

    ctx = gx_context or docs.gx_context([definition] if definition is not None else ())
    suite = docs.replace_suite(ctx, build_suite(table, definition, checks))
    batch_definition = docs.batch_definition(ctx, spec.name)
    definition = gx.ValidationDefinition(name=f"{validation_id}", data=batch_definition, suite=suite)
    definition = ctx.validation_definitions.add(definition)
    gx_run = RunIdentifier(run_name=f"{operation}.{run_id}", run_time=now)
    # First without examples: on Spark, GX collects a map expectation's unexpected values and
    # their index columns in two jobs of their own even when it passes (most of a suite's
    # jobs; the limit(0) ones, and the rows of rule queries, which SUMMARY does not show,
    # are answered without Spark: streamlake.quality.gx_spark).
    # Outcomes of passing expectations are the same either way (success, counts, observed
    # values); only when something failed is the suite run again with examples.
    result = definition.run(batch_parameters={"dataframe": df}, run_id=gx_run, result_format=QUICK_RESULT_FORMAT)
    outcomes = [_outcome(r, by_key) for r in result.results]
    if not all(o.success for o in outcomes):
        result = definition.run(
            batch_parameters={"dataframe": df}, run_id=gx_run,
            result_format={**EXAMPLES_RESULT_FORMAT,
                           "unexpected_index_column_names": [c for c in spec.example_columns if c in df.columns]})
        outcomes = [_outcome(r, by_key) for r in result.results]
    order = {c.key: i for i, c in enumerate(checks)}
    outcomes.sort(key=lambda o: order.get(o.key, len(order)))

    batch_id = next((r.expectation_config.kwargs.get("batch_id") for r in result.results
                     if r.expectation_config.kwargs.get("batch_id")), f"{docs.DATASOURCE}-{spec.name}")
    result_id = ValidationResultIdentifier(expectation_suite_identifier=ExpectationSuiteIdentifier(name=suite.name),
                                           run_id=gx_run, batch_identifier=batch_id)
    report = QualityReport(
        validation_id=validation_id, run_id=run_id, operation=operation, table=table,
        path=None if path is None else str(path), suite=spec.name, from_version=from_version,
        to_version=to_version, rows=rows, validated_at=now, outcomes=outcomes,
        docs_page=docs.page_for(ctx, result_id), context=dict(context or {}), result_id=result_id)
    if record:
        from streamlake.quality.results import append_results

        append_results(_result_rows(report))
    if build_docs:
        try:
            docs.build(ctx, [result_id])
        except Exception as exc:  # noqa: BLE001 - the results are recorded; the docs are a view of them
            log.warning("Data Docs could not be rebuilt after %s: %s", validation_id, exc)
    log.info("%s", report.summary())
    return report


def validate_table(spark, table: str, path, from_version: int | None = None, to_version: int | None = None, *,
                   definition=None, operation: str, context: Mapping | None = None, job_running: bool = False,
                   max_age_s: float = DEFAULT_MAX_AGE_S, run_id: str | None = None, record: bool = True,
                   build_docs: bool = True, gx_context=None) -> QualityReport:
    """Validate the rows commits ``(from_version, to_version]`` of the table at ``path``
    added (the whole snapshot at ``to_version`` if ``from_version`` is None; latest
    version if ``to_version`` is None) with ``table``'s suite (of ``definition``'s pipeline;
    bronze needs none). Records the results and
    rebuilds the Data Docs; never raises for failing expectations (see
    :func:`require_quality`)."""
    from streamlake.delta.changes import read_changes

    df, rng = read_changes(spark, path, from_version, to_version)
    return validate_dataframe(df, table, definition=definition, operation=operation, path=str(path), from_version=rng.from_version,
                              to_version=rng.to_version, context=context, job_running=job_running,
                              max_age_s=max_age_s, run_id=run_id, record=record, build_docs=build_docs,
                              gx_context=gx_context)


def failure_message(reports: list[QualityReport]) -> str:
    failed = [r for r in reports if not r.passed]
    lines = [f"data quality: {len(failed)} of {len(reports)} validations have failing critical expectations"]
    for r in reports:
        lines.append(r.summary())
    return "\n".join(lines)


def require_quality(reports: list[QualityReport]) -> list[QualityReport]:
    """Raise :class:`QualityError` (listing every failing expectation) if a critical one failed."""
    if any(not r.passed for r in reports):
        raise QualityError(failure_message(reports), reports)
    return reports


def since_last_validation(job_tables: Mapping[str, str],
                          to_versions: Mapping[str, int | None] | None = None) -> dict[str, tuple]:
    """Ranges ``(last validated version, to_version)`` per table: what an operation
    that ends at ``to_versions`` (default: each table's latest) has not had validated
    yet. A table never validated gets ``(None, to)``: its whole snapshot."""
    from streamlake.quality.results import last_validated_version

    to_versions = to_versions or {}
    return {t: (last_validated_version(str(p)), to_versions.get(t)) for t, p in job_tables.items()}


def validate_operation(job_tables: Mapping[str, str], ranges: Mapping[str, tuple] | None = None,
                       operation: str = "manual", context: Mapping | None = None, *, definition=None, spark=None,
                       job_running: bool = False, max_age_s: float = DEFAULT_MAX_AGE_S,
                       raise_on_critical: bool = True) -> list[QualityReport]:
    """Validate every table an operation touched, record everything, and fail on critical.

    ``job_tables`` maps a table name (``bronze``, ``silver``, ``quarantine``,
    ``gold/<aggregate>``, ``late_events/<aggregate>``) of ``definition``'s pipeline to its
    path; ``ranges`` maps a table name to its
    ``(from_version, to_version)``. A table without a range is validated since its
    last recorded validation (:func:`streamlake.quality.results.last_validation`)
    up to its latest version, or whole if it was never validated. Tables that do not
    exist (yet) are skipped. All validations share one run id and the Data Docs are
    rebuilt once at the end. A table without a range whose commits since its last
    validation, which passed, added no rows (its rows are a subset of what was
    validated: after a savepoint, a restore) is not validated again, unless
    ``job_running`` asks for freshness, which depends on the time: its report is
    ``covered_by`` that validation, and nothing is run or recorded. Raises
    :class:`QualityError` if a critical expectation failed (with
    ``raise_on_critical``), after recording everything.
    """
    from streamlake.delta.changes import added_files
    from streamlake.delta.table import open_table, table_exists
    from streamlake.quality import docs
    from streamlake.quality.results import last_validation

    now = dt.datetime.now(dt.timezone.utc)
    run_id = _new_id("q", now)
    ranges = dict(ranges or {})
    ctx = None
    reports: list[QualityReport] = []
    for table, path in job_tables.items():
        if not table_exists(path):
            log.info("quality: %s at %s does not exist yet; skipped", table, path)
            continue
        rng = ranges.get(table)
        if rng is None:
            last = last_validation(str(path))
            version = open_table(path).version()
            if last and last["status"] != "FAIL" and not job_running and (
                    version <= last["to_version"] or not added_files(path, last["to_version"], version)[1]):
                report = QualityReport(
                    validation_id=_new_id("qv", now), run_id=run_id, operation=operation, table=table, path=str(path),
                    suite=suite_name(table, definition), from_version=last["to_version"], to_version=version, rows=0,
                    validated_at=now, outcomes=[], docs_page=last["docs_page"], context=dict(context or {}),
                    covered_by=last)
                log.info("%s", report.summary())
                reports.append(report)
                continue
            rng = (last["to_version"] if last else None, None)
        if spark is None:
            from streamlake.spark.session import get_spark

            spark = get_spark("streamlake-quality", master="local[1]", conf={"spark.ui.enabled": "false"})
        ctx = ctx or docs.gx_context([definition] if definition is not None else ())
        reports.append(validate_table(spark, table, path, rng[0], rng[1], definition=definition,
                                      operation=operation, context=context,
                                      job_running=job_running, max_age_s=max_age_s, run_id=run_id,
                                      build_docs=False, gx_context=ctx))
    if ctx is not None:
        try:
            docs.build(ctx, [r.result_id for r in reports if r.result_id is not None])
        except Exception as exc:  # noqa: BLE001 - the results are recorded; the docs are a view of them
            log.warning("Data Docs could not be rebuilt after quality run %s: %s", run_id, exc)
    if raise_on_critical:
        require_quality(reports)
    return reports

