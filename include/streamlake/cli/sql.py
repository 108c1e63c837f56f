"""``streamlake sql "QUERY" [--json] [--remote sc://...]``: a SQL query over the platform's tables by name.

Names: ``<job>.<table>`` (``sensors.gold_per_minute``) and ``streamlake.<table>`` for the
platform's own (:mod:`streamlake.operations.sql_catalog`). The query runs on the Spark Connect
server (``--remote``, else the platform's running one) when it answers, otherwise in a local
session of this process with the same names for every job in ``$STREAMLAKE_HOME``. It prints a
table, or with ``--json`` a JSON array of row objects. A refused query is one line with
Spark's SQL error (exit 2); an unknown table lists the names that exist.
"""

from __future__ import annotations

import json
import logging
import sys


def _cell(value) -> str:
    return "NULL" if value is None else str(value)


def format_table(rows: list[dict], columns: list[str]) -> str:
    """Rows as an aligned text table with a header line (the way spark-sql prints them)."""
    cells = [[_cell(r[c]) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line, "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |", line]
    out += ["| " + " | ".join(v.ljust(w) for v, w in zip(row, widths)) + " |" for row in cells]
    out += [line, f"({len(rows)} row{'s' if len(rows) != 1 else ''})"]
    return "\n".join(out)


def cmd_sql(args) -> int:
    from streamlake.operations.sql_catalog import run_query
    from streamlake.platform import spark_connect
    from streamlake.spark.session import get_spark, quiet_local_session

    # pyspark logs a refused query's context to stderr (a JSON line) before raising: the error
    # below is the one line a refused query prints
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        logging.getLogger(name).disabled = True
    url = spark_connect.connect_url(args.remote)
    if args.remote and url is None:
        print(f"sql: the Spark Connect server {args.remote} does not answer; running in a local session",
              file=sys.stderr)
    spark = get_spark("streamlake-sql", remote=url) if url else quiet_local_session("streamlake-sql")
    try:
        result = run_query(spark, args.query)
    finally:
        spark.stop()
    rows = result.to_pylist()
    if args.json:
        print(json.dumps(rows, default=str, indent=None))
    else:
        print(format_table(rows, result.column_names))
    return 0


def add_parsers(sub) -> None:
    s = sub.add_parser("sql", help="a SQL query over every table by name (<pipeline>.<table>, streamlake.<table>)")
    s.add_argument("query", help='e.g. "SELECT * FROM sensors.gold_per_minute ORDER BY window_start DESC LIMIT 5"')
    s.add_argument("--json", action="store_true", help="print a JSON array of row objects instead of a table")
    s.add_argument("--remote", help="sc://host:port of a Spark Connect server to run it on (default: the platform's, "
                                    "when it runs; else a local session)")
    s.set_defaults(func=cmd_sql)
