"""What Great Expectations runs on Spark for a suite, without the queries whose answer is not used.

:mod:`streamlake.quality.validate` runs every suite first with
``partial_unexpected_count`` 0 (counts and observed values only), then, if
something failed, again with examples; never in GX's ``COMPLETE`` result format.
GX 1.x on Spark still sends two kinds of queries whose answer cannot matter then,
each a plan analysed and run by Spark (on a Spark Connect server, round trips):

* a map expectation's (values not null, in a set, between bounds, unique, a column
  pair, a compound key) ``*.unexpected_values`` metric, whatever the result
  format: ``filter(unexpected).select(...).limit(partial_unexpected_count).collect()``.
  In the first pass that is ``limit(0)``, which returns an empty list: about a
  third of a suite's queries.
* an ``UnexpectedRowsExpectation``'s (a pipeline rule, a gold measure's
  ``count = events``) ``unexpected_rows_query.table`` metric: a temporary view,
  then up to 200 of the unexpected rows collected; the expectation reads them only
  in the ``COMPLETE`` format (its success and observed value come from the
  ``unexpected_rows_query.row_count`` metric, which still runs). Two round trips
  per rule in every pass.

:func:`skip_needless_queries` answers exactly those with what GX would then
make of them (the empty list) without Spark, and leaves every other call to GX.
Measured here, test_quality_suites.py and test_verify.py in one worker, runs
alternated: the ``limit(0)`` ones 182-187 -> 167-169 s; then the rows of rule
queries 171-173 -> 163-165 s. GX's version is pinned
(constraints.txt); test_quality_suites.py proves the outcomes equal GX's own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

ENGINE = "SparkDFExecutionEngine"
ROWS_QUERY_TABLE = "unexpected_rows_query.table"
_MARK = "_streamlake_skips"


def _format(result_format) -> str | None:
    """The format's name (``SUMMARY``, ``COMPLETE``...) of a result format given as a
    name, a GX ``ResultFormat`` or a dict; None when there is none."""
    if isinstance(result_format, dict):
        result_format = result_format.get("result_format")
    result_format = getattr(result_format, "value", result_format)
    return None if result_format is None else str(result_format).upper()


def limit_zero(kwargs: dict) -> bool:
    """An ``unexpected_values`` call asked for at most 0 values, not in ``COMPLETE``."""
    result_format = (kwargs.get("metric_value_kwargs") or {}).get("result_format") or {}
    return (isinstance(result_format, dict) and _format(result_format) != "COMPLETE"
            and result_format.get("partial_unexpected_count") == 0)


def rows_unused(kwargs: dict) -> bool:
    """An ``unexpected_rows_query.table`` call in a validation whose result format is
    known and not ``COMPLETE``, the only one in which the expectation reads the rows."""
    result_format = _format((kwargs.get("runtime_configuration") or {}).get("result_format"))
    return result_format is not None and result_format != "COMPLETE"


def _skipping(query: Callable, needless: Callable[[dict], bool]) -> Callable:
    @functools.wraps(query)  # keeps GX's attributes of the function (its metric_fn_type)
    def without_needless_queries(*args, **kwargs):
        if needless(kwargs):
            return []
        return query(*args, **kwargs)

    setattr(without_needless_queries, _MARK, needless.__name__)
    return without_needless_queries


def _needless_test(name: str, query: Callable) -> Callable[[dict], bool] | None:
    from great_expectations.expectations.metrics.map_metric_provider import map_metric_provider as maps

    if name.endswith(".unexpected_values") and query in {
            maps._spark_column_map_condition_values, maps._spark_column_pair_map_condition_values,
            maps._spark_multicolumn_map_condition_values}:
        return limit_zero
    if name == ROWS_QUERY_TABLE and not hasattr(query, _MARK):
        return rows_unused
    return None


def skip_needless_queries() -> int:
    """Make GX's Spark metrics answer without a query where the answer is not used:
    ``*.unexpected_values`` of column, column-pair and multicolumn map expectations asked
    for at most 0 values (not ``COMPLETE``), and ``unexpected_rows_query.table`` outside
    ``COMPLETE``; both return ``[]``, what GX makes of them then. Idempotent; returns how
    many metrics it changed in this call. Raises ImportError without GX."""
    from great_expectations.expectations import registry

    changed = 0
    for name, definition in registry._registered_metrics.items():
        provider = definition.get("providers", {}).get(ENGINE)
        if provider is None:
            continue
        metric_class, query = provider
        needless = _needless_test(name, query)
        if needless is not None:
            definition["providers"][ENGINE] = (metric_class, _skipping(query, needless))
            changed += 1
    return changed


def skipped_metrics() -> dict[str, str]:
    """The metrics :func:`skip_needless_queries` has changed in this process, each with the
    test (``limit_zero``, ``rows_unused``) that decides when it skips the query."""
    from great_expectations.expectations import registry

    out = {}
    for name, definition in registry._registered_metrics.items():
        test = getattr(definition.get("providers", {}).get(ENGINE, (None, None))[1], _MARK, None)
        if test:
            out[name] = test
    return dict(sorted(out.items()))
