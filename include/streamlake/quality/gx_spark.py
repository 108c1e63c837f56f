"""What Great Expectations runs on Spark for a map expectation, without the queries that cannot find anything.

For each map expectation (values not null, in a set, between bounds, unique, a
column pair, a compound key), GX 1.x on Spark asks for the expectation's
``unexpected_values`` metric whatever the result format, and computes it as a
query: ``filter(unexpected).select(...).limit(partial_unexpected_count).collect()``.
:mod:`streamlake.quality.validate` runs every suite first with
``partial_unexpected_count`` 0 (counts and observed values only), so each of
those queries is ``limit(0)``: an empty list, yet a plan analysed and run by
Spark (on a Spark Connect server, one round trip each), about a third of a
suite's Spark queries.

:func:`skip_empty_unexpected_value_queries` answers exactly those (``limit(0)``,
any result format but ``COMPLETE``) with the empty list they return, without
Spark, and leaves every other call to GX. Measured here: the sensors example's five
suites in a warm local session, 6.7-7.4 -> 5.1-6.1 s a round; test_quality_suites.py
and test_verify.py in one worker, 182-187 -> 167-169 s. GX's version is pinned
(constraints.txt); test_quality_suites.py proves the outcomes equal GX's own.
"""

from __future__ import annotations

import functools

ENGINE = "SparkDFExecutionEngine"
_MARK = "_streamlake_skips_limit_zero"


def _limit_zero(metric_value_kwargs: dict) -> bool:
    result_format = metric_value_kwargs.get("result_format") or {}
    return (isinstance(result_format, dict) and result_format.get("result_format") != "COMPLETE"
            and result_format.get("partial_unexpected_count") == 0)


def _skipping(query):
    @functools.wraps(query)  # keeps GX's attributes of the function (its metric_fn_type)
    def unexpected_values(*args, **kwargs):
        if _limit_zero(kwargs.get("metric_value_kwargs") or {}):
            return []
        return query(*args, **kwargs)

    setattr(unexpected_values, _MARK, True)
    return unexpected_values


def skip_empty_unexpected_value_queries() -> int:
    """Make GX's Spark ``*.unexpected_values`` metrics of column, column-pair and
    multicolumn map expectations return ``[]`` without a query when they are asked for
    at most 0 values (not ``COMPLETE``), which is what their query returns. Idempotent;
    returns how many metrics it changed in this call. Raises ImportError without GX."""
    from great_expectations.expectations import registry
    from great_expectations.expectations.metrics.map_metric_provider import map_metric_provider as maps

    queries = {maps._spark_column_map_condition_values, maps._spark_column_pair_map_condition_values,
               maps._spark_multicolumn_map_condition_values}
    changed = 0
    for name, definition in registry._registered_metrics.items():
        provider = definition.get("providers", {}).get(ENGINE)
        if not name.endswith(".unexpected_values") or provider is None:
            continue
        metric_class, query = provider
        if query in queries:
            definition["providers"][ENGINE] = (metric_class, _skipping(query))
            changed += 1
    return changed


def skipped_metrics() -> list[str]:
    """The metrics :func:`skip_empty_unexpected_value_queries` has changed in this process."""
    from great_expectations.expectations import registry

    return sorted(name for name, d in registry._registered_metrics.items()
                  if getattr(d.get("providers", {}).get(ENGINE, (None, None))[1], _MARK, False))
