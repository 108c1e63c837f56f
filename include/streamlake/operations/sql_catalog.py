"""Every table of the platform by SQL name, in a Spark session's catalog.

A pipeline's tables are ``<job>.<table>`` with the table's path made a name: ``bronze``,
``silver``, ``quarantine``, ``gold/per_minute`` -> ``gold_per_minute``,
``late_events/per_minute`` -> ``late_events_per_minute``. Spark's catalog takes letters,
digits and ``_`` only, so any other character of a job's name is ``_`` there
(``e2e-orders`` -> ``e2e_orders``). The platform's own tables are
``streamlake.<table>`` (``consistency_checks``, ``verified_ranges``, ``quality_results``,
``operations``, ``operation_outcomes``). Each name is an external Delta table (``CREATE TABLE ... USING delta
LOCATION``) over the files the platform writes: registering copies nothing and a query reads
the table's current version through Delta's Spark connector.

The names live in the session's catalog (Spark's in-memory catalog, shared by every session
of one Spark application, so by every client of a Spark Connect server). They are derived
from the job specs under ``$STREAMLAKE_HOME`` and registered again when missing:
:func:`register_tables` is idempotent and cheap for names that exist. The Spark Connect
server of ``make run`` gets them at its start, and after every proof of a job
(``jobs/verify.py``), so a new pipeline's tables appear without a restart.

Command line: ``python -m streamlake.operations.sql_catalog [--remote sc://...]``.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from typing import Iterable

from streamlake.delta.table import table_exists
from streamlake.errors import StreamLakeError
from streamlake.operations.jobs import JobSpec, list_jobs, load_job
from streamlake.spark.session import reach_store
from streamlake.storage.location import is_object_store

log = logging.getLogger(__name__)

PLATFORM_SCHEMA = "streamlake"


class UnknownTableError(StreamLakeError):
    """A query names a table the catalog does not hold (the message lists those it does)."""


def sql_identifier(name: str) -> str:
    """``name`` as Spark's catalog takes it: every character but letters, digits and ``_`` as ``_``."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def sql_table(table: str) -> str:
    """A pipeline table's SQL name: its path inside the root with ``/`` as ``_``."""
    return sql_identifier(table)


def sql_name(job: str, table: str) -> str:
    """The SQL name of ``job``'s table ``table`` (``gold/per_minute`` of ``sensors``:
    ``sensors.gold_per_minute``)."""
    return f"{sql_identifier(job)}.{sql_table(table)}"


def _platform_tables() -> dict[str, str]:
    from streamlake.operations.consistency import RESULTS
    from streamlake.operations.ledger import VERIFIED_RANGES
    from streamlake.delta.records import OPERATIONS, platform_table_path
    from streamlake.operations.outcomes import OPERATION_OUTCOMES
    from streamlake.quality.results import QUALITY_RESULTS

    return {spec.name: platform_table_path(spec.name)
            for spec in (RESULTS, VERIFIED_RANGES, QUALITY_RESULTS, OPERATIONS, OPERATION_OUTCOMES)}


def sql_names(jobs: Iterable[JobSpec] | None = None) -> dict[str, str]:
    """``schema.table`` -> the table's location, for every table of ``jobs`` (default: every job
    under ``$STREAMLAKE_HOME``) and the platform's own. A job named like the platform's schema
    is left out (its tables would shadow the platform's); a job whose spec no longer loads is
    skipped with a warning."""
    if jobs is None:
        loaded = []
        for name in list_jobs():
            try:
                loaded.append(load_job(name))
            except (StreamLakeError, OSError, ValueError) as exc:
                log.warning("job %s: its tables get no SQL names: %s", name, exc)
        jobs = loaded
    names = {f"{PLATFORM_SCHEMA}.{t}": path for t, path in _platform_tables().items()}
    owners = {PLATFORM_SCHEMA: "the platform"}
    for job in jobs:
        schema = sql_identifier(job.name)
        if schema.lower() in owners:
            log.warning("job %s: its SQL schema %s is %s's already; its tables get no SQL names",
                        job.name, schema, owners[schema.lower()])
            continue
        owners[schema.lower()] = f"job {job.name}"
        names.update({sql_name(job.name, t): path for t, path in job.tables().items()})
    return names


def _quoted(name: str) -> str:
    return ".".join(f"`{part}`" for part in name.split(".", 1))


def register_tables(spark, jobs: Iterable[JobSpec] | None = None) -> list[str]:
    """Give every existing table of ``jobs`` (default: all) and of the platform its SQL name in
    ``spark``'s catalog, unless it has one. Tables not created yet are left for a later call.
    Returns the names the catalog holds for them. Tables on S3 are read through s3a with the
    options the platform uses for their root (:func:`streamlake.spark.session.reach_store`)."""
    from pyspark.errors import PySparkException

    registered = []
    schemas: set[str] = set()
    named: dict[str, set[str]] = {}  # schema -> the tables the catalog holds (one query per schema)
    for name, path in sorted(sql_names(jobs).items()):
        schema, table = name.split(".", 1)
        if schema not in named:
            try:
                named[schema] = {r[1].lower() for r in spark.sql(f"SHOW TABLES IN {_quoted(schema)}").collect()}
                schemas.add(schema)
            except PySparkException:  # no such schema yet
                named[schema] = set()
        if table.lower() in named[schema]:
            registered.append(name)
            continue
        try:
            if not table_exists(path):
                continue
        except Exception as exc:  # noqa: BLE001 - a store this process cannot reach: no name for now
            log.warning("%s (%s) gets no SQL name: %s", name, path, " ".join(str(exc).split())[:300])
            continue
        if is_object_store(path):
            reach_store(spark, path)
        location = str(path).replace("\\", "\\\\").replace("'", "\\'")
        try:
            if schema not in schemas:
                spark.sql(f"CREATE SCHEMA IF NOT EXISTS {_quoted(schema)}")
                schemas.add(schema)
            spark.sql(f"CREATE TABLE IF NOT EXISTS {_quoted(name)} USING delta LOCATION '{location}'")
        except PySparkException as exc:  # one table Spark cannot name is no reason to name none
            log.warning("%s (%s) gets no SQL name: %s", name, path, " ".join(str(exc).split())[:300])
            continue
        registered.append(name)
    return registered


def run_query(spark, query: str):
    """``spark.sql(query)`` on a catalog that holds every table's name: a pyarrow Table. The
    query runs at once; only when it names a table the catalog lacks are the names
    registered (:func:`register_tables`) and the query run again.

    Raises UnknownTableError (listing the names that exist) for a table no job has, and
    StreamLakeError with Spark's SQL error, on one line, for any other refusal."""
    from pyspark.errors import PySparkException

    names = None
    for attempt in range(2):
        try:
            return spark.sql(query).toArrow()
        except PySparkException as exc:
            condition = exc.getCondition() if hasattr(exc, "getCondition") else exc.getErrorClass()
            message = " ".join(str(exc).split("JVM stacktrace:")[0].split())  # Spark's error, not its trace
            if not (condition or "").startswith(("TABLE_OR_VIEW_NOT_FOUND", "SCHEMA_NOT_FOUND")):
                raise StreamLakeError(message) from None
            if attempt == 1:  # a table, or a pipeline (schema), no job has
                first = message.split(". ")[0].rstrip(".")  # Spark's sentence naming the table, not its advice
                raise UnknownTableError(f"{first}; the tables: {', '.join(names) or 'none'}") from None
        names = register_tables(spark)
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    from streamlake.spark.session import get_spark

    parser = argparse.ArgumentParser(prog="python -m streamlake.operations.sql_catalog",
                                     description="Name every table in a Spark Connect server's catalog.")
    parser.add_argument("--remote", required=True, help="sc://host:port")
    args = parser.parse_args(argv)
    spark = get_spark("streamlake-sql-catalog", remote=args.remote)
    try:
        names = register_tables(spark)
    finally:
        spark.stop()
    print(f"sql: {len(names)} tables named on {args.remote}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
