"""The ``quality_results`` platform table, and the queries the UI and the CLI make of it.

One row per expectation per validation, appended under the platform root
(:mod:`streamlake.delta.records`: ``$STREAMLAKE_HOME/data/_platform`` or an
object-store URI), next to ``consistency_checks``; blind Delta appends, so
concurrent tasks do not conflict. A *validation* is one suite run on one table's rows; a *run* is
one operation's validations (:func:`streamlake.quality.validate.validate_operation`).

Columns: ``run_id``, ``validation_id``, ``operation``, ``validated_at``,
``table_name``, ``table_path``, ``from_version``/``to_version`` (the Delta
version range ``(from, to]``; ``from`` null for a whole snapshot), ``rows``
(rows validated), ``suite``, ``expectation_key`` (the check's stable key),
``expectation`` (GX type), ``column_name``, ``kwargs`` (JSON), ``severity``,
``success``, ``observed_value`` (JSON), ``unexpected_count``,
``unexpected_percent``, ``examples`` (JSON: up to 5 failing values with the
row's lineage), ``exception``, ``status`` (the validation's verdict by
severity: PASS, WARN or FAIL), ``docs_page`` (its Data Docs page, relative to
the Data Docs folder), ``dag_id``, ``dag_run_id``, ``task_id`` and ``context``
(JSON) of the operation.

The table grows by a few dozen rows per validation, thousands of validations a
day on `make run`. Its appends are compacted
(:func:`streamlake.delta.records.compact_if_needed`), and the queries choose
their validations in Arrow: only the rows of the validations a query returns
become Python objects.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from streamlake.delta.table import TableSpec
from streamlake.delta.records import append_rows, platform_rows

TS = pa.timestamp("us", tz="UTC")

QUALITY_RESULTS = TableSpec(
    name="quality_results",
    schema=pa.schema([
        ("run_id", pa.string()), ("validation_id", pa.string()), ("operation", pa.string()),
        ("validated_at", TS), ("table_name", pa.string()), ("table_path", pa.string()),
        ("from_version", pa.int64()), ("to_version", pa.int64()), ("rows", pa.int64()),
        ("suite", pa.string()), ("expectation_key", pa.string()), ("expectation", pa.string()),
        ("column_name", pa.string()), ("kwargs", pa.string()), ("severity", pa.string()),
        ("success", pa.bool_()), ("observed_value", pa.string()), ("unexpected_count", pa.int64()),
        ("unexpected_percent", pa.float64()), ("examples", pa.string()), ("exception", pa.string()),
        ("status", pa.string()), ("docs_page", pa.string()),
        ("dag_id", pa.string()), ("dag_run_id", pa.string()), ("task_id", pa.string()), ("context", pa.string()),
    ]),
    description="every expectation of every data-quality validation the platform ran",
)

STATUSES = ("FAIL", "WARN", "PASS")
_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def append_results(rows: Iterable[Mapping]) -> int:
    """Append rows (one Delta commit, a blind append); returns how many. Raises
    UnsafeStoreError, writing nothing, on a store without safe commits."""
    return append_rows(QUALITY_RESULTS, rows)


def _where(pipeline: str | None = None, **equals):
    """A pyarrow filter: each column of ``equals`` equal to its value (None: any), the
    suites of ``pipeline`` (``streamlake.<pipeline>.<table>``; None: all); None if no condition."""
    conditions = [pc.field(k) == v for k, v in equals.items() if v is not None]
    if pipeline is not None:
        conditions.append(pc.starts_with(pc.field("suite"), pattern=f"streamlake.{pipeline}."))
    expr = None
    for c in conditions:
        expr = c if expr is None else expr & c
    return expr


def _newest_first(rows: list[dict]) -> list[dict]:
    rows.sort(key=lambda r: (r["validated_at"], r["validation_id"]), reverse=True)
    return rows


def _rows_of(validation_ids: list[str]) -> list[dict]:
    """Every row of the given validations, newest validation first."""
    if not validation_ids:
        return []
    table = platform_rows(QUALITY_RESULTS, pc.field("validation_id").isin(validation_ids))
    return [] if table is None else _newest_first(table.to_pylist())


def _validation_index(filter_expr) -> list[dict]:
    """One entry per validation matching ``filter_expr`` (``validation_id``, ``validated_at``,
    ``table_name``, ``suite``, ``to_version``), newest first; read and grouped in Arrow."""
    keys = ["validation_id", "table_name", "suite", "to_version"]
    table = platform_rows(QUALITY_RESULTS, filter_expr, keys + ["validated_at"])
    if table is None or table.num_rows == 0:
        return []
    index = table.group_by(keys).aggregate([("validated_at", "max")]).rename_columns(keys + ["validated_at"])
    return _newest_first(index.to_pylist())


def read_results(**equals) -> list[dict]:
    """Every recorded row, newest validation first, filtered by equality (None: any)."""
    table = platform_rows(QUALITY_RESULTS, _where(**equals))
    return [] if table is None else _newest_first(table.to_pylist())


def failing_first(rows: Iterable[Mapping]) -> list[dict]:
    """Failing expectations first (critical, warning, info), then passing ones; by key within."""
    return sorted((dict(r) for r in rows), key=lambda r: (
        bool(r["success"]), _SEVERITY_ORDER.get(r["severity"], 9), r["expectation_key"] or ""))


def summarize(rows: list[Mapping]) -> dict:
    """One validation's summary from its expectation rows."""
    first = rows[0]
    total = len(rows)
    passed = sum(1 for r in rows if r["success"])
    failing = [r for r in rows if not r["success"]]
    return {
        "validation_id": first["validation_id"], "run_id": first["run_id"], "operation": first["operation"],
        "validated_at": first["validated_at"], "table_name": first["table_name"],
        "table_path": first["table_path"], "from_version": first["from_version"],
        "to_version": first["to_version"], "rows": first["rows"], "suite": first["suite"],
        "status": first["status"], "expectations": total, "passed": passed,
        "pass_rate": passed / total if total else 1.0,
        "unexpected": sum(r["unexpected_count"] or 0 for r in rows),
        "critical_failures": sorted(r["expectation_key"] for r in failing if r["severity"] == "critical"),
        "warnings": sorted(r["expectation_key"] for r in failing if r["severity"] == "warning"),
        "docs_page": first["docs_page"], "dag_id": first["dag_id"], "dag_run_id": first["dag_run_id"],
        "task_id": first["task_id"],
    }


def group_validations(rows: Iterable[Mapping]) -> OrderedDict[str, list[dict]]:
    """Rows grouped by validation id, in the order the ids first appear."""
    out: OrderedDict[str, list[dict]] = OrderedDict()
    for r in rows:
        out.setdefault(r["validation_id"], []).append(dict(r))
    return out


def validations(table: str | None = None, limit: int | None = None, pipeline: str | None = None) -> list[dict]:
    """Summaries of recorded validations, newest first (optionally of one table, of one
    pipeline; the newest ``limit``)."""
    index = _validation_index(_where(pipeline, table_name=table))
    chosen = [v["validation_id"] for v in (index[:limit] if limit else index)]
    return [summarize(group) for group in group_validations(_rows_of(chosen)).values()]


def latest(table: str | None = None, pipeline: str | None = None) -> list[dict]:
    """The latest validation per (table, suite): its summary plus ``results`` (its
    expectation rows, failing first). Failing validations first, then by table."""
    newest: dict[tuple, str] = {}
    for v in _validation_index(_where(pipeline, table_name=table)):  # newest first
        newest.setdefault((v["table_name"], v["suite"]), v["validation_id"])
    out = [{**summarize(rows), "results": failing_first(rows)}
           for rows in group_validations(_rows_of(list(newest.values()))).values()]
    return sorted(out, key=lambda v: (STATUSES.index(v["status"]) if v["status"] in STATUSES else 9,
                                      v["table_name"], v["suite"]))


def trend(table: str, limit: int = 200, pipeline: str | None = None) -> list[dict]:
    """The table's validations (of one pipeline), oldest first (the last ``limit``), for the trend plot."""
    return list(reversed(validations(table, limit, pipeline)))


def last_validation(table_path: str) -> dict | None:
    """Summary (:func:`summarize`) of the validation that reached furthest into the table
    at ``table_path`` (highest ``to_version``; the newest of those), or None."""
    best = None
    for v in _validation_index(_where(table_path=str(table_path))):  # newest first
        if v["to_version"] is not None and (best is None or v["to_version"] > best["to_version"]):
            best = v
    return summarize(_rows_of([best["validation_id"]])) if best else None


def last_validated_version(table_path: str) -> int | None:
    """The highest ``to_version`` recorded for a table path: where "since the last
    validation" starts."""
    last = last_validation(table_path)
    return last["to_version"] if last else None
